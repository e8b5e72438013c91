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
> 1 ms.

Gradient rows (``grad``, the gradient oracle: backward at the dtype vs backward in float64 on
the same input and upstream gradient): ``op+ref`` is then forward+backward at the dtype plus
forward+backward in float64 (``fuzz/(fwd+bwd+ref)``).

``--baseline REV``: every row is measured twice, alternately, in two processes: once with the
gate of this tree and once with the gate of ``REV`` (a temporary ``git worktree``), and printed
side by side (before -> after) - the same machine, the same minute, the same inputs.

Usage: python bench/throughput.py [--seconds 3] [--dtype float32] [--device cuda] [--no-grad]
                                  [--baseline REV]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# --tree DIR: measure the gate found in DIR (a baseline worktree) instead of this one
_TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else HERE
sys.path.insert(0, _TREE)

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

    def _clock(self, dtype, t0):
        dt = time.perf_counter() - t0
        if dtype == "float64":
            self.ref_s += dt
        else:
            self.op_s += dt
            self.op_n += 1

    def call(self, fn, args, kwargs, *, mode, dtype, device):
        t0 = time.perf_counter()
        out = self._inner.call(fn, args, kwargs, mode=mode, dtype=dtype, device=device)
        self._clock(dtype, t0)
        return out

    def vjp(self, fn, args, kwargs, upstream, *, dtype, device, **kw):
        t0 = time.perf_counter()
        out = self._inner.vjp(fn, args, kwargs, upstream, dtype=dtype, device=device, **kw)
        self._clock(dtype, t0)
        return out


def measure(name: str, grad: bool, seconds: float, dtype: str, device: str) -> dict:
    """One row: rates of the operator (forward, or forward+backward for ``grad``), of the oracle
    alone and of the whole search loop, on the same pinned shapes."""
    cat = load_catalog(builtin=("torch",))
    spec = pinned(cat.get(name), CASES[name])
    if grad:
        from gate.oracles.registry import build_runner

        v = Variant(dtype, device, oracle="grad")
        runner = build_runner(spec, v)
    else:
        v = Variant(dtype, device)
        runner = VariantRunner(spec, v)
    # the compiled loops (rounding, scoring, band counts, random numbers) loaded before anything
    # is timed, as a real run has them: its worker zygote loads them once before it forks
    # (gate.backends.isolate.WARM_UP), so no search pays Numba's cache loads (~0.3 s, a tenth of
    # a 3 s row, were inside the timed search before)
    try:
        from gate.oracles.registry import warm_kernels
    except ImportError:  # an older gate (--baseline): its search loads them as it goes
        warm_kernels = None
    if warm_kernels is not None:
        warm_kernels()
    raw = draw(spec, np.random.default_rng(0))
    cand = runner.quantize(raw)
    b = runner.backend
    if grad:
        runner.evaluate(cand, quantized=True)  # stores the upstream gradient in the candidate

        def op():
            runner._vjp(cand, dtype, runner.fn, dtype)

        def op_ref():
            op()
            runner._vjp(cand, "float64", runner.ref_fn, dtype)
    else:
        low_args, low_kw = runner.build_call(cand, v.dtype, low=True)
        ref_args, ref_kw = runner.build_call(cand, "float64", low=False)

        def op():
            b.call(runner.fn, low_args, low_kw, mode="input", dtype=v.dtype, device=device)

        def op_ref():
            op()
            b.call(runner.ref_fn, ref_args, ref_kw, mode="input", dtype="float64", device=device)

    normal = rate(op, seconds / 2)
    runner.figures = "search"
    with np.errstate(all="ignore"):
        oracle = ratio(lambda: runner.evaluate(raw), op_ref, seconds)
    runner.figures = "all"
    clocked = ClockedBackend(b)
    runner.backend = clocked
    # batch=1: one operator call per evaluation, so fuzz/op compares like with like
    # (batched evaluation is measured by bench/batched_eval.py)
    f = fuzz_task(Task(op=spec, variant=v, budget=Budget(seconds=seconds), seed=0), runner=runner, batch=1)
    fz = f.evals / f.seconds
    op_rate = clocked.op_n / max(clocked.op_s, 1e-9)
    op_ref_rate = clocked.op_n / max(clocked.op_s + clocked.ref_s, 1e-9)
    runner.backend = b
    batched = "-"
    if not grad:
        fb = fuzz_task(Task(op=spec, variant=v, budget=Budget(seconds=seconds), seed=0), runner=runner)
        width = (fb.coverage.get("batch") or {}).get("width", 1)
        batched = f"{fb.evals / fb.seconds / op_ref_rate:.2f} (x{width})" if width > 1 else "-"
    return {"op": name, "grad": grad, "ms": 1000 / op_rate, "op_rate": op_rate, "op_ref_rate": op_ref_rate,
            "fuzz": fz, "fuzz_op": fz / op_rate, "fuzz_op_ref": fz / op_ref_rate, "oracle": oracle,
            "batched": batched, "normal": normal, "evals": f.evals}


