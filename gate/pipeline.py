"""One run of the gate: select -> plan -> fuzz -> replay on base -> judge -> (localise) -> report.

This module wires the stages together and nothing more: each stage lives in its own package.
A :class:`gate.errors.GateError` anywhere still produces a report (outcome ``error``) with every
verdict computed so far, so a JUnit file and the report are always written.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import HARNESS_VERSION, __version__
from .backends import get_backend
from .config import DEFAULT_BUDGET_TOTAL, Config, load_config, parse_config
from .errors import GateError, Outcome, SetupError, Terminated
from .judge import verdict as V
from .judge.baselines import BaselineError, BaselineStore, GitBaselineSource
from .judge.decide import (GateSettings, base_side, decide, judged_row, overall, recheck_determinism, refinements,
                           stability_fixes, under_searched)
from .judge.replay import (OUT_OF_TIME, ReplayJob, base_isolate_options, deciding_inputs, replay_head, replay_in_tree,
                           suspicion, worktree)
from .ops.catalog import Catalog, load_catalog
from .ops.spec import OpSpec
from .plan import Budget, Task, plan
from .report import FILES, make_output_dir
from .search.evaluation import CRASH, OK
from .report.annotations import NOT_GATED_WARNING, how_to_gate


@dataclass
class RunOptions:
    repo: Path = Path(".")
    base: Optional[str] = None
    head: str = "HEAD"
    config: Optional[Path] = None
    out: Path = Path("dl-gate-out")
    budget_total: Optional[float] = None
    budget_per_op: Optional[float] = None
    evals: Optional[int] = None  # per variant (deterministic budget)
    seed: Optional[int] = None
    ops: Optional[List[str]] = None  # force these operators instead of selecting from the diff
    dtypes: Optional[List[str]] = None
    devices: Optional[List[str]] = None
    modes: Optional[List[str]] = None
    strategy: Optional[str] = None
    oracles: Optional[List[str]] = None  # default: the config's gate.oracles, else precision
    isolate: Optional[bool] = None  # default: the config's gate.isolate
    eval_timeout: Optional[float] = None  # default: the config's gate.eval_timeout, else 10 s
    progress: Optional[Callable[[str], None]] = None
    #: called with (the report so far, the progress line) at each step: the supervisor's state
    checkpoint: Optional[Callable[[V.GateReport, str], None]] = None


def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, encoding="utf-8", errors="replace")
    if res.returncode != 0:
        msg = (res.stderr.strip().splitlines() or ["git failed"])[-1]
        raise GateError(f"git {' '.join(args)}: {msg}")
    return res.stdout.strip()


def base_config(repo: Path, rev: str, rel: str) -> Optional[Config]:
    res = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{rel}"], capture_output=True, encoding="utf-8", errors="replace")
    if res.returncode != 0:
        return None
    return parse_config(res.stdout, Path(f"{rel}@{rev[:10]}"), root=repo)


#: repository -> (head commit, python_path roots) of the run, set by setup_stage: where
#: :func:`op_source` looks an operator up without importing it
_SOURCE_TREES: Dict[str, Tuple[str, List[str]]] = {}
_SOURCE_INDEX: Dict[Tuple[str, str], object] = {}


def op_source(spec: OpSpec, repo: Path) -> Tuple[Optional[str], Optional[int]]:
    """File (relative to the repo when inside it) and line of the operator's definition.

    This process (the judge) never imports the code under test for it: a user operator is found
    statically (the selection's Python index of head), else by a separate process with the
    workers' environment; a built-in operator is the framework's own, looked up here only where
    this process has imported the framework already."""
    import sys

    if spec.origin == "user":
        found = _static_source(spec, repo)
        return found if found is not None else _worker_source(spec, repo)
    if spec.framework not in sys.modules:
        return _worker_source(spec, repo)
    try:
        fn = get_backend(spec.framework).resolve(spec.callable, spec.construct)
        fn = inspect.unwrap(fn)
        path = inspect.getsourcefile(fn)
        line = inspect.getsourcelines(fn)[1]
    except Exception:
        return (spec.sources[0] if spec.sources else None), None
    if path is None:
        return None, None
    return _relative(path, repo), line


def _relative(path: str, repo: Path) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path(repo).resolve()))
    except ValueError:
        return str(p)


def _static_source(spec: OpSpec, repo: Path) -> Optional[Tuple[str, int]]:
    """(file, first line) of the definition in head's Python index; None where it cannot tell
    (a callable outside the repository, an assignment from a call, a dynamic definition)."""
    from .changes.git import Git
    from .changes.pyindex import PyIndex

    key = str(Path(repo).resolve())
    head, roots = _SOURCE_TREES.get(key, ("HEAD", [""]))
    try:
        idx = _SOURCE_INDEX.get((key, head))
        if idx is None:
            idx = _SOURCE_INDEX[(key, head)] = PyIndex(Git(Path(repo)), head, roots)
        ent = idx.resolve_dotted(spec.callable)
        if ent is None or ent.kind not in ("def", "var"):
            return None
        mod = idx.module(ent.module)
        path = idx.path_of.get(ent.module)
        if mod is None or path is None:
            return None
        if ent.kind == "def":
            return path, int(mod.defs[ent.key].start)
        stmts = mod.assigns.get(ent.key) or []
        return (path, int(stmts[0].lineno)) if stmts else None
    except Exception:  # noqa: BLE001 - an index that cannot tell: the worker looks it up
        return None


_LOCATE = """
import importlib, inspect, json, os, sys
out, name = sys.argv[1], sys.argv[2]
mod, _, attr = name.partition(":")
if not attr:
    mod, _, attr = name.rpartition(".")
obj = importlib.import_module(mod)
for a in [a for a in attr.split(".") if a]:
    obj = getattr(obj, a)
obj = inspect.unwrap(obj)
with open(out, "w") as f:
    json.dump([inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1]], f)
sys.stdout.flush()
os._exit(0)
"""


def _worker_source(spec: OpSpec, repo: Path) -> Tuple[Optional[str], Optional[int]]:
    """The definition as a separate process with the workers' environment finds it."""
    import sys
    import tempfile

    from .backends.sandbox import worker_env

    fallback = (spec.sources[0] if spec.sources else None), None
    key = str(Path(repo).resolve())
    roots = _SOURCE_TREES.get(key, ("HEAD", [""]))[1]
    paths = [str(Path(repo) / r) for r in roots]
    with tempfile.TemporaryDirectory(prefix="dl-gate-source-") as tmp:
        out = Path(tmp) / "source.json"
        try:
            subprocess.run([sys.executable, "-c", _LOCATE, str(out), spec.callable], cwd=str(repo),
                           env=worker_env(path_front=paths), capture_output=True, timeout=120)
            path, line = json.loads(out.read_text())
        except (OSError, ValueError, TypeError, subprocess.TimeoutExpired):
            return fallback
    if not path:
        return fallback
    return _relative(path, repo), int(line)


def _selection(opts: RunOptions, cfg: Config, catalog: Catalog, base_sha: str, head_sha: str):
    if opts.ops:
        return [{"op": catalog.get(n).name, "reasons": [{"kind": "forced", "file": None, "line": None,
                                                          "symbol": n, "path": [n]}]} for n in opts.ops], {}
    from .select import select_ops

    sel = select_ops(opts.repo, base_sha, head_sha, catalog, cfg)
    d = sel.to_dict()
    return d.get("selected", []), d


