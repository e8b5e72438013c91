"""Exhaustive inputs: the exact maximum error of an elementwise operator instead of a search's
estimate.

A 16-bit dtype has 65,536 values. For an operator whose every output element depends only on the
same input element (the row's ``elementwise: true``) and that has one float input, all of them go
through the operator in one batched call per dtype and parameter setting (finite, subnormal, ±0,
±inf and every NaN pattern), and the precision oracle's maximum over that call is the exact
maximum error, with the input that attains it. :func:`gate.fuzz.fuzz_task` does this by itself
for such variants; the search then spends what is left of the budget on what one call cannot
show (length-dependent code paths, crashes on odd shapes).

The reference on these sets is the row's ``truth`` (a correctly rounded mpmath function, its
values cached on disk per dtype: :mod:`gate.oracles.references`) where the row names one, else
the operator's float64 run.

Float32 has 2^32 values: :func:`sweep` runs a shard of them (``--shard I/N``) in chunks, for a
nightly or GPU campaign (``dl-gate fuzz OP --exhaustive --dtype float32 --shard 3/64``), and
:func:`merge_sweeps` joins the shards' results into the exact maximum.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..ops.spec import OpSpec, resolve_params
from ..oracles.precision import Metrics, compare, overflow_bound
from ..oracles.references import dtype_values, is_true_reference
from ..oracles.references import resolve as resolve_truth
from ..plan import Variant
from ..search.inputs import Candidate, draw
from ..oracles.runner import STRIDED_ORIGIN

SIXTEEN_BIT = ("float16", "bfloat16")
#: parameter settings run exhaustively (the product of the rows' choices); beyond it the defaults
MAX_PARAM_SETS = 8
ORIGIN = "exhaustive"


def float_input(spec: OpSpec):
    """The one float input an exhaustive set can cover (``None`` when there is not exactly one,
    or another input is an index/bool tensor)."""
    floats = [t for t in spec.inputs if t.kind == "float"]
    if len(floats) != 1 or len(spec.inputs) != 1 or len(floats[0].shape) == 0:
        return None
    return floats[0]


def applies(spec: OpSpec, variant: Variant) -> bool:
    """Every value of the variant's dtype is run: an elementwise row with one float input, the
    precision oracle, a 16-bit dtype that input is cast to."""
    t = float_input(spec) if spec.elementwise else None
    return (t is not None and variant.oracle == "precision" and variant.dtype in SIXTEEN_BIT
            and t.dtype_at(variant.dtype) == variant.dtype)


def param_sets(spec: OpSpec) -> List[Dict[str, Any]]:
    """The parameter settings to cover: every combination of the choices (at most
    :data:`MAX_PARAM_SETS`, else the defaults); ranges at their default."""
    names, options = [], []
    for p in spec.params:
        if p.kind == "expr":
            continue
        names.append(p.name)
        if p.kind == "choice":
            options.append(list(p.choices or (p.default,)))
        else:
            options.append([p.default if p.default is not None else p.lo])
    combos = list(itertools.product(*options)) if options else [()]
    if len(combos) > MAX_PARAM_SETS:
        combos = [tuple(p.default if p.default is not None else (p.choices or (p.lo,))[0]
                        for p in spec.params if p.kind != "expr")]
    return [dict(zip(names, c)) for c in combos]


def _shape(rank: int, n: int) -> Tuple[int, ...]:
    if rank == 1 or n < 256 or n % 256:
        return (1,) * (rank - 1) + (n,)
    return (1,) * (rank - 2) + (n // 256, 256)


def candidate(spec: OpSpec, values: np.ndarray, params: Dict[str, Any], origin: str = ORIGIN) -> Candidate:
    """One candidate holding ``values`` (float64) in the input's rank, with ``params``."""
    t = float_input(spec)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    shape = _shape(len(t.shape), values.size)
    template = draw(spec, np.random.default_rng(0), fixed_params=params)
    dims = dict(template.dims)
    for d, size in zip(t.shape, shape):
        if isinstance(d, str) and d.isidentifier() and d in dims:
            dims[d] = int(size)
    full = {**template.params, **params}
    return Candidate(dims=dims, params=full, arrays={t.name: values.reshape(shape)}, origin=origin)


