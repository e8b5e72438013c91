"""``dl-gate baseline refresh`` and ``dl-gate merge``: (re)measure baselines, shard and merge.

A refresh fuzzes each operator variant within the budget and writes one row per
operator x variant x environment (errors found, the worst inputs as a replay corpus, budget
spent, date), atomically, never deleting rows it did not re-measure, and prints what changed.
``--shard i/N`` measures every N-th operator (a CI matrix); ``dl-gate merge`` joins the shards.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, List, Optional

from ..errors import GateError
from ..plan import validate_variant_filters
from .common import Progress, add_config_arg, add_variant_args, count, load, seconds, split_list


def register(sub) -> None:
    p = sub.add_parser("baseline", help="manage baselines (refresh)")
    bsub = p.add_subparsers(dest="baseline_command", metavar="ACTION")
    r = bsub.add_parser("refresh", help="re-measure baselines and write them under baselines/", formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  dl-gate baseline refresh --budget 600\n"
                               "  dl-gate baseline refresh --ops torch.softmax --per-op 30 --shard 1/4 --out shard1")
    add_config_arg(r)
    r.add_argument("--ops", action="append", metavar="OP", help="only these operators (default: the config's operators)")
    r.add_argument("--budget", type=seconds, metavar="SECONDS", help="total seconds, shared by the operators "
                   "(until 0.1 this flag was per operator: that is --per-op now)")
    r.add_argument("--per-op", type=seconds, metavar="SECONDS", help="seconds per operator (default: config budget.per_op, else 10)")
    r.add_argument("--evals", type=count, metavar="N", help="evaluations per variant instead of seconds")
    r.add_argument("--seed", type=int, help="random seed (default: the config's)")
    r.add_argument("--shard", metavar="I/N", help="measure only shard I of N (1-based) of the operators")
    r.add_argument("--out", metavar="DIR", help="write here instead of the config's baselines dir (for shards)")
    r.add_argument("--nightly", action="store_true",
                   help="also run the scheduled multi-operator graph and deployment-path (export) campaigns")
    r.add_argument("--nightly-budget", type=seconds, metavar="SECONDS", default=300.0,
                   help="total budget of the nightly campaigns (default 300)")
    add_variant_args(r)
    r.set_defaults(func=run_refresh)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    m = sub.add_parser("merge", help="merge baseline shards (from `baseline refresh --shard`) into baselines/", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  dl-gate merge shard1 shard2 --into baselines")
    add_config_arg(m)
    m.add_argument("shards", nargs="+", metavar="DIR")
    m.add_argument("--into", metavar="DIR", help="target baselines dir (default: the config's)")
    m.set_defaults(func=run_merge)


def parse_shard(text: Optional[str]):
    if not text:
        return None
    mt = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not mt or not (1 <= int(mt.group(1)) <= int(mt.group(2))):
        raise GateError(f"--shard must look like I/N with 1 <= I <= N, not {text!r}")
    return int(mt.group(1)), int(mt.group(2))


def refresh_minutes(n_ops: int, per_op: float) -> str:
    """How long a time-budgeted refresh of ``n_ops`` operators takes, in words: each operator's
    search budget, which its variants share (deep-spin/entmax: 22 operators at 10 s, 216 s)."""
    s = n_ops * per_op
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def refresh_baselines(cfg, *, ops: Optional[List[str]], per_op: Optional[float], evals: Optional[int], seed: int,
                      total: Optional[float] = None,
                      out: Path, say: Callable[[str], None], shard=None, dtypes=None, devices=None, modes=None):
    from ..backends import FRAMEWORKS, get_backend
    from ..fuzz import fuzz_task
    from ..search.seeds import SeedStore
    from ..judge.baselines import check_writable, ignored_by_git, write_rows
    from ..ops.catalog import load_catalog
    from ..plan import Budget, Task, plan

    catalog = load_catalog(cfg.ops, builtin=FRAMEWORKS)
    names = [catalog.get(n).name for n in ops] if ops else [s.name for s in cfg.ops]
    if not names and cfg.path is None:
        raise GateError("no .dl-gate.yml here: run `dl-gate init` first (or name built-in operators with --ops)")
    if not names:
        raise GateError("nothing to refresh: the config declares no operators (name some with --ops)")
    names = sorted(names)
    if shard:
        i, n = shard
        names = names[i - 1::n]
    check_writable(out, names)
    from ..backends.sandbox import unset_names

    unset = unset_names(cfg.raw.get("env"))
    hint = ""
    if unset:  # init wrote them because the library's tests (or its import) need them
        hint = (f"; the config's env: names {', '.join(unset)}, not set here: export {unset[0]}=... as the "
                "job does (dl-gate init --env gave its value)")
        say(f"warning: the config's env: names {', '.join(unset)}, not set in this environment")
    if per_op is None and total:  # --budget: total seconds, shared by this shard's operators
        per_op = total / len(names)
    gate_cfg = cfg.gate
    dtypes = dtypes or gate_cfg.get("dtypes")
    findings = []
    frameworks = {}
    seed_store = SeedStore(cfg.baselines_dir / "seeds")  # the same seeds the gate's runs start from
    from ..backends.isolate import isolate_options

    isolate = isolate_options(None, None, gate_cfg)
    _build(cfg, say)
    kernels = _triton(cfg, catalog)
    each = per_op or cfg.budget.get("per_op") or 10.0
    say(f"refreshing {len(names)} operator(s): " + (f"{evals} evaluations per variant" if evals else
        f"{each:g}s of search each (budget.per_op), at least {refresh_minutes(len(names), each)} in all "
        "(a slow operator's variants take longer: each searches at least 20 evaluations)"))
    for k, name in enumerate(names, 1):
        spec = catalog.get(name)
        if kernels is not None:
            spec = kernels.adjust(spec)  # Triton kernels: measured on the device they run on, as `run` fuzzes them
        frameworks[name] = spec.framework
        backend = get_backend(spec.framework)
        budget = Budget(seconds=None if evals else (per_op or cfg.budget.get("per_op") or 10.0))
        want = [d for d in dtypes if d in spec.dtypes] if dtypes else None
        tasks = plan([spec], budget, per_op=budget, seed=seed, dtypes=want, devices=devices or gate_cfg.get("devices"),
                     modes=modes or gate_cfg.get("modes"), available_devices=backend.devices(),
                     oracles=gate_cfg.get("oracles"))
        grad_spec = _grad_row(spec, tasks, isolate, say)
        for t in tasks:
            if t.variant.oracle == "grad" and grad_spec is not spec:
                t = Task(op=grad_spec, variant=t.variant, budget=t.budget, seed=t.seed, strategy=t.strategy)
            if evals:
                t = Task(op=t.op, variant=t.variant, budget=Budget(evals=evals), seed=t.seed, strategy=t.strategy)
            say(f"[{k}/{len(names)}] measuring {t.id} ({t.budget.evals} evals)" if t.budget.evals else
                f"[{k}/{len(names)}] measuring {t.id} ({t.budget.seconds:.3g}s)")
            findings.append(fuzz_task(t, seed_store=seed_store, isolate=isolate))
    # a variant where nothing was measured gets no row: a "0 ulp" row would make it look exact
    unmeasured = [f for f in findings if f.status in ("no-valid-input", "error")
                  or (f.status == "ok" and f.metrics is None and not f.crashes)]
    for f in unmeasured:
        say(f"not recorded: {f.id}: {f.status}: {f.message or 'no input gave a result'}")
    changes = write_rows(out, [f for f in findings if f not in unmeasured], frameworks)
    ignored = ignored_by_git(out)
    if ignored:
        say(f"warning: {ignored}")
    if unmeasured:
        raise GateError(f"{len(unmeasured)} variant(s) could not be measured, e.g. {unmeasured[0].id}: "
                        f"{unmeasured[0].message or unmeasured[0].status} (the other rows were written){hint}")
    return changes


def _grad_row(spec, tasks, isolate, say):
    """The row ``spec``'s gradient variants are measured with: as ``run`` judges them
    (gate.judge.structure: a row elementwise only by default is asked whether it is)."""
    from ..judge.structure import judged_for_grad, needs_probe, probe_structure, say_structure

    if not needs_probe(spec) or not any(t.variant.oracle == "grad" for t in tasks):
        return spec
    found = probe_structure(spec, isolate, side="this tree")
    line = say_structure(spec.name, found)
    if line:
        say(line)
    return judged_for_grad(spec, found)


def _build(cfg, say) -> None:
    """A library with a native extension (``build:``) is built before it is measured, as ``run``
    builds head: cached by source hash, a failure is the refresh's error naming the first compiler line."""
    from ..backends.build import BuildSpec, build_tree

    spec = BuildSpec.from_config(cfg.raw.get("build"), cfg.root)
    if spec is not None:
        res = build_tree(cfg.root, spec, "head", say)
        say(f"build: {'restored from the cache' if res.cached else 'built'} ({len(res.files)} file(s))")


