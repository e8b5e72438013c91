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
from ..oracles.precision import compare
from .inputs import Candidate
from .runner import OK, Evaluation, VariantRunner

SEPARABLE_RTOL = 1e-9


class BatchEvaluator:
    def __init__(self, runner: VariantRunner, max_batch: int = 64):
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
                parts.append((t.name, a.shape[:bd] + a.shape[bd + 1:], str(a.dtype)))
            else:
                parts.append((t.name, a.shape, hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()))
        return tuple(parts)

    # -- evaluating ---------------------------------------------------------------------
    def evaluate_many(self, cands: Sequence[Candidate]) -> List[Tuple[Candidate, Evaluation]]:
        """``[(quantised candidate, evaluation)]`` in the order of ``cands``."""
        qs = [self.runner.quantize(c) for c in cands]
        results: List[Optional[Tuple[Candidate, Evaluation]]] = [None] * len(qs)
        groups: Dict[tuple, List[int]] = {}
        if self.enabled:
            for i, q in enumerate(qs):
                key = self._group_key(q)
                if key is None:
                    results[i] = self._single(q)
                else:
                    groups.setdefault(key, []).append(i)
        else:
            for i, q in enumerate(qs):
                results[i] = self._single(q)
        for idx in groups.values():
            for start in range(0, len(idx), self.max_batch):
                chunk = idx[start:start + self.max_batch]
                if len(chunk) == 1 or self.separable.get(self._params_key(qs[chunk[0]])) is False:
                    for i in chunk:
                        results[i] = self._single(qs[i])
                    continue
                for i, r in zip(chunk, self._batched([qs[i] for i in chunk])):
                    results[i] = r
        return [r for r in results]  # type: ignore[misc]

    def _single(self, q: Candidate) -> Tuple[Candidate, Evaluation]:
        self.calls += 1
        return self.runner.evaluate(q, quantized=True)

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

    def _batched(self, group: List[Candidate]) -> List[Tuple[Candidate, Evaluation]]:
        runner, bd = self.runner, self.batch_dim
        first = group[0]
        sizes = [q.arrays[self.batched[0]].shape[bd] for q in group]
        merged = Candidate(dims=dict(first.dims), params=dict(first.params), arrays={}, origin="batch")
        for t in self.spec.inputs:
            if t.name in self.batched:
                merged.arrays[t.name] = np.concatenate([q.arrays[t.name] for q in group], axis=bd)
            else:
                merged.arrays[t.name] = first.arrays[t.name]
        merged.dims[self.symbol] = int(sum(sizes))
        t0 = time.perf_counter()
        try:
            self.calls += 1
            ref = runner.run_reference(merged)
            out = runner.run_low(merged)
        except Exception:
            return [self._single(q) for q in group]
        ref_parts, out_parts = self._split(ref, sizes), self._split(out, sizes)
        pkey = self._params_key(first)
        if ref_parts is None or out_parts is None:
            self.separable[pkey] = False
            return [self._single(q) for q in group]
        if pkey not in self.separable:
            self.separable[pkey] = self._check(group, ref_parts)
            if not self.separable[pkey]:
                return [self._single(q) for q in group]
        each = (time.perf_counter() - t0) / len(group)
        results = []
        for q, o, r in zip(group, out_parts, ref_parts):
            t1 = time.perf_counter()
            metrics = compare(o, r, runner.variant.dtype, self.spec.ulp_floor)
            results.append((q, Evaluation(OK, metrics=metrics, seconds=each + time.perf_counter() - t1)))
        return results

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


__all__ = ["BatchEvaluator"]
