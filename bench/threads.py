"""The search's evaluations per second on one CPU thread per operator call vs the framework's
default (every core), side by side in one run, on a quiet machine and beside busy processes.

Why the gate computes on one thread by default (``threads:`` in .dl-gate.yml, ``$DL_GATE_THREADS``):
a CI runner has 2-4 cores and is rarely alone (another step, a service container, the gate's own
worker beside its parent). A parallel region of 2 threads on 2 cores waits for whichever thread
the scheduler took away, and a search makes thousands of small calls.

For each operator the same search (seed 0, a fixed number of evaluations, so both settings do the
same work) runs alternately with ``torch.set_num_threads(1)`` and with every core, ``--rounds``
times; ``--busy K`` starts K processes that each keep one core busy during the measurement.
Columns: evaluations/s at 1 thread, at every core, and their ratio (> 1: one thread is faster).
``--pinned``: the large pinned shapes of bench/throughput.py (operator calls > 1 ms, where more
threads speed the operator up) instead of the catalogue's own dims (what a gate run fuzzes).

Usage: python bench/threads.py [--evals 400] [--busy 0 1] [--pinned] [--ops torch.softmax ...]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from gate.fuzz import fuzz_task  # noqa: E402
from gate.oracles.runner import VariantRunner  # noqa: E402
from gate.ops.catalog import load_catalog  # noqa: E402
from gate.plan import Budget, Task, Variant  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from throughput import CASES, pinned  # noqa: E402

OPS = ["torch.softmax", "torch.layer_norm", "torch.gelu", "torch.matmul", "torch.conv2d"]


def _spin(stop):  # one busy core: another job on the runner
    while not stop.is_set():
        sum(range(10000))


def _rate(spec, threads: int, evals: int) -> float:
    torch.set_num_threads(threads)
    v = Variant("float32", "cpu")
    runner = VariantRunner(spec, v)
    t0 = time.perf_counter()
    f = fuzz_task(Task(op=spec, variant=v, budget=Budget(evals=evals), seed=0), runner=runner)
    return f.evals / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evals", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--busy", type=int, nargs="*", default=[0, 1], help="busy processes beside the search, one "
                                                                      "measurement per count")
    ap.add_argument("--pinned", action="store_true")
    ap.add_argument("--ops", nargs="*", default=OPS)
    args = ap.parse_args()
    every = os.cpu_count() or 1
    cat = load_catalog(builtin=("torch",))
    print(f"{os.cpu_count()} cores; threads: 1 vs {every} (every core); {args.evals} evaluations, "
          f"{args.rounds} rounds alternated; {'pinned shapes' if args.pinned else 'catalogue dims'}")
    print(f"{'operator':20} {'busy':>4} {'evals/s @1':>11} {f'evals/s @{every}':>11} {'1 / all':>8}")
    for busy in args.busy:
        stop = mp.Event()
        spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(busy)]
        for p in spinners:
            p.start()
        try:
            for name in args.ops:
                spec = cat.get(name)
                if args.pinned:
                    spec = pinned(spec, CASES[name])
                one, all_ = [], []
                for _ in range(args.rounds):
                    one.append(_rate(spec, 1, args.evals))
                    all_.append(_rate(spec, every, args.evals))
                r1, ra = sum(one) / len(one), sum(all_) / len(all_)
                print(f"{name:20} {busy:4d} {r1:11.1f} {ra:11.1f} {r1 / ra:8.2f}", flush=True)
        finally:
            stop.set()
            for p in spinners:
                p.join(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
