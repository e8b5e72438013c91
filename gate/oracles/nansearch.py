"""NaN/Inf search (Audee): the precision runner driven by guidance ``spread`` — maximise
``max(out) − min(out)``, which pushes values towards the dtype's overflow — plus mutators that
probe overflow edges of the variant dtype (its largest finite value, the square and cube root
of it, log of it for exp-like ops, the smallest normal and subnormal…). A NaN or infinity in the
output where the float64 reference is finite and representable is the finding
(``Metrics.nonfinite``; the engine stops at the first one: its fitness is infinite).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ..backends.base import FLOAT_FORMATS
from ..ops.spec import OpSpec
from ..search.inputs import Candidate, pick_positions, project
from .base import OracleRunner
from .runner import OK, Evaluation


def edge_values(dtype: str) -> np.ndarray:
    """Magnitudes where outputs of common operators cross the dtype's range."""
    p, emin, emax = FLOAT_FORMATS[dtype]
    big = (2.0 - 2.0 ** (1 - p)) * 2.0 ** emax  # largest finite
    tiny = 2.0 ** emin  # smallest normal
    sub = 2.0 ** (emin - p + 1)  # smallest subnormal
    vals = [big, big / 2, big / 16, math.sqrt(big), big ** (1 / 3), math.log(big), math.log(big) / 2,
            math.log(big) + 1, math.log(tiny), tiny, sub, 1.0 / big, math.sqrt(tiny)]
    return np.array(sorted(set(vals)))


def _float_inputs(spec: OpSpec, cand: Candidate):
    return [t for t in spec.inputs if t.kind == "float" and cand.arrays.get(t.name) is not None
            and cand.arrays[t.name].size > 0]


def _inside(vals: np.ndarray, dom) -> np.ndarray:
    if dom.lo is not None:
        vals = vals[vals > dom.lo]
    if dom.hi is not None:
        vals = vals[vals < dom.hi]
    return vals


def overflow_mutators(dtype: str) -> Dict[str, Callable]:
    edges = edge_values(dtype)
    signed = np.concatenate([edges, -edges])
    p = FLOAT_FORMATS[dtype][0]

    def overflow_edge(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
        """Set one, a few or all elements of one input to ± an edge value (just below or above)."""
        ts = _float_inputs(spec, cand)
        if not ts:
            return None
        t = ts[int(rng.integers(len(ts)))]
        vals = _inside(signed * (1.0 + rng.choice([0.0, 1.0, -1.0]) * 2.0 ** -int(rng.integers(1, p))), t.domain)
        if vals.size == 0:
            return None
        flat = cand.arrays[t.name].reshape(-1).copy()
        k = max(1, int(flat.size * rng.choice([0.0, 0.1, 1.0])))
        idx = pick_positions(rng, flat.size, k)
        if idx is None:
            flat[:] = rng.choice(vals, size=flat.size)
        else:
            flat[idx] = rng.choice(vals, size=idx.size)
        return cand.derive("overflow_edge", **{t.name: flat.reshape(cand.arrays[t.name].shape)})

    def scale_to_edge(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
        """Scale one input so that its largest magnitude lands on an edge value."""
        ts = _float_inputs(spec, cand)
        if not ts:
            return None
        t = ts[int(rng.integers(len(ts)))]
        a = cand.arrays[t.name]
        top = float(np.max(np.abs(a[np.isfinite(a)]))) if np.any(np.isfinite(a)) else 0.0
        if top == 0.0:
            return None
        target = float(rng.choice(edges))
        return cand.derive("scale_to_edge", **{t.name: project(a * (target / top), t.domain)})

    def grow(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
        """Multiply one input by 2^k, k in [1, 8]: climb the spread towards overflow."""
        ts = _float_inputs(spec, cand)
        if not ts:
            return None
        t = ts[int(rng.integers(len(ts)))]
        return cand.derive("grow", **{t.name: project(cand.arrays[t.name] * 2.0 ** int(rng.integers(1, 9)), t.domain)})

    return {"overflow_edge": overflow_edge, "scale_to_edge": scale_to_edge, "grow": grow}


class NanRunner(OracleRunner):
    oracle = "nan"
    guidance = "spread"
    stop_on_inf = True  # a NaN/Inf is what this search is for: the first one ends it

    @classmethod
    def mutators_for(cls, spec, variant, options):
        return overflow_mutators(variant.dtype)

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        q, ev = super().evaluate(cand, keep_outputs=True, quantized=quantized)
        if ev.status == OK:
            ev.extra = {"oracle": self.oracle, "spread": ev.metrics.spread}
            if ev.metrics.nonfinite:
                ev.extra.update(_first_nonfinite(ev.outputs, ev.reference, self.variant.dtype))
        if not keep_outputs:
            ev.outputs = ev.reference = None
        return q, ev


def _first_nonfinite(outs, refs, dtype: str) -> dict:
    from .precision import overflow_bound

    bound = overflow_bound(dtype)
    for k, (o, r) in enumerate(zip(outs or (), refs or ())):
        if not (o.is_float and r.is_float):
            continue
        a, b = np.asarray(o.array, dtype=np.float64), np.asarray(r.array, dtype=np.float64)
        bad = ~np.isfinite(a) & np.isfinite(b) & (np.abs(b) < bound)
        if np.any(bad):
            idx = np.unravel_index(int(np.argmax(bad)), a.shape)
            return {"nonfinite_output": k, "nonfinite_index": [int(i) for i in idx],
                    "nonfinite_value": float(a[idx]), "reference_value": float(b[idx])}
    return {}
