#!/usr/bin/env python
"""Batched vs one-at-a-time evaluation of the same candidates (gate/oracles/batch.py).

For each operator: parents drawn from the spec, each with ``width - 1`` value mutations (the
children a mutation step of the search makes: same shapes, so they batch); every group is
evaluated both ways, alternately, in one process. Prints candidates per second for both, the
ratio, and the largest difference between the two runs' error figures (0 = identical).

    python bench/batched_eval.py [--width 8] [--rounds 40] [--ops torch.relu,...]
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gate.oracles.batch import BatchEvaluator  # noqa: E402
from gate.search.inputs import draw  # noqa: E402
from gate.search.mutate import MUTATORS, bind  # noqa: E402
from gate.oracles.runner import VariantRunner  # noqa: E402
from gate.ops.catalog import Catalog, load_builtin  # noqa: E402
from gate.plan import Variant  # noqa: E402

OPS = ["torch.relu", "torch.tanh", "torch.sigmoid", "torch.gelu", "torch.softmax", "torch.layer_norm", "torch.conv2d"]
VALUE_MUTATORS = ("perturb_1e-4", "perturb_1e-6", "noise", "scale", "edge")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=8, help="candidates per batch (default 8)")
    ap.add_argument("--rounds", type=int, default=40, help="groups per operator (default 40)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ops", help="comma-separated subset")
    ap.add_argument("--search-evals", type=int, default=600,
                    help="also time whole searches of this many evaluations (0: skip)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    cat = Catalog(load_builtin(("torch",)))
    names = args.ops.split(",") if args.ops else OPS
    print(f"batched_eval: width {args.width}, {args.rounds} groups per op, dtype {args.dtype}, "
          f"torch threads {args.threads}")
    print(f"{'operator':18} {'one-by-one/s':>13} {'batched/s':>10} {'speed-up':>9} {'max |diff| ulp':>15}")
    ratios = []
    for name in names:
        spec = cat.get(name)
        runner = VariantRunner(spec, Variant(args.dtype))
        batch = BatchEvaluator(runner)
        rng = np.random.default_rng(0)
        muts = [bind(MUTATORS[m], spec, dtype=args.dtype) for m in VALUE_MUTATORS]
        groups = []
        for _ in range(args.rounds):
            parent = draw(spec, rng)
            kids = [parent]
            while len(kids) < args.width:
                c = muts[int(rng.integers(len(muts)))](parent, rng)
                if c is not None:
                    kids.append(c)
            groups.append(kids)
        runner.evaluate(groups[0][0])  # warm up
        batch.evaluate_many(groups[0])
        t_one = t_batch = 0.0
        diff = 0.0
        n = 0
        for g in groups:
            t0 = time.perf_counter()
            one = [runner.evaluate(c) for c in g]
            t1 = time.perf_counter()
            many = batch.evaluate_many(g)
            t2 = time.perf_counter()
            t_one += t1 - t0
            t_batch += t2 - t1
            n += len(g)
            for (_, a), (_, b) in zip(one, many):
                if a.metrics and b.metrics and np.isfinite(a.metrics.ulp) and np.isfinite(b.metrics.ulp):
                    diff = max(diff, abs(a.metrics.ulp - b.metrics.ulp))
        ratio = t_one / t_batch
        ratios.append(ratio)
        sep = "" if batch.separable and all(batch.separable.values()) else " (not separable for some settings)"
        print(f"{name:18} {n / t_one:13.0f} {n / t_batch:10.0f} {ratio:8.2f}x {diff:15.3g}{sep}")
    print(f"\ngeometric mean speed-up of evaluation: {float(np.exp(np.mean(np.log(ratios)))):.2f}x")
    if args.search_evals:
        from gate.fuzz import fuzz_task
        from gate.plan import Budget, Task

        print(f"\nwhole search, {args.search_evals} evaluations (fuzz_task, batch 1 vs {args.width}):")
        for name in names:
            spec = cat.get(name)
            task = Task(op=spec, variant=Variant(args.dtype), budget=Budget(evals=args.search_evals), seed=0)
            t0 = time.perf_counter()
            a = fuzz_task(task, batch=1)
            t1 = time.perf_counter()
            b = fuzz_task(task, batch=args.width)
            t2 = time.perf_counter()
            print(f"{name:18} {a.evals / (t1 - t0):8.0f}/s {b.evals / (t2 - t1):8.0f}/s  {(t1 - t0) / (t2 - t1):5.2f}x"
                  f"  (default for this op: batch {b.coverage['batch']['default']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
