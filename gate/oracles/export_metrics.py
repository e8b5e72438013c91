"""The export oracle (Opera's deployment-path differential): an operator — or a graph — exported
through a path users deploy with (TorchScript, ONNX in onnxruntime, SavedModel; see
:mod:`gate.backends.exporters`) must compute what eager computes on identical inputs.

* The model is exported once from an example input and then run, exported and eager, on the
  inputs a short search draws and mutates at the same shapes (a trace frozen on the example's
  branch shows up on the others). Errors are in ULPs of float32 with eager as the reference
  (``Finding.metrics``, like the precision oracle); both sides are also scored against float64
  and the exported path *diverges* when its float64 error exceeds ``m ×`` eager's plus the
  operator's floor (PyTorch's own compiled-vs-eager rule, m = 2 for float32).
* A conversion, save, load or run failure where eager works is a finding (a ``Crash``), grouped
  by the converter function that failed: the innermost traceback frame, in the deepest chained
  exception, whose module belongs to the path's converter packages.
* Messages that say the operator or construct is *not supported* are classified apart
  (``status = "unsupported"``): a documented limitation, not a defect.
"""
from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ..backends.base import Output
from ..backends.exporters import ExportPath, ExportUnsupported, StageError
from .precision import Metrics, compare

EXPORT_DTYPE = "float32"
#: the "m" of the compiled-vs-eager rule for float32
MULTIPLIER = 2.0
#: messages that mean "the converter or runtime does not support this" (classified apart)
UNSUPPORTED_PATTERNS = (
    r"is not supported",
    r"not supported",
    r"[Uu]nsupported",
    r"Could not find an implementation",
    r"No ONNX function found",
    r"No decompositions registered",
    r"NOT_IMPLEMENTED",
    r"No Op registered for",
    r"is not implemented",
    r"not implemented for",
    r"Could not guard on data-dependent",
    r"data-dependent",
)


@dataclass
class Failure:
    kind: str  # unsupported | failure
    stage: str  # convert | save | load | run
    function: str  # converter function (module.qualname) the failure is grouped by
    error: str  # ExcType: first line

    @property
    def group(self) -> str:
        return f"{self.stage} in {self.function}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "stage": self.stage, "converter_function": self.function, "error": self.error,
                "group": self.group}


def _one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:160]}"


def _chain(exc: BaseException) -> List[BaseException]:
    out, seen = [], set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def converter_function(exc: BaseException, packages: Sequence[str]) -> str:
    """``module.qualname`` of the innermost frame inside one of ``packages``, searched from the
    deepest chained exception outwards; ``<native>`` when no frame is in a converter package."""
    for e in reversed(_chain(exc)):
        found = None
        for frame, _ in traceback.walk_tb(e.__traceback__):
            mod = frame.f_globals.get("__name__", "")
            if any(mod == p or mod.startswith(p + ".") for p in packages):
                found = f"{mod}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"
        if found:
            return found
    return "<native>"


def classify(exc: BaseException, path: ExportPath, stage: str = "convert") -> Failure:
    """A conversion failure: its stage, the converter function it is grouped by, and whether
    the converter said "not supported"."""
    if isinstance(exc, StageError):
        stage, exc = exc.stage, exc.exc
    chain = _chain(exc)
    text = " | ".join(f"{type(e).__name__}: {e}" for e in chain)
    unsupported = any(isinstance(e, ExportUnsupported) for e in chain) or any(
        re.search(p, text) for p in UNSUPPORTED_PATTERNS)
    error = _one_line(chain[-1])
    return Failure(kind="unsupported" if unsupported else "failure", stage=stage,
                   function=converter_function(exc, path.converter_packages), error=error)


# ---------------------------------------------------------------------------------------
# scoring
# ---------------------------------------------------------------------------------------
def score(exported: Sequence[Output], eager: Sequence[Output], ulp_floor: str = "output") -> Metrics:
    """Exported against eager on identical inputs, in ULPs of float32 (eager is the reference)."""
    return compare(exported, eager, EXPORT_DTYPE, ulp_floor)


def float64_rule(exported: Sequence[Output], eager: Sequence[Output], ref64: Sequence[Output], floor_ulp: float,
                 ulp_floor: str = "output") -> Dict[str, Any]:
    """Both sides against float64: the exported path diverges when its error exceeds
    ``MULTIPLIER ×`` eager's plus the operator's floor."""
    me = compare(eager, ref64, EXPORT_DTYPE, ulp_floor)
    mx = compare(exported, ref64, EXPORT_DTYPE, ulp_floor)
    eager_err = math.inf if me.severity == math.inf else me.ulp
    export_err = math.inf if mx.severity == math.inf else mx.ulp
    diverges = export_err > MULTIPLIER * eager_err + floor_ulp if math.isfinite(eager_err) else False
    return {"eager_vs_f64_ulp": eager_err, "export_vs_f64_ulp": export_err, "diverges": bool(diverges)}


__all__ = ["classify", "Failure", "converter_function", "score", "float64_rule", "UNSUPPORTED_PATTERNS",
           "EXPORT_DTYPE", "MULTIPLIER"]
