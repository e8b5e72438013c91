"""Thin, read-only access to a git repository: refs, merge-base, ``diff -U0``, file contents at a
revision (one long-lived ``git cat-file --batch``) and ``git grep`` over a revision.

Every command runs with settings that make its output independent of the user's git config
(no pager, colour, external diff, textconv or path quoting; fixed a/ b/ prefixes)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from ..errors import GateError

_BASE = ["git", "-c", "core.quotePath=false", "-c", "color.ui=false", "-c", "safe.directory=*"]
_ENV = {"GIT_PAGER": "cat", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}


class GitError(GateError):
    """A git command failed in a way the user can fix (bad ref, not a repository)."""


class Git:
    def __init__(self, repo: os.PathLike):
        self.repo = Path(repo)
        if not self.repo.is_dir():
            raise GitError(f"{self.repo} is not a directory")
        top = self._run(["rev-parse", "--show-toplevel"], check=False)
        if top.returncode != 0:
            raise GitError(f"{self.repo} is not a git repository")
        self.root = Path(top.stdout.strip())
        self._cat: Optional[subprocess.Popen] = None
        self._blob_cache: Dict[tuple, Optional[bytes]] = {}

    # -- plumbing ------------------------------------------------------------------------
    def _run(self, args: Sequence[str], check: bool = True, input: Optional[bytes] = None,
             text: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, **_ENV}
        try:
            # any encoding in a diff or a path: undecodable bytes survive as lone surrogates
            proc = subprocess.run([*_BASE, *args], cwd=self.repo, env=env, capture_output=True,
                                  input=input if not text or input is None else input.decode("utf-8", "surrogateescape"),
                                  **({"encoding": "utf-8", "errors": "surrogateescape"} if text else {}))
        except FileNotFoundError:
            raise GitError("git is not installed (needed to read the pull request's changes)") from None
        if check and proc.returncode != 0:
            err = proc.stderr if text else proc.stderr.decode(errors="replace")
            raise GitError(f"git {args[0]} failed: {(err.strip().splitlines() or ['?'])[-1]}")
        return proc

    def run(self, *args: str) -> str:
        return self._run(list(args)).stdout

    # -- refs ----------------------------------------------------------------------------
    def resolve(self, ref: str) -> str:
        """Full SHA of the commit ``ref`` names; a one-line GitError if it names none."""
        if not ref or ref.startswith("-"):
            raise GitError(f"bad git ref {ref!r}")
        proc = self._run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"], check=False)
        if proc.returncode != 0:
            raise GitError(f"unknown git ref {ref!r} in {self.root} (fetch it first, e.g. git fetch origin {ref})")
        return proc.stdout.strip()

    def merge_base(self, a: str, b: str) -> str:
        proc = self._run(["merge-base", a, b], check=False)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise GitError(
                f"no merge base between {a[:12]} and {b[:12]} (a shallow clone? fetch full history, "
                "e.g. actions/checkout with fetch-depth: 0)")
        return proc.stdout.split()[0]

    # -- diff ----------------------------------------------------------------------------
    def diff_u0(self, old: str, new: str) -> str:
        """``git diff -U0`` between two commits, renames detected, binary files marked."""
        return self._run(["diff", "-U0", "-M", "--no-color", "--no-ext-diff", "--no-textconv",
                          "--src-prefix=a/", "--dst-prefix=b/", "--diff-filter=ACDMRT", old, new, "--"]).stdout

    # -- trees and blobs -----------------------------------------------------------------
    def ls_files(self, rev: str, suffixes: Optional[Iterable[str]] = None) -> List[str]:
        out = self._run(["ls-tree", "-r", "--name-only", "-z", rev]).stdout
        names = [n for n in out.split("\0") if n]
        if suffixes:
            sfx = tuple(suffixes)
            names = [n for n in names if n.endswith(sfx)]
        return names

    def show(self, rev: str, path: str) -> Optional[bytes]:
        """Contents of ``path`` at ``rev`` (None if it does not exist there)."""
        key = (rev, path)
        if key in self._blob_cache:
            return self._blob_cache[key]
        if self._cat is None or self._cat.poll() is not None:
            self._cat = subprocess.Popen([*_BASE, "cat-file", "--batch"], cwd=self.repo, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env={**os.environ, **_ENV})
        assert self._cat.stdin and self._cat.stdout
        self._cat.stdin.write(f"{rev}:{path}\n".encode())
        self._cat.stdin.flush()
        header = self._cat.stdout.readline().decode()
        parts = header.split()
        data: Optional[bytes] = None
        if len(parts) == 3 and parts[1] == "blob":
            size = int(parts[2])
            data = self._cat.stdout.read(size)
            self._cat.stdout.read(1)  # trailing newline
        elif len(parts) == 3:  # a tree or submodule at that path
            self._cat.stdout.read(int(parts[2]) + 1)
        self._blob_cache[key] = data
        return data

    def text(self, rev: str, path: str) -> Optional[str]:
        data = self.show(rev, path)
        return None if data is None else data.decode("utf-8", errors="replace")

    def grep_files(self, rev: str, words: Iterable[str], pathspecs: Sequence[str] = (),
                   fixed: bool = True, word: bool = True) -> List[str]:
        """Paths at ``rev`` containing any of ``words`` (whole words unless ``word=False``)."""
        words = sorted(set(words))
        if not words:
            return []
        out: set = set()
        for i in range(0, len(words), 200):  # keep the command line short
            args = ["grep", "-l", "-I", "--no-color"]
            if fixed:
                args.append("-F")
            else:
                args.append("-E")
            if word:
                args.append("-w")
            for w in words[i:i + 200]:
                args += ["-e", w]
            args += [rev, "--", *pathspecs]
            proc = self._run(args, check=False)
            if proc.returncode not in (0, 1):
                raise GitError(f"git grep failed: {proc.stderr.strip()[:200]}")
            for line in proc.stdout.splitlines():
                out.add(line.split(":", 1)[1] if line.startswith(rev + ":") else line)
        return sorted(out)

    def close(self) -> None:
        if self._cat is not None:
            try:
                self._cat.stdin.close()  # type: ignore[union-attr]
                self._cat.wait(timeout=5)
            except Exception:  # pragma: no cover - best effort
                self._cat.kill()
            self._cat = None

    def __enter__(self) -> "Git":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