def run_gate(opts: RunOptions) -> V.GateReport:
    t0 = time.perf_counter()
    report = V.GateReport(outcome=Outcome.ERROR.value, reason="", seed=opts.seed)

    def say(line: str) -> None:
        if opts.progress:
            opts.progress(line)
        if opts.checkpoint:
            opts.checkpoint(report, line)
    report.env["gate_version"] = __version__
    report.env["harness"] = HARNESS_VERSION
    try:
        clear_previous_run(Path(opts.out))
        make_output_dir(opts.out)
        _run(opts, report, say)
    except GateError as exc:
        report.stopped(str(exc))
        if isinstance(exc, SetupError):
            report.env["setup_error"] = True
    except Terminated as exc:
        report.stopped(str(exc))
    except SystemExit as exc:  # code the gate imported ended the process (a sys.exit at import or in a runner)
        report.stopped(f"the operator library called sys.exit({exc.code!r}) outside an evaluation; run with "
                         "--isolate to contain it")
    except Exception as exc:  # a harness fault: still an `error` report, with what was computed
        import traceback

        traceback.print_exc()
        report.stopped(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    report.seconds = round(time.perf_counter() - t0, 2)
    return report


#: what a run writes under its output directory; an earlier run's copies are removed first, so
#: that repro scripts of another branch never sit next to this run's report
RUN_OUTPUTS = ("repro", "findings", *FILES.values())


def clear_previous_run(out: Path) -> None:
    """Only where an earlier dl-gate run left its report.json (never in a directory of the user's)."""
    try:
        prev = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return
    if not (isinstance(prev, dict) and "gate_version" in (prev.get("env") or {})):
        return
    for name in RUN_OUTPUTS:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink()


@dataclass
class Context:
    """The run's refs and configs (``setup``'s output): what every later stage reads."""
    repo: Path
    base_sha: str
    head_sha: str
    merge_base: str
    cfg: Config
    cfg_rel: Optional[str]  # the config's path in the tree (None: kept outside the repository)
    bcfg: Optional[Config]  # base's config (the PR cannot loosen its own gate)
    settings: GateSettings
    base_specs: Dict[str, OpSpec]
    catalog: Catalog
    kernels: object
    seed: int


@dataclass
class Planned:
    """``plan_stage``'s output: every variant of every selected operator and those that get a budget."""
    names: List[str]
    planned: List[dict]  # spec, task, row, status per variant
    run_tasks: List[Task]
    by_id: Dict[str, dict]
    total: float
    per_op: float
    store: object  # the base's BaselineStore
    isolate: object  # IsolateOptions, or None: evaluations run in-process
    #: the fuzz stage's finished work items as they come (judged as they are if the run is stopped)
    done: List[dict] = field(default_factory=list)
    #: base's replay results of each variant as they come (OUT_OF_TIME where not yet replayed):
    #: what a run stopped during the replay judges its variants on
    base: Dict[str, list] = field(default_factory=dict)


def _run(opts: RunOptions, report: V.GateReport, say) -> None:
    """The stage list: each stage takes the previous one's output. Each stage's wall time (and
    the share the budget gave it, where it has one) goes to ``report.env["stages"]``."""
    stages = report.env.setdefault("stages", {})

    @contextlib.contextmanager
    def stage(name, share=None):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            took = round(time.perf_counter() - t0 - stages.get("replay", {}).get("seconds", 0.0)
                         if name == "fuzz" else time.perf_counter() - t0, 3)
            stages[name] = {"seconds": took, **({"share": share} if share is not None else {})}

    with stage("setup"):
        ctx = setup_stage(opts, report)
    with stage("select"):
        names = select_stage(opts, ctx, report)
    if not names:
        return
    with stage("plan"):
        planned = plan_stage(opts, ctx, names, report, say)
    with stage("fuzz", None if opts.evals else planned.total):  # the search, base's worktree included
        try:
            work = fuzz_stage(opts, ctx, planned, report, say)
        except Terminated:
            judge_stopped(opts, ctx, planned, report)
            raise
    with stage("judge"):
        judge_stage(opts, ctx, planned, work, report)
    loc = ctx.cfg.budget.get("localise")
    with stage("localise", 60.0 if loc is None else float(loc)):
        localise_stage(report, work, {"repo": ctx.repo, "merge_base": ctx.merge_base, "head_sha": ctx.head_sha,
                                      "config": ctx.cfg, "base_config": ctx.bcfg, "selected": report.selected,
                                      "settings": ctx.settings, "out": Path(opts.out), "say": say,
                                      "isolate": planned.isolate})


def _checked_repo(opts: RunOptions) -> Tuple[Path, Path]:
    """(the directory given, the repository's top)."""
    repo = Path(opts.repo).resolve()
    if not repo.is_dir():
        raise GateError(f"repository {repo} does not exist")
    try:
        top = Path(git(repo, "rev-parse", "--show-toplevel")).resolve()
    except GateError:
        raise SetupError(f"{repo} is not a git repository (dl-gate run compares a PR's head with its base)") from None
    return repo, top


def _refs(opts: RunOptions, repo: Path, report: V.GateReport) -> Tuple[str, str]:
    """(base sha, head sha), head checked to be the commit checked out."""
    if not opts.base:
        raise GateError("no base ref: pass --base REF (in GitHub Actions, GITHUB_BASE_REF is used)")
    try:
        base_sha = git(repo, "rev-parse", "--verify", f"{opts.base}^{{commit}}")
    except GateError:
        shallow = git(repo, "rev-parse", "--is-shallow-repository") == "true"
        raise SetupError(f"base ref {opts.base} is not in this repository"
                         + (" (a shallow clone: check out with fetch-depth: 0)" if shallow else
                            " (fetch it, e.g. actions/checkout with fetch-depth: 0)")) from None
    head_sha = git(repo, "rev-parse", "--verify", f"{opts.head}^{{commit}}")
    checked_out = git(repo, "rev-parse", "HEAD")
    if checked_out != head_sha:  # the operators are imported from the working tree, not from a ref
        raise SetupError(f"--head {opts.head} ({head_sha[:10]}) is not the checked-out commit ({checked_out[:10]}): "
                         "the gate imports the operators from the working tree; check the head out first")
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, encoding="utf-8", errors="replace").stdout
    dirty = [ln[3:] for ln in status.splitlines() if ln.strip()]
    if dirty:
        report.warnings.append(f"uncommitted changes in the working tree ({', '.join(dirty[:5])}"
                               + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
                               + f"): the gate runs them, the report names {head_sha[:10]}")
    return base_sha, head_sha


def setup_stage(opts: RunOptions, report: V.GateReport) -> Context:
    """Refs, configs (head's, base's) and the operator catalogue."""
    from .plan import validate_variant_filters

    validate_variant_filters(opts.dtypes, opts.modes, opts.devices)
    start, top = _checked_repo(opts)
    # run from a subdirectory (or --repo pointing into one): the repository is the whole tree,
    # the config the nearest one above the directory given
    repo = top
    cfg = load_config(opts.config) if opts.config else load_config(search_from=start, up_to=top)
    cfg_outside = cfg.path is not None and top not in cfg.path.resolve().parents
    if cfg_outside:  # a config kept outside the repository: its paths are the repository's
        cfg = load_config(opts.config, root=top)
    base_sha, head_sha = _refs(opts, repo, report)
    if cfg.path is None and not opts.ops:  # a forced run of built-in operators needs no config
        cfg = _config_from_base(repo, start, base_sha, report)
    cfg.activate()  # also forgets stale imports of the user's library
    if opts.evals is None and cfg.budget.get("evals"):  # budget.evals: the deterministic budget, as --evals
        opts.evals = int(cfg.budget["evals"])
    merge_base = git(repo, "merge-base", base_sha, head_sha)
    report.base_ref, report.base_sha, report.head_sha = opts.base, base_sha, head_sha
    if cfg_outside:  # not in the PR's tree: the same file judges both sides
        cfg_rel, bcfg = None, cfg
    else:
        cfg_rel = str(cfg.path.resolve().relative_to(repo)) if cfg.path else ".dl-gate.yml"
        bcfg = base_config(repo, base_sha, cfg_rel)
    # the PR cannot loosen its own gate: settings (and op thresholds) come from the base
    settings = GateSettings.from_config((bcfg.raw.get("gate") if bcfg else None) or cfg.gate)
    if bcfg is not None and bcfg is not cfg:
        _contain_as_base(cfg, bcfg, report)
    base_specs = {s.name: s for s in (bcfg.ops if bcfg else [])}
    # base decides what is gated: a row the PR deletes from the config is still in the catalogue
    head_names = {s.name for s in cfg.ops}
    dropped = [s for s in base_specs.values() if s.name not in head_names]
    if dropped:
        report.warnings.append(f"the PR removes {', '.join(s.name for s in dropped)} from {cfg_rel or 'the config'}: "
                               "still gated (base's config decides what is gated)")
    catalog = load_catalog([*cfg.ops, *dropped], builtin=cfg.builtin)
    kernels = _kernels(repo, head_sha, catalog, cfg, report)  # before the operator library is imported
    from .select import python_roots

    _SOURCE_TREES[str(repo.resolve())] = (head_sha, python_roots(repo, cfg))  # op_source: found, not imported
    seed = opts.seed if opts.seed is not None else cfg.seed
    report.seed = seed
    return Context(repo=repo, base_sha=base_sha, head_sha=head_sha, merge_base=merge_base, cfg=cfg, cfg_rel=cfg_rel,
                   bcfg=bcfg, settings=settings, base_specs=base_specs, catalog=catalog, kernels=kernels, seed=seed)