def _triton(cfg, catalog):
    """The operators that launch Triton kernels (read from the committed tree, as ``run`` reads
    head), with the mode this machine runs them in; ``None`` when none does or no git tree is here."""
    from ..backends.triton_support import activate
    from ..select.kernels import operator_kernels

    try:
        found = operator_kernels(cfg.root, "HEAD", catalog, cfg)
    except GateError:
        return None
    return activate(found)


def refresh_nightly(cfg, *, budget: float, seed: int, out: Path, say: Callable[[str], None]):
    """Graph and export campaigns (gate.graphs.nightly): their findings become baseline rows like
    any other (op = the graph signature or operator, variant .../graph or .../export)."""
    from ..graphs.nightly import run_nightly
    from ..judge.baselines import write_rows
    from ..ops.catalog import load_catalog

    catalog = load_catalog(cfg.ops, builtin=cfg.builtin or ("torch",))
    frameworks = sorted({s.framework for s in catalog})
    say(f"nightly campaigns: graphs + export, {budget:g}s over {', '.join(frameworks)}")
    findings = run_nightly(list(catalog), budget_seconds=budget, seed=seed, frameworks=tuple(frameworks))
    return write_rows(out, findings, {f.op: f.framework for f in findings})


def run_refresh(args) -> int:
    validate_variant_filters(split_list(args.dtype), split_list(args.mode), split_list(args.device))
    cfg, _ = load(args)
    shard = parse_shard(args.shard)
    out = Path(args.out) if args.out else cfg.baselines_dir
    seed = args.seed if args.seed is not None else cfg.seed
    say = Progress()  # rich on a terminal, one line per message in CI
    changes = []
    with say:
        changes = _refresh(args, cfg, out, seed, shard, say)
    for c in changes:
        print(c.line())
    n = {k: sum(c.kind == k for c in changes) for k in ("added", "changed", "unchanged")}
    print(f"\n{out}: {n['added']} added, {n['changed']} changed, {n['unchanged']} unchanged row(s)")
    return 0


def _refresh(args, cfg, out, seed, shard, say) -> list:
    changes = []
    # the config's deterministic budget (budget.evals) unless seconds are asked for here
    evals = args.evals or (cfg.budget.get("evals") if args.per_op is None and args.budget is None else None)
    if cfg.ops or args.ops or not args.nightly:
        changes = refresh_baselines(cfg, ops=split_list(args.ops), per_op=args.per_op, total=args.budget, evals=evals, seed=seed,
                                    out=out, say=say, shard=shard, dtypes=split_list(args.dtype),
                                    devices=split_list(args.device), modes=split_list(args.mode))
    if args.nightly:
        changes += refresh_nightly(cfg, budget=args.nightly_budget, seed=seed, out=out, say=say)
    return changes


def run_merge(args) -> int:
    from ..judge.baselines import merge_dirs

    cfg, _ = load(args)
    target = Path(args.into) if args.into else cfg.baselines_dir
    for s in args.shards:
        if not Path(s).is_dir():
            raise GateError(f"shard directory {s} does not exist")
    changes = merge_dirs(target, [Path(s) for s in args.shards])
    for c in changes:
        print(c.line())
    print(f"\nmerged {len(args.shards)} shard(s) into {target}: {len(changes)} row(s)")
    return 0
