"""``dl-gate baseline refresh`` and ``dl-gate merge``: (re)measure baselines, shard and merge.

A refresh fuzzes each operator variant within the budget and writes one row per
operator x variant x environment (errors found, the worst inputs as a replay corpus, budget
spent, date), atomically, never deleting rows it did not re-measure, and prints what changed.
``--shard i/N`` measures every N-th operator (a CI matrix); ``dl-gate merge`` joins the shards.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

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
    r.add_argument("--jobs", type=count, metavar="N",
                   help="operators measured at once, each by its own process (default: $DL_GATE_JOBS, else one per "
                        "core the config's threads leave, at most 4; 1 without isolation)")
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


def refresh_minutes(n_ops: int, per_op: float, jobs: int = 1) -> str:
    """How long a time-budgeted refresh of ``n_ops`` operators takes, in words: each operator's
    search budget, which its variants share (deep-spin/entmax: 22 operators at 10 s, 216 s),
    ``jobs`` operators at a time."""
    s = -(-n_ops // max(1, jobs)) * per_op
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def refresh_baselines(cfg, *, ops: Optional[List[str]], per_op: Optional[float], evals: Optional[int], seed: int,
                      total: Optional[float] = None,
                      out: Path, say: Callable[[str], None], shard=None, dtypes=None, devices=None, modes=None,
                      jobs: Optional[int] = 1):
    from ..backends import FRAMEWORKS
    from ..search.seeds import SeedStore
    from ..judge.baselines import check_writable, ignored_by_git, write_rows
    from ..ops.catalog import load_catalog

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
    jobs = refresh_jobs(jobs, len(names), isolate)
    at_once = f", {jobs} at a time (--jobs)" if jobs > 1 else ""
    say(f"refreshing {len(names)} operator(s){at_once}: " + (f"{evals} evaluations per variant" if evals else
        f"{each:g}s of search each (budget.per_op), at least {refresh_minutes(len(names), each, jobs)} in all "
        "(a slow operator's variants take longer: each searches at least 20 evaluations)"))
    job = _OpJob(cfg=cfg, catalog=catalog, kernels=kernels, per_op=per_op, evals=evals, seed=seed, dtypes=dtypes,
                 devices=devices or gate_cfg.get("devices"), modes=modes or gate_cfg.get("modes"),
                 oracles=gate_cfg.get("oracles"), seed_store=seed_store, isolate=isolate, n=len(names))
    failed = []  # (operator, its error): the other operators are still measured and written
    for name, result in _measure_all(job, names, jobs, say):
        if isinstance(result, GateError):
            say(f"not recorded: {name}: {result}")
            failed.append((name, result))
            continue
        frameworks.update(result[0])
        findings += result[1]
    # a variant where nothing was measured gets no row: a "0 ulp" row would make it look exact
    unmeasured = [f for f in findings if f.status in ("no-valid-input", "error")
                  or (f.status == "ok" and f.metrics is None and not f.crashes)]
    for f in unmeasured:
        say(f"not recorded: {f.id}: {f.status}: {f.message or 'no input gave a result'}")
    changes = write_rows(out, [f for f in findings if f not in unmeasured], frameworks)
    ignored = ignored_by_git(out)
    if ignored:
        say(f"warning: {ignored}")
    if failed:
        raise GateError(f"{len(failed)} operator(s) could not be measured, e.g. {failed[0][0]}: {failed[0][1]} "
                        f"(the other rows were written){hint}")
    if unmeasured:
        raise GateError(f"{len(unmeasured)} variant(s) could not be measured, e.g. {unmeasured[0].id}: "
                        f"{unmeasured[0].message or unmeasured[0].status} (the other rows were written){hint}")
    return changes


def refresh_jobs(asked: Optional[int], n_ops: int, isolate) -> int:
    """How many processes measure the operators: ``asked`` (``--jobs``; ``$DL_GATE_JOBS``; by
    default as many as the cores this process may use hold operator calls of the config's
    ``threads`` each, at most 4), never more than the operators, and 1 without isolation (the
    library's code then runs in the measuring process itself, where a crash must end one
    refresh, not several) or where a call computes on every core (``threads: 0``)."""
    from ..backends.base import intra_op_threads

    if asked is None:
        env = os.environ.get("DL_GATE_JOBS")
        if env:
            try:
                asked = int(env)
            except ValueError:
                raise GateError(f"DL_GATE_JOBS must be a whole number of processes, not {env!r}") from None
        else:
            threads = intra_op_threads()
            asked = 1 if threads == 0 else min(4, max(1, _cores() // threads))
    if asked < 1:
        raise GateError(f"--jobs must be at least 1, not {asked}")
    if isolate is None:
        return 1
    return max(1, min(asked, n_ops))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass
class _OpJob:
    """What measuring one operator needs, the same in this process and in a pool's (picklable)."""
    cfg: object
    catalog: object
    kernels: object
    per_op: Optional[float]
    evals: Optional[int]
    seed: int
    dtypes: Optional[list]
    devices: Optional[list]
    modes: Optional[list]
    oracles: Optional[list]
    seed_store: object
    isolate: object
    n: int