#: how the PR's code is contained (workers, their limits): base's config decides
CONTAINMENT_KEYS = ("isolate", "eval_timeout", "eval_memory_mb")


def _contain_as_base(cfg: Config, bcfg: Config, report: V.GateReport) -> None:
    """Head's ``gate.isolate`` / ``eval_timeout`` / ``eval_memory_mb`` replaced by base's: a PR
    cannot turn its own code's isolation off (the command line's ``--no-isolate`` still can).
    Nor does a PR give the workers values of its own (``env: {NAME: value}``): base's workers run
    with them too, and a value (``LD_PRELOAD``, a library's backend switch) would let head's
    change reach base's side; the values are base's config's (head may still name variables
    whose values the job gives)."""
    _contain_env(cfg, bcfg, report)
    head_g, base_g = dict(cfg.raw.get("gate") or {}), dict(bcfg.raw.get("gate") or {})
    changed = [k for k in CONTAINMENT_KEYS if head_g.get(k) != base_g.get(k)]
    if not changed:
        return
    for k in CONTAINMENT_KEYS:
        if k in base_g:
            head_g[k] = base_g[k]
        else:
            head_g.pop(k, None)
    cfg.raw["gate"] = head_g
    report.warnings.append(f"the PR changes gate.{', gate.'.join(changed)}: not used (base's config decides how "
                           "the PR's code is contained)")


def _contain_env(cfg: Config, bcfg: Config, report: V.GateReport) -> None:
    """Head's ``env:`` with base's values (see :func:`_contain_as_base`), made the workers' own."""
    from .backends.sandbox import allow, env_names, env_values

    head_env, base_env = cfg.raw.get("env"), bcfg.raw.get("env")
    hv, bv = env_values(head_env), env_values(base_env)
    if hv == bv:
        return
    env = {n: bv.get(n) for n in env_names(head_env)}
    for n, v in bv.items():
        env.setdefault(n, v)
    cfg.raw["env"] = env
    allow(env)
    changed = sorted(n for n in set(hv) | set(bv) if hv.get(n) != bv.get(n))
    report.warnings.append(f"the PR changes the values of env: {', '.join(changed)}: not used (base's config gives "
                           "the workers' values)")


NO_CONFIG = "no .dl-gate.yml: run `dl-gate init`"
REMOVED = "operator removed or broken"


def _config_from_base(repo: Path, start: Path, base_sha: str, report: V.GateReport) -> Config:
    """No config on head: base's, where the PR deleted it (base decides what is gated); else
    the run cannot gate anything (a setup error, never a silent pass)."""
    from .config import CONFIG_NAMES

    d = start
    while True:
        for name in CONFIG_NAMES:
            rel = (d / name).relative_to(repo).as_posix()
            res = subprocess.run(["git", "-C", str(repo), "show", f"{base_sha}:{rel}"], capture_output=True,
                                 encoding="utf-8", errors="replace")
            if res.returncode == 0:
                report.warnings.append(f"the PR deletes {rel}: base's config gates it")
                return parse_config(res.stdout, repo / rel, root=d)
        if d == repo or repo not in d.parents:
            break
        d = d.parent
    raise SetupError(NO_CONFIG)


#: run in a worker-like process (the allow-list environment): does each callable still resolve?
_PROBE = """
import json, os, sys
from gate.backends.isolate import import_answers
with open(sys.argv[1], "w") as f:
    json.dump(import_answers(json.loads(sys.argv[2])), f)
sys.stdout.flush()
os._exit(0)
"""


def _imports_in_worker(ctx: Context, suspects: Sequence[OpSpec], paths: Sequence[str]) -> Optional[Dict[str, str]]:
    """The suspects' imports asked of an isolation worker forked from the warm zygote (its
    framework already imported: ~0.1 s instead of an interpreter and a framework import per
    run); None when the run evaluates without isolation or the frameworks are mixed (then a
    separate process answers)."""
    from dataclasses import replace as _replace

    from .backends.isolate import import_errors, isolate_options

    frameworks = {s.framework for s in suspects}
    if len(frameworks) != 1 or not frameworks <= {"torch", "tensorflow"}:
        return None
    base_gate = (ctx.bcfg.raw.get("gate") if ctx.bcfg else None) or ctx.cfg.gate
    isolate = isolate_options(None, None, base_gate)
    if isolate is None:
        return None
    import sys

    isolate = _replace(isolate, sys_path=tuple(dict.fromkeys([*paths, *[p for p in sys.path if p not in ("", ".")]])),
                       cwd=str(ctx.repo))
    return import_errors(frameworks.pop(), [s.callable for s in suspects], isolate)


def removed_ops(ctx: Context, selected: Sequence[str] = ()) -> Dict[str, str]:
    """Base's operator rows whose callable no longer imports or resolves on head: name -> why.

    Candidates: the rows the selection's Python index finds defined on the merge-base and not
    on head, and the selected rows (a change can break the module's import; not for a library
    whose extension is built later, in the plan stage); each is imported
    in a separate process with the workers' environment, never in this one (a re-export or a
    dynamic definition the index does not follow is not a removal)."""
    user = [s for s in ctx.base_specs.values() if s.origin == "user"]
    if not user:
        return {}
    from .changes import CodeBase
    from .changes.git import Git
    from .select import python_roots
    from .select.python import entry_node

    g = Git(ctx.repo)
    cb = CodeBase(g, ctx.merge_base, ctx.head_sha, python_roots(g.root, ctx.cfg))
    missing = {s.name for s in user if entry_node(cb.py("base"), s.callable) is not None
               and entry_node(cb.py("head"), s.callable) is None}
    # a library with a native extension imports only once head is built (the plan stage builds
    # it): there, only a definition the index no longer finds is checked
    importable = not (ctx.cfg.raw.get("build") or (ctx.bcfg.raw.get("build") if ctx.bcfg else None))
    suspects = [s for s in user if s.name in missing or (importable and s.name in selected)]
    if not suspects:
        return {}
    paths = [str((ctx.cfg.root / p).resolve()) for p in (ctx.cfg.raw.get("python_path") or ["."])]
    answers = _imports_in_worker(ctx, suspects, paths)
    if answers is None:
        answers = _import_probe(ctx.repo, paths, [s.callable for s in suspects], "head")
    broken = {s.name: answers[s.callable] for s in suspects if answers.get(s.callable)}
    _not_base_either(ctx, [s for s in suspects if s.name in broken and s.name not in missing], broken)
    return {s.name: (f"{s.callable} is defined on base and not on head" if s.name in missing else
                     f"{s.callable} does not import on head") + f" ({broken[s.name]})"
            for s in suspects if s.name in broken}


def _import_probe(cwd: Path, paths: Sequence[str], callables: Sequence[str], side: str) -> Dict[str, str]:
    """callable -> why it does not import or resolve ("" when it does), asked of a separate
    process with the workers' environment, run in ``cwd`` with ``paths`` first on its path."""
    import sys
    import tempfile

    from .backends.sandbox import worker_env

    with tempfile.TemporaryDirectory(prefix="dl-gate-resolve-") as tmp:
        out = Path(tmp) / "resolved.json"
        proc = None
        try:
            proc = subprocess.run([sys.executable, "-c", _PROBE, str(out), json.dumps(list(callables))],
                                  cwd=str(cwd), env=worker_env(path_front=list(paths)), capture_output=True,
                                  text=True, timeout=300)
            return json.loads(out.read_text())
        except subprocess.TimeoutExpired:
            return {c: f"importing it on {side} did not finish in 300s" for c in callables}
        except (OSError, ValueError):  # the import ended the process before it answered
            code = proc.returncode if proc is not None else None
            return {c: f"importing it on {side} ended the process with exit code {code}" for c in callables}


