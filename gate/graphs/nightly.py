"""The scheduled (nightly) run of the two methods that test operators where users meet them:
multi-operator graphs (:mod:`gate.graphs.campaign`) and deployment-path differentials
(:mod:`gate.oracles.export`), within one total budget split by ``share``.

``run_nightly`` returns plain :class:`gate.search.finding.Finding` rows — variant oracle
``graph`` (op = the graph's structural signature) or ``export`` (mode = the deployment path) —
that the baselines stage stores and the judge compares like any other row. ``nightly`` returns
the same rows with the run's coverage figures, campaign statistics and export failures grouped
by converter function.
"""
from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..backends import framework_installed, get_backend
from ..backends.exporters import get_path, paths_for
from ..errors import GateError
from ..oracles.export import Exportable, export_finding, group_failures, op_exportable
from ..search.finding import Finding
from ..ops.spec import OpSpec
from ..oracles.export_metrics import EXPORT_DTYPE
from ..plan import Variant
from .campaign import CampaignResult, GraphCampaign
from .evaluate import DEFAULT_FLOOR_ULP, GraphRunner
from .generate import ARMS, GraphSpace
from .model import Graph

DEFAULT_SHARE = {"graphs": 0.5, "export": 0.5}


@dataclass
class NightlyRun:
    findings: List[Finding]
    seed: int
    budget_seconds: float
    seconds: float = 0.0
    coverage: Dict[str, dict] = field(default_factory=dict)  # framework -> coverage figures
    campaigns: Dict[str, CampaignResult] = field(default_factory=dict)
    export_failures: Dict[str, List[str]] = field(default_factory=dict)  # "<path>: <function>" -> ids
    not_covered: List[str] = field(default_factory=list)  # export rows the budget did not reach
    notes: List[str] = field(default_factory=list)

    def to_dict(self, with_inputs: bool = False) -> dict:
        return {
            "seed": self.seed,
            "budget_seconds": self.budget_seconds,
            "seconds": round(self.seconds, 3),
            "coverage": self.coverage,
            "campaigns": {k: c.to_dict() for k, c in self.campaigns.items()},
            "export_failures": self.export_failures,
            "not_covered": self.not_covered,
            "notes": self.notes,
            "findings": [f.to_dict(with_inputs) for f in self.findings],
        }


def _shares(share: Optional[Mapping[str, float]]) -> Dict[str, float]:
    s = dict(DEFAULT_SHARE if share is None else share)
    bad = [k for k in s if k not in DEFAULT_SHARE]
    if bad:
        raise GateError(f"unknown share {', '.join(bad)} (use {', '.join(DEFAULT_SHARE)})")
    if any(v < 0 for v in s.values()) or sum(s.values()) <= 0:
        raise GateError("shares must be non-negative and not all zero")
    total = sum(s.values())
    return {k: s.get(k, 0.0) / total for k in DEFAULT_SHARE}


def graph_exportable(finding: Finding, specs: Mapping[str, OpSpec]) -> Optional[Tuple[Exportable, object]]:
    """A graph finding as a model to export, with its worst input as the example."""
    raw = (finding.extra or {}).get("graph")
    if not raw or finding.best is None:
        return None
    g = Graph.from_dict(raw)
    runner = GraphRunner(g, specs, EXPORT_DTYPE)
    floors = [runner.specs[j].threshold(EXPORT_DTYPE).ulp for j in g.sinks]
    floor = max([f for f in floors if math.isfinite(f)] or [DEFAULT_FLOOR_ULP])
    ex = Exportable(name=g.signature, framework=g.framework, spec=runner.spec, model=runner.model(),
                    reference=runner.model(reference=True), floor_ulp=floor, ulp_floor="output")
    return ex, finding.best


