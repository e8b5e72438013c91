"""Localise: a regression -> where to look.

For every verdict that fails (``regression``, ``behaviour-change``) the stage fills
``verdict.diagnosis`` (:class:`gate.localise.model.Diagnosis`) with

1. the variant and the parameter value that drives the finding (:mod:`.vary`, one axis at a time);
2. a minimal input (:mod:`.shrink`), the worst output element and the input values feeding it;
3. base vs head outputs and errors on that input, side by side;
4. for composite operators, the first sub-operation where the error jumps (:mod:`.trace`);
5. the changed code that reaches the operator, nearest to that sub-operation first (:mod:`.code`);
6. a standalone repro script + data (:mod:`.repro`); ``dl-gate explain`` prints it all.

Every question is asked on head (in this process) and on base (one worker process in a base
worktree, :mod:`.evaluate`) on identical inputs, with the judge's own rules (:mod:`.target`).
The whole stage runs within ``budget.localise`` seconds (default 60), shared among findings;
what is cut short says ``truncated``. Nothing here raises: a failure becomes
``diagnosis.error`` and the verdict stands.

Entry point for the pipeline: :func:`localise_all` ``(report, work, ctx)``.
"""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Dict, List

from .model import Deadline, Diagnosis, safe_id

DEFAULT_BUDGET = 60.0
FAILING = ("regression", "behaviour-change")


def localise_all(report, work: List[dict], ctx: dict) -> None:
    """Diagnose every failing verdict in ``work`` (see :mod:`gate.pipeline`) within the budget."""
    items = [w for w in work if w.get("verdict") is not None and w["verdict"].outcome in FAILING
             and not w["verdict"].reported_only]  # changed alongside a stability fix, a refinement: not failed
    if not items:
        return
    t0 = time.perf_counter()
    try:
        _localise(report, items, ctx)
    except (Exception, SystemExit) as exc:  # the stage never takes the verdict down with it
        msg = f"localisation failed: {type(exc).__name__}: {exc}"
        for w in items:
            if w["verdict"].diagnosis is None:
                w["verdict"].diagnosis = {"error": msg}
        report.warnings.append(msg)
    report.env["localise"] = {**dict(report.env.get("localise") or {}), "seconds": round(time.perf_counter() - t0, 2),
                              "findings": len(items),
                              "truncated": sum(bool((w["verdict"].diagnosis or {}).get("truncated")) for w in items)}


def _budget(ctx: dict) -> float:
    cfg = ctx.get("config")
    raw = (cfg.budget if cfg is not None else {}).get("localise")
    return DEFAULT_BUDGET if raw is None else float(raw)


def _python_path(ctx: dict):
    """(base python_path, config dir relative to the repo, head python_path relative to the repo)."""
    import os

    cfg, bcfg, repo = ctx.get("config"), ctx.get("base_config"), Path(ctx["repo"]).resolve()
    head_pp = (cfg.raw.get("python_path") if cfg is not None else None) or ["."]
    base_pp = (bcfg.raw.get("python_path") if bcfg is not None else None) or head_pp
    cfg_dir = ""
    if cfg is not None and cfg.path is not None:
        try:
            cfg_dir = str(Path(cfg.path).resolve().parent.relative_to(repo))
        except ValueError:
            cfg_dir = ""
    cfg_dir = "" if cfg_dir == "." else cfg_dir
    root = Path(cfg.root) if cfg is not None else repo
    head_rel = []
    for p in head_pp:
        rel = os.path.relpath((root / p).resolve(), repo)
        head_rel.append(rel)
    return base_pp, cfg_dir, head_rel


def _spawner(ctx: dict, items: List[dict]):
    """How the localisation workers start: forked from the isolation zygote of the findings'
    framework (the one the search's workers came from: torch already imported, ~1.5 s of CPU a
    worker saved) when the run isolates and its findings share one framework; else None (a
    fresh interpreter each)."""
    iso = ctx.get("isolate")
    frameworks = {w["task"].op.framework for w in items}
    if iso is None or not getattr(iso, "zygote", False) or len(frameworks) != 1:
        return None
    from ..backends.isolate import spawn_module

    fw = frameworks.pop()
    return lambda module, argv, cwd, err: spawn_module(fw, module, argv, cwd, err, iso)