def _not_base_either(ctx: Context, suspects: Sequence[OpSpec], broken: Dict[str, str]) -> None:
    """Operators that do not import on head are imported on base too, in the same environment: one
    that does not import there either is not the PR's doing but the job's (a dependency missing,
    a variable in the config's ``env:`` unset): a setup error naming it, never a regression."""
    if not suspects:
        return
    cfg = ctx.bcfg or ctx.cfg
    try:  # the config's folder within the repository (python_path is relative to it)
        rel = Path(ctx.cfg.root).resolve().relative_to(Path(ctx.repo).resolve())
    except ValueError:
        rel = Path(".")
    with worktree(ctx.repo, ctx.merge_base) as tree:
        paths = [str((tree / rel / p).resolve()) for p in (cfg.raw.get("python_path") or ["."])]
        on_base = _import_probe(tree, paths, [s.callable for s in suspects], "base")
    both = [s for s in suspects if on_base.get(s.callable)]
    if not both:
        return
    s = both[0]
    from .backends.sandbox import unset_names

    unset = unset_names(ctx.cfg.raw.get("env"))
    hint = (f"; the config's env: names {', '.join(unset)}, not set in this job's environment" if unset else
            "; install what the library needs in the job (the Action's install: input)")
    more = f" (and {len(both) - 1} more)" if len(both) > 1 else ""
    raise SetupError(f"{s.callable} does not import on head nor on base {ctx.merge_base[:10]}, in the same "
                     f"environment{more}: {broken[s.name]}{hint}")


def select_stage(opts: RunOptions, ctx: Context, report: V.GateReport) -> List[str]:
    """The operators this diff reaches (``report.selected`` keeps why); none: the gate passes.

    A base operator that no longer resolves on head is a regression without a search."""
    selected, sel_dict = _selection(opts, ctx.cfg, ctx.catalog, ctx.merge_base, ctx.head_sha)
    report.selected = selected
    if sel_dict:
        report.env["selection"] = {k: sel_dict.get(k) for k in ("cleared", "unmapped", "uncovered_native", "not_gated") if k in sel_dict}
        # e.g. an operator whose callable is no longer found: it is not gated, say so in the report
        report.warnings.extend(f"selection: {n}" for n in sel_dict.get("notes") or [])
    for n in (sel_dict or {}).get("not_gated") or []:
        # "reaches": the changed line is often not in the operator's own file (a helper it calls, a
        # forward inherited from a base class: entmax's losses read "changed (root_finding.py:50)")
        report.warnings.append(f"{NOT_GATED_WARNING}{n['op']} reaches a change ({n['file']}:{n['line']}, {n['symbol']}: "
                               f"code it calls or inherits) and is not gated: {n['why'] or 'listed under not_gated'}; "
                               f"{how_to_gate(n['op'])}")
    gone = {} if opts.ops else removed_ops(ctx, [s["op"] for s in selected])
    if gone:
        for name, why in gone.items():
            spec = ctx.base_specs[name]
            report.verdicts.append(V.VariantVerdict(op=name, framework=spec.framework, variant={},
                                                    outcome=V.REGRESSION, reason=f"{REMOVED}: {why}"))
            if name not in {s["op"] for s in selected}:
                selected.append({"op": name, "reasons": [{"kind": "removed", "file": spec.sources[0] if spec.sources
                                                          else None, "line": None, "symbol": spec.callable,
                                                          "path": [spec.callable, name]}]})
        names = [s["op"] for s in selected if s["op"] not in gone]
        if not names:
            report.outcome, report.reason = overall(report.verdicts, report.errors, ctx.settings)
        return names
    if not selected:
        report.outcome = Outcome.PASS.value
        ungated = sorted({n["op"] for n in (sel_dict or {}).get("not_gated") or []})
        report.reason = ("no gated operator changed; changed but not gated: " + ", ".join(ungated) if ungated else
                         "no operator changed: nothing in this diff reaches an operator's numerics")
        return []
    return [s["op"] for s in selected]


def plan_stage(opts: RunOptions, ctx: Context, names: List[str], report: V.GateReport, say) -> Planned:
    """Build head, start the isolation workers, plan every variant and spend the total budget by priority."""
    if ctx.kernels is not None:
        report.warnings.extend(ctx.kernels.warnings(names))
    cfg = ctx.cfg
    _build(ctx.repo, cfg, cfg.raw.get("build"), "head", report, Path(opts.out), say)  # a failure: error, first compiler line
    from .backends.isolate import isolate_options, prestart

    isolate = isolate_options(opts.isolate, opts.eval_timeout, cfg.gate)  # crashes and hangs stay in a worker
    if isolate is not None:
        prestart({ctx.catalog.get(n).framework for n in names}, isolate)
    budget_cfg = cfg.budget
    total = float(opts.budget_total or budget_cfg.get("total") or DEFAULT_BUDGET_TOTAL)
    per_op = op_share(total, opts.budget_per_op or budget_cfg.get("per_op"), len(names))
    store = BaselineStore(GitBaselineSource(ctx.repo, ctx.base_sha, cfg.raw.get("baselines", "baselines"))).load()
    from .backends.facts import BackendFacts

    facts = BackendFacts(isolate)  # asked of a worker: this process does not import the framework
    planned = [p for name in names for p in _variants(opts, ctx, name, per_op, store, report, facts)]
    run_tasks, skipped = _allocate(opts, ctx, planned, total, report)
    by_id = {p["task"].id: p for p in planned}
    report.not_covered = sorted(skipped)
    # a time budget: the seed fixes the search's choices, not how many evaluations fit
    report.env["budget"] = {"evals": opts.evals} if opts.evals else {"seconds": total, "per_op": per_op}
    say(f"selected {len(names)} operator(s), {len(planned)} variant(s); fuzzing {len(run_tasks)} within "
        + (f"{opts.evals} evals each" if opts.evals else f"{total:g}s (at most {per_op:g}s per operator)")
        + f", seed {ctx.seed}")
    say(_plan_line(opts, ctx, run_tasks, total, per_op))
    return Planned(names=names, planned=planned, run_tasks=run_tasks, by_id=by_id, total=total, per_op=per_op,
                   store=store, isolate=isolate)


def op_share(total: float, per_op: Optional[float], n_ops: int) -> float:
    """The seconds each changed operator of a PR run gets: the total spread over them, and at
    least ``per_op`` (never past the total). A PR that changes one operator searches it for the
    whole total (with ``total: 300, per_op: 10`` it had 10 s and left 290 s unspent, seen in
    issue 28's acceptance); one that changes many gives each ``per_op`` and the run's allocation
    spends the total by priority."""
    share = total / max(1, n_ops)
    return float(min(max(per_op or 0.0, share), total))


def _plan_line(opts: RunOptions, ctx: Context, run_tasks: List[Task], total: float, per_op: float) -> str:
    """The run's plan, said at its start: the fuzz stage's bound (what the operators can spend,
    each variant at least ``gate.min_evals`` evaluations within it), localisation's share, and
    when the run ends at the latest (the supervisor's deadline, ``DL_GATE_DEADLINE_AT``)."""
    import os

    ops = {t.op.name for t in run_tasks}
    if opts.evals:
        fuzz = f"fuzz: {opts.evals} evaluations per variant"
    else:
        floor = ctx.settings.min_evals
        fuzz = f"fuzz: {per_op:g}s per operator, at most {total:g}s in all" + (
            f" (a variant goes past its operator's time only to reach {floor} evaluations)" if floor else "")
    loc = ctx.cfg.budget.get("localise")
    share = _replay_share(opts, ctx)
    replay = f"; base replay at most {share:g}s" if share is not None else ""
    text = f"plan: {fuzz}{replay}; localisation at most {60.0 if loc is None else float(loc):g}s"
    at = os.environ.get("DL_GATE_DEADLINE_AT")
    try:
        when = time.strftime("%H:%M:%S", time.localtime(float(at))) if at else None
    except (TypeError, ValueError, OverflowError):
        when = None
    return text + (f"; ends by {when} (the run's deadline)" if when else "")


def _variants(opts: RunOptions, ctx: Context, name: str, per_op: float, store, report: V.GateReport,
              facts) -> List[dict]:
    """Every variant of operator ``name`` with its stored baseline row."""
    gate_cfg = ctx.cfg.gate
    dtypes = opts.dtypes or gate_cfg.get("dtypes")
    spec = ctx.catalog.get(name)
    if name in ctx.base_specs:
        spec, warning = judged_row(spec, ctx.base_specs[name])
        if warning:
            report.warnings.append(warning)
    if ctx.kernels is not None:
        spec = ctx.kernels.adjust(spec)  # Triton: on the device its kernels run on
    want_dtypes = [d for d in dtypes if d in spec.dtypes] if dtypes else None
    budget = Budget(evals=opts.evals) if opts.evals else Budget(seconds=per_op)
    tasks = plan([spec], budget, per_op=budget, seed=ctx.seed, strategy=opts.strategy or gate_cfg.get("strategy", "linf"),
                 dtypes=want_dtypes, devices=opts.devices or gate_cfg.get("devices"),
                 modes=opts.modes or gate_cfg.get("modes"), available_devices=facts.devices(spec.framework),
                 oracles=opts.oracles or gate_cfg.get("oracles"))
    if opts.evals:
        tasks = [Task(op=t.op, variant=t.variant, budget=Budget(evals=opts.evals), seed=t.seed,
                      strategy=t.strategy) for t in tasks]
    out = []
    for task in tasks:
        row, status = store.lookup(spec.name, task.variant.key, facts.environment(spec.framework, task.variant.device))
        out.append({"spec": spec, "task": task, "row": row, "status": status})
    return out