def nightly(catalog: Iterable[OpSpec], *, budget_seconds: float, seed: int = 0, frameworks: Sequence[str] = ("torch",),
            share: Optional[Mapping[str, float]] = None, arm: str = "mcts", dtypes: Sequence[str] = ("float16",),
            device: str = "cpu", evals_per_graph: int = 4, max_graphs: Optional[int] = None,
            export_paths: Optional[Sequence[str]] = None, export_evals: int = 12, export_graphs: int = 3,
            export_ops: Optional[Sequence[str]] = None,
            progress: Optional[Callable[[str], None]] = None) -> NightlyRun:
    """Graph fuzzing, then export differentials, within ``budget_seconds`` in all."""
    if budget_seconds <= 0:
        raise GateError("the nightly budget must be a positive number of seconds")
    if arm not in ARMS:
        raise GateError(f"unknown arm {arm!r} (use {', '.join(ARMS)})")
    shares = _shares(share)
    for name in export_paths or ():
        get_path(name)  # a one-line error for an unknown path
    specs = list(catalog)
    t0 = time.perf_counter()
    run = NightlyRun(findings=[], seed=seed, budget_seconds=budget_seconds)
    say = progress or (lambda msg: None)
    fws = _installed(frameworks, run)

    # -- 1. graphs -------------------------------------------------------------------------
    graph_rows: Dict[str, List[Finding]] = {}
    if shares["graphs"] > 0:
        graph_rows = _graphs(specs, fws, run, per_fw=budget_seconds * shares["graphs"] / len(fws), arm=arm,
                             dtypes=dtypes, seed=seed, evals_per_graph=evals_per_graph, device=device,
                             max_graphs=max_graphs, say=say)

    # -- 2. export differentials ------------------------------------------------------------
    if shares["export"] > 0:
        export_budget = budget_seconds * shares["export"]
        if shares["graphs"] == 0 or max_graphs is not None:
            deadline = time.perf_counter() + export_budget
        else:
            deadline = t0 + budget_seconds
        jobs = _export_jobs(specs, fws, graph_rows, run, export_paths=export_paths, export_graphs=export_graphs,
                            export_ops=export_ops, export_evals=export_evals, seed=seed, device=device)
        say(f"export: {len(jobs)} model x path rows")
        _run_jobs(jobs, deadline, run)
        run.export_failures = group_failures(run.findings)
    run.seconds = time.perf_counter() - t0
    return run


def _installed(frameworks: Sequence[str], run: NightlyRun) -> List[str]:
    """The frameworks of ``frameworks`` that are installed (a note for each one that is not)."""
    fws = []
    for fw in frameworks:
        if not framework_installed(fw):
            run.notes.append(f"{fw} is not installed: skipped")
            continue
        fws.append(fw)
    if not fws:
        raise GateError(f"none of {', '.join(frameworks)} is installed")
    return fws


def _graphs(specs: List[OpSpec], fws: List[str], run: NightlyRun, *, per_fw: float, arm: str, dtypes: Sequence[str],
            seed: int, evals_per_graph: int, device: str, max_graphs: Optional[int],
            say: Callable[[str], None]) -> Dict[str, List[Finding]]:
    """One graph campaign per framework, ``per_fw`` seconds each (or ``max_graphs`` graphs);
    their findings go into ``run`` and come back by framework."""
    graph_rows: Dict[str, List[Finding]] = {}
    for fw in fws:
        start = time.perf_counter()
        try:
            space = GraphSpace.build(specs, fw, dtypes=dtypes, device=device)
        except ValueError as exc:
            run.notes.append(f"graphs ({fw}): {exc}")
            continue
        for name, why in sorted(space.ineligible.items()):
            run.notes.append(f"graphs ({fw}): {name} is not a graph node: {why}")
        left = per_fw - (time.perf_counter() - start)
        say(f"graphs ({fw}, {arm}): {len(space.ops)} operators, {left:.0f}s")
        camp = GraphCampaign(space, arm=arm, dtypes=dtypes, seed=seed, evals_per_graph=evals_per_graph,
                             device=device)
        res = camp.run(seconds=max(left, 0.0) if max_graphs is None else None, graphs=max_graphs)
        run.campaigns[fw] = res
        run.coverage[fw] = res.coverage
        graph_rows[fw] = res.findings
        run.findings.extend(res.findings)
    return graph_rows


