"""Batched evaluation: many candidates of a batch-separable operator in one call.

A spec with ``batch_dim`` declares that its inputs are independent along that dimension. The
candidates of one group (same parameters, same shapes apart from the batch dimension, identical
non-batched inputs such as a shared weight) are concatenated along it, the operator and its
float64 reference run once each, and the outputs are split back and scored one candidate at a
time with the same oracle as :meth:`VariantRunner.evaluate`.

The declaration is checked, not trusted: the first time a parameter setting is batched, the
reference output of the batch is compared with the reference run of two members alone (float64,
so a separable operator agrees to rounding while e.g. a softmax over the batch dimension does
not); a setting that fails is evaluated one candidate at a time from then on. A batched call
that raises is re-run one candidate at a time, so crashes and invalid inputs are attributed to
the candidate that caused them.
"""
from __future__ import annotations

import hashlib
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backends.base import Output
from .precision import Metrics, below_normal, compare, not_measured, overflow_bound, ulp
from ..search.inputs import Candidate
from ..search.evaluation import OK, Evaluation

SEPARABLE_RTOL = 1e-9
#: a candidate with more input elements than this is evaluated alone: its call has no per-call
#: overhead worth sharing, and scoring a batch (:func:`compare_segments`) costs more per element
#: than scoring one output (measured with bench/batched_eval.py's groups on CPU: batched 0.46x the
#: time of one at a time at 512 elements, 0.83x at 4,096, 1.2-3x from 32,768)
MAX_BATCHED_ELEMENTS = 8192


