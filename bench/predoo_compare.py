#!/usr/bin/env python
"""Predoo vs the gate's search, side by side on the same operators and wall-time budgets.

Predoo (Zhang et al., ISSTA 2021, §3), re-implemented faithfully except for its oracle:

* seed corpus: ``--predoo-seeds`` random normal tensors of one *declared* shape per operator
  (table DECLARED below: the sizes at the top of the spec's ranges, one setting per parameter);
* mutation: add one constant perturbation δ ~ U[0, θ] to every element of an input, θ drawn
  from {1e-4, 1e-6, 1e-8} (the paper's three settings) - the shape never changes;
* guidance: ``linf`` keeps a mutant in the corpus when its max element error beats the best so
  far, ``l1`` when its summed element error does, ``random`` never keeps one;
* scored with the gate's corrected oracle (one input, exactly representable in the dtype under
  test, fed to both sides; float64 reference on the same values) - Predoo's own oracle compares
  outputs of differently rounded inputs and would credit it with rounding noise. Both arms'
  "max error" is the max error in ULPs of the dtype (inf for a NaN/Inf output where the
  reference is finite).

The gate's search is ``gate.fuzz.fuzz_task`` as the gate runs it (UCT scheduler, coverage-guided
generation with edge values, batched evaluation, OpInfo seeds for torch rows).

Per operator it prints the max error each arm found at equal wall time, the time the gate took
to reach Predoo's final max error (and that time over Predoo's budget), and for the user-style
operators with planted regressions (bench/userops) whether and when each arm found an input on
which head is worse than base: head error above the gate floor and above m x base error on the
same input (m = 2 for float32, 3 below), or NaN/Inf where base is finite; the gate gets up to
``--detect-budget`` seconds (60 by default), Predoo as long in full mode, its equal-time budget
in ``--quick`` mode.

    python bench/predoo_compare.py --quick      # about 1-2 minutes
    python bench/predoo_compare.py              # about 8 minutes
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gate.config import load_config  # noqa: E402
from gate.fuzz import fuzz_task  # noqa: E402
from gate.search.inputs import Candidate, build_arrays, derived_params, project  # noqa: E402
from gate.search.mutate import perturb  # noqa: E402
from gate.oracles.runner import OK, VariantRunner  # noqa: E402
from gate.search.seeds import SeedStore  # noqa: E402
from gate.ops.catalog import Catalog, load_builtin  # noqa: E402
from gate.ops.spec import OpSpec  # noqa: E402
from gate.plan import Budget, Task, Variant  # noqa: E402

BUILTIN_OPS = ["torch.conv2d", "torch.softmax", "torch.tanh", "torch.sigmoid", "torch.relu", "torch.layer_norm"]
PLANTED_OPS = ["userops.softmax", "userops.layer_norm", "userops.elu"]

#: Predoo's declared shape and parameter setting per operator
DECLARED: Dict[str, Tuple[Dict[str, int], Dict[str, object]]] = {
    "torch.conv2d": ({"N": 2, "C": 4, "O": 4, "K": 3, "H": 12, "W": 12}, {"stride": 1, "padding": 0, "dilation": 1}),
    "torch.softmax": ({"N": 16, "D": 256}, {"dim": -1}),
    "torch.tanh": ({"N": 64, "D": 64}, {}),
    "torch.sigmoid": ({"N": 64, "D": 64}, {}),
    "torch.relu": ({"N": 64, "D": 64}, {}),
    "torch.layer_norm": ({"N": 16, "D": 256}, {"eps": 1e-5}),
    "userops.softmax": ({"N": 16, "D": 250}, {"dim": -1}),
    "userops.layer_norm": ({"N": 16, "D": 250}, {"eps": 1e-5}),
    "userops.elu": ({"N": 64, "D": 60}, {"alpha": 1.0}),
}
THETAS = (1e-4, 1e-6, 1e-8)


class Stop(Exception):
    """Raised from a callback to end a run early (detection-only runs)."""


# ---------------------------------------------------------------------------------------
# the oracle both arms are scored by
# ---------------------------------------------------------------------------------------
def severity(ev) -> float:
    return ev.metrics.severity if ev.status == OK and ev.metrics is not None else -math.inf


class Detector:
    """Is head worse than base on this input? (the judge's rule: m x base error above a floor)."""

    def __init__(self, spec: OpSpec, variant: Variant):
        self.base = VariantRunner(spec.replace(callable=spec.callable.rsplit(".", 1)[0] + ".base"), variant)
        self.floor = spec.threshold(variant.dtype).ulp
        if not math.isfinite(self.floor):
            self.floor = 8.0
        self.m = 2.0 if variant.dtype == "float32" else 3.0

    def __call__(self, q: Candidate, ev) -> bool:
        hs = severity(ev)
        if hs <= self.floor:
            return False
        _, eb = self.base.evaluate(q, quantized=True)
        if eb.status != OK:
            return False
        bs = eb.metrics.severity
        if math.isinf(hs):
            return not math.isinf(bs)
        return hs > self.m * bs


# ---------------------------------------------------------------------------------------
# Predoo
# ---------------------------------------------------------------------------------------
def predoo_seed(spec: OpSpec, dims, params, rng: np.random.Generator) -> Candidate:
    full = derived_params(spec, params, dims)
    arrays = build_arrays(spec, dims, full, rng)
    for t in spec.inputs:
        if t.kind == "float":  # Predoo: standard normal values
            arrays[t.name] = project(rng.standard_normal(arrays[t.name].shape), t.domain)
    return Candidate(dims=dict(dims), params=full, arrays=arrays, origin="predoo-seed")


def run_predoo(spec: OpSpec, runner: VariantRunner, seconds: float, rng: np.random.Generator, *,
               guidance: str = "linf", n_seeds: int = 5,
               on_best: Optional[Callable[[float, Candidate, object], None]] = None) -> dict:
    dims, params = DECLARED[spec.name]
    mutators = [perturb(th) for th in THETAS]
    t0 = time.perf_counter()
    corpus: List[Candidate] = []
    best, best_score, evals, traj = -math.inf, -math.inf, 0, []

    def score(ev) -> float:
        if guidance == "l1" and ev.status == OK and not math.isinf(ev.metrics.severity):
            return ev.metrics.l1
        return severity(ev)

    def consider(q, ev):
        nonlocal best
        s = severity(ev)
        if s > best:
            best = s
            traj.append((time.perf_counter() - t0, s))
            if on_best:
                on_best(time.perf_counter() - t0, q, ev)

    for _ in range(n_seeds):
        q, ev = runner.evaluate(predoo_seed(spec, dims, params, rng))
        evals += 1
        corpus.append(q)
        consider(q, ev)
        best_score = max(best_score, score(ev))
    while time.perf_counter() - t0 < seconds:
        parent = corpus[int(rng.integers(len(corpus)))] if guidance != "random" else corpus[int(rng.integers(n_seeds))]
        child = mutators[int(rng.integers(len(mutators)))](parent, spec, rng)
        q, ev = runner.evaluate(child)
        evals += 1
        consider(q, ev)
        sc = score(ev)
        if guidance != "random" and sc > best_score:
            best_score = sc
            corpus.append(q)
        if math.isinf(best):
            break
    return {"best": best, "trajectory": traj, "evals": evals, "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------
# the gate
# ---------------------------------------------------------------------------------------
def run_gate(spec: OpSpec, variant: Variant, seconds: float, seed: int, store: Optional[SeedStore],
             on_best: Optional[Callable[[float, Candidate, object], None]] = None) -> dict:
    t0 = time.perf_counter()
    traj: List[Tuple[float, float]] = []

    def cb(q, ev, fit):
        t = time.perf_counter() - t0
        traj.append((t, severity(ev)))
        if on_best:
            on_best(t, q, ev)

    task = Task(op=spec, variant=variant, budget=Budget(seconds=seconds), seed=seed)
    try:
        f = fuzz_task(task, seed_store=store, on_best=cb)
        evals = f.evals
    except Stop:
        evals = None
    best = max((s for _, s in traj), default=-math.inf)
    return {"best": best, "trajectory": traj, "evals": evals, "seconds": time.perf_counter() - t0}


def time_to_reach(traj: List[Tuple[float, float]], target: float) -> Optional[float]:
    for t, s in traj:
        if s >= target:
            return t
    return None


def detect_time(run: Callable[[Callable], dict]) -> Optional[float]:
    found: List[float] = []

    def on_best(t, q, ev):
        if detector(q, ev):
            found.append(t)
            raise Stop()

    detector = run.detector  # type: ignore[attr-defined]
    try:
        run(on_best)
    except Stop:
        pass
    return found[0] if found else None


def fmt(x: Optional[float], unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-"
    return f"{x:.3g}{unit}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short budgets (about 1-2 minutes in all)")
    ap.add_argument("--seconds", type=float, help="equal wall-time budget per op and arm (default 15, quick 3)")
    ap.add_argument("--detect-budget", type=float, default=60.0, help="seconds per planted op to detect (default 60)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--predoo-guidance", default="linf", choices=["linf", "l1", "random"])
    ap.add_argument("--predoo-seeds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads for both arms (default 1)")
    ap.add_argument("--ops", help="comma-separated subset")
    ap.add_argument("--no-seeds", action="store_true", help="run the gate without OpInfo seeds")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    seconds = args.seconds or (3.0 if args.quick else 15.0)

    import torch

    torch.set_num_threads(args.threads)
    cfg = load_config(ROOT / "bench" / "userops" / "ops.yml")
    cfg.activate()
    catalog = Catalog([*load_builtin(("torch",)), *cfg.ops])
    names = args.ops.split(",") if args.ops else BUILTIN_OPS + PLANTED_OPS
    variant = Variant(args.dtype)
    store = None if args.no_seeds else SeedStore(None)
    print(f"predoo_compare: dtype {args.dtype}, {seconds:g}s per op and arm, Predoo guidance "
          f"{args.predoo_guidance}, torch threads {args.threads}, seed {args.seed}", flush=True)
    rows = []
    t_all = time.perf_counter()
    for name in names:
        spec = catalog.get(name)
        runner = VariantRunner(spec, variant)
        planted = name in PLANTED_OPS
        if store is not None:
            store.load(spec)  # warm the OpInfo cache outside the timed run
        warm = predoo_seed(spec, *DECLARED[name], np.random.default_rng(0))
        runner.evaluate(warm)
        det = Detector(spec, variant) if planted else None
        p_det: List[float] = []
        g_det: List[float] = []

        def p_cb(t, q, ev, _det=det, _hits=p_det):
            if _det is not None and not _hits and _det(q, ev):
                _hits.append(t)

        def g_cb(t, q, ev, _det=det, _hits=g_det):
            if _det is not None and not _hits and _det(q, ev):
                _hits.append(t)

        p = run_predoo(spec, runner, seconds, np.random.default_rng(args.seed), guidance=args.predoo_guidance,
                       n_seeds=args.predoo_seeds, on_best=p_cb)
        g = run_gate(spec, variant, seconds, args.seed, store, on_best=g_cb)
        reach = time_to_reach(g["trajectory"], p["best"])
        row = {"op": name, "predoo": p["best"], "gate": g["best"], "reach": reach, "T": seconds,
               "predoo_last": p["trajectory"][-1][0] if p["trajectory"] else None,
               "predoo_evals": p["evals"], "gate_evals": g["evals"], "planted": planted}
        if planted:
            row["gate_detect"] = g_det[0] if g_det else None
            if row["gate_detect"] is None and args.detect_budget > seconds:
                def gate_run(cb, _spec=spec):
                    return run_gate(_spec, variant, args.detect_budget, args.seed + 1, store, on_best=cb)
                gate_run.detector = det
                row["gate_detect"] = detect_time(gate_run)
                row["gate_detect_note"] = "second run"
            row["predoo_detect"] = p_det[0] if p_det else None
            if row["predoo_detect"] is None and not args.quick and args.detect_budget > seconds:
                def predoo_run(cb, _spec=spec, _runner=runner):
                    return run_predoo(_spec, _runner, args.detect_budget, np.random.default_rng(args.seed + 1),
                                      guidance=args.predoo_guidance, n_seeds=args.predoo_seeds, on_best=cb)
                predoo_run.detector = det
                row["predoo_detect"] = detect_time(predoo_run)
            row["predoo_detect_budget"] = seconds if args.quick else max(seconds, args.detect_budget)
        rows.append(row)
        print(f"  {name}: Predoo {fmt(row['predoo'])} ulp ({p['evals']} evals), gate {fmt(row['gate'])} ulp "
              f"({g['evals'] if g['evals'] is not None else '?'} evals)"
              + (f", detect gate {fmt(row['gate_detect'], 's')} Predoo {fmt(row['predoo_detect'], 's')}" if planted else ""),
              flush=True)
    print_table(rows, args)
    print(f"\ntotal wall time {time.perf_counter() - t_all:.0f}s")
    return 0


def print_table(rows, args) -> None:
    head = ("operator", "Predoo max ulp", "gate max ulp", "gate t->Predoo max", "/ Predoo time", "Predoo last impr.",
            "planted: Predoo", "planted: gate")
    table = [head]
    for r in rows:
        ratio = r["reach"] / r["T"] if r["reach"] is not None else None
        if r["planted"]:
            pd = f"found {fmt(r['predoo_detect'], 's')}" if r["predoo_detect"] is not None else \
                f"not in {r['predoo_detect_budget']:g}s"
            gd = f"found {fmt(r['gate_detect'], 's')}" if r["gate_detect"] is not None else \
                f"not in {args.detect_budget:g}s"
        else:
            pd = gd = ""
        table.append((r["op"], fmt(r["predoo"]), fmt(r["gate"]), fmt(r["reach"], "s") if r["reach"] is not None else "never",
                      fmt(ratio), fmt(r["predoo_last"], "s"), pd, gd))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    print()
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    ok_err = sum(1 for r in rows if r["gate"] >= r["predoo"])
    ok_time = sum(1 for r in rows if r["reach"] is not None and r["reach"] <= r["T"] / 10)
    planted = [r for r in rows if r["planted"]]
    ok_det = sum(1 for r in planted if r["gate_detect"] is not None and r["gate_detect"] <= 60)
    print(f"\ngate max error >= Predoo's: {ok_err}/{len(rows)} ops; reached Predoo's final max error within 1/10 "
          f"of Predoo's time: {ok_time}/{len(rows)}; planted regressions detected by the gate within 60 s: "
          f"{ok_det}/{len(planted)} (Predoo: {sum(1 for r in planted if r['predoo_detect'] is not None)}/{len(planted)})")


if __name__ == "__main__":
    sys.exit(main())
