"""Types of the changes stage: what a pull request changed, file by file and symbol by symbol.

Serialisable (``to_dict``/``from_dict``) so the select stage can run from a saved ChangeSet."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Set


@dataclass(frozen=True)
class Hunk:
    """One ``-U0`` hunk: ``old_len`` lines at ``old_start`` replaced by ``new_len`` at ``new_start``.
    A zero-length side means a pure insertion/deletion *after* line ``*_start`` on that side."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int

    def lines(self, side: str) -> Set[int]:
        """Changed lines on ``side`` ("old"/"new"), without neighbours."""
        start, n = (self.old_start, self.old_len) if side == "old" else (self.new_start, self.new_len)
        return set(range(start, start + n))

    def neighbours(self, side: str) -> Set[int]:
        """For a zero-length side: the two lines the insertion/deletion sits between."""
        start, n = (self.old_start, self.old_len) if side == "old" else (self.new_start, self.new_len)
        if n:
            return set()
        return {x for x in (start, start + 1) if x >= 1}

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ChangedFile:
    path: str  # path at head (for a deletion: the path it had at base)
    status: str  # added | deleted | modified | renamed | typechange
    old_path: Optional[str] = None  # path at base (None for an added file)
    binary: bool = False
    hunks: List[Hunk] = field(default_factory=list)

    def lines(self, side: str) -> Set[int]:
        out: Set[int] = set()
        for h in self.hunks:
            out |= h.lines(side)
        return out

    def neighbour_lines(self, side: str) -> Set[int]:
        out: Set[int] = set()
        for h in self.hunks:
            out |= h.neighbours(side)
        return out - self.lines(side)

    def line_of(self, side: str = "new") -> int:
        """First changed line on ``side`` (for reports); 1 when the file has no text hunk."""
        ls = self.lines(side) or self.neighbour_lines(side)
        return min(ls) if ls else 1

    @property
    def at_base(self) -> Optional[str]:
        return None if self.status == "added" else (self.old_path or self.path)

    @property
    def at_head(self) -> Optional[str]:
        return None if self.status == "deleted" else self.path

    def to_dict(self) -> dict:
        return {"path": self.path, "status": self.status, "old_path": self.old_path, "binary": self.binary,
                "hunks": [h.to_dict() for h in self.hunks]}

    @classmethod
    def from_dict(cls, raw: dict) -> "ChangedFile":
        return cls(path=raw["path"], status=raw["status"], old_path=raw.get("old_path"),
                   binary=bool(raw.get("binary")), hunks=[Hunk(**h) for h in raw.get("hunks", [])])


@dataclass
class ChangedSymbol:
    """A definition a change touches.

    ``change`` is modified / added / deleted, or ``unchanged`` when its normalised form (AST without
    docstrings, comments, annotations and formatting; C++ tokens without comments) is identical on
    both sides: such a symbol changes no numerics and ``why`` says so."""

    file: str
    line: int
    symbol: str  # display name: "pkg.mod:Class.method" (Python) or "ns::Class::fn" (C++)
    lang: str  # python | cpp
    kind: str  # function | method | class | variable | import | module | macro | registration | file
    change: str  # modified | added | deleted | unchanged
    side: str = "head"  # the revision the symbol is looked up in: head, or base when deleted
    name: str = ""  # short name (C++: the identifier callers use)
    why: str = ""
    neighbour_only: bool = False  # touched only as the neighbour of a zero-length hunk
    data: Dict[str, object] = field(default_factory=dict)  # analyser extras (registrations, ...)

    @property
    def semantic(self) -> bool:
        return self.change != "unchanged"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "ChangedSymbol":
        return cls(**raw)


@dataclass
class ChangeSet:
    repo: str
    base: str  # the refs as given
    head: str
    base_sha: str
    head_sha: str
    merge_base: str
    files: List[ChangedFile] = field(default_factory=list)
    symbols: List[ChangedSymbol] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # files an analyser could not read (syntax errors, ...)
    codebase: object = field(default=None, repr=False, compare=False)  # live index, not serialised

    def file(self, path: str) -> Optional[ChangedFile]:
        for f in self.files:
            if f.path == path or f.old_path == path:
                return f
        return None

    def symbols_in(self, path: str) -> List[ChangedSymbol]:
        return [s for s in self.symbols if s.file == path]

    def to_dict(self) -> dict:
        return {
            "repo": self.repo, "base": self.base, "head": self.head, "base_sha": self.base_sha,
            "head_sha": self.head_sha, "merge_base": self.merge_base,
            "files": [f.to_dict() for f in self.files], "symbols": [s.to_dict() for s in self.symbols],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, raw: dict) -> "ChangeSet":
        return cls(repo=raw["repo"], base=raw["base"], head=raw["head"], base_sha=raw["base_sha"],
                   head_sha=raw["head_sha"], merge_base=raw["merge_base"],
                   files=[ChangedFile.from_dict(f) for f in raw.get("files", [])],
                   symbols=[ChangedSymbol.from_dict(s) for s in raw.get("symbols", [])],
                   notes=list(raw.get("notes", [])))