#: a baseline row's evaluations below which its seconds per evaluation are mostly its first call's
MEASURED_MIN_EVALS = 10


def _allocate(opts: RunOptions, ctx: Context, planned: List[dict], total: float,
              report: V.GateReport) -> Tuple[List[Task], List[str]]:
    """(tasks to run with their budgets, ids of those the total budget does not reach)."""
    if opts.evals:
        return [p["task"] for p in planned], []
    from .search.schedule import allocate

    # history: how close the base's stored error came to the gate's floor (closer = sooner)
    history = {p["task"].id: p["row"].ulp / ctx.settings.floor(p["spec"], p["task"].variant)
               for p in planned if p["row"] is not None and math.isfinite(p["row"].ulp)}
    # seconds per evaluation as base's baseline measured them, where it made enough evaluations
    # that its first call's costs do not dominate (the static estimate otherwise: a refresh that
    # gave a variant 1.4 s made 2 evaluations of hyper-connections' sinkhorn_knopps, "1.3 s" each,
    # and the run then covered 2 of its 14 variants)
    cost = {p["task"].id: p["row"].seconds / p["row"].evals for p in planned
            if p["row"] is not None and p["row"].evals >= MEASURED_MIN_EVALS and p["row"].seconds > 0}
    alloc = allocate([p["task"] for p in planned], total, history=history, cost=cost)
    report.env["allocation"] = alloc.to_dict()
    cap = {p["task"].id: p["task"].budget.seconds for p in planned}  # per_op split over the op's variants
    run_tasks = [Task(op=t.op, variant=t.variant, budget=Budget(seconds=min(t.budget.seconds, cap[t.id])),
                      seed=t.seed, strategy=t.strategy) for t in alloc.tasks]
    return run_tasks, [n["task"] for n in alloc.not_covered]


def fuzz_stage(opts: RunOptions, ctx: Context, planned: Planned, report: V.GateReport, say) -> List[dict]:
    """Search every planned variant on head, then replay its inputs on base (in base's worktree).

    Base's worktree is there from the start: the search asks base about the NaN/Inf it finds
    (gate.judge.contrast), and every input is replayed there afterwards."""
    from .search.seeds import SeedStore

    cfg, bcfg, cfg_rel, by_id = ctx.cfg, ctx.bcfg, ctx.cfg_rel, planned.by_id
    seed_store = SeedStore(cfg.baselines_dir / "seeds")  # `dl-gate harvest` seeds, OpInfo samples
    user_tasks = [t for t in planned.run_tasks if by_id[t.id]["spec"].origin == "user"]
    py_path = (bcfg.raw.get("python_path") if bcfg else None) or cfg.raw.get("python_path") or ["."]
    base_results: Dict[str, list] = {}
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(worktree(ctx.repo, ctx.merge_base)) if user_tasks else None
        if tree is not None and cfg.path:
            py_path = [str((tree / (Path(cfg_rel).parent if cfg_rel else Path()) / p)) for p in py_path]
        # base's extension is built in its worktree (cached by source hash); one that does not
        # build leaves base unreplayed: head is judged against the stored baselines
        if tree is not None and not _build(tree / (Path(cfg_rel).parent if cfg_rel else Path()), cfg,
                                           (bcfg.raw if bcfg else cfg.raw).get("build"), "base", report,
                                           Path(opts.out), say):
            tree = None
        isolate = planned.isolate
        base_isolate = base_isolate_options(tree, py_path, isolate, ctx.repo) if tree is not None and isolate else None
        sources: Dict[str, Tuple[Optional[str], Optional[int]]] = {}
        costs: Dict[str, float] = {}  # an operator's seconds an evaluation, as its searches measured them
        _settle_structure(ctx, planned, isolate, base_isolate, report, say)
        pools = _Pools(planned, None if opts.evals else ctx.settings.min_evals, _fuzz_deadline(opts, ctx))
        work = planned.done
        for task in planned.run_tasks:
            task = pools.budget(task)
            t0 = time.perf_counter()
            work.append(_fuzz_one(task, by_id[task.id], planned.store, ctx.repo, seed_store, isolate, base_isolate,
                                  ctx.base_specs.get(by_id[task.id]["spec"].name), say, sources, costs,
                                  stop_at=pools.deadline))
            pools.spend(task, work[-1]["finding"].seconds, time.perf_counter() - t0)
        report.env["fuzz"] = pools.to_dict()
        # base runs the operator its own config names (a PR may rename the function)
        share = _replay_share(opts, ctx)
        users = [w for w in work if w["spec"].origin == "user"]
        # each variant's deciding inputs first where the replay may not fit its time (otherwise
        # base replays every input in head's order: an operator that keeps state sees the same)
        short = _replay_may_not_fit(users, costs, share, opts, ctx)
        if short:  # and the variants where head crashed or returned NaN/Inf before the others
            users = sorted(users, key=lambda w: suspicion(w.get("head") or (), w.get("row")))
        jobs = [ReplayJob(key=w["task"].id, variant=w["task"].variant, candidates=w["cands"],
                          spec=base_side(w["spec"], ctx.base_specs.get(w["spec"].name)),
                          first=deciding_inputs(w.get("head") or (), w["cands"]) if short else ())
                for w in users]
        if jobs and tree is not None:
            say(f"replaying {sum(len(j.candidates) for j in jobs)} input(s) on base {ctx.merge_base[:10]}"
                + (" (each variant's deciding inputs first: the time left may not hold them all)" if short else ""))
            t0 = time.perf_counter()
            base_results = replay_in_tree(tree, py_path, jobs, isolate=isolate, head_root=ctx.repo, seconds=share,
                                          sink=planned.base)
            report.env.setdefault("stages", {})["replay"] = {"seconds": round(time.perf_counter() - t0, 3),
                                                             **({"share": share} if share is not None else {})}
            _replay_deciding_inputs(ctx, work, jobs, base_results, tree, py_path, isolate, say)
            left = {k: sum(r.error == OUT_OF_TIME for r in rs) for k, rs in base_results.items()}
            if any(left.values()):
                n_all = sum(left[k] == len(base_results[k]) for k in left)
                report.warnings.append(
                    f"the base replay's share ({share:g}s, budget.replay) ran out: {sum(left.values())} input(s) of "
                    f"{sum(1 for v in left.values() if v)} variant(s) not replayed on base ({n_all} variant(s) with none: "
                    "held against their stored baselines)")
    for w in work:
        w["base"] = base_results.get(w["task"].id)
    return work


#: inputs of one variant replayed on base past the replay's share when its verdict turns on them
DECIDING_INPUTS = 3


def _replay_may_not_fit(work: List[dict], costs: Dict[str, float], share: Optional[float], opts: RunOptions,
                        ctx: Context) -> bool:
    """Whether base's replay of every input may take more than the time it has: its share, or
    what is left before the run's deadline less localisation and the report's margin (a loaded
    runner's fuzz stage past its own), at the operators' costs as head's searches measured them,
    doubled (a margin for base's workers, which start cold; not a measured ratio)."""
    import os

    avail = share
    try:
        at = float(os.environ["DL_GATE_DEADLINE_AT"])
    except (KeyError, ValueError):
        at = None
    if at is not None and not opts.evals:
        loc = ctx.cfg.budget.get("localise")
        left = at - time.time() - (60.0 if loc is None else float(loc)) - DEADLINE_MARGIN
        avail = left if avail is None else min(avail, left)
    if avail is None:
        return False
    need = 2.0 * sum(len(w["cands"]) * costs.get(w["spec"].name, 0.0) for w in work)
    return need > avail


