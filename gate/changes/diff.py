"""``git diff -U0`` text -> :class:`ChangedFile` list, parsed with ``unidiff`` (a maintained
unified-diff parser): renames, deletions, new files and binary files included."""
from __future__ import annotations

from typing import List

import unidiff

from .model import ChangedFile, Hunk


def _strip(path: str) -> str:
    path = path.rstrip("\t")
    if path.startswith(("a/", "b/")):
        return path[2:]
    return path


def parse_diff(text: str) -> List[ChangedFile]:
    """Parse the output of ``git diff -U0 -M --src-prefix=a/ --dst-prefix=b/``."""
    try:
        patch = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:  # pragma: no cover - git's own output
        raise ValueError(f"cannot parse git diff output: {exc}") from None
    out: List[ChangedFile] = []
    for pf in patch:
        src = None if pf.source_file in (None, "/dev/null") else _strip(pf.source_file)
        dst = None if pf.target_file in (None, "/dev/null") else _strip(pf.target_file)
        # git marks new / deleted files with /dev/null on one side. unidiff's is_added_file /
        # is_removed_file also guess from the hunks, which misreads a -U0 edit at the top of a
        # file (``@@ -0,0 +1 @@``) as a new file: use the markers only.
        if src is None:
            status, path, old = "added", dst or _strip(pf.path), None
        elif dst is None:
            status, path, old = "deleted", src, None
        elif pf.is_rename:
            status, path, old = "renamed", dst or _strip(pf.path), src
        else:
            status, path, old = "modified", dst or _strip(pf.path), None
        hunks = [Hunk(h.source_start, h.source_length, h.target_start, h.target_length) for h in pf]
        out.append(ChangedFile(path=path, status=status, old_path=old, binary=bool(pf.is_binary_file), hunks=hunks))
    return out
