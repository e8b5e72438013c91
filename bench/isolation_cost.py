"""Throughput cost of crash/hang isolation: evaluations per second in-process vs in a worker
process (gate.backends.isolate), on the same candidates, measured side by side in one run; plus
what replacing a dead worker costs (paid once per crash or hang): a fork of the warm zygote vs a
fresh interpreter that imports the framework.

    python bench/isolation_cost.py [--ops torch.relu,torch.conv2d] [--evals 300] [--dtype float32]
    python bench/isolation_cost.py --large   # the shapes of bench/throughput.py (a million elements)

With ``--large`` a third column runs the isolated worker with ``DL_GATE_SHARED_MEMORY=0``: every
message through the pipe (how it was before gate/backends/ipc.py), the control arm.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from gate.search.inputs import draw  # noqa: E402
from gate.backends.isolate import IsolateOptions  # noqa: E402
from gate.oracles.registry import build_runner  # noqa: E402
from gate.ops.catalog import load_catalog  # noqa: E402
from gate.plan import Variant  # noqa: E402


def rates(a, b, cands, block: int = 25):
    """Evaluations per second of runners ``a`` and ``b`` on the same candidates, timed in
    alternating blocks so that drifting machine load hits both alike."""
    a.evaluate(cands[0])  # warm: first-call caches, lazy initialisation
    b.evaluate(cands[0])
    spent = [0.0, 0.0]
    for i in range(0, len(cands), block):
        for k, runner in enumerate((a, b)):
            t0 = time.perf_counter()
            for c in cands[i:i + block]:
                runner.evaluate(c)
            spent[k] += time.perf_counter() - t0
    return len(cands) / spent[0], len(cands) / spent[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=ap_default())
    ap.add_argument("--evals", type=int, default=300)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--oracle", default="precision")
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--large", action="store_true", help="pin the shapes of bench/throughput.py (about 1M elements)")
    args = ap.parse_args()
    catalog = load_catalog()
    if args.large:
        return large(args, catalog)
    print(f"{'operator':24} {'in-process/s':>13} {'isolated/s':>11} {'ratio':>7}   (oracle {args.oracle}, {args.dtype}, "
          f"{args.evals} evaluations each, same candidates, interleaved)")
    for name in args.ops.split(","):
        spec = catalog.get(name)
        variant = Variant(args.dtype, "cpu", "input", "default", args.oracle)
        rng = np.random.default_rng(0)
        cands = [draw(spec, rng) for _ in range(args.evals)]
        local = build_runner(spec, variant)
        isolated = build_runner(spec, variant, isolate=IsolateOptions(timeout=60))
        try:
            r_in, r_iso = rates(local, isolated, cands)
        finally:
            isolated.close()
        print(f"{name:24} {r_in:13.1f} {r_iso:11.1f} {r_iso / r_in:7.2f}")
    spec = catalog.get(args.ops.split(",")[0])
    variant = Variant(args.dtype, "cpu", "input", "default", args.oracle)
    cand = draw(spec, np.random.default_rng(1))
    print(f"crash recovery: seconds from a worker's death to the next evaluation's result "
          f"(median of {args.restarts}; the worker is killed with SIGSEGV between evaluations)")
    for zygote in (False, True):
        r = build_runner(spec, variant, isolate=IsolateOptions(timeout=60, zygote=zygote))
        times = []
        try:
            r.evaluate(cand)
            for _ in range(args.restarts):
                r._active.proc.send_signal(signal.SIGSEGV)
                r._active.proc.wait()
                t0 = time.perf_counter()
                r.evaluate(cand)  # finds the worker dead, replaces it, evaluates
                times.append(time.perf_counter() - t0)
        finally:
            r.close()
        how = "forked by the zygote" if zygote else "fresh interpreter"
        print(f"  {how:22}: {sorted(times)[len(times) // 2]:.3f}s")
    return 0


def large(args, catalog) -> int:
    """In-process vs isolated through shared memory vs isolated through the pipe, on large inputs."""
    from bench.throughput import CASES, pinned

    ops = [o for o in args.ops.split(",") if o in CASES] if args.ops != ap_default() else list(CASES)
    evals = min(args.evals, 40)
    print(f"{'operator':36} {'in-process/s':>13} {'shared mem/s':>13} {'pipe/s':>8} {'shared/in':>10} {'pipe/in':>8}"
          f"   ({args.dtype}, {evals} evaluations each, same candidates, interleaved)")
    for name in ops:
        spec = pinned(catalog.get(name), CASES[name])
        variant = Variant(args.dtype, "cpu", "input", "default", args.oracle)
        rng = np.random.default_rng(0)
        cands = [draw(spec, rng) for _ in range(evals)]
        local = build_runner(spec, variant)
        shared = build_runner(spec, variant, isolate=IsolateOptions(timeout=120, zygote=False))
        os.environ["DL_GATE_SHARED_MEMORY"] = "0"  # read by this worker's interpreter and by our sender below
        try:
            piped = build_runner(spec, variant, isolate=IsolateOptions(timeout=120, zygote=False))
        finally:
            del os.environ["DL_GATE_SHARED_MEMORY"]
        try:
            r_in, r_sh = rates(local, shared, cands, block=5)
            _, r_pi = rates(local, piped, cands, block=5)
        finally:
            shared.close()
            piped.close()
        print(f"{name:36} {r_in:13.1f} {r_sh:13.1f} {r_pi:8.1f} {r_sh / r_in:10.2f} {r_pi / r_in:8.2f}")
    return 0


def ap_default() -> str:
    return "torch.relu,torch.softmax,torch.conv2d"


if __name__ == "__main__":
    sys.exit(main())
