"""Fuzzing throughput vs the operator's own call rate, side by side in one run.

For each operator (shapes and parameters pinned so every call costs the same) the gate fuzzes
for a few seconds while the time spent inside the operator calls is clocked, so both rates are
measured on the *same* inputs (fuzzed inputs include subnormals and huge values, on which many
CPU kernels run far slower than on a normal draw):

  op/s         calls/s of the op alone at the variant dtype, on the fuzzer's own inputs
  op+ref/s     calls/s of the op plus its float64 reference (the oracle's irreducible work)
  fuzz/s       evaluations/s of the whole search loop (mutation, quantisation, both runs, scoring)
  normal op/s  calls/s of the op on one fixed normal input (for reference)

and the ratios fuzz/op and fuzz/(op+ref); ``oracle/(op+ref)``: one evaluation of a fixed normal
input by the precision runner as a search runs it (rounding to the dtype, both calls, conversions,
the search's figures; no mutation, no coverage) over op+ref on that input - how far the search
loop could go if mutation and coverage cost nothing; ``batched/(op+ref)``: the same search with the default
batching (8 children of one parent in one call for ``batch_dim`` rows), evaluations/s over the
single-candidate op+ref rate (``-`` for rows that cannot batch). Target: fuzz >= 50% of the raw rate for ops that take
> 1 ms. Usage: python bench/throughput.py [--seconds 3] [--dtype float32] [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from gate.fuzz import fuzz_task  # noqa: E402
from gate.search.inputs import draw  # noqa: E402
from gate.oracles.runner import VariantRunner  # noqa: E402
from gate.ops.catalog import load_catalog  # noqa: E402
from gate.ops.spec import ParamSpec  # noqa: E402
from gate.plan import Budget, Task, Variant  # noqa: E402

CASES = {
    # op: pinned dims (large enough for > 1 ms per call on 2 cores)
    "torch.conv2d": {"N": 8, "C": 16, "O": 32, "K": 3, "H": 64, "W": 64},
    "torch.softmax": {"N": 256, "D": 4096},
    "torch.layer_norm": {"N": 512, "D": 2048},
    "torch.matmul": {"M": 384, "K": 384, "N": 384},
    "torch.scaled_dot_product_attention": {"B": 4, "H": 8, "L": 256, "S": 256, "E": 64},
    "torch.gelu": {"N": 1024, "D": 1024},
}


def pinned(spec, dims):
    params = tuple(ParamSpec(name=p.name, choices=(p.default if p.default is not None else p.choices[0],), kind="choice",
                             default=p.default) if p.kind != "expr" else p for p in spec.params)
    return spec.replace(dims=tuple((n, (dims[n], dims[n])) for n, _ in spec.dims), params=params)


def rate(fn, seconds):
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def ratio(f, g, seconds, blocks=6):
    """Calls per second of ``f`` over those of ``g``, timed in alternating blocks (drifting load
    hits both alike)."""
    f(), g()
    tf = tg = 0.0
    nf = ng = 0
    for _ in range(blocks):
        for fn, is_f in ((f, True), (g, False)):
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < seconds / (2 * blocks):
                fn()
                n += 1
            dt = time.perf_counter() - t0
            if is_f:
                tf, nf = tf + dt, nf + n
            else:
                tg, ng = tg + dt, ng + n
    return (nf / tf) / (ng / tg)


class ClockedBackend:
    """Proxy for a backend that clocks the time spent inside operator calls."""

    def __init__(self, inner):
        self._inner = inner
        self.op_s = self.ref_s = 0.0
        self.op_n = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def call(self, fn, args, kwargs, *, mode, dtype, device):
        t0 = time.perf_counter()
        out = self._inner.call(fn, args, kwargs, mode=mode, dtype=dtype, device=device)
        dt = time.perf_counter() - t0
        if dtype == "float64":
            self.ref_s += dt
        else:
            self.op_s += dt
            self.op_n += 1
        return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ops", nargs="*", default=list(CASES))
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the backend synchronises after each CUDA call)")
    args = ap.parse_args()
    cat = load_catalog(builtin=("torch",))
    from gate.backends import get_backend

    print(f"CPU threads per operator call: {get_backend('torch').threads()} (the gate's default 1; "
          "DL_GATE_THREADS=0 for the framework's own)")
    print(f"{'operator':36} {'ms/call':>8} {'op/s':>8} {'op+ref/s':>9} {'fuzz/s':>8} {'fuzz/op':>8} "
          f"{'fuzz/(op+ref)':>13} {'oracle/(op+ref)':>15} {'batched/(op+ref)':>16} {'normal op/s':>11}")
    for name in args.ops:
        spec = pinned(cat.get(name), CASES[name])
        v = Variant(args.dtype, args.device)
        runner = VariantRunner(spec, v)
        raw = draw(spec, np.random.default_rng(0))
        cand = runner.quantize(raw)
        low_args, low_kw = runner.build_call(cand, v.dtype, low=True)
        ref_args, ref_kw = runner.build_call(cand, "float64", low=False)
        b = runner.backend

        def op():
            b.call(runner.fn, low_args, low_kw, mode="input", dtype=v.dtype, device=args.device)

        def op_ref():
            op()
            b.call(runner.ref_fn, ref_args, ref_kw, mode="input", dtype="float64", device=args.device)

        normal = rate(op, args.seconds / 2)
        runner.figures = "search"
        with np.errstate(all="ignore"):
            oracle = ratio(lambda: runner.evaluate(raw), op_ref, args.seconds)
        runner.figures = "all"
        clocked = ClockedBackend(b)
        runner.backend = clocked
        # batch=1: one operator call per evaluation, so fuzz/op compares like with like
        # (batched evaluation is measured by bench/batched_eval.py)
        f = fuzz_task(Task(op=spec, variant=v, budget=Budget(seconds=args.seconds), seed=0), runner=runner, batch=1)
        fz = f.evals / f.seconds
        op_rate = clocked.op_n / clocked.op_s
        op_ref_rate = clocked.op_n / (clocked.op_s + clocked.ref_s)
        runner.backend = b
        fb = fuzz_task(Task(op=spec, variant=v, budget=Budget(seconds=args.seconds), seed=0), runner=runner)
        width = (fb.coverage.get("batch") or {}).get("width", 1)
        batched = f"{fb.evals / fb.seconds / op_ref_rate:.2f} (x{width})" if width > 1 else "-"
        print(f"{name:36} {1000 / op_rate:8.2f} {op_rate:8.1f} {op_ref_rate:9.1f} {fz:8.1f} {fz / op_rate:8.2f} "
              f"{fz / op_ref_rate:13.2f} {oracle:15.2f} {batched:>16} {normal:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
