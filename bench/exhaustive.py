"""Exact maximum vs search estimate, side by side in one run.

For each elementwise operator x 16-bit dtype: every value of the dtype through the operator in one
call per parameter setting (gate.fuzz.exhaustive), against its correctly rounded reference (the
row's ``truth``), timed; then the time-budget search alone (``exhaustive=False``) in the *same*
seconds, and in a longer fixed budget for context. Columns:

  exact ulp      the exact maximum error over all 65,536 inputs (and the input x where it occurs)
  NaN/Inf        inputs whose output is NaN/Inf where the true value is finite (and the first such x)
  exh s          seconds of the exhaustive call(s) (the reference read from the disk cache)
  search ulp     the search's worst error in the same seconds (evaluations in brackets)
  search@Ns      the search's worst error in N seconds (default 2)
  found          search / exact (1.00: the search found the maximum)

The reference tables are computed first, once per function x parameters x dtype, and cached
(``$DL_GATE_CACHE/references``); their cost is printed separately ("truth s"), it is paid once per
machine. Both sides measure each element in ulps of its own reference (``ulp_floor: dtype``), the
unit exhaustive sets are judged in; the search uses the float64 run as its reference. Usage: python bench/exhaustive.py [--ops torch.erf,torch.exp] [--long 2] [--seed 0] [--device cuda]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from gate.fuzz import exhaustive as EX  # noqa: E402
from gate.fuzz import fuzz_task  # noqa: E402
from gate.oracles.runner import VariantRunner  # noqa: E402
from gate.ops.catalog import load_catalog  # noqa: E402
from gate.ops.spec import resolve_params  # noqa: E402
from gate.oracles.references import resolve  # noqa: E402
from gate.plan import Budget, Task, Variant  # noqa: E402

DEFAULT_OPS = ("torch.exp", "torch.log", "torch.log1p", "torch.expm1", "torch.erf", "torch.erfinv", "torch.lgamma",
               "torch.digamma", "torch.tanh", "torch.sigmoid", "torch.gelu", "torch.rsqrt", "torch.pow", "torch.sin",
               "torch.silu", "torch.mish")


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS))
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--long", type=float, default=2.0, help="seconds of the longer search (context)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args(argv)
    cat = load_catalog(builtin=["torch", "tensorflow"])
    rows = []
    print(f"{'operator':15} {'dtype':9} {'truth s':>7} {'exact ulp':>10} {'at x':>12} {'NaN/Inf':>14} {'exh s':>6} "
          f"{'search ulp (evals)':>20} {'found':>6} {'search@' + format(args.long, 'g') + 's (evals)':>20} {'found':>6}")
    for name in args.ops.split(","):
        # both measured per element (ulps of each element's own reference, as exhaustive sets are)
        spec = cat.get(name).replace(ulp_floor="dtype")
        for dtype in args.dtypes.split(","):
            v = Variant(dtype=dtype, device=args.device)
            if not EX.applies(spec, v):
                print(f"{name:15} {dtype:9} (not exhaustive: {'not elementwise' if not spec.elementwise else 'inputs'})")
                continue
            truth = resolve(spec.truth)
            t0 = time.perf_counter()
            for params in EX.param_sets(spec):  # the one-off cost: correctly rounded values, cached
                truth.table(dtype, truth.own_params(resolve_params(params, spec.name)))
            t_truth = time.perf_counter() - t0
            runner = VariantRunner(spec, v)
            with np.errstate(all="ignore"):
                t0 = time.perf_counter()
                ex = EX.run(runner, spec, v)
                t_ex = time.perf_counter() - t0
                m = ex.metrics
                exact = m.ulp  # the finite maximum; NaN/Inf counted apart
                same = fuzz_task(Task(op=spec, variant=v, budget=Budget(seconds=t_ex), seed=args.seed), runner=runner,
                                 exhaustive=False)
                longer = fuzz_task(Task(op=spec, variant=v, budget=Budget(seconds=args.long), seed=args.seed),
                                   runner=runner, exhaustive=False)

            def err(f):
                if f.metrics is None:
                    return None
                if f.metrics.nonfinite and f.finite_metrics is not None:
                    return f.finite_metrics.ulp
                return f.metrics.ulp

            def found(x):
                if x is None or exact in (0, None):
                    return "-"
                if math.isinf(exact):
                    return "1.00" if x is not None and math.isinf(x) else "0.00"
                return f"{min(x, math.inf) / exact:.2f}"

            e1, e2 = err(same), err(longer)
            w = ex.worst
            best = max(ex.sets, key=lambda s_: s_.metrics.ulp if s_.metrics else -1)
            x, nf = best.worst_input, sum(s_.metrics.nonfinite for s_ in ex.sets if s_.metrics)
            nfx = next((s_.nonfinite_input for s_ in ex.sets if s_.nonfinite_input is not None), None)
            nftxt = f"{nf} (x={nfx:.4g})" if nf else "0"
            w = best
            ptxt = "[" + ",".join([w.path] + [f"{k}={val}" for k, val in w.params.items()]) + "]"
            print(f"{name:15} {dtype:9} {t_truth:7.1f} {fmt(exact):>10} {x:>12.5g} {nftxt:>14} {t_ex:6.2f} "
                  f"{fmt(e1) + f' ({same.evals})':>20} {found(e1):>6} {fmt(e2) + f' ({longer.evals})':>20} "
                  f"{found(e2):>6} {ptxt}", flush=True)
            rows.append((name, dtype, exact, t_ex, e1, e2))
    finite = [(r[4], r[2]) for r in rows if r[2] and math.isfinite(r[2]) and r[4] is not None]
    if finite:
        hit = sum(1 for s, e in finite if s >= e * 0.999)
        print(f"\nsearch in the same seconds reached the exact maximum on {hit}/{len(finite)} operator x dtype rows; "
              f"median share of the exact maximum: {np.median([s / e for s, e in finite]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
