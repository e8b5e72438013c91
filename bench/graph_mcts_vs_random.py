"""MCTS vs random graph generation, side by side in one run.

Both arms get the same time on the same catalogue, interleaved in slices so machine noise
hits both alike; printed per arm: graphs generated, operator-level coverage per criterion,
unique failures (first diverging operator x cause x dtype, or crash), and the rates per
minute and per 100 graphs.

    python bench/graph_mcts_vs_random.py --seconds 120 --seeds 0,1
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate.graphs.campaign import GraphCampaign  # noqa: E402
from gate.graphs.coverage import CRITERIA  # noqa: E402
from gate.graphs.generate import GraphSpace  # noqa: E402
from gate.ops.catalog import load_builtin  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="seconds per arm per seed (default 60)")
    ap.add_argument("--slices", type=int, default=6, help="interleaved slices per arm (default 6)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--framework", default="torch")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--evals-per-graph", type=int, default=4)
    args = ap.parse_args()
    specs = load_builtin((args.framework,))
    space = GraphSpace.build(specs, args.framework, dtypes=(args.dtype,))
    print(f"catalogue: {len(space.ops)} graph-eligible {args.framework} operators; dtype {args.dtype}; "
          f"{args.seconds:g}s per arm per seed in {args.slices} interleaved slices")
    totals = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        camps = {arm: GraphCampaign(space, arm=arm, dtypes=(args.dtype,), seed=seed,
                                    evals_per_graph=args.evals_per_graph) for arm in ("mcts", "random")}
        spent = {arm: 0.0 for arm in camps}
        results = {}
        for _ in range(args.slices):
            for arm, camp in camps.items():
                t = time.perf_counter()
                results[arm] = camp.run(seconds=args.seconds / args.slices)
                spent[arm] += time.perf_counter() - t
        print(f"\nseed {seed}")
        head = f"{'arm':7} {'graphs':>6} {'valid':>5} " + " ".join(f"{c:>16}" for c in CRITERIA) + \
            f" {'items':>6} {'failures':>8} {'fail/min':>8} {'items/min':>9} {'fail/100g':>9}"
        print(head)
        for arm, res in results.items():
            minutes = spent[arm] / 60.0
            items = sum(v["covered"] for v in res.coverage.values())
            cov = " ".join(f"{v['covered']:>5}/{v['total']:<5}({100 * v['ratio']:3.0f}%)" for v in res.coverage.values())
            nf = len(res.failures)
            print(f"{arm:7} {camps[arm].graphs:>6} {camps[arm].valid:>5} {cov} {items:>6} {nf:>8} "
                  f"{nf / minutes:>8.2f} {items / minutes:>9.1f} {100.0 * nf / max(camps[arm].graphs, 1):>9.2f}")
            t = totals.setdefault(arm, [0, 0, 0, 0.0])
            t[0] += camps[arm].graphs
            t[1] += items
            t[2] += nf
            t[3] += minutes
    if len(args.seeds.split(",")) > 1:
        print("\nall seeds")
        for arm, (g, items, nf, minutes) in totals.items():
            print(f"{arm:7} graphs {g}, items {items}, failures {nf}: {nf / minutes:.2f} failures/min, "
                  f"{100.0 * nf / max(g, 1):.2f} per 100 graphs")
    m, r = totals["mcts"], totals["random"]
    print(f"\nratio mcts/random: coverage items {m[1] / max(r[1], 1):.2f}, failures/min "
          f"{(m[2] / m[3]) / max(r[2] / r[3], 1e-9):.2f}, failures per graph "
          f"{(m[2] / max(m[0], 1)) / max(r[2] / max(r[0], 1), 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