def _localise(report, items: List[dict], ctx: dict) -> None:
    from .evaluate import BaseWorker, Head, Session
    from .localiser import Localiser

    budget = _budget(ctx)
    say = ctx.get("say") or (lambda s: None)
    report.env["localise"] = {"budget": budget}
    if budget <= 0:
        for w in items:
            w["verdict"].diagnosis = Diagnosis(variant=w["task"].variant.to_dict(), truncated=True,
                                               notes=["localisation is off (budget.localise: 0)"]).to_dict()
        return
    deadline = Deadline(budget)
    say(f"localising {len(items)} finding(s) within {budget:g}s")
    base_pp, cfg_dir, head_pp = _python_path(ctx)
    spawn = _spawner(ctx, items)
    base = None
    if any(w.get("base") is not None for w in items) and ctx.get("merge_base"):
        base = BaseWorker(Path(ctx["repo"]), ctx["merge_base"], base_pp, cfg_dir, prepare=_base_build(ctx, cfg_dir),
                          spawn=spawn)
        base.start()  # checks out and starts importing while head works on the first finding
    # an isolated gate runs head's operator in workers only, also to trace its sub-operations
    head_worker = BaseWorker(Path(ctx["repo"]), None, head_pp, "", spawn=spawn) if ctx.get("isolate") is not None else None
    session = Session(Head(isolate=ctx.get("isolate")), base, head_worker)
    shared: Dict[str, object] = {"head_python_path": head_pp}
    out = Path(ctx.get("out") or "dl-gate-out")
    try:
        for n, w in enumerate(items):
            vv = w["verdict"]
            share = Deadline(deadline.left / (len(items) - n))
            t0 = time.perf_counter()
            say(f"localising {vv.id} ({share.left:.0f}s)")
            try:
                diag = Localiser(w, ctx, report, session, share, out, shared).run()
            except (Exception, SystemExit) as exc:
                diag = Diagnosis(variant=w["task"].variant.to_dict(),
                                 error=f"{type(exc).__name__}: {exc}",
                                 notes=[traceback.format_exc(limit=4).strip().splitlines()[-1]])
            diag.seconds = round(time.perf_counter() - t0, 2)
            vv.diagnosis = diag.to_dict()
            if diag.repro_command:
                if vv.repro_command:
                    vv.details["fuzz_command"] = vv.repro_command
                vv.repro_command = diag.repro_command
            if diag.details_file:
                _update_details(Path(diag.details_file), vv)
    finally:
        session.head.close()
        # how each worker started: "zygote" (forked, its framework imported) or "interpreter"
        started = {name: w.started for name, w in (("base", base), ("head", head_worker)) if w is not None and w.started}
        if started:
            report.env["localise"]["workers"] = started
        if head_worker is not None:
            head_worker.close()
        if base is not None:
            report.env["localise"]["base_requests"] = base.requests
            try:
                base.close()
            except Exception:
                pass
    report.env["localise"]["evaluations"] = session.checks


def _update_details(path: Path, vv) -> None:
    try:
        doc = json.loads(path.read_text())
        doc["diagnosis"] = vv.diagnosis
        doc["verdict"] = vv.to_dict()
        path.write_text(json.dumps(doc, indent=1, default=str))
    except Exception:
        pass


__all__ = ["localise_all", "Diagnosis", "Deadline", "safe_id"]


def _base_build(ctx: dict, cfg_dir: str):
    """The base worktree's extension build (the base config's ``build:``; cached, so normally a
    restore of what the judge stage built), or None when the library builds nothing."""
    cfg, bcfg = ctx.get("config"), ctx.get("base_config")
    raw = ((bcfg.raw if bcfg is not None else None) or (cfg.raw if cfg is not None else {}) or {}).get("build")
    if not raw or cfg is None:
        return None

    def prepare(tree: Path) -> None:
        from ..backends.build import BuildSpec, build_tree

        build_tree(tree / cfg_dir if cfg_dir else tree, BuildSpec.from_config(raw, cfg.root), "base")

    return prepare
