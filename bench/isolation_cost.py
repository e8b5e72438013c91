"""Throughput cost of crash/hang isolation: evaluations per second in-process vs in a worker
process (gate.backends.isolate), on the same candidates, measured side by side in one run; plus
what replacing a dead worker costs (paid once per crash or hang): a fork of the warm zygote vs a
fresh interpreter that imports the framework.

    python bench/isolation_cost.py [--ops torch.relu,torch.conv2d] [--evals 300] [--dtype float32]
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
    ap.add_argument("--ops", default="torch.relu,torch.softmax,torch.conv2d")
    ap.add_argument("--evals", type=int, default=300)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--oracle", default="precision")
    ap.add_argument("--restarts", type=int, default=3)
    args = ap.parse_args()
    catalog = load_catalog()
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


if __name__ == "__main__":
    sys.exit(main())