class BatchEvaluator:
    def __init__(self, runner, max_batch: int = 64):  # the precision runner (gate.oracles.runner)
        self.runner = runner
        self.spec = runner.spec
        self.max_batch = max_batch
        self.batch_dim: Optional[int] = self.spec.batch_dim
        self.batched: List[str] = []
        self.symbol = None
        if self.batch_dim is not None:
            firsts = [t for t in self.spec.inputs if len(t.shape) > self.batch_dim]
            if firsts:
                self.symbol = firsts[0].shape[self.batch_dim]
                self.batched = [t.name for t in self.spec.inputs
                                if len(t.shape) > self.batch_dim and t.shape[self.batch_dim] == self.symbol]
        self.separable: Dict[str, bool] = {}
        self.calls = 0  # operator calls made (batched or not), for benchmarks

    @property
    def enabled(self) -> bool:
        return bool(self.batched) and isinstance(self.symbol, str)

    @property
    def pays(self) -> bool:
        """Worth it by default: every input is batched, so every value mutation of a parent
        joins its batch (a shared weight splits batches whenever a child mutates it)."""
        return self.enabled and len(self.batched) == len(self.spec.inputs)

    # -- grouping -----------------------------------------------------------------------
    def _params_key(self, q: Candidate) -> str:
        return repr(sorted((k, repr(v)) for k, v in q.params.items()))

    def _group_key(self, q: Candidate) -> Optional[tuple]:
        bd = self.batch_dim
        parts = [self._params_key(q)]
        for t in self.spec.inputs:
            a = q.arrays.get(t.name)
            if a is None:
                return None
            if t.name in self.batched:
                if a.ndim <= bd:
                    return None
                parts.append((t.name, a.shape[:bd] + a.shape[bd + 1:], a.dtype.char))
            else:
                parts.append((t.name, a.shape, hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()))
        return tuple(parts)

    # -- evaluating ---------------------------------------------------------------------
    def evaluate_many(self, cands: Sequence[Candidate]) -> List[Tuple[Candidate, Evaluation]]:
        """``[(quantised candidate, evaluation)]`` in the order of ``cands``."""
        results: List[Optional[Tuple[Candidate, Evaluation]]] = [None] * len(cands)
        groups: Dict[tuple, List[int]] = {}
        for i, c in enumerate(cands):
            small = sum(int(a.size) for a in c.arrays.values() if a is not None) <= MAX_BATCHED_ELEMENTS
            key = self._group_key(c) if self.enabled and small else None
            if key is None:
                results[i] = self._single(c, quantized=False)
            else:
                groups.setdefault(key, []).append(i)
        for idx in groups.values():
            for start in range(0, len(idx), self.max_batch):
                chunk = idx[start:start + self.max_batch]
                if len(chunk) == 1 or self.separable.get(self._params_key(cands[chunk[0]])) is False:
                    for i in chunk:
                        results[i] = self._single(cands[i], quantized=False)
                    continue
                for i, r in zip(chunk, self._batched([cands[i] for i in chunk])):
                    results[i] = r
        return [r for r in results]  # type: ignore[misc]

    def _single(self, c: Candidate, quantized: bool = True) -> Tuple[Candidate, Evaluation]:
        self.calls += 1
        return self.runner.evaluate(c, quantized=quantized)

    def _split(self, outs: List[Output], sizes: List[int]) -> Optional[List[List[Output]]]:
        bd, total = self.batch_dim, sum(sizes)
        cuts = np.cumsum(sizes)[:-1]
        per: List[List[Output]] = [[] for _ in sizes]
        for o in outs:
            a = np.asarray(o.array)
            if a.ndim <= bd or a.shape[bd] != total:
                return None
            for k, piece in enumerate(np.split(a, cuts, axis=bd)):
                per[k].append(Output(piece, o.dtype))
        return per

    def _batched(self, raw: List[Candidate]) -> List[Tuple[Candidate, Evaluation]]:
        """Quantise each member as it would be alone (rounding is elementwise, but an input's span
        is kept within the dtype's range per candidate: runner.within_spread), run the group as
        one batch, score each member."""
        runner, bd = self.runner, self.batch_dim
        raw = [runner.quantize(c) for c in raw]
        first = raw[0]
        sizes = [c.arrays[self.batched[0]].shape[bd] for c in raw]
        merged = Candidate(dims=dict(first.dims), params=dict(first.params), arrays={}, origin="batch")
        for t in self.spec.inputs:
            if t.name in self.batched:
                merged.arrays[t.name] = np.concatenate([c.arrays[t.name] for c in raw], axis=bd)
            else:
                merged.arrays[t.name] = first.arrays[t.name]
        merged.dims[self.symbol] = int(sum(sizes))
        cuts = np.cumsum(sizes)[:-1]
        group = []
        for c in raw:
            q = Candidate(dims=dict(c.dims), params=dict(c.params), arrays={}, origin=c.origin)
            group.append(q)
        for t in self.spec.inputs:
            if t.name in self.batched:
                for q, piece in zip(group, np.split(merged.arrays[t.name], cuts, axis=bd)):
                    q.arrays[t.name] = piece
            else:
                for q in group:
                    q.arrays[t.name] = merged.arrays[t.name]
        t0 = time.perf_counter()
        try:
            self.calls += 1
            ref = runner.run_reference(merged)
            out = runner.run_low(merged)
        except Exception:
            return [self._single(q) for q in group]
        pkey = self._params_key(first)
        total = sum(sizes)
        if not all(np.ndim(o.array) > bd and np.shape(o.array)[bd] == total for o in [*ref, *out]):
            self.separable[pkey] = False
            return [self._single(q) for q in group]
        if pkey not in self.separable:
            self.separable[pkey] = self._check(group, self._split(ref, sizes))
            if not self.separable[pkey]:
                return [self._single(q) for q in group]
        ftz = True  # the search: results below the smallest normal are not judged (precision.below_normal)
        if bd == 0:
            metrics = compare_segments(out, ref, sizes, runner.variant.dtype, self.spec.ulp_floor, ftz=ftz,
                                       check_dtypes=runner.variant.mode == "input")
        else:
            metrics = [compare(o, r, runner.variant.dtype, self.spec.ulp_floor, ftz=ftz,
                               check_dtypes=runner.variant.mode == "input")
                       for o, r in zip(self._split(out, sizes), self._split(ref, sizes))]
        each = (time.perf_counter() - t0) / len(group)
        return [(q, Evaluation(OK, metrics=m, seconds=each)) for q, m in zip(group, metrics)]

    def _check(self, group: List[Candidate], ref_parts: List[List[Output]]) -> bool:
        """Is the batched reference the reference of each member alone (to float64 rounding)?"""
        for q, parts in list(zip(group, ref_parts))[:2]:
            try:
                alone = self.runner.run_reference(q)
            except Exception:
                return False
            if len(alone) != len(parts):
                return False
            for a, b in zip(alone, parts):
                x, y = np.asarray(a.array, dtype=np.float64), np.asarray(b.array, dtype=np.float64)
                if x.shape != y.shape:
                    return False
                both = np.isfinite(x) & np.isfinite(y)
                if not np.array_equal(np.isfinite(x), np.isfinite(y)):
                    return False
                if np.any(both):
                    scale = max(1.0, float(np.max(np.abs(x[both]))))
                    if float(np.max(np.abs(x[both] - y[both]))) > SEPARABLE_RTOL * scale:
                        return False
        return True


