"""Minimal input: shrink shape, rank and values while the finding still holds.

Delta debugging (Zeller's ddmin) over the index set of each named dim (every tensor axis
labelled with that dim is sliced with the same indices, derived parameters are recomputed,
index inputs are folded into their new range), then over the elements of each float input
(elements outside the kept set take a plain value inside the input's domain), then each kept
value is rounded to as few significant digits as still reproduce. Where the worst output
element maps onto an input axis (same rank and extent), that index is tried first, which
usually jumps straight to a single element. Every candidate of a round is asked in one batch
(head in-process, base in its worker), and the shrinker stops at its deadline with the best
input so far.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..search.inputs import Candidate, derived_params
from ..ops import expr
from ..ops.spec import Domain, OpSpec

SIMPLE_VALUES = (0.0, 1.0, -1.0, 0.5, 2.0, 0.25, 10.0)
MAX_ROUND = 48  # candidates per ddmin round


@dataclass
class ShrinkResult:
    cand: Candidate
    check: object  # the Check of the final candidate
    rounds: int = 0
    evaluated: int = 0
    truncated: bool = False
    log: List[str] = field(default_factory=list)


def simple_values(domain: Domain) -> List[float]:
    """Plain values inside the domain's open interval (a set domain's own values), plainest first."""
    if domain.values:
        return sorted(domain.values, key=lambda v: (abs(v), v < 0))
    out = [v for v in SIMPLE_VALUES if (domain.lo is None or v > domain.lo) and (domain.hi is None or v < domain.hi)]
    if not out:
        lo = domain.lo if domain.lo is not None else (domain.hi - 1.0)
        hi = domain.hi if domain.hi is not None else lo + 2.0
        out = [(lo + hi) / 2.0]
    return out


def simple_value(domain: Domain) -> float:
    return simple_values(domain)[0]


def _idents(e) -> set:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(e))) if isinstance(e, str) else set()


def sliceable_dims(spec: OpSpec) -> List[str]:
    """Dims that label whole tensor axes and appear in no compound shape expression."""
    plain: set = set()
    compound: set = set()
    for t in spec.inputs:
        for e in t.shape:
            if isinstance(e, str) and e.isidentifier():
                plain.add(e)
            else:
                compound |= _idents(e)
        compound |= _idents(t.index_hi) if isinstance(t.index_hi, str) and not str(t.index_hi).isidentifier() else set()
    return [d for d, _ in spec.dims if d in plain and d not in compound]


def dims_valid(spec: OpSpec, params: dict, dims: Dict[str, int]) -> bool:
    env = dict(params)
    for name, (lo_e, hi_e) in spec.dims:
        v = dims.get(name)
        if v is None:
            return False
        try:
            lo, hi = int(expr.evaluate(lo_e, env)), int(expr.evaluate(hi_e, env))
        except Exception:
            return False
        if not lo <= v <= hi:
            return False
        env[name] = v
    return True


def dim_lower_bound(spec: OpSpec, cand: Candidate, dim: str) -> int:
    env = {**cand.params, **cand.dims}
    for name, (lo_e, _) in spec.dims:
        if name == dim:
            try:
                return max(0, int(expr.evaluate(lo_e, env)))
            except Exception:
                return cand.dims.get(dim, 1)
    return 1


def slice_dim(spec: OpSpec, cand: Candidate, dim: str, keep: Sequence[int]) -> Optional[Candidate]:
    keep = list(keep)
    new = cand.copy(origin="shrink")
    for t in spec.inputs:
        a = new.arrays.get(t.name)
        if a is None:
            continue
        for axis, e in enumerate(t.shape):
            if str(e) == dim and axis < a.ndim:
                a = np.take(a, keep, axis=axis)
        new.arrays[t.name] = a
    new.dims[dim] = len(keep)
    new.params = derived_params(spec, cand.params, new.dims)
    if not dims_valid(spec, new.params, new.dims):
        return None
    env = {**new.params, **new.dims}
    for t in spec.inputs:
        if t.kind == "index" and t.index_hi is not None and t.name in new.arrays:
            try:
                hi = max(1, int(expr.evaluate(t.index_hi, env)))
                new.arrays[t.name] = np.mod(new.arrays[t.name], hi)
            except Exception:
                pass
    return new


def squeeze_dims(spec: OpSpec, cand: Candidate, dims: Sequence[str]) -> Optional[Candidate]:
    """Drop the size-1 axes labelled with ``dims`` from every input (lower rank)."""
    new = cand.copy(origin="shrink")
    changed = False
    for t in spec.inputs:
        a = new.arrays.get(t.name)
        if a is None:
            continue
        axes = [ax for ax, e in enumerate(t.shape) if str(e) in dims and ax < a.ndim and a.shape[ax] == 1]
        if len(axes) != sum(1 for e in t.shape if str(e) in dims):
            return None  # the labelled axes are not all plain size-1 axes here
        if axes:
            if a.ndim - len(axes) < 1:
                return None
            new.arrays[t.name] = np.squeeze(a, axis=tuple(axes))
            changed = True
    return new if changed else None


def ddmin(n: int, build: Callable[[List[int]], Optional[Candidate]], check, min_size: int, deadline,
          prefer: Optional[List[List[int]]] = None, stats: Optional[dict] = None) -> Tuple[List[int], object]:
    """A 1-minimal subset of ``range(n)`` (size ≥ ``min_size``) whose candidate still holds,
    and the Check that showed it (None when nothing smaller held)."""
    current = list(range(n))
    best_check = None
    if prefer:
        cands = [(s, build(s)) for s in prefer if min_size <= len(s) < len(current)]
        cands = [(s, c) for s, c in cands if c is not None]
        if cands:
            res = check([c for _, c in cands])
            for (s, _), r in zip(cands, res):
                if r.holds:
                    current, best_check = list(s), r
                    break
    k = 2
    while len(current) > min_size and not deadline.expired():
        size = len(current)
        k = min(k, size)
        chunks = [current[i * size // k:(i + 1) * size // k] for i in range(k)]
        subsets: List[List[int]] = [c for c in chunks if len(c) >= min_size and c]
        if k > 2:
            for c in chunks:
                drop = set(c)
                subsets.append([x for x in current if x not in drop])
        subsets = [s for s in subsets if min_size <= len(s) < size]
        subsets.sort(key=len)
        subsets = subsets[:MAX_ROUND]
        built = [(s, build(s)) for s in subsets]
        built = [(s, c) for s, c in built if c is not None]
        found = None
        if built:
            res = check([c for _, c in built])
            if stats is not None:
                stats["rounds"] = stats.get("rounds", 0) + 1
            for (s, _), r in zip(built, res):
                if r.holds:
                    found = (s, r)
                    break
        if found is not None:
            current, best_check = found
            k = 2 if len(found[0]) <= size // k + 1 else max(k - 1, 2)
        else:
            if k >= size:
                break
            k = min(2 * k, size)
    return current, best_check


class Shrinker:
    def __init__(self, spec: OpSpec, check: Callable[[List[Candidate]], list], deadline,
                 locate: Optional[Callable[[object], Optional[Tuple[int, Tuple[int, ...], Tuple[int, ...]]]]] = None):
        """``locate(check)`` -> (output number, index, output shape) of the worst element."""
        self.spec = spec
        self._check = check
        self.deadline = deadline
        self._locate = locate
        self.focus: Optional[Tuple[int, Tuple[int, ...]]] = None
        self.out_shape: Optional[Tuple[int, ...]] = None
        self.stats: dict = {"rounds": 0, "evaluated": 0}
        self.log: List[str] = []

    def check(self, cands: List[Candidate]) -> list:
        self.stats["evaluated"] += len(cands)
        return self._check(cands)

    # -- where the worst output element sits in the inputs -----------------------------------
    def _focus_index(self, cand: Candidate, dim: str) -> Optional[int]:
        if self.focus is None or self.out_shape is None:
            return None
        _, idx = self.focus
        for t in self.spec.inputs:
            a = cand.arrays.get(t.name)
            if a is None or a.ndim != len(self.out_shape):
                continue
            for axis, e in enumerate(t.shape):
                if str(e) == dim and a.shape[axis] == self.out_shape[axis] and axis < len(idx):
                    return int(idx[axis])
        return None

    def locate(self, chk) -> None:
        self.focus = self.out_shape = None
        if self._locate is not None and chk is not None:
            loc = self._locate(chk)
            if loc is not None:
                self.focus, self.out_shape = (loc[0], tuple(loc[1])), tuple(loc[2])

    def run(self, cand: Candidate, first_check) -> ShrinkResult:
        best, best_check = cand, first_check
        self.locate(best_check)
        truncated = False
        dims = [d for d in sliceable_dims(self.spec) if d in cand.dims]
        # 1. jump: every dim at once to its focus index
        focus = {d: self._focus_index(best, d) for d in dims}
        if any(v is not None for v in focus.values()):
            c = best
            for d, f in focus.items():
                if f is None or c is None:
                    continue
                lo = max(1, dim_lower_bound(self.spec, c, d))
                n = c.dims[d]
                start = min(max(0, f - (lo - 1) // 2), max(0, n - lo))
                c = slice_dim(self.spec, c, d, list(range(start, start + lo)))
            if c is not None and c.size < best.size:
                r = self.check([c])[0]
                if r.holds:
                    best, best_check = r.cand, r
                    self.locate(best_check)
                    self.log.append(f"focus jump: {cand.size} -> {best.size} elements")
        # 2. ddmin per dim, until a pass changes nothing
        for _ in range(3):
            changed = False
            for d in dims:
                if self.deadline.expired():
                    truncated = True
                    break
                n = best.dims.get(d, 0)
                lo = dim_lower_bound(self.spec, best, d)
                if n <= max(lo, 0) or n <= 1 and lo >= 1:
                    continue
                base_c = best
                f = self._focus_index(base_c, d)
                prefer = None
                if f is not None:
                    w = max(1, lo)
                    start = min(max(0, f - (w - 1) // 2), max(0, n - w))
                    prefer = [list(range(start, start + w))]
                keep, chk = ddmin(n, lambda s: slice_dim(self.spec, base_c, d, s), self.check, max(lo, 0),
                                  self.deadline, prefer=prefer, stats=self.stats)
                if chk is not None and len(keep) < n:
                    best, best_check = chk.cand, chk
                    self.locate(best_check)
                    changed = True
                    self.log.append(f"dim {d}: {n} -> {len(keep)}")
            if not changed or truncated:
                break
        # 3. rank: drop size-1 axes
        if not self.deadline.expired():
            ones = [d for d in dims if best.dims.get(d) == 1]
            cands = []
            if len(ones) > 1:
                cands.append(squeeze_dims(self.spec, best, ones))
            cands += [squeeze_dims(self.spec, best, [d]) for d in ones]
            cands = [c for c in cands if c is not None]
            if cands:
                for r in self.check(cands):
                    if r.holds:
                        before = sum(a.ndim for a in best.arrays.values())
                        best, best_check = r.cand, r
                        self.locate(best_check)
                        self.log.append(f"rank: {before} -> {sum(a.ndim for a in best.arrays.values())} axes in all")
                        break
        elif dims:
            truncated = True
        # 4. values
        best, best_check, t2 = self._values(best, best_check)
        truncated = truncated or t2
        self.stats["evaluated"] = self.stats.get("evaluated", 0)
        return ShrinkResult(best, best_check, self.stats.get("rounds", 0), self.stats["evaluated"], truncated, self.log)

    @staticmethod
    def _fill(base: Candidate, name: str, s: float, keep) -> Candidate:
        c = base.copy(origin="shrink")
        arr = np.full(base.arrays[name].size, s, dtype=np.float64)
        idx = np.asarray(keep, dtype=np.int64)
        arr[idx] = base.arrays[name].reshape(-1)[idx]
        c.arrays[name] = arr.reshape(base.arrays[name].shape)
        return c

    def _values(self, best: Candidate, best_check):
        truncated = False
        for t in self.spec.inputs:
            if t.kind != "float" or t.name not in best.arrays:
                continue
            if self.deadline.expired():
                return best, best_check, True
            a = best.arrays[t.name]
            if a.size == 0:
                continue
            flat = a.reshape(-1)
            plain = simple_values(t.domain)[:2]
            if any(np.all(flat == s) for s in plain):
                continue
            # the whole tensor plain (0, else 1: a weight) first; then keep what matters
            whole = self.check([self._fill(best, t.name, s, []) for s in plain])
            done = next((r for r in whole if r.holds), None)
            if done is not None:
                best, best_check = done.cand, done
                self.log.append(f"values of {t.name}: all {a.size} set to {done.cand.arrays[t.name].reshape(-1)[0]:g}")
                continue
            s = plain[0]

            def build(keep, base=best, name=t.name, s=s):
                return self._fill(base, name, s, keep)

            prefer = []
            if self.focus is not None and self.out_shape is not None and a.shape == tuple(self.out_shape):
                prefer.append([int(np.ravel_multi_index(self.focus[1], a.shape))])
            if a.size > 4096:  # only the cheap guess on large inputs
                for r in (self.check([build(p) for p in prefer]) if prefer else []):
                    if r.holds:
                        best, best_check = r.cand, r
                        break
                continue
            keep, chk = ddmin(a.size, build, self.check, 1, self.deadline, prefer=prefer, stats=self.stats)
            if chk is not None:
                best, best_check = chk.cand, chk
                self.log.append(f"values of {t.name}: {a.size - len(keep)} of {a.size} set to {s:g}")
        # round the values that are left to few significant digits
        for t in self.spec.inputs:
            if t.kind != "float" or t.name not in best.arrays:
                continue
            a = best.arrays[t.name]
            plain = simple_values(t.domain)[:2]
            idx = [int(i) for i in np.flatnonzero(~np.isin(a.reshape(-1), plain))][:32]
            for i in idx:
                if self.deadline.expired():
                    return best, best_check, True
                v = float(best.arrays[t.name].reshape(-1)[i])
                if not np.isfinite(v):
                    continue
                opts = []
                for digits in (1, 2, 3, 4):
                    w = float(f"{v:.{digits}g}")
                    if w != v and w not in opts:
                        opts.append(w)
                if not opts:
                    continue
                cands = []
                for w in opts:
                    c = best.copy(origin="shrink")
                    flat = c.arrays[t.name].reshape(-1).copy()
                    flat[i] = w
                    c.arrays[t.name] = flat.reshape(c.arrays[t.name].shape)
                    cands.append(c)
                for r in self.check(cands):
                    if r.holds:
                        best, best_check = r.cand, r
                        break
        return best, best_check, truncated