def _row_in(tree: str, name: str, grad: bool, args) -> dict:
    """One row measured by a fresh process on the gate of ``tree``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--tree", tree, "--row", name, "--seconds", str(args.seconds),
           "--dtype", args.dtype, "--device", args.device] + (["--grad-row"] if grad else [])
    env = dict(os.environ, DL_GATE_PLOT="0")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _label(r: dict) -> str:
    return r["op"] + (" (grad)" if r["grad"] else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ops", nargs="*", default=list(CASES))
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the backend synchronises after each CUDA call)")
    ap.add_argument("--no-grad", action="store_true", help="forward rows only")
    ap.add_argument("--baseline", metavar="REV", help="measure every row on REV's gate too, side by side")
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--grad-row", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:  # one row, as JSON (a process of --baseline)
        print(json.dumps(measure(args.row, args.grad_row, args.seconds, args.dtype, args.device)))
        return 0
    from gate.backends import get_backend

    print(f"CPU threads per operator call: {get_backend('torch').threads()} (the gate's default 1; "
          "DL_GATE_THREADS=0 for the framework's own)")
    from gate.oracles import fused

    print(f"scoring of outputs of {fused.MIN_ELEMENTS}+ elements: "
          f"{'the fused kernel (Numba)' if fused.available() else 'NumPy (Numba not available)'}")
    rows = [(n, g) for n in args.ops for g in ((False,) if args.no_grad else (False, True))]
    if args.baseline:
        return _side_by_side(rows, args)
    print(f"{'operator':44} {'ms/call':>8} {'op/s':>8} {'op+ref/s':>9} {'fuzz/s':>8} {'fuzz/op':>8} "
          f"{'fuzz/(op+ref)':>13} {'oracle/(op+ref)':>15} {'batched/(op+ref)':>16} {'normal op/s':>11}")
    for name, grad in rows:
        r = measure(name, grad, args.seconds, args.dtype, args.device)
        print(f"{_label(r):44} {r['ms']:8.2f} {r['op_rate']:8.1f} {r['op_ref_rate']:9.1f} {r['fuzz']:8.1f} "
              f"{r['fuzz_op']:8.2f} {r['fuzz_op_ref']:13.2f} {r['oracle']:15.2f} {r['batched']:>16} {r['normal']:11.1f}")
    return 0


def _side_by_side(rows, args) -> int:
    tmp = tempfile.mkdtemp(prefix="dl-gate-baseline-")
    base = os.path.join(tmp, "tree")
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", "-q", base, args.baseline], check=True)
    try:
        print(f"before: {args.baseline}, after: this tree; each row measured alternately in two processes")
        print(f"{'operator':44} {'op+ref/s':>17} {'fuzz/s':>15} {'fuzz/(op+ref)':>15} {'oracle/(op+ref)':>16}")
        for name, grad in rows:
            b = _row_in(base, name, grad, args)
            a = _row_in(HERE, name, grad, args)
            print(f"{_label(a):44} {b['op_ref_rate']:7.1f} -> {a['op_ref_rate']:6.1f} {b['fuzz']:6.1f} -> "
                  f"{a['fuzz']:5.1f} {b['fuzz_op_ref']:6.2f} -> {a['fuzz_op_ref']:5.2f} "
                  f"{b['oracle']:7.2f} -> {a['oracle']:5.2f}", flush=True)
    finally:
        subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", base], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