def in_domain(values: np.ndarray, spec: OpSpec) -> np.ndarray:
    """The finite values strictly inside the input's declared domain."""
    t = float_input(spec)
    keep = np.isfinite(values)
    if t.domain.values:
        keep &= np.isin(values, t.domain.values)
    if t.domain.lo is not None:
        keep &= values > t.domain.lo
    if t.domain.hi is not None:
        keep &= values < t.domain.hi
    return values[keep]


@dataclass
class SetResult:
    """The exact figures of one parameter setting over every value of the dtype."""

    params: Dict[str, Any]
    values: int
    status: str
    metrics: Optional[Metrics] = None
    worst_input: Optional[float] = None
    nonfinite_input: Optional[float] = None  # an input whose output is NaN/Inf where the reference is finite
    domain_only: bool = False  # the operator refused values outside its domain: those were left out
    error: Optional[str] = None
    seconds: float = 0.0
    path: str = "contiguous"  # contiguous (the vector loop) or strided (element by element)
    witness: Optional[Candidate] = field(default=None, repr=False)  # the worst value alone
    nonfinite_witness: Optional[Candidate] = field(default=None, repr=False)

    def to_dict(self) -> dict:
        m = self.metrics
        return {"params": {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                           for k, v in self.params.items()},
                "values": self.values, "path": self.path, "status": self.status,
                "max_ulp": _num(m.ulp) if m else None, "max_abs": _num(m.abs) if m else None,
                "worst_input": _num(self.worst_input), "worst_out": _num(m.worst_out) if m else None,
                "worst_ref": _num(m.worst_ref) if m else None,
                "nonfinite": m.nonfinite if m else 0, "nonfinite_input": _num(self.nonfinite_input),
                "domain_only": self.domain_only, "error": self.error, "seconds": round(self.seconds, 3)}


@dataclass
class ExhaustiveResult:
    dtype: str
    sets: List[SetResult] = field(default_factory=list)
    candidates: List[Candidate] = field(default_factory=list)  # the full sets (replayed on head and base)
    witnesses: List[Candidate] = field(default_factory=list)  # one value each: the worst, the first NaN/Inf
    best_eval: Any = None  # the Evaluation of the worst set
    truth: Optional[str] = None
    seconds: float = 0.0

    @property
    def metrics(self) -> Optional[Metrics]:
        ms = [s.metrics for s in self.sets if s.metrics is not None]
        return max(ms, key=lambda m: (m.severity, m.abs)) if ms else None

    @property
    def worst(self) -> Optional[SetResult]:
        ok = [s for s in self.sets if s.metrics is not None]
        return max(ok, key=lambda s: (s.metrics.severity, s.metrics.abs)) if ok else None

    def summary(self) -> dict:
        w = self.worst
        return {"dtype": self.dtype, "values": max((s.values for s in self.sets), default=0),
                "calls": len(self.sets),
                "reference": self.truth or "float64 run", "seconds": round(self.seconds, 3),
                "max_ulp": _num(w.metrics.ulp) if w else None, "worst_input": _num(w.worst_input) if w else None,
                "worst_params": w.to_dict()["params"] if w else None,
                "nonfinite": sum(s.metrics.nonfinite for s in self.sets if s.metrics),
                "sets": [s.to_dict() for s in self.sets]}


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def _first_nonfinite(ev, dtype: str, arr: np.ndarray) -> Optional[float]:
    if ev.outputs is None or ev.reference is None:
        return None
    ovf = overflow_bound(dtype)
    for o, r in zip(ev.outputs, ev.reference):
        a, b = np.asarray(o.array, dtype=np.float64), np.asarray(r.array, dtype=np.float64)
        if a.shape != arr.shape:
            continue
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~np.isfinite(a.reshape(-1)) & (np.abs(b.reshape(-1)) < ovf))
        if bad.size:
            return float(arr.reshape(-1)[bad[0]])
    return None


