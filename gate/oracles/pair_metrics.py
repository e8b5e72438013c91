"""Oracles that compare two computations which must agree (EAGLE's equivalent graphs, Audee's
cross-framework differential) instead of one computation against float64.

* :func:`compare_pair`: the divergence of side B from side A in ULPs of the dtype under test,
  with NaN/Inf positions that must match (a NaN on one side only, an infinity on one side only
  or of the other sign all count in ``nonfinite``); integer outputs compare exactly.
* :func:`closer`: which side is closer to the float64 reference.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from ..backends.base import Output
from .precision import Metrics, compare


def compare_pair(a: Sequence[Output], b: Sequence[Output], dtype: str, ulp_floor: str = "output") -> Metrics:
    """Divergence of ``b`` from ``a`` (both computed at ``dtype``, from identical values)."""
    m = compare(b, a, dtype, ulp_floor)
    if m.shape_mismatch:
        return m
    mismatched = 0
    for oa, ob in zip(a, b):
        if not (oa.is_float and ob.is_float):
            continue
        x = np.asarray(oa.array, dtype=np.float64)
        y = np.asarray(ob.array, dtype=np.float64)
        special = ~(np.isfinite(x) & np.isfinite(y))
        same = (np.isnan(x) & np.isnan(y)) | (x == y)
        mismatched += int(np.count_nonzero(special & ~same))
    return dataclasses.replace(m, nonfinite=mismatched)


def closer(err_a: Optional[Metrics], err_b: Optional[Metrics], name_a: str, name_b: str) -> str:
    """Name of the side whose error against float64 is smaller ("tie" when equal)."""
    if err_a is None or err_b is None:
        return "unknown"
    ka = (err_a.severity, err_a.ulp, err_a.abs)
    kb = (err_b.severity, err_b.ulp, err_b.abs)
    if ka == kb:
        return "tie"
    return name_a if ka < kb else name_b
