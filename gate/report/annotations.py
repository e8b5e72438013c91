"""GitHub workflow-command annotations (``::error file=…,line=…::``).

A regression is annotated at the changed lines that reach the regressed operator
(``diagnosis.changed_code``, most likely first), falling back to the operator's own source
location. GitHub shows at most 10 error annotations (and 10 warnings) per step: the most
important ones are kept and a plain log line says how many were left out. A harness fault is a
warning (``error`` is reported, never the gate's failure unless ``fail-on`` says so); a missing
baseline is a notice.

Every value is escaped as the runner expects (``%``, CR, LF in the message; also ``:`` and
``,`` in properties), so report text (untrusted in a fork's ``workflow_run``) can never start a
workflow command of its own."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import IO, Dict, List, Optional, Tuple

from ..judge.verdict import BEHAVIOUR_CHANGE, ERROR, NEEDS_BASELINE, GateReport
from .common import (ANNOTATIONS_PER_STEP, changed_code, is_failing, new_nonfinite, one_line,
                     ordered, relpath)
from .digest import head_vs_base


def escape_data(s: str) -> str:
    return str(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def neutral(s: str) -> str:
    """Text safe to print to a step's log: one line, and no ``::`` that could read as a
    workflow command."""
    return one_line(s, 2000).replace("::", ": :")


@dataclass(frozen=True)
class Annotation:
    level: str  # error | warning | notice
    message: str
    title: str = ""
    file: Optional[str] = None
    line: Optional[int] = None

    def command(self) -> str:
        props = []
        if self.file:
            props.append(f"file={escape_property(self.file)}")
            if self.line:
                props.append(f"line={int(self.line)}")
        if self.title:
            props.append(f"title={escape_property(self.title)}")
        head = f"::{self.level}" + (" " + ",".join(props) if props else "")
        return f"{head}::{escape_data(self.message)}"


def _targets(v, root) -> List[Tuple[Optional[str], Optional[int]]]:
    out: List[Tuple[Optional[str], Optional[int]]] = []
    for c in changed_code(v):
        f = relpath(str(c.get("file")), root)
        if f:
            try:
                line = int(c.get("line") or 1)
            except (TypeError, ValueError):
                line = 1
            out.append((f, max(1, line)))
    if not out:
        f = relpath(v.source_file, root) if v.source_file else None
        out.append((f, int(v.source_line) if f and v.source_line else None))
    return out


def build_annotations(report: GateReport, root: Optional[os.PathLike] = None) -> List[Annotation]:
    """Every annotation the report deserves, most important first (not yet capped)."""
    notes: List[Annotation] = []
    # failing variants grouped by the line they point at: one annotation per changed line,
    # never a pile of them on one line (GitHub shows only 10 per step)
    at: Dict[Tuple[Optional[str], Optional[int]], List[Tuple[object, str]]] = {}
    for v in ordered(report):
        figures = ""
        if new_nonfinite(v) or v.head_error is not None:  # head and base written alike, as on every surface
            figures = f" ({head_vs_base(v)})"
        if is_failing(report, v):
            for f, line in _targets(v, root):
                group = at.setdefault((f, line), [])
                if not group:  # a placeholder keeps this location's place in severity order
                    notes.append(Annotation("error", "", "", f, line))
                if all(u is not v for u, _ in group):
                    group.append((v, figures))
        elif v.outcome == ERROR:
            notes.append(Annotation("warning", f"{v.id}: {one_line(v.reason)}", f"dl-gate harness error: {v.op}",
                                    relpath(v.source_file, root), v.source_line))
        elif v.outcome == BEHAVIOUR_CHANGE:
            notes.append(Annotation("warning", f"{v.id}: {one_line(v.reason)}{figures}",
                                    f"dl-gate behaviour change: {v.op}", relpath(v.source_file, root), v.source_line))
        elif v.outcome == NEEDS_BASELINE:
            notes.append(Annotation("notice", f"{v.id}: {one_line(v.reason)}", f"dl-gate needs a baseline: {v.op}"))
    for i, n in enumerate(notes):
        if n.level == "error" and not n.title:
            group = at[(n.file, n.line)]
            v, figures = group[0]
            where = "this change reaches " if changed_code(v) else ""
            more = f" (+{len(group) - 1} more failing variant(s): see the job summary)" if len(group) > 1 else ""
            ops = sorted({u.op for u, _ in group})
            notes[i] = Annotation("error", f"{where}{v.id}: {one_line(v.reason)}{figures}{more}",
                                  f"dl-gate {v.outcome}: {', '.join(ops)[:120]}", n.file, n.line)
    setup = bool(report.env.get("setup_error"))  # the workflow is set up so that nothing can be judged
    level, title = ("error", "dl-gate setup error") if setup else ("warning", "dl-gate harness error")
    for e in report.errors:
        notes.append(Annotation(level, one_line(e), title))
    if report.outcome == "error" and not report.errors:
        notes.append(Annotation(level, one_line(report.reason), title))
    # a change that reaches an operator the configuration does not gate: at the changed line
    ungated = ((report.env.get("selection") or {}).get("not_gated") or []) if isinstance(report.env, dict) else []
    for n in ungated:
        notes.append(Annotation("warning", one_line(f"this change reaches {n['op']}, which is not gated: "
                                                    f"{n.get('why') or 'listed under not_gated'}; {how_to_gate(n['op'])}"),
                                "dl-gate: not gated", n.get("file"), n.get("line")))
    for w in report.warnings:
        if ungated and w.startswith(NOT_GATED_WARNING):
            continue  # said at the changed line above
        notes.append(Annotation("warning", one_line(w), "dl-gate"))
    return notes


#: how the run's warning about a change to an operator that is not gated begins (gate.pipeline)
NOT_GATED_WARNING = "not gated: "


def how_to_gate(op: str) -> str:
    """What to do about an operator a change reaches and the config does not gate."""
    return (f"add a row for it under ops: to gate it (`dl-gate init --ops {op}` adds the one it can build and "
            f"leaves the other rows as they are; by hand: docs/config.md, 'Operator rows')")


def cap(notes: List[Annotation], per_level: int = ANNOTATIONS_PER_STEP) -> Tuple[List[Annotation], Dict[str, int]]:
    """Keep the first ``per_level`` of each level; return them and the counts left out."""
    kept: List[Annotation] = []
    dropped: Dict[str, int] = {}
    used: Dict[str, int] = {}
    for n in notes:
        if used.get(n.level, 0) < per_level:
            kept.append(n)
            used[n.level] = used.get(n.level, 0) + 1
        else:
            dropped[n.level] = dropped.get(n.level, 0) + 1
    return kept, dropped


def emit_annotations(report: GateReport, root: Optional[os.PathLike] = None, stream: Optional[IO[str]] = None,
                     per_level: int = ANNOTATIONS_PER_STEP) -> List[Annotation]:
    """Print the annotations (capped per level) as workflow commands; return those printed."""
    stream = stream or sys.stdout
    kept, dropped = cap(build_annotations(report, root), per_level)
    for n in kept:
        print(n.command(), file=stream)
    for level, n in sorted(dropped.items()):
        print(f"dl-gate: {n} more {level} annotation(s) left out (GitHub shows {per_level} per step); "
              "see the job summary", file=stream)
    stream.flush()
    return kept