def compare_segments(outputs: Sequence[Output], reference: Sequence[Output], sizes: Sequence[int], dtype: str,
                     ulp_floor: str = "output", ftz: bool = True, check_dtypes: bool = True) -> List[Metrics]:
    """:func:`gate.oracles.precision.compare` of each candidate of a batch at once: the outputs
    are concatenated along axis 0, candidate ``i`` owns ``sizes[i]`` rows. Gives exactly the
    figures ``compare`` gives on each candidate's rows (maxima, counts and the worst element
    exactly; sums to rounding, as they are summed row by row), with the elementwise work done
    once for the whole batch. Long on purpose: it follows ``compare`` statement by statement, so
    that the two can be read side by side and keep giving the same figures."""
    n = len(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    if len(outputs) != len(reference):
        return [Metrics(shape_mismatch=f"{len(outputs)} outputs vs {len(reference)} in the reference")] * n
    unmeasured = not_measured(outputs, reference, dtype) if check_dtypes else None
    worst = [(-1.0, 0, (), 0.0, 0.0)] * n
    max_ulp, tot_abs, tot_rel, tot_l1, tot_ulp = (np.zeros(n) for _ in range(5))
    nonfinite = np.zeros(n, dtype=np.int64)
    int_mismatch = np.zeros(n, dtype=np.int64)
    numel = np.zeros(n, dtype=np.int64)
    ovf = overflow_bound(dtype)
    for k, (o, r) in enumerate(zip(outputs, reference)):
        a, b = np.asarray(o.array), np.asarray(r.array)
        if a.shape != b.shape:
            return [Metrics(shape_mismatch=f"output {k}: shape {a.shape} vs reference {b.shape}")] * n
        rest = a.shape[1:]
        width = int(np.prod(rest)) if rest else 1
        numel += np.asarray(sizes, dtype=np.int64) * width
        if not o.is_float or not r.is_float:
            rows = np.count_nonzero((a != b).reshape(a.shape[0], -1), axis=1)
            int_mismatch += np.add.reduceat(rows, starts) if a.shape[0] else 0
            continue
        if width == 0:
            continue
        a = a.astype(np.float64, copy=False).reshape(a.shape[0], width)
        b = b.astype(np.float64, copy=False).reshape(b.shape[0], width)
        absb = np.abs(b)
        fast = bool(np.isfinite(a).all() and np.isfinite(b).all())
        if fast:
            mag_rows = absb.max(axis=1)
            fast = float(mag_rows.max()) < ovf and not (ftz and np.any(below_normal(a, absb, dtype) & (a != b)))
        if fast:  # every value finite and in range: every element is judged, no masks
            any_judged = np.ones(n, dtype=bool)
            err = np.abs(a - b)
            mag = np.maximum.reduceat(mag_rows, starts)
            floor_rows = np.repeat(_floors(mag, dtype, ulp_floor, n), sizes)[:, None]
            denom = ulp(b, dtype)
            np.maximum(denom, floor_rows, out=denom)
            ulp_err = np.divide(err, denom, out=denom)
            rel_err = err / np.maximum(absb, np.maximum(floor_rows, np.finfo(np.float64).tiny))
        else:
            ref_finite = np.isfinite(b)
            ref_representable = ref_finite & (absb < ovf)
            out_finite = np.isfinite(a)
            nonfinite += np.add.reduceat(np.count_nonzero(ref_representable & ~out_finite, axis=1), starts)
            ref_overflow = ref_finite & ~ref_representable
            exact = (ref_overflow & np.isinf(a) & (np.sign(a) == np.sign(b))) | (~ref_finite & ~np.isnan(b) & (a == b))
            if ftz:  # output and reference both below the smallest normal: exact (precision.below_normal)
                exact = exact | below_normal(a, absb, dtype)
            judged = ref_finite & out_finite & ~exact
            any_judged = np.add.reduceat(np.count_nonzero(judged, axis=1), starts) > 0
            if not np.any(any_judged):
                continue
            err = np.zeros_like(b)
            err[judged] = np.abs(a[judged] - b[judged])
            mag_rows = np.where(ref_representable, absb, 0.0).max(axis=1)
            mag = np.maximum.reduceat(mag_rows, starts)
            floor_rows = np.repeat(_floors(mag, dtype, ulp_floor, n), sizes)[:, None]
            denom = np.maximum(ulp(b, dtype), floor_rows)
            ulp_err = np.where(judged, err / denom, 0.0)
            abs_floor = np.maximum(floor_rows, np.finfo(np.float64).tiny)
            rel_err = np.where(judged, err / np.maximum(absb, abs_floor), 0.0)
        rows = np.arange(a.shape[0])
        row_max = ulp_err.max(axis=1)
        row_arg = ulp_err.argmax(axis=1)
        seg_max = np.maximum.reduceat(row_max, starts)
        hit = row_max == np.repeat(seg_max, sizes)
        first = np.minimum.reduceat(np.where(hit, rows, a.shape[0]), starts)
        seg_abs = np.maximum.reduceat(err.max(axis=1), starts)
        seg_rel = np.maximum.reduceat(rel_err.max(axis=1), starts)
        seg_l1 = np.add.reduceat(err.sum(axis=1), starts)
        seg_ulp = np.add.reduceat(ulp_err.sum(axis=1), starts)
        for i in np.flatnonzero(any_judged):
            u = float(seg_max[i])
            if u > worst[i][0]:
                r, c = int(first[i]), int(row_arg[first[i]])
                shape = (int(sizes[i]),) + tuple(rest)
                worst[i] = (u, k, tuple(int(x) for x in np.unravel_index((r - starts[i]) * width + c, shape)),
                            float(a[r, c]), float(b[r, c]))
        max_ulp = np.where(any_judged, np.maximum(max_ulp, seg_max), max_ulp)
        tot_abs = np.where(any_judged, np.maximum(tot_abs, seg_abs), tot_abs)
        tot_rel = np.where(any_judged, np.maximum(tot_rel, seg_rel), tot_rel)
        tot_l1 = tot_l1 + np.where(any_judged, seg_l1, 0.0)
        tot_ulp = tot_ulp + np.where(any_judged, seg_ulp, 0.0)
    return [Metrics(ulp=float(max_ulp[i]), abs=float(tot_abs[i]), rel=float(tot_rel[i]), l1=float(tot_l1[i]),
                    mean_ulp=float(tot_ulp[i]) / max(int(numel[i]), 1), nonfinite=int(nonfinite[i]),
                    int_mismatch=int(int_mismatch[i]), numel=int(numel[i]), worst_output=worst[i][1],
                    worst_index=worst[i][2], worst_out=worst[i][3], worst_ref=worst[i][4],
                    unmeasured=unmeasured) for i in range(n)]


def _floors(mag: np.ndarray, dtype: str, ulp_floor: str, n: int) -> np.ndarray:
    """Each candidate's ulp floor: the ulp of its largest representable reference value
    (``output``) or the dtype's smallest subnormal (``dtype``), as the oracle takes it."""
    if ulp_floor == "output":  # as floor_value: an all-zero reference counts in ulps of 1
        return ulp(np.where(mag > 0, mag, 1.0), dtype)
    return np.full(n, float(ulp(np.asarray(0.0), dtype)))


__all__ = ["BatchEvaluator", "compare_segments"]