def _measure_op(job: _OpJob, k: int, name: str, say) -> Tuple[Dict[str, str], list]:
    """({operator: framework}, findings) of operator ``name`` (the ``k``-th of ``job.n``): each of
    its variants searched within the budget, as ``run`` fuzzes them."""
    from ..fuzz import fuzz_task
    from ..plan import Budget, Task, plan

    spec = job.catalog.get(name)
    if job.kernels is not None:
        spec = job.kernels.adjust(spec)  # Triton kernels: measured on the device they run on, as `run` fuzzes them
    cfg, evals = job.cfg, job.evals
    budget = Budget(seconds=None if evals else (job.per_op or cfg.budget.get("per_op") or 10.0))
    want = [d for d in job.dtypes if d in spec.dtypes] if job.dtypes else None
    tasks = plan([spec], budget, per_op=budget, seed=job.seed, dtypes=want, devices=job.devices, modes=job.modes,
                 available_devices=_devices(spec.framework, job.isolate), oracles=job.oracles)
    grad_spec = _grad_row(spec, tasks, job.isolate, say)
    findings = []
    for t in tasks:
        if t.variant.oracle == "grad" and grad_spec is not spec:
            t = Task(op=grad_spec, variant=t.variant, budget=t.budget, seed=t.seed, strategy=t.strategy)
        if evals:
            t = Task(op=t.op, variant=t.variant, budget=Budget(evals=evals), seed=t.seed, strategy=t.strategy)
        say(f"[{k}/{job.n}] measuring {t.id} ({t.budget.evals} evals)" if t.budget.evals else
            f"[{k}/{job.n}] measuring {t.id} ({t.budget.seconds:.3g}s)")
        findings.append(fuzz_task(t, seed_store=job.seed_store, isolate=job.isolate))
    return {name: spec.framework}, findings


_FACTS: Dict[tuple, object] = {}


def _devices(framework: str, isolate) -> List[str]:
    """The devices ``framework`` has, as a worker sees them (gate.backends.facts, as ``run`` asks):
    the measuring process never imports the framework itself (~1.2 s of CPU for torch, before the
    first row; the operators' workers are forked from the warm zygote). One question a process
    and framework."""
    from ..backends.facts import BackendFacts

    key = (framework, repr(isolate))
    if key not in _FACTS:
        _FACTS[key] = BackendFacts(isolate)
    return _FACTS[key].devices(framework)


def _measure_all(job: _OpJob, names: List[str], jobs: int, say):
    """``(operator, ({operator: framework}, findings))`` for each of ``names``, in their order
    whatever the order they were measured in, or ``(operator, the GateError that stopped it)``.
    With ``jobs`` > 1 the operators are measured by that many processes at once (a variant's
    search is one process and its worker, one core between them: a 2-core runner measures two
    operators at a time), their messages relayed to ``say``; every variant's search is the same
    task with the same seed either way (``--evals``: the same rows)."""
    if jobs > 1:
        import pickle

        try:
            pickle.dumps(job)  # what a pool process is sent: a config holding something no process can receive
        except Exception as exc:
            say(f"measuring in one process: the config cannot be sent to another ({type(exc).__name__}: {exc})"[:300])
            jobs = 1
    if jobs <= 1:
        for k, name in enumerate(names, 1):
            try:
                yield name, _measure_op(job, k, name, say)
            except GateError as exc:
                yield name, exc
        return
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold a framework's threads
    messages = ctx.Queue()

    def relay() -> None:
        for line in iter(messages.get, None):
            say(line)

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_pool_init,
                                 initargs=(messages, job.cfg)) as pool:
            futures = [pool.submit(_pool_measure, job, k, name) for k, name in enumerate(names, 1)]
            for name, fut in zip(names, futures):
                try:
                    yield name, fut.result()
                except GateError as exc:
                    yield name, exc
                except BrokenProcessPool:  # a measuring process killed (out of memory): no library code runs there
                    raise GateError(f"a measuring process ended while {name} was measured (out of memory?): "
                                    "run `dl-gate baseline refresh --jobs 1`") from None
    finally:
        messages.put(None)
        relay_thread.join(timeout=5)


_POOL_SAY = None


def _pool_init(messages, cfg) -> None:
    """A pool process: its messages go to the parent's display; the library's directories on the
    import path as in the parent (``cfg.activate``)."""
    global _POOL_SAY
    _POOL_SAY = messages.put
    cfg.activate()


def _pool_measure(job: _OpJob, k: int, name: str):
    return _measure_op(job, k, name, _POOL_SAY or (lambda _m: None))


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
                                    devices=split_list(args.device), modes=split_list(args.mode), jobs=args.jobs)
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
