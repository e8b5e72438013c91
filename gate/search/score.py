"""The score the search sees: :class:`Metrics` of one evaluation, the ``fitness`` a guidance
maximises, and ``ulp`` (the unit every error is counted in). Data and numbers only: no oracle,
no framework; the precision oracle (:mod:`gate.oracles.precision`) computes these figures."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import numpy as np

from ..backends.base import FLOAT_FORMATS
from ..serial import from_json_safe, json_safe


_EXP_MASK = np.uint64(0x7FF0000000000000)


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Unit in the last place of |x| in ``dtype``: 2^(e-(p-1)) for |x| in [2^e, 2^(e+1)), the
    subnormal spacing near zero and, beyond the dtype's range, the same p digits as if its
    exponent went on (a float32 value of 2.6e10 returned by a float16 variant's upcast is off
    by ~1e3 from its float64 value: 6e-5 ulp of 16M, not 30 ulp of 65504's 32; a value beyond
    the range that a finite output misses by all of it still reads ~2^p/2 ulp or more).

    Masking the float64 exponent bits gives 2^e exactly; scaling by 2^-(p-1) and bounding
    takes three more passes (several times faster than frexp/ldexp on large outputs).
    Non-finite inputs give the ulp of float64's largest exponent in p digits (finite)."""
    p, emin, _ = FLOAT_FORMATS[dtype]
    x = np.asarray(x, dtype=np.float64)
    shape = x.shape
    flat = np.ascontiguousarray(x).reshape(-1)
    out = (flat.view(np.uint64) & _EXP_MASK).view(np.float64)  # 2^e; 0 for zeros/subnormals, inf for inf/NaN
    out *= math.ldexp(1.0, -(p - 1))
    np.maximum(out, math.ldexp(1.0, emin - (p - 1)), out=out)
    np.minimum(out, math.ldexp(1.0, 1023 - (p - 1)), out=out)
    return out.reshape(shape)


@dataclass(frozen=True)
class Metrics:
    ulp: float = 0.0
    abs: float = 0.0
    rel: float = 0.0
    l1: float = 0.0
    mean_ulp: float = 0.0
    nonfinite: int = 0
    int_mismatch: int = 0
    numel: int = 0
    worst_output: int = 0
    worst_index: Tuple[int, ...] = ()
    worst_out: float = 0.0
    worst_ref: float = 0.0
    shape_mismatch: Optional[str] = None
    spread: float = 0.0  # max - min of the finite float outputs (Audee's NaN search maximises it)
    #: why these figures do not measure the variant's dtype: its low-precision run returned a
    #: wider dtype (a layer with a float32 dtype policy, an internal upcast returned as is), or
    #: the "float64" reference returned a narrower one; None when both are what they claim
    unmeasured: Optional[str] = None
    #: the scale of the computation the figures were taken on (a gradient's: the upstream
    #: gradient times its inputs and outputs, :func:`gate.oracles.precision.residue_magnitude`);
    #: 0 when the output's own magnitude is the scale. The judge measures the float64 runs'
    #: divergence on it too: two float64 runs of a result that is zero in exact arithmetic differ
    #: by residues, which are no behaviour change
    scale: float = 0.0
    #: a gradient's (gate.oracles.gradients): elements of the low-precision forward output that
    #: are NaN/Inf where its float64 forward is finite (measured when judging, not while searching)
    forward_nonfinite: int = 0

    @property
    def severity(self) -> float:
        """A single number that orders findings: NaN/Inf and mismatches first, then ULP."""
        if self.shape_mismatch or self.nonfinite or self.int_mismatch:
            return math.inf
        return self.ulp

    def to_dict(self) -> dict:
        return json_safe(asdict(self))  # non-finite figures as "inf"/"-inf"/"nan", the index a list

    @classmethod
    def from_dict(cls, raw: dict) -> "Metrics":
        raw = from_json_safe({k: v for k, v in raw.items() if k in cls.__dataclass_fields__})
        raw["worst_index"] = tuple(raw.get("worst_index") or ())
        return cls(**raw)


def fitness(m: Metrics, guidance: str) -> float:
    """The number the search maximises. ``linf``: max ULP error; ``l1``: mean ULP error;
    ``spread``: max − min of the output (drives values towards overflow, Audee's NaN search);
    ``random``: no feedback. NaN/Inf and mismatches dominate everything."""
    if m.shape_mismatch or m.nonfinite or m.int_mismatch:
        return math.inf
    if guidance == "spread":
        return m.spread
    if guidance == "l1":
        return m.mean_ulp
    return m.ulp