def _replay_deciding_inputs(ctx: Context, work: List[dict], jobs: List[ReplayJob], base_results: Dict[str, list],
                            tree: Path, py_path, isolate, say) -> None:
    """A variant that would fail on inputs base was not replayed on (the replay's share ran out)
    gets those inputs replayed on base past the share: a regression is decided on base's answer
    to the same input wherever base can give one, never on the stored baseline's figures from
    other inputs. (lucidrains' memory-efficient attention, ~10 s an evaluation: an all-NaN
    output that base gives on the same input failed as "new NaN/Inf (baseline had none)".)
    At most :data:`DECIDING_INPUTS` a variant: those where head crashes or returns NaN/Inf, then
    its worst; a variant that would pass costs nothing."""
    job_of = {j.key: j for j in jobs}
    todo: Dict[str, List[int]] = {}
    for w in work:
        key = w["task"].id
        got, head = base_results.get(key), w.get("head")
        if key not in job_of or not got or not head or not any(r.error == OUT_OF_TIME for r in got):
            continue
        vv = _decide(ctx, w, got)
        if vv.outcome not in (V.REGRESSION, V.BEHAVIOUR_CHANGE):
            continue
        missing = [i for i, r in enumerate(got) if r.error == OUT_OF_TIME and i < len(head)]
        bad = [i for i in missing if head[i].status == CRASH or (head[i].status == OK and head[i].metrics.nonfinite)]
        worst = max((i for i in missing if head[i].status == OK), key=lambda i: head[i].metrics.ulp, default=None)
        picked = list(dict.fromkeys(bad[:DECIDING_INPUTS - 1] + ([worst] if worst is not None else [])))
        if picked:
            todo[key] = picked[:DECIDING_INPUTS]
    if not todo:
        return
    say(f"replaying {sum(map(len, todo.values()))} input(s) on base past the replay's share: the verdicts of "
        f"{len(todo)} variant(s) turn on them")
    more = replay_in_tree(tree, py_path, [ReplayJob(key=k, variant=job_of[k].variant, spec=job_of[k].spec,
                                                    candidates=[job_of[k].candidates[i] for i in idx])
                                          for k, idx in todo.items()], isolate=isolate, head_root=ctx.repo)
    for key, idx in todo.items():
        for i, r in zip(idx, more.get(key) or []):
            base_results[key][i] = r


def _settle_structure(ctx: Context, planned: Planned, isolate, base_isolate, report: V.GateReport, say) -> None:
    """Rows judged elementwise only by default (no ``kind:``) are asked whether they are
    (gate.judge.structure), on base's worker where base has the operator, before their gradient
    variants are searched; a coupled one's gradient variants are judged on their own scale."""
    from .judge.structure import judged_for_grad, needs_probe, probe_structure, say_structure

    grads = {}
    for t in planned.run_tasks:
        spec = planned.by_id[t.id]["spec"]
        if t.variant.oracle == "grad" and needs_probe(spec):
            grads.setdefault(spec.name, spec)
    found = {}
    for name, spec in grads.items():
        base_spec = ctx.base_specs.get(name)
        on_base = base_isolate is not None and base_spec is not None
        found[name] = probe_structure(base_side(spec, base_spec) if on_base else spec,
                                      base_isolate if on_base else isolate, side="base" if on_base else "head")
        report.env.setdefault("structure", {})[name] = found[name].to_dict()
        line = say_structure(name, found[name])
        if line:
            say(line)
    if not found:
        return
    tasks = []
    for t in planned.run_tasks:
        p = planned.by_id[t.id]
        if t.variant.oracle == "grad" and p["spec"].name in found:
            spec = judged_for_grad(p["spec"], found[p["spec"].name])
            t = Task(op=spec, variant=t.variant, budget=t.budget, seed=t.seed, strategy=t.strategy)
            p["spec"], p["task"] = spec, t
        tasks.append(t)
    planned.run_tasks[:] = tasks


#: the base replay's share of a time-budgeted run (seconds), unless ``budget.replay`` says
REPLAY_SHARE = 60.0


def _replay_share(opts: RunOptions, ctx: Context) -> Optional[float]:
    """Seconds the base replay may take: ``budget.replay`` (base's config's), else
    :data:`REPLAY_SHARE` for a time-budgeted run (an ``--evals`` run is bounded by its inputs,
    unless the config says)."""
    # base's config where there is one: a PR cannot spare its own code the comparison with base
    raw = (ctx.bcfg or ctx.cfg).budget.get("replay")
    if raw is not None:
        return float(raw)
    return None if opts.evals else REPLAY_SHARE


def _fuzz_deadline(opts: RunOptions, ctx: Context) -> Optional[float]:
    """When the fuzz stage must end at the latest: the run's deadline (the supervisor's,
    ``DL_GATE_DEADLINE_AT``) less the base replay's and localisation's shares and a margin for
    the verdicts and the report; None without a deadline or with an ``--evals`` budget."""
    import os

    if opts.evals:
        return None
    try:
        at = float(os.environ["DL_GATE_DEADLINE_AT"])
    except (KeyError, ValueError):
        return None
    loc = ctx.cfg.budget.get("localise")
    reserve = (_replay_share(opts, ctx) or 0.0) + (60.0 if loc is None else float(loc)) + DEADLINE_MARGIN
    return at - reserve


#: seconds kept before the run's deadline for the verdicts, the report and the files it writes
DEADLINE_MARGIN = 20.0


class _Pools:
    """The fuzz stage's time, spent as measured. Each operator has ``per_op`` seconds (and the run
    ``total``); a variant's share is what its operator has left over its variants still to run (at
    most what the allocation gave it), and its search may go past that share to reach
    ``min_evals`` evaluations: up to what its operator has left, or, where that is less, its fair
    part of what the run has left (the run's time over the variants still to run). ``per_op``
    spreads the search over operators; it does not cut a variant below the evaluations a verdict
    needs while the run's total has time for them (a slow gradient, CUDA variants beside the CPU
    ones, a loaded machine), and no variant can take another's part of the total. The stage stays
    within ``total``: each variant is booked at its wall time, and its search gets its share less
    the overhead a variant has been measured to cost beyond its search (so that the variants run
    last still get theirs). Where the variants before spent the total anyway (their walls past
    their shares on a loaded runner), a variant may still reach ``min_evals`` within its part of
    the time left before ``deadline`` (the run's, less the later stages' shares). With an
    ``--evals`` budget nothing is timed (``min_evals`` None)."""

    def __init__(self, planned: "Planned", min_evals: Optional[int], deadline: Optional[float] = None,
                 clock: Callable[[], float] = time.time):
        self.min_evals = min_evals
        self.clock = clock  # what ``deadline`` is read against (a test gives a fixed one)
        #: when the fuzz stage must end at the latest (``time.time()``: the run's deadline less the
        #: later stages' shares), or None: where the run's total is spent by the variants before
        #: (walls past their shares on a loaded runner), a variant still reaches ``min_evals``
        #: within its part of the time left to then, rather than be judged on no evaluation
        self.deadline = deadline
        self.total_left = float(planned.total)
        self.op_left: Dict[str, float] = {}
        self.todo: Dict[str, int] = {}
        for t in planned.run_tasks:
            self.op_left.setdefault(t.op.name, float(planned.per_op))
            self.todo[t.op.name] = self.todo.get(t.op.name, 0) + 1
        self.rows: List[dict] = []

    def budget(self, task: Task) -> Task:
        if task.budget.seconds is None or self.min_evals is None:
            return task
        name = task.op.name
        total = max(0.0, self.total_left)
        cap = min(max(0.0, self.op_left[name]), total)
        n_left = max(sum(self.todo.values()), 1)
        # each variant costs more than its search (worker warm-up, replays, controls): the overhead
        # measured so far is left to every variant still to run, so that the last ones are not
        # starved of the evaluations a verdict needs (50 variants in 50 s: the last two got none)
        over = self.overhead()
        share = max(0.0, min(task.budget.seconds, cap / max(self.todo[name], 1), total / n_left) - over)
        limit = max(cap, total / n_left)  # to reach min_evals, past the operator's cap
        if self.deadline is not None:
            # tensorflow/model-remediation's revert on a loaded runner: two variants' walls (a
            # TensorFlow worker's start, replays) spent the 120 s, and the third got 0 evaluations
            # (under-searched: exit 2) with minutes left before the run's deadline
            limit = max(limit, max(0.0, self.deadline - self.clock()) / n_left)
        return Task(op=task.op, variant=task.variant, seed=task.seed, strategy=task.strategy,
                    budget=Budget(seconds=share, min_evals=self.min_evals, max_seconds=limit))

    def overhead(self) -> float:
        """The seconds a variant costs beyond its search, as measured so far: the mean over the
        variants done after the first (the first carries the stage's one-time costs, a worker's
        start and first compile, which the later ones do not pay again); 0 until then."""
        done = [max(0.0, r["wall"] - r["searched"]) for r in self.rows[1:] if r["share"] is not None]
        return sum(done) / len(done) if done else 0.0

    def spend(self, task: Task, searched: float, wall: float) -> None:
        """Book a variant's fuzz-stage time: its wall time, not only its search (the replays, the
        controls and the determinism recheck around a search are the stage's time too: counting
        the search alone let a slow operator's stage run 17 % past its share)."""
        name = task.op.name
        self.todo[name] -= 1
        if task.budget.seconds is not None:
            self.op_left[name] -= wall
            self.total_left -= wall
        self.rows.append({"task": task.id, "share": task.budget.seconds, "searched": round(searched, 3),
                          "wall": round(wall, 3)})

    def to_dict(self) -> dict:
        return {"min_evals": self.min_evals, "variants": self.rows}


