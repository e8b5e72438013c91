"""Changes: git refs -> what a pull request changed.

``collect_changes(repo, base, head)`` diffs head against the merge-base of base and head (the
three-dot diff a pull request shows), parses ``git diff -U0`` with ``unidiff``, and maps changed
lines to the definitions they touch: Python through ``ast`` (both sides, normalised), C/C++/CUDA
through tree-sitter (functions, classes, macros, registrations). Nothing here knows about
operators: that is the select stage's job."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from .diff import parse_diff
from .git import Git, GitError
from .model import ChangedFile, ChangedSymbol, ChangeSet, Hunk
from .pyindex import PyIndex


class CodeBase:
    """Lazily built indexes of the two revisions a ChangeSet compares (merge-base and head)."""

    def __init__(self, git: Git, base_sha: str, head_sha: str, python_roots: Sequence[str] = ("",)):
        self.git = git
        self.revs = {"base": base_sha, "head": head_sha}
        self.python_roots = list(python_roots) or [""]
        self._py = {}
        self._cpp = {}

    def py(self, side: str) -> PyIndex:
        if side not in self._py:
            self._py[side] = PyIndex(self.git, self.revs[side], self.python_roots)
        return self._py[side]

    def cpp(self, side: str):
        from .cpp import CppIndex

        if side not in self._cpp:
            self._cpp[side] = CppIndex(self.git, self.revs[side])
        return self._cpp[side]


def collect_changes(repo: os.PathLike, base: str, head: str = "HEAD", python_path: Optional[Sequence[str]] = None) -> ChangeSet:
    """What ``head`` changed since its merge-base with ``base``.

    ``python_path``: directories (relative to the repository root) that hold importable packages;
    module names are computed relative to them (default: the repository root)."""
    from .atenyaml import aten_yaml_changes, is_aten_yaml
    from .cpp import cpp_changes, is_cpp
    from .python import python_changes

    git = Git(Path(repo))
    base_sha = git.resolve(base)
    head_sha = git.resolve(head)
    mb = git.merge_base(base_sha, head_sha)
    files = parse_diff(git.diff_u0(mb, head_sha))
    roots = [r.strip("/") if r not in (".", "./") else "" for r in (python_path or [""])]
    cb = CodeBase(git, mb, head_sha, roots)
    cs = ChangeSet(repo=str(git.root), base=base, head=head, base_sha=base_sha, head_sha=head_sha, merge_base=mb,
                   files=files, codebase=cb)
    if any(not f.binary and (f.path.endswith(".py") or (f.old_path or "").endswith(".py")) for f in files):
        syms, notes = python_changes(files, cb.py("base"), cb.py("head"))
        cs.symbols.extend(syms)
        cs.notes.extend(notes)
    if any(not f.binary and (is_cpp(f.path) or is_cpp(f.old_path)) for f in files):
        try:
            import tree_sitter  # noqa: F401
            import tree_sitter_cpp  # noqa: F401
        except ImportError:
            cs.notes.append("C/C++/CUDA changes not analysed: install tree-sitter and tree-sitter-cpp "
                            "(pip install tree-sitter tree-sitter-cpp)")
        else:
            syms, notes = cpp_changes(files, cb.cpp("base"), cb.cpp("head"))
            cs.symbols.extend(syms)
            cs.notes.extend(notes)
    for f in files:
        if f.binary or not (is_aten_yaml(f.path) or is_aten_yaml(f.old_path)):
            continue
        base_text = git.text(mb, f.old_path or f.path) if f.status != "added" else None
        head_text = git.text(head_sha, f.path) if f.status != "deleted" else None
        syms, notes = aten_yaml_changes(f, base_text, head_text)
        cs.symbols.extend(syms)
        cs.notes.extend(notes)
    return cs


__all__ = ["collect_changes", "ChangeSet", "ChangedFile", "ChangedSymbol", "Hunk", "CodeBase", "Git", "GitError",
           "parse_diff"]