def _export_jobs(specs: List[OpSpec], fws: List[str], graph_rows: Dict[str, List[Finding]], run: NightlyRun, *,
                 export_paths: Optional[Sequence[str]], export_graphs: int, export_ops: Optional[Sequence[str]],
                 export_evals: int, seed: int, device: str) -> List[Tuple[str, Callable[[], Finding]]]:
    """The export rows to run, in order, each a label and a job: per framework, the worst few
    graphs first, then every exportable operator in a seeded order, on every usable path."""
    jobs: List[Tuple[str, Callable[[], Finding]]] = []
    rng = np.random.default_rng([seed, 0xE7])
    for fw in fws:
        paths = [p for p in paths_for(fw) if export_paths is None or p.name in export_paths]
        usable = []
        for p in paths:
            why = p.missing()
            if why:
                run.notes.append(f"export path {p.name}: not available ({why})")
            else:
                usable.append(p)
        by_name = {s.name: s for s in specs if s.framework == fw}
        # graphs first (the worst few), then every exportable operator in a seeded order
        worst = sorted((f for f in graph_rows.get(fw, []) if f.best is not None and f.metrics is not None),
                       key=lambda f: (-f.metrics.severity, f.op))
        chosen, seen = [], set()
        for f in worst:
            if f.op not in seen:
                seen.add(f.op)
                chosen.append(f)
            if len(chosen) >= export_graphs:
                break
        for f in chosen:
            for p in usable:
                if p.name == "torchscript-script":
                    continue  # a graph has no Python function of its own to script
                jobs.append((f"{f.op}[{EXPORT_DTYPE}/{device}/{p.name}/export]",
                             (lambda f=f, p=p: _export_graph(f, by_name, p.name, seed, export_evals, device))))
        names = sorted(n for n, s in by_name.items() if EXPORT_DTYPE in s.dtypes
                       and (export_ops is None or n in export_ops))
        order = [names[int(i)] for i in rng.permutation(len(names))]
        for n in order:
            for p in usable:
                jobs.append((f"{n}[{EXPORT_DTYPE}/{device}/{p.name}/export]",
                             (lambda s=by_name[n], p=p: _export_op(s, p.name, seed, export_evals, device))))
    return jobs


def _run_jobs(jobs: List[Tuple[str, Callable[[], Finding]]], deadline: float, run: NightlyRun) -> None:
    """Run the export rows in order until ``deadline``; those it did not reach are not covered."""
    for k, (label, job) in enumerate(jobs):
        left = deadline - time.perf_counter()
        if left <= 0:
            run.not_covered.extend(lbl for lbl, _ in jobs[k:])
            break
        f = job()
        if f is not None:
            run.findings.append(f)


def _export_op(spec: OpSpec, path: str, seed: int, evals: int, device: str) -> Finding:
    backend = get_backend(spec.framework)
    backend.seed(seed)
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    try:
        ex, example = op_exportable(spec, backend, rng)
    except GateError as exc:
        return Finding(op=spec.name, framework=spec.framework, status="no-valid-input", message=str(exc),
                       variant=Variant(dtype=EXPORT_DTYPE, device=device, mode=path, oracle="export"))
    return export_finding(ex, example, path, seed=seed, evals=evals, device=device)


def _export_graph(f: Finding, specs: Mapping[str, OpSpec], path: str, seed: int, evals: int,
                  device: str) -> Optional[Finding]:
    got = graph_exportable(f, specs)
    if got is None:
        return None
    ex, example = got
    out = export_finding(ex, example, path, seed=seed, evals=evals, device=device)
    out.extra["graph"] = f.extra.get("graph")
    return out


def run_nightly(catalog: Iterable[OpSpec], *, budget_seconds: float, seed: int = 0,
                frameworks: Sequence[str] = ("torch",), share: Optional[Mapping[str, float]] = None,
                **options) -> List[Finding]:
    """The scheduled run's rows: graph findings and export findings (see :func:`nightly`)."""
    return nightly(catalog, budget_seconds=budget_seconds, seed=seed, frameworks=frameworks, share=share,
                   **options).findings


__all__ = ["run_nightly", "nightly", "NightlyRun", "graph_exportable", "DEFAULT_SHARE"]