def judge_stage(opts: RunOptions, ctx: Context, planned: Planned, work: List[dict], report: V.GateReport,
                recheck: bool = True) -> None:
    """A verdict per variant (head vs base and the stored baseline), the not-covered ones, and the
    outcome (``recheck``: a failing verdict's input is run again for determinism)."""
    for w in work:
        vv = _verdict(opts, ctx, planned, w, recheck)
        w["verdict"] = vv
        if ctx.kernels is not None:
            ctx.kernels.mark(vv)
        report.verdicts.append(vv)
        if vv.details.get("warning"):
            report.warnings.append(f"{vv.id}: {vv.details['warning']}")
        if w.get("corpus_error"):
            report.warnings.append(f"{vv.id}: {w['corpus_error']}; searched without its stored inputs")
        if w.get("replayed"):
            r = w["replayed"]
            vv.details["replayed"] = r
            report.warnings.append(f"{vv.id}: judged on {r['kept']} of its {r['of']} inputs (~{r['cost']:g}s an "
                                   f"evaluation, on head and on base: the others would not fit its share of the "
                                   f"budget; left out: {', '.join(f'{n} {g}' for g, n in r['left_out'].items())})")
        report.env.setdefault("frameworks", {})[w["spec"].framework] = w["finding"].env.get("version")
    searched = {t.id for t in planned.run_tasks}
    for tid in report.not_covered:
        p = planned.by_id[tid]
        report.verdicts.append(V.VariantVerdict(
            op=p["spec"].name, framework=p["spec"].framework, variant=p["task"].variant.to_dict(),
            outcome=V.NOT_COVERED, reason="the run was stopped before this variant was searched" if tid in searched
            else "the total budget ran out before this variant (raise budget.total)"))
    report.warnings += stability_fixes(report.verdicts)  # an operator's changes that came with its fix: not failed
    report.warnings += refinements(report.verdicts)  # a refined forward's gradient change: not failed
    report.outcome, report.reason = overall(report.verdicts, report.errors, ctx.settings)
    _name_ungated(report)
    if ctx.settings.behaviour_change == "fail":  # the reporters mark these as failures too
        report.fail_outcomes = [V.REGRESSION, V.BEHAVIOUR_CHANGE]


def _name_ungated(report: V.GateReport) -> None:
    """A pass says which changed operators it did not judge: a PR whose changes reach only
    operators without a row (zuko's flows, whose forward returns a distribution; piqa's mdsi,
    which cannot run in float64) read "7 variant(s) checked, no regression" about the helpers
    beside them, the changed ones in a warning only."""
    from .errors import Outcome

    ungated = sorted({n["op"] for n in (report.env.get("selection") or {}).get("not_gated") or []})
    if report.outcome == Outcome.PASS.value and ungated:
        more = f" (+{len(ungated) - 3} more)" if len(ungated) > 3 else ""
        report.reason += f"; changed but not gated: {', '.join(ungated[:3])}{more}"


def judge_stopped(opts: RunOptions, ctx: Context, planned: Planned, report: V.GateReport) -> None:
    """The run was stopped (SIGTERM: a CI time limit, the supervisor's deadline) during the fuzz
    stage: the variants searched so far are judged as they stand, against their stored baselines
    (base's replay did not finish), the rest are not covered. A regression reached stands
    (:meth:`GateReport.stopped`); the search's findings are in the report either way."""
    done = [w for w in planned.done if "head" in w]
    if not done:
        return
    compared = 0
    for w in done:
        got = planned.base.get(w["task"].id)  # what base's replay gave before the stop
        w["base"] = got if got and any(r.error != OUT_OF_TIME for r in got) else None
        compared += w["base"] is not None
    ids = {w["task"].id for w in done}
    report.not_covered = sorted(set(report.not_covered) | {t.id for t in planned.run_tasks if t.id not in ids})
    report.warnings.append(f"the run was stopped before base's replay finished: of the {len(done)} of "
                           f"{len(planned.run_tasks)} variant(s) searched by then, {compared} are judged on the inputs "
                           f"base replayed by then (each variant's deciding inputs first), {len(done) - compared} "
                           "against their stored baselines only")
    judge_stage(opts, ctx, planned, done, report, recheck=False)


def _decide(ctx: Context, w: dict, base) -> V.VariantVerdict:
    """A work item's verdict against ``base``'s results (the judge's rules, nothing more): what
    the judge stage decides, and what the fuzz stage asks of an incomplete base replay."""
    return decide(w["spec"], w["task"].variant, w["head"], base, w["row"], w["status"], w["finding"],
                  ctx.settings, inputs=[c.summary() for c in w["cands"]],
                  controls=[c.origin == "control" for c in w["cands"]],
                  ordinary=[c.origin == "control" or c.origin.startswith(("degenerate", "structured"))
                            for c in w["cands"]])


def _verdict(opts: RunOptions, ctx: Context, planned: Planned, w: dict, recheck: bool = True) -> V.VariantVerdict:
    """One work item's verdict, with its figures, source, repro command and determinism check."""
    task, finding = w["task"], w["finding"]
    vv = _decide(ctx, w, w["base"])
    vv.source_file, vv.source_line = w["src"]
    vv.details.update({"abs": _m(finding, "abs"), "rel": _m(finding, "rel"), "l1": _m(finding, "l1")})
    if finding.extra.get("search") == "exhaustive":  # every 16-bit value was run: exact maxima, head and base
        vv.details["search"] = "exhaustive"
        vv.details["exhaustive"] = {k: v for k, v in finding.extra["exhaustive"].items() if k != "sets"}
    if vv.input_summary is None and finding.best is not None:
        vv.input_summary = finding.best.summary()
    under_searched(vv, ctx.settings, opts.evals)
    vv.repro_command = (f"dl-gate fuzz {task.op.name} --dtype {task.variant.dtype} --mode {task.variant.mode} "
                        f"--device {task.variant.device} --seed {task.seed} "
                        + (f"--evals {finding.evals}" if opts.evals else f"--budget {planned.per_op:g}"))
    if recheck and vv.outcome in (V.REGRESSION, V.BEHAVIOUR_CHANGE):
        i = vv.details.get("input_index")
        if i is not None and i < len(w["cands"]):
            recheck_determinism(vv, w["spec"], task.variant, w["cands"][i], w["head"][i], isolate=planned.isolate)
    return vv


def _build(tree: Path, cfg: Config, raw, side: str, report: V.GateReport, out: Path, say) -> bool:
    """Build the library's extension in ``tree`` as ``raw`` (the side's ``build:``) says, cached
    by source hash. Head failing is the run's error; base failing leaves base unreplayed (the
    stored baselines judge). True when there is nothing to build or the build is in place."""
    from .backends.build import BuildError, BuildSpec, build_tree, write_log

    spec = BuildSpec.from_config(raw, cfg.root)
    if spec is None:
        return True
    try:
        res = build_tree(tree, spec, side, say)
    except BuildError as exc:
        log = write_log(out, side, exc)
        report.env.setdefault("build", {})[side] = {"error": exc.first_error or str(exc),
                                                     "log": str(log) if log else None}
        if side == "head":
            raise
        report.warnings.append(f"{exc}; base is not replayed, head is judged against the stored baselines")
        return False
    report.env.setdefault("build", {})[side] = res.to_dict()
    return True


