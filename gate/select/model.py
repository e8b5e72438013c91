"""The select stage's output: which operators a pull request can change, and why.

Every changed file ends up somewhere a user can see: an operator's reasons, ``cleared`` (a
changed symbol that changes no operator, with why), ``unmapped`` (a changed file nothing maps to)
or ``uncovered_native`` (a native op that changed but no catalogue row declares)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List


@dataclass
class Reason:
    file: str
    line: int
    symbol: str
    path: List[str]  # changed symbol -> ... -> operator
    kind: str  # python | aten | tf-op | torch-library | glob | sources | select-all

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Reason":
        return cls(file=raw["file"], line=int(raw["line"]), symbol=raw["symbol"], path=list(raw.get("path", [])),
                   kind=raw["kind"])


@dataclass
class SelectedOp:
    op: str
    reasons: List[Reason] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"op": self.op, "reasons": [r.to_dict() for r in self.reasons]}

    @classmethod
    def from_dict(cls, raw: dict) -> "SelectedOp":
        return cls(op=raw["op"], reasons=[Reason.from_dict(r) for r in raw.get("reasons", [])])


@dataclass
class Cleared:
    file: str
    line: int
    symbol: str
    why: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Cleared":
        return cls(**raw)


@dataclass
class Unmapped:
    file: str
    why: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Unmapped":
        return cls(**raw)


@dataclass
class NotGated:
    """A changed symbol that reaches an operator the configuration lists as not gated
    (``not_gated:``, which ``dl-gate init`` writes for what it left out, with why)."""

    op: str
    why: str
    file: str
    line: int
    symbol: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "NotGated":
        return cls(**raw)


@dataclass
class UncoveredNative:
    op: str  # ATen op (``gelu``), custom op (``ns::op``) or TF op (``Relu``)
    framework: str  # torch | tensorflow
    reasons: List[Reason] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"op": self.op, "framework": self.framework, "reasons": [r.to_dict() for r in self.reasons]}

    @classmethod
    def from_dict(cls, raw: dict) -> "UncoveredNative":
        return cls(op=raw["op"], framework=raw["framework"], reasons=[Reason.from_dict(r) for r in raw.get("reasons", [])])


@dataclass
class Selection:
    base: str
    head: str
    base_sha: str
    head_sha: str
    merge_base: str
    selected: List[SelectedOp] = field(default_factory=list)
    cleared: List[Cleared] = field(default_factory=list)
    unmapped: List[Unmapped] = field(default_factory=list)
    uncovered_native: List[UncoveredNative] = field(default_factory=list)
    capped: List[str] = field(default_factory=list)  # operators a select-all would add beyond `cap`
    notes: List[str] = field(default_factory=list)
    files_changed: int = 0
    not_gated: List[NotGated] = field(default_factory=list)  # changes reaching operators listed as not gated

    def op_names(self) -> List[str]:
        return [s.op for s in self.selected]

    def get(self, op: str) -> SelectedOp:
        for s in self.selected:
            if s.op == op:
                return s
        raise KeyError(op)

    def to_dict(self) -> dict:
        return {
            "base": self.base, "head": self.head, "base_sha": self.base_sha, "head_sha": self.head_sha,
            "merge_base": self.merge_base, "files_changed": self.files_changed,
            "selected": [s.to_dict() for s in self.selected],
            "cleared": [c.to_dict() for c in self.cleared],
            "unmapped": [u.to_dict() for u in self.unmapped],
            "uncovered_native": [u.to_dict() for u in self.uncovered_native],
            "capped": list(self.capped), "notes": list(self.notes),
            "not_gated": [n.to_dict() for n in self.not_gated],
        }

    @classmethod
    def from_dict(cls, raw: dict) -> "Selection":
        return cls(
            base=raw["base"], head=raw["head"], base_sha=raw["base_sha"], head_sha=raw["head_sha"],
            merge_base=raw["merge_base"], files_changed=int(raw.get("files_changed", 0)),
            selected=[SelectedOp.from_dict(s) for s in raw.get("selected", [])],
            cleared=[Cleared.from_dict(c) for c in raw.get("cleared", [])],
            unmapped=[Unmapped.from_dict(u) for u in raw.get("unmapped", [])],
            uncovered_native=[UncoveredNative.from_dict(u) for u in raw.get("uncovered_native", [])],
            capped=list(raw.get("capped", [])), notes=list(raw.get("notes", [])),
            not_gated=[NotGated.from_dict(n) for n in raw.get("not_gated", [])],
        )
