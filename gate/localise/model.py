"""The localise stage's output type and its clock.

A :class:`Diagnosis` is what a failing gate says about one regression: where to look. It is
plain data (JSON through ``to_dict``/``from_dict``) and lands in ``VariantVerdict.diagnosis``;
the bulky evidence behind it (every variation tried, the full sub-operation trace, the
shrinking log) goes to ``findings/<id>.json`` beside the report and is referenced by
``details_file``.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from ..serial import json_safe


@dataclass
class Diagnosis:
    variant: Dict[str, str] = field(default_factory=dict)  # dtype, device, mode, layout
    kind: str = ""  # crash | nonfinite | int_mismatch | precision | behaviour
    parameter: Optional[str] = None  # e.g. "approximate='tanh' only" or "dtype=bfloat16 only"
    parameter_evidence: Optional[str] = None  # one line: which values were tried and which hold
    minimal_input: Optional[str] = None
    minimal_input_elements: Optional[int] = None
    found_input_elements: Optional[int] = None
    worst_element: Optional[str] = None
    base_vs_head: List[Dict[str, str]] = field(default_factory=list)  # rows {name, base, head}
    suboperation: Optional[Dict[str, Any]] = None  # {call, file, line, rate, delta, stack, base}
    changed_code: List[Dict[str, Any]] = field(default_factory=list)  # {file, line, symbol, distance, why}
    repro_script: Optional[str] = None
    repro_data: Optional[str] = None
    repro_command: Optional[str] = None
    details_file: Optional[str] = None
    truncated: bool = False
    seconds: float = 0.0
    notes: List[str] = field(default_factory=list)
    error: Optional[str] = None

    def to_dict(self) -> dict:
        return json_safe({k: v for k, v in asdict(self).items() if v not in (None, [], {}) or k in ("truncated",)})

    @classmethod
    def from_dict(cls, raw: dict) -> "Diagnosis":
        return cls(**{k: v for k, v in dict(raw or {}).items() if k in cls.__dataclass_fields__})


jsonable = json_safe  # the shared strict-JSON helper


class Deadline:
    """Seconds left of a budget. ``sub(fraction)`` carves a child deadline out of what is left
    (never beyond the parent's end)."""

    def __init__(self, seconds: float, start: Optional[float] = None):
        self.start = time.perf_counter() if start is None else start
        self.end = self.start + max(0.0, float(seconds))

    @property
    def left(self) -> float:
        return max(0.0, self.end - time.perf_counter())

    @property
    def spent(self) -> float:
        return time.perf_counter() - self.start

    def expired(self) -> bool:
        return time.perf_counter() >= self.end

    def sub(self, fraction: float) -> "Deadline":
        return Deadline(self.left * max(0.0, min(1.0, fraction)))


def safe_id(text: str) -> str:
    """A file name for a finding id such as ``mylib.gelu[float16/cpu/input]``."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_")


def fmt(x: Optional[float], digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.{digits}g}"
