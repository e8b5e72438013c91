"""What a reviewer acts on, computed once for every surface (PR comment, job summary, terminal):

* **root causes**: the failing verdicts grouped by the changed line the localiser ranked first
  (one block per line: which operators and variants, the smallest input, head vs base, the repro);
  verdicts no changed line was found for are grouped by their operator's source;
* an **operator x dtype grid** of outcomes (modes merged, the worst shown);
* **improvements**, named;
* **one next step**: the ``dl-gate explain`` command for the finding with the smallest input, and
  the repro script's command, with the paths a reviewer has after downloading the run's artifact.

Pure functions over :class:`~gate.judge.verdict.GateReport`, no I/O and no Markdown: the
reporters render the text. Head and base are always written the same way ("N NaN/Inf, E ulp"
for both), so a head figure of "0 ulp + 142 NaN/Inf" never reads better than base's."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Dict, List, Optional, Tuple

from ..judge.verdict import (BEHAVIOUR_CHANGE, ERROR, IMPROVEMENT, NOT_MEASURED, PASS, REGRESSION,
                             UNDER_SEARCHED, GateReport, VariantVerdict)
from .common import SEVERITY, changed_code, diag, fmt_num, is_failing, new_nonfinite, ordered, repro_command

#: the name of the artifact the workflows ``dl-gate init`` writes upload the output folder as
ARTIFACT = "dl-gate-report"
#: the folder a reviewer downloads it into (and the Action's default ``out``)
OUT = "dl-gate-out"


@dataclass
class Cause:
    """Failing verdicts that share their most likely changed line (or, with none located, their
    operator's source)."""

    file: Optional[str]
    line: Optional[int]
    symbol: str = ""
    deleted: bool = False
    located: bool = True  # False: no changed line reaches these verdicts; file/line are the operator's
    verdicts: List[VariantVerdict] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line or 1}" if self.file else "(no source location)"

    @property
    def ops(self) -> List[str]:
        return sorted({v.op for v in self.verdicts})

    @property
    def smallest(self) -> VariantVerdict:
        return smallest(self.verdicts)

    @property
    def also(self) -> Optional[VariantVerdict]:
        """The most severe verdict of another kind than the smallest input's (a precision loss
        beside new NaN/Inf), or None."""
        other = [v for v in self.verdicts if kind(v) != kind(self.smallest)]
        return max(other, key=_severity_score) if other else None


def kind(v: VariantVerdict) -> str:
    """What kind of failure a verdict is, in two words or fewer."""
    if v.head_crash and not v.base_crash:
        return "crash"
    if new_nonfinite(v):
        return "NaN/Inf"
    if v.outcome == BEHAVIOUR_CHANGE:
        return "behaviour"
    if v.outcome == REGRESSION:
        return "precision"
    return v.outcome


def _severity_score(v: VariantVerdict) -> Tuple[int, float]:
    order = {"crash": 3, "NaN/Inf": 2, "precision": 1}
    r = v.ratio if v.ratio is not None and not math.isnan(v.ratio) else 0.0
    return (order.get(kind(v), 0), r)


def _elements(v: VariantVerdict) -> float:
    n = diag(v).get("minimal_input_elements")
    return float(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else math.inf


def smallest(verdicts: List[VariantVerdict]) -> VariantVerdict:
    """The verdict whose minimal input is smallest (a reviewer reads it fastest); among equals the
    most severe, then one with a repro script."""
    return min(verdicts, key=lambda v: (_elements(v), -_severity_score(v)[0], not repro_command(v),
                                        -(_severity_score(v)[1]), v.id))


def causes(report: GateReport) -> List[Cause]:
    """Failing verdicts grouped by their first changed line, most verdicts first."""
    groups: Dict[tuple, Cause] = {}
    for v in ordered(report):
        if not is_failing(report, v):
            continue
        code = changed_code(v)
        if code:
            c = code[0]
            try:
                line = int(c.get("line") or 1)
            except (TypeError, ValueError):
                line = 1
            key = ("code", str(c.get("file")), line)
            if key not in groups:
                groups[key] = Cause(str(c.get("file")), line, str(c.get("symbol") or ""), bool(c.get("deleted")))
        else:
            key = ("op", v.source_file or "", v.op)
            if key not in groups:
                groups[key] = Cause(v.source_file, v.source_line, v.op, located=False)
        groups[key].verdicts.append(v)
    return sorted(groups.values(), key=lambda c: (not c.located, -len(c.verdicts), c.where))


def sides(v: VariantVerdict) -> Tuple[str, str]:
    """(head, base) figures written the same way: NaN/Inf counts first on both sides whenever
    either side has any (zero included), "raises" for a crash."""
    unit = f" {v.metric}" if v.metric else ""
    nf = bool(v.head_nonfinite or v.base_nonfinite)

    def one(error: Optional[float], nonfinite: Optional[int], crash: Optional[str]) -> str:
        if crash:
            return "raises"
        err = f"{fmt_num(error)}{unit}" if error is not None else "–"
        return f"{nonfinite or 0} NaN/Inf, {err}" if nf else err

    return one(v.head_error, v.head_nonfinite, v.head_crash), one(v.base_error, v.base_nonfinite, v.base_crash)


def head_vs_base(v: VariantVerdict) -> str:
    """``head X vs base Y (threshold T)``, both sides written by :func:`sides`."""
    head, base = sides(v)
    text = f"head {head} vs base {base}"
    if v.threshold is not None and not (v.head_crash or v.base_crash):
        text += f" (threshold {fmt_num(v.threshold)}{f' {v.metric}' if v.metric else ''})"
    return text


# -- the grid --------------------------------------------------------------------------------------

def column(v: VariantVerdict, devices: int) -> str:
    """A grid column: the dtype, with the oracle and the layout when not the plain ones (modes are
    merged into one cell), and the device when the run had several."""
    var = v.variant or {}
    parts = [str(var.get("dtype") or "?")]
    oracle = var.get("oracle") or "precision"
    if oracle != "precision":
        parts.append(str(oracle))
    layout = var.get("layout") or "default"
    if layout != "default":
        parts.append(str(layout))
    if devices > 1:
        parts.append(str(var.get("device") or "cpu"))
    return " ".join(parts)


_DTYPE_ORDER = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}


