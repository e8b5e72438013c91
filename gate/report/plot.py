"""A PNG chart of base vs head error per operator x variant, saved with the artifacts.

matplotlib is an optional extra (``pip install 'dl-gate[plot]'``; the action's image has it):
without it the report is complete (the Markdown carries a Mermaid chart GitHub renders) and
:func:`write_plot` returns None with the reason in :data:`LAST_SKIP`. matplotlib is imported
only here and only when a plot is written, with the non-interactive Agg canvas (no pyplot, no
global backend state)."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from ..judge.verdict import GateReport
from .common import head_for_chart, is_failing, new_nonfinite, ordered

MAX_VARIANTS = 60
LAST_SKIP: Optional[str] = None

#: the width of one character of an 8-point tick label in inches (DejaVu Sans averages ~0.6 em)
_CHAR_IN = 8 * 0.6 / 72

_COLOURS = {"fail": "#cf222e", "pass": "#2da44e", "other": "#bf8700", "base": "#8c959f"}


def write_plot(report: GateReport, path: os.PathLike, root: Optional[os.PathLike] = None) -> Optional[Path]:
    """Write a horizontal grouped bar chart (base grey, head coloured by outcome, threshold as a
    black tick; log scale when the errors span more than
    1.5 decades or one is infinite). Returns the path, or None
    when there is nothing to plot or matplotlib is not installed. (``root``: unused, the chart
    names no source file; a file sink's writer takes it.)"""
    global LAST_SKIP
    if os.environ.get("DL_GATE_PLOT", "").strip().lower() in ("0", "false", "no", "off"):
        LAST_SKIP = "PNG plot off (DL_GATE_PLOT=0)"
        return None
    rows = [v for v in ordered(report) if v.head_error is not None or v.base_error is not None]
    rows = rows[:MAX_VARIANTS]
    if not rows:
        LAST_SKIP = "no variant has an error figure to plot"
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        LAST_SKIP = "PNG plot skipped: matplotlib is not installed (pip install 'dl-gate[plot]')"
        return None
    LAST_SKIP = None

    heads = [head_for_chart(v) for v in rows]
    values = [x for v in rows for x in (v.base_error, v.head_error, v.threshold)
              if x is not None and math.isfinite(x) and x > 0]
    top = max(values) if values else 1.0
    floor = max(min(values) if values else 1.0, top * 1e-8)  # a 1e-160 error is drawn as ~0, not as an axis
    log = top / floor > 30 or any(h is not None and math.isinf(h) for h in heads)
    inf_as = top * 10

    def val(x):
        if x is None or math.isnan(x):
            return 0.0
        if math.isinf(x):
            return inf_as
        return max(x, floor / 2) if log and x > 0 else max(x, 0.0)

    n = len(rows)
    fig = Figure(figsize=(9, 1.2 + 0.42 * n), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(n))
    h = 0.38
    ax.barh([y - h / 2 for y in ys], [val(v.base_error) for v in rows], height=h, color=_COLOURS["base"],
            label="base")
    head_colours = [_COLOURS["fail"] if is_failing(report, v) else
                    (_COLOURS["pass"] if v.outcome in ("pass", "improvement") else _COLOURS["other"]) for v in rows]
    ax.barh([y + h / 2 for y in ys], [val(x) for x in heads], height=h, color=head_colours, label="head")
    thr = [(y, v.threshold) for y, v in zip(ys, rows) if v.threshold is not None and math.isfinite(v.threshold)]
    if thr:
        ax.scatter([t for _, t in thr], [y for y, _ in thr], marker="|", s=300, color="black", zorder=3,
                   label="threshold")
    for y, v, x in zip(ys, rows, heads):
        if x is not None and math.isinf(x):
            label = f" NaN/Inf ×{v.head_nonfinite}" if new_nonfinite(v) else " ∞"
            ax.text(inf_as, y + h / 2, label, va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{v.op} [{v.key}]"[:70] for v in rows], fontsize=8)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
        ax.set_xlim(left=floor / 3, right=inf_as * 30)
    metric = rows[0].metric or "error"
    ax.set_xlabel(f"max error vs float64 ({metric})")
    ax.set_title(f"dl-gate: {report.outcome} (head vs base)", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    # fixed margins from the label lengths: tight_layout measures every text (~0.45 s a chart here)
    height = 1.2 + 0.42 * n
    label_in = max(len(t.get_text()) for t in ax.get_yticklabels()) * _CHAR_IN
    fig.subplots_adjust(left=min(0.7, (label_in + 0.25) / 9), right=0.97, top=1 - 0.4 / height,
                        bottom=(0.35 + 0.5) / height)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": "dl-gate"})
    return path