def run(runner, spec: OpSpec, variant: Variant) -> ExhaustiveResult:
    """Every value of ``variant.dtype`` through ``runner`` (any runner with ``evaluate``), one
    call per parameter setting. An operator that refuses the whole set (raises on NaN or on
    values outside its domain) is run on the finite values inside its declared domain."""
    from ..oracles.runner import OK

    t0 = time.perf_counter()
    dtype = variant.dtype
    t = float_input(spec)
    allv = dtype_values(dtype)
    res = ExhaustiveResult(dtype=dtype, truth=spec.reference if is_true_reference(spec.reference)
                           else (spec.truth or spec.reference))
    best = None
    truth = resolve_truth(spec.reference) or resolve_truth(spec.truth)
    # torch kernels run a vector loop on contiguous memory and an element-by-element loop on
    # strided views and in their tails: every value goes through both (pytorch's CPU rsqrt in
    # float16 is 0.5 ulp in the first and 1.33 ulp in the second)
    paths = [ORIGIN, STRIDED_ORIGIN] if spec.framework == "torch" else [ORIGIN]
    for params in param_sets(spec):
        if truth is not None:
            # the correctly rounded values, computed here once (then read from the disk cache by
            # any worker: an isolated evaluation must not spend its timeout on mpmath)
            truth.table(dtype, truth.own_params(resolve_params(params, spec.name)))
        for origin in paths:
            s0 = time.perf_counter()
            cand = candidate(spec, allv, params, origin=origin)
            q, ev = runner.evaluate(cand, keep_outputs=True, quantized=True)
            domain_only = False
            if ev.status != OK:
                sub = in_domain(allv, spec)
                if sub.size < allv.size:
                    cand = candidate(spec, sub, params, origin=origin)
                    q, ev = runner.evaluate(cand, keep_outputs=True, quantized=True)
                    domain_only = True
            sr = SetResult(params=params, values=int(cand.arrays[t.name].size), status=ev.status,
                           domain_only=domain_only, error=ev.error, seconds=time.perf_counter() - s0,
                           path="strided" if origin == STRIDED_ORIGIN else "contiguous")
            if ev.status == OK and ev.metrics is not None:
                m = ev.metrics
                arr = q.arrays[t.name]
                sr.metrics = m
                if m.worst_index and m.worst_output == 0:
                    sr.worst_input = float(arr[tuple(m.worst_index)])
                sr.nonfinite_input = _first_nonfinite(ev, dtype, arr) if m.nonfinite else None
                if sr.worst_input is not None:
                    sr.witness = candidate(spec, np.array([sr.worst_input]), params)
                    res.witnesses.append(sr.witness)
                if sr.nonfinite_input is not None:
                    sr.nonfinite_witness = candidate(spec, np.array([sr.nonfinite_input]), params)
                    res.witnesses.append(sr.nonfinite_witness)
                if best is None or (m.severity, m.abs) > (best.metrics.severity, best.metrics.abs):
                    best = ev
            ev.outputs = ev.reference = None  # the figures are kept, not 65,536 outputs
            res.candidates.append(cand)
            res.sets.append(sr)
    res.best_eval = best
    res.seconds = time.perf_counter() - t0
    return res


# -- float32: the 2^32 sweep, sharded --------------------------------------------------------------
def parse_shard(text: str) -> Tuple[int, int]:
    """``I/N`` (1-based) -> (i, n); one-line error otherwise."""
    from ..errors import ConfigError

    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r}: expected I/N, e.g. 3/64") from None
    if not (n >= 1 and 1 <= i <= n):
        raise ConfigError(f"--shard {text!r}: I must be in 1..N")
    return i, n


def shard_range(i: int, n: int, bits: int = 32) -> Tuple[int, int]:
    total = 1 << bits
    return (i - 1) * total // n, i * total // n