def grid(report: GateReport) -> Tuple[List[str], List[Tuple[str, Dict[str, List[VariantVerdict]]]]]:
    """(columns, [(operator, {column: verdicts})]) over every judged verdict."""
    devices = len({(v.variant or {}).get("device", "cpu") for v in report.verdicts})
    cols: List[str] = []
    rows: Dict[str, Dict[str, List[VariantVerdict]]] = {}
    for v in report.verdicts:
        c = column(v, devices)
        if c not in cols:
            cols.append(c)
        rows.setdefault(v.op, {}).setdefault(c, []).append(v)
    cols.sort(key=lambda c: (_DTYPE_ORDER.get(c.split()[0], 9), c.split()[0], len(c.split()), c))

    def op_order(item):
        failing = any(is_failing(report, v) for vs in item[1].values() for v in vs)
        return (not failing, item[0])

    return cols, sorted(rows.items(), key=op_order)


def cell(report: GateReport, verdicts: List[VariantVerdict]) -> Tuple[str, str]:
    """(outcome, short text) of a grid cell: its worst verdict."""
    if not verdicts:
        return ("", "")
    v = min(verdicts, key=lambda v: (-1 if is_failing(report, v) else SEVERITY.get(v.outcome, 9),
                                     -_severity_score(v)[0]))
    if is_failing(report, v):
        return (REGRESSION, kind(v))
    short = {IMPROVEMENT: "improved", PASS: "pass", UNDER_SEARCHED: "under-searched", ERROR: "error",
             NOT_MEASURED: "not measured", BEHAVIOUR_CHANGE: "reported"}
    return (v.outcome, short.get(v.outcome, v.outcome))


# -- improvements and the next step --------------------------------------------------------------

def improvements(report: GateReport) -> List[Tuple[VariantVerdict, str]]:
    """(verdict, what improved) of every improvement: NaN/Inf or crashes fixed first (most inputs
    first), then the largest precision gain."""
    out = []
    for v in report.verdicts:
        if v.outcome != IMPROVEMENT:
            continue
        unit = f" {v.metric}" if v.metric else ""
        fixed = (v.details or {}).get("fixed_inputs") or 0
        errs = f"{fmt_num(v.base_error)} → {fmt_num(v.head_error)}{unit}"
        if fixed:
            text = f"fixes NaN/Inf or a crash on {fixed} input(s); elsewhere {errs}"
        elif (v.base_nonfinite or 0) > (v.head_nonfinite or 0):
            text = f"NaN/Inf {v.base_nonfinite} → {v.head_nonfinite or 0}"
        else:
            text = errs
        gain = (v.base_error or 0.0) / v.head_error if v.head_error else math.inf
        out.append(((-int(fixed), -gain if not math.isnan(gain) else 0.0, v.id), v, text))
    out.sort(key=lambda t: t[0])
    return [(v, text) for _, v, text in out]


def _basename(path: str) -> str:
    return (PureWindowsPath(path) if "\\" in path else PurePosixPath(path)).name


def repro_in_artifact(v: VariantVerdict, out: str = OUT) -> Optional[str]:
    """The repro script's path in the run's output folder as a reviewer has it locally
    (``dl-gate-out/repro/NAME.py``): the runner's absolute path means nothing off the runner."""
    script = diag(v).get("repro_script")
    if not script:
        rc = repro_command(v) or ""
        script = next((w for w in rc.split() if w.endswith(".py")), "")
    return f"{out}/repro/{_basename(script)}" if script else None


@dataclass
class NextStep:
    download: Optional[str]  # the command that fetches the run's artifact (None: run locally)
    explain: str  # dl-gate explain ...
    repro: Optional[str]  # python dl-gate-out/repro/....py
    finding: str  # the verdict id the commands are about


def next_step(report: GateReport, *, out: str = OUT, run_id: Optional[str] = None,
              repository: Optional[str] = None, artifact: str = ARTIFACT) -> Optional[NextStep]:
    """What to run first: on the finding with the smallest input (the first cause's), or, with
    no failing verdict, on nothing (None)."""
    cs = causes(report)
    if not cs:
        return None
    v = cs[0].smallest
    download = None
    if run_id and repository:
        download = f"gh run download {run_id} -R {repository} -n {artifact} -D {out}"
    explain = f"dl-gate explain '{out}/report.json#{v.id}'"
    script = repro_in_artifact(v, out)
    return NextStep(download, explain, f"python {script}" if script else None, v.id)