def _kernels(repo: Path, head_sha: str, catalog: Catalog, cfg: Config, report: V.GateReport):
    """Operators that launch Triton kernels: the interpreter on CPU, compiled on CUDA (set up
    before the library is imported); noted in the report."""
    from .backends.triton_support import activate
    from .select.kernels import operator_kernels

    run = activate(operator_kernels(repo, head_sha, catalog, cfg))
    if run is not None:
        report.env["triton"] = run.to_dict()
    return run


def _fuzz_one(task: Task, planned: dict, store, repo: Path, seed_store, isolate, base_isolate,
              base_spec: Optional[OpSpec], say, sources: Dict[str, Tuple[Optional[str], Optional[int]]],
              costs: Optional[Dict[str, float]] = None, stop_at: Optional[float] = None) -> dict:
    """Fuzz one variant (against base where it can run: gate.judge.contrast) and replay on head
    every input the verdict will be made on: the corpus, the search's, controls, degenerate.
    ``stop_at`` (``time.time()``: the fuzz stage's deadline): head's replay starts no input past
    it (the inputs it did not reach are not judged, and not replayed on base either)."""
    from .fuzz import fuzz_task
    from .search.inputs import accumulation_inputs, degenerate_inputs, draw, neighbours, structured_inputs
    from .judge.contrast import contrast_runner

    spec, row, status = planned["spec"], planned["row"], planned["status"]
    if spec.name not in sources:
        sources[spec.name] = op_source(spec, repo)
    corpus_error = None
    try:
        corpus = store.corpus(row) if row is not None and status == "ok" else []
    except BaselineError as exc:  # one row's stored inputs unreadable: this variant searches without them
        corpus, corpus_error = [], str(exc)
    say(f"fuzzing {task.id}")
    runner = None
    if base_isolate is not None and spec.origin == "user" and task.variant.oracle == "precision":
        runner = contrast_runner(spec, base_side(spec, base_spec), task.variant, isolate, base_isolate)
    try:
        finding = fuzz_task(task, seeds=corpus, seed_store=seed_store, isolate=isolate, runner=runner)
    finally:
        if runner is not None:
            finding_stats = dict(runner.stats)
            runner.close()
    if runner is not None:
        finding.coverage["contrast"] = finding_stats
    rng = np.random.default_rng(task.rng_seed() + [1])
    groups: Dict[str, list] = {"corpus": list(corpus), "found": list(finding.inputs), "neighbours": []}
    anchor = finding.best_finite or finding.best
    if anchor is not None and finding.extra.get("search") != "exhaustive":  # exact maxima need no draws
        # the worst input's roundings: base's error there is a distribution, not one draw
        groups["neighbours"] = neighbours(spec, anchor, task.variant.dtype, np.random.default_rng(task.rng_seed() + [2]))
    controls = [draw(spec, rng, origin="control") for _ in range(3)]
    groups["control"], groups["controls"] = controls[:1], controls[1:]
    like = controls[-1]
    groups["degenerate"] = degenerate_inputs(spec, like)  # all zeros, one constant: where a dropped guard shows
    groups["structured"] = structured_inputs(spec, like)  # peaked rows, ties, a wide dynamic range: what real data has
    groups["accumulation"] = accumulation_inputs(spec, like, task.variant.dtype)  # partial sums that overflow the dtype
    groups["tests"] = seed_store.tests_calls(spec, [c for g in groups.values() for c in g],
                                             task.variant.dtype)  # the library's own test inputs
    # an evaluation's cost: the search's mean past its first call's one-off warm-up, or its one
    # call; a search that got no evaluation (its share spent) takes its operator's, where known
    costs = {} if costs is None else costs
    if finding.evals >= 1:
        costs[spec.name] = (max(0.0, finding.seconds - finding.warmup) / (finding.evals - 1) if finding.evals > 1
                            else finding.seconds)
    cands, replayed = judged_inputs(groups, costs.get(spec.name), task.budget.seconds)
    deadline = None if stop_at is None else time.monotonic() + (stop_at - time.time())
    head_results = replay_head(spec, task.variant, cands, finding.crashes, isolate=isolate, deadline=deadline)
    late = [i for i, r in enumerate(head_results) if r.error == OUT_OF_TIME]
    if late and len(late) == len(cands):  # the search's worst at least (the reserve holds one evaluation)
        head_results[0] = replay_head(spec, task.variant, cands[:1], finding.crashes, isolate=isolate)[0]
        late = late[1:]
    if late:
        # naver/roma's fix at load 3: special_procrustes' gradient replayed its 24 judged inputs
        # (matrices grown to 4096 rows) for 130 s past a 4 s share, and the run met its deadline
        # before base's replay had begun; the inputs head could not reach in time are not judged
        keep = [i for i in range(len(cands)) if i not in set(late)]
        left = dict((replayed or {}).get("left_out") or {})
        left["past the fuzz stage's deadline"] = len(late)
        replayed = {"kept": len(keep), "of": (replayed or {}).get("of", len(cands)),
                    "cost": round(costs.get(spec.name) or 0.0, 3), "left_out": left}
        cands, head_results = [cands[i] for i in keep], [head_results[i] for i in keep]
    return {"spec": spec, "task": task, "finding": finding, "row": row, "status": status, "replayed": replayed,
            "cands": cands, "head": head_results, "src": sources[spec.name], "corpus_error": corpus_error}


#: the groups of inputs a variant's verdict is made on, in the order they are replayed (head, then
#: base), and, where they cannot all be, the order they are kept in: the search's worst first
JUDGED_ORDER = ("corpus", "found", "neighbours", "control", "controls", "degenerate", "structured",
                "accumulation", "tests")
JUDGED_PRIORITY = ("found", "control", "corpus", "degenerate", "neighbours", "controls", "structured",
                   "accumulation", "tests")
#: seconds a variant's replays may always take, whatever its search's share (a variant whose share
#: was spent before its search still replays a fast operator's every input)
REPLAY_FLOOR = 10.0


def judged_inputs(groups: Dict[str, list], cost: Optional[float], seconds: Optional[float]
                  ) -> Tuple[list, Optional[dict]]:
    """The inputs a variant is judged on, in :data:`JUDGED_ORDER`, and (None, or what was left
    out) where a time-budgeted run cannot replay them all: each is evaluated on head and again on
    base, ~``cost`` seconds each (the operator's measured mean), and a variant's replays may take
    about its search's share ``seconds`` (at least :data:`REPLAY_FLOOR`). Past that, the groups are
    kept in :data:`JUDGED_PRIORITY` (the search's worst, one random control, the stored inputs, the
    degenerate ones, ...) down to at least the search's and one control. An operator of several
    seconds an evaluation (lucidrains' memory-efficient attention beside a test suite: 7.4-9.5 s)
    otherwise replayed its ~15 fixed inputs past the run's deadline, and the run that had reached a regression was
    stopped as an error. An ``--evals`` run (``seconds`` None), or an operator whose cost is not
    known (``cost`` None: no evaluation of it measured), replays every input."""
    every = [c for g in JUDGED_ORDER for c in groups.get(g, ())]
    if seconds is None or cost is None or cost <= 0:
        return every, None
    allowed = max(seconds, REPLAY_FLOOR)
    if len(every) * cost <= allowed:
        return every, None
    room = max(int(allowed // cost), len(groups.get("found", ())) + min(1, len(groups.get("control", ()))))
    keep: Dict[str, int] = {}
    for g in JUDGED_PRIORITY:
        n = min(len(groups.get(g, ())), room)
        keep[g], room = n, room - n
    kept = [c for g in JUDGED_ORDER for c in list(groups.get(g, ()))[:keep.get(g, 0)]]
    left = {g: len(groups.get(g, ())) - keep.get(g, 0) for g in JUDGED_ORDER if len(groups.get(g, ())) > keep.get(g, 0)}
    return kept, {"kept": len(kept), "of": len(every), "cost": round(cost, 3), "left_out": left}


def localise_stage(report: V.GateReport, work: List[dict], ctx: dict) -> None:
    """Run the localise stage when it is installed (gate.localise.localise_all)."""
    try:
        from .localise import localise_all
    except ImportError:
        return
    localise_all(report, work, ctx)


def _m(f, key):
    return getattr(f.metrics, key) if f.metrics else None