def sweep(runner, spec: OpSpec, variant: Variant, shard: Tuple[int, int] = (1, 1), chunk: int = 1 << 22,
          params: Optional[Dict[str, Any]] = None, limit: Optional[int] = None,
          progress=None, strided: bool = False) -> dict:
    """The float32 bit patterns of shard ``i/n`` through ``runner`` in chunks of ``chunk``
    values (the reference: the runner's, the float64 run unless a correctly rounded one is
    declared), each element in ulps of its own reference. ``strided``: as strided views (the
    kernel's element-by-element loop) instead of contiguous chunks. Returns the shard's exact
    maximum with its input (JSON-safe); ``limit`` stops after that many values (a smoke test)."""
    from ..oracles.runner import OK

    i, n = shard
    lo, hi = shard_range(i, n)
    if limit is not None:
        hi = min(hi, lo + int(limit))
    params = dict(params if params is not None else param_sets(spec)[0])
    t0 = time.perf_counter()
    best: Dict[str, Any] = {"max_ulp": -1.0}
    done = nonfinite = failed = 0
    nonfinite_input = None
    for start in range(lo, hi, chunk):
        stop = min(start + chunk, hi)
        bits = np.arange(start, stop, dtype=np.uint64).astype(np.uint32)
        vals = bits.view(np.float32).astype(np.float64)
        cand = candidate(spec, vals, params, origin="sweep-strided" if strided else "sweep")
        q, ev = runner.evaluate(cand, keep_outputs=bool(nonfinite_input is None), quantized=True)
        done += stop - start
        if ev.status != OK or ev.metrics is None:
            failed += stop - start
            best.setdefault("errors", []).append(f"[{start:#010x}, {stop:#010x}): {ev.status}: {ev.error}")
            continue
        m = ev.metrics
        nonfinite += m.nonfinite
        if m.nonfinite and nonfinite_input is None:
            nonfinite_input = _first_nonfinite(ev, "float32", q.arrays[float_input(spec).name])
        if m.ulp > best["max_ulp"] and m.worst_index:
            x = float(q.arrays[float_input(spec).name][tuple(m.worst_index)])
            best.update(max_ulp=float(m.ulp), worst_input=x, worst_bits=f"{np.float32(x).view(np.uint32):#010x}",
                        worst_out=float(m.worst_out), worst_ref=float(m.worst_ref))
        if progress:
            progress(done, hi - lo)
    return {"op": spec.name, "dtype": variant.dtype, "device": variant.device, "mode": variant.mode,
            "path": "strided" if strided else "contiguous", "shard": f"{i}/{n}", "range": [f"{lo:#010x}", f"{hi:#010x}"], "values": done, "failed": failed,
            "params": {k: str(v) for k, v in params.items()}, "nonfinite": nonfinite,
            "nonfinite_input": nonfinite_input, "seconds": round(time.perf_counter() - t0, 2),
            **{k: v for k, v in best.items()}}


def merge_sweeps(parts: Sequence[dict]) -> dict:
    """The shards' results joined: the maximum over them, the values covered, the shards missing."""
    if not parts:
        return {}
    best = max(parts, key=lambda p: p.get("max_ulp", -1.0))
    n = int(str(parts[0]["shard"]).split("/")[1])
    have = sorted({int(str(p["shard"]).split("/")[0]) for p in parts})
    return {"op": best["op"], "dtype": best["dtype"], "values": sum(p["values"] for p in parts),
            "complete": have == list(range(1, n + 1)) and not any(p.get("failed") for p in parts),
            "missing_shards": n - len(have), "first_missing": [i for i in range(1, n + 1) if i not in have][:20],
            "max_ulp": best.get("max_ulp"), "worst_input": best.get("worst_input"),
            "worst_bits": best.get("worst_bits"), "nonfinite": sum(p.get("nonfinite", 0) for p in parts)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m gate.fuzz.exhaustive merge FILE...``: join the float32 sweep shards written by
    ``dl-gate fuzz OP --exhaustive --shard I/N --json FILE`` (per operator and variant)."""
    import json
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "merge" or len(args) < 2:
        print("usage: python -m gate.fuzz.exhaustive merge SHARD.json...", file=sys.stderr)
        return 2
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for path in args[1:]:
        try:
            doc = json.loads(open(path).read())
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read ({exc})", file=sys.stderr)
            return 2
        for r in doc.get("sweeps", []):
            key = f"{r['dtype']}/{r['device']}/{r['mode']}" + ("/strided" if r.get("path") == "strided" else "")
            groups.setdefault((r["op"], key), []).append(r)
    out = [{"variant": v, **merge_sweeps(parts)} for (_, v), parts in sorted(groups.items())]
    print(json.dumps(out, indent=1))
    return 0 if all(o["complete"] for o in out) else 1


if __name__ == "__main__":  # pragma: no cover - CLI
    raise SystemExit(main())


__all__ = ["applies", "run", "param_sets", "candidate", "ExhaustiveResult", "SetResult", "sweep", "merge_sweeps",
           "parse_shard", "shard_range", "SIXTEEN_BIT"]
