"""``dl-gate fuzz OP…``: search each operator's variants for the inputs with the largest
precision error against float64, print a table, save the worst inputs for replay."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

import numpy as np

from ..backends import get_backend
from ..errors import GateError
from ..plan import FUZZ_ORACLES, Budget, plan, validate_variant_filters
from ..report import make_output_dir
from .common import add_config_arg, add_variant_args, count, load, seconds, split_list
from .common import print_table as table
from .common import fmt_num as fmt


def register(sub) -> None:
    p = sub.add_parser("fuzz", help="fuzz operators for their worst precision error", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  dl-gate fuzz torch.softmax --per-op 5 --dtype float16 --json out.json\n"
                              "  dl-gate fuzz torch.erf --exhaustive --dtype float32 --shard 3/64 --json shard3.json")
    p.add_argument("ops", nargs="+", metavar="OP", help="operator name(s), see `dl-gate ops`")
    add_config_arg(p)
    add_variant_args(p)
    p.add_argument("--budget", type=seconds, metavar="SECONDS", help="total seconds, shared by the operators")
    p.add_argument("--per-op", type=seconds, metavar="SECONDS", help="seconds per operator (default 10 unless --evals)")
    p.add_argument("--evals", type=count, metavar="N", help="evaluations per operator (deterministic budget)")
    p.add_argument("--strategy", default="linf", help="guidance: linf (max ULP), l1 (mean ULP), random or spread (max - min)")
    p.add_argument("--oracle", action="append", metavar="ORACLE",
                   help=f"oracle(s) to run (repeatable or comma-separated; 'all' for every one that applies): "
                        f"{', '.join(FUZZ_ORACLES)} (default: the config's gate.oracles, else precision)")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="evaluate in worker processes: an exit, segfault, abort or hang becomes a crash finding "
                        "(the default; --no-isolate for trusted code; config gate.isolate)")
    p.add_argument("--eval-timeout", type=seconds, metavar="SECONDS",
                   help="seconds one isolated evaluation may take before it counts as a hang "
                        "(default: the config's gate.eval_timeout, else 10)")
    p.add_argument("--seed", type=int, help="random seed (default: the config's, else 0); printed")
    p.add_argument("--scheduler", default="uct", choices=["uct", "uniform"],
                   help="mutation scheduler: uct (bandit, default) or uniform (control)")
    p.add_argument("--no-seeds", action="store_true",
                   help="ignore stored seeds (<baselines>/seeds from `dl-gate harvest`, OpInfo samples)")
    p.add_argument("--exhaustive", action=argparse.BooleanOptionalAction, default=None,
                   help="elementwise rows run every float16/bfloat16 value by default (--no-exhaustive: the search "
                        "alone); --exhaustive with --dtype float32 sweeps the 2^32 float32 values of --shard")
    p.add_argument("--shard", metavar="I/N", default="1/1",
                   help="with --exhaustive at float32: run shard I of N of the 2^32 values (a nightly or GPU "
                        "campaign; join the shards' JSON with `python -m gate.fuzz.exhaustive merge FILES`)")
    p.add_argument("--strided", action="store_true",
                   help="with --exhaustive at float32: pass the values as strided views (the kernel's element-by-"
                        "element loop, which non-contiguous tensors and vector tails take) instead of contiguous chunks")
    p.add_argument("--json", metavar="FILE", help="write findings (with worst inputs) as JSON")
    p.add_argument("--save-inputs", metavar="DIR", default="dl-gate-out/inputs",
                   help="directory for worst inputs as .npz (default dl-gate-out/inputs)")
    p.set_defaults(func=run)


def oracle_list(names) -> List[str]:
    if not names:
        return ["precision"]
    if "all" in names:
        return list(FUZZ_ORACLES)
    for n in names:
        if n not in FUZZ_ORACLES:
            raise GateError(f"unknown oracle {n!r} (use {', '.join(FUZZ_ORACLES)} or all)")
    return list(names)




def run(args) -> int:
    from ..fuzz import GUIDANCES, fuzz_task

    cfg, catalog = load(args)
    if args.strategy not in GUIDANCES:
        raise GateError(f"unknown strategy {args.strategy!r} (use {', '.join(GUIDANCES)})")
    dtypes, modes, devices = split_list(args.dtype), split_list(args.mode), split_list(args.device)
    validate_variant_filters(dtypes, modes, devices)
    oracles = oracle_list(split_list(args.oracle) or cfg.gate.get("oracles"))
    from ..backends.isolate import isolate_options

    isolate = isolate_options(args.isolate, args.eval_timeout, cfg.gate)
    specs = [catalog.get(n) for n in args.ops]
    seed = args.seed if args.seed is not None else cfg.seed
    # --budget and/or --evals as given; neither: 10 seconds per operator
    # --per-op (or --budget shared by the operators) and/or --evals as given; none: 10 s per operator
    secs = args.per_op or (args.budget / len(specs) if args.budget else None)
    per_op = Budget(seconds=secs if (secs or not args.evals) else None, evals=args.evals)
    if per_op.seconds is None and per_op.evals is None:
        per_op = Budget(seconds=10.0)
    tasks = []
    for spec in specs:
        backend = get_backend(spec.framework)
        tasks.extend(plan([spec], per_op, per_op=per_op, seed=seed, strategy=args.strategy, dtypes=dtypes,
                          devices=devices, modes=modes, available_devices=backend.devices(), oracles=oracles))
    if not tasks:
        raise GateError("no variant to fuzz on this machine (check --dtype/--device/--mode)")
    from ..oracles.references import is_true_reference

    for spec in specs:  # fail fast, before any work, on an un-importable callable
        get_backend(spec.framework).resolve(spec.callable, spec.construct)
        if spec.reference and not is_true_reference(spec.reference):
            get_backend(spec.framework).resolve(spec.reference)
    if args.exhaustive and any(t.variant.dtype == "float32" for t in tasks):
        return sweep_float32(args, [t for t in tasks if t.variant.dtype == "float32"])
    print(f"dl-gate fuzz: seed {seed}, strategy {args.strategy}, budget per operator: "
          + (f"{per_op.seconds:g}s" if per_op.seconds else "") + (" " if per_op.seconds and per_op.evals else "")
          + (f"{per_op.evals} evals" if per_op.evals else ""), file=sys.stderr)
    findings = []
    store = None
    if not args.no_seeds:
        from ..search.seeds import SeedStore

        store = SeedStore(cfg.baselines_dir / "seeds")
    from .common import Progress

    with Progress() as say:  # rich on a terminal, one line per variant in CI (as run and refresh)
        for i, task in enumerate(tasks, 1):
            say(f"fuzzing {task.id} ({i}/{len(tasks)})")
            findings.append(fuzz_task(task, seed_store=store, scheduler=args.scheduler, isolate=isolate,
                                      exhaustive=args.exhaustive is not False))
    print_table(findings)
    out_dir = Path(args.save_inputs) if args.save_inputs else None
    if out_dir:
        saved = save_inputs(findings, out_dir)
        if saved:
            print(f"\nworst inputs saved under {out_dir}/ ({saved} files)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"seed": seed, "findings": [f.to_dict() for f in findings]}, indent=1))
    return 0


def print_table(findings) -> None:
    header = ("variant", "status", "evals", "max ulp", "max abs", "max rel", "nan/inf", "crash", "worst input")
    rows = []
    for f in findings:
        m = f.metrics
        # with a NaN/Inf as the worst input, the error columns show the worst finite error found
        e = f.finite_metrics if f.finite_metrics is not None and m is not None and m.nonfinite else m
        rows.append((
            f.id, f.status + (" (exhaustive)" if f.extra.get("search") == "exhaustive" else ""), str(f.evals),
            fmt(e.ulp) if e else "-", fmt(e.abs) if e else "-", fmt(e.rel) if e else "-",
            ("shape!" if m.shape_mismatch else str(m.nonfinite)) if m else "-", str(sum(c.count for c in f.crashes)),
            (f.best.summary() if f.best else (f.message or "")),
        ))
    table(header, rows)
    for f in findings:
        for c in f.crashes:
            print(f"crash in {f.id}: {c.signature} (x{c.count}): {c.message}")
        if f.metrics is not None and f.metrics.shape_mismatch:
            print(f"shape mismatch in {f.id}: {f.metrics.shape_mismatch}")
    for f in findings:
        facts = {k: v for k, v in f.extra.items() if k not in ("oracle", "pair", "search") and not isinstance(v, (list, dict))}
        ex = f.extra.get("exhaustive")
        if isinstance(ex, dict):
            print(f"{f.id}: exhaustive over every {ex['dtype']} value ({ex['values']} inputs, reference "
                  f"{ex['reference']}): exact max {fmt(ex['max_ulp']) if isinstance(ex['max_ulp'], float) else ex['max_ulp']}"
                  f" ulp at x = {ex['worst_input']!r}" + (f" {ex['worst_params']}" if ex.get("worst_params") else ""))
        if facts:
            print(f"{f.id}: " + ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in facts.items()))


def sweep_float32(args, tasks) -> int:
    """``--exhaustive`` at float32: every float32 value of ``--shard`` through each elementwise
    operator (in this process: a campaign over trusted rows), its exact maximum and input."""
    from ..fuzz import exhaustive as EX
    from ..oracles.runner import VariantRunner

    shard = EX.parse_shard(args.shard)
    results = []
    for task in tasks:
        if not task.op.elementwise or EX.float_input(task.op) is None or task.variant.oracle != "precision":
            raise GateError(f"{task.op.name}: --exhaustive at float32 needs an elementwise row with one float input "
                            "(elementwise: true)")
        lo, hi = EX.shard_range(*shard)
        print(f"{task.id}: float32 values {lo:#010x}..{hi - 1:#010x} (shard {args.shard}, {hi - lo} values)",
              file=sys.stderr)
        with np.errstate(all="ignore"):
            r = EX.sweep(VariantRunner(task.op, task.variant), task.op, task.variant, shard=shard,
                         strided=args.strided)
        results.append(r)
        print(f"{task.id} shard {r['shard']} ({r['path']}): {r['values']} values, exact max {fmt(r.get('max_ulp'))} ulp at "
              f"x = {r.get('worst_input')!r} ({r.get('worst_bits')}), {r['nonfinite']} NaN/Inf where float64 is "
              f"finite, {r['seconds']:.1f}s" + (f", {r['failed']} values failed" if r["failed"] else ""))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"sweeps": results}, indent=1))
    return 0


def save_inputs(findings, out_dir: Path) -> int:
    n = 0
    for f in findings:
        cands = [("worst", f.best), ("finite", f.best_finite)] + [(f"crash{i}", c.candidate) for i, c in enumerate(f.crashes)]
        for tag, cand in cands:
            if cand is None:
                continue
            d = make_output_dir(out_dir / f.op)
            cand.save(d / f"{f.variant.key.replace('/', '_')}.{tag}.npz")
            n += 1
    return n
