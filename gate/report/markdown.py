"""The Markdown report: what the job summary (``GITHUB_STEP_SUMMARY``) and the PR comment show.

Layout, top to bottom:

1. the verdict line (outcome, one-line reason, counts, base/head);
2. a table per operator x variant: base error, head error, ratio, threshold, outcome
   (passing rows fold into a ``<details>`` when there are many);
3. a Mermaid ``xychart-beta`` chart of head error (bars) against base error and threshold
   (lines), which GitHub renders inline;
4. one collapsible ``<details>`` per variant that needs a look, with whatever the localise
   stage found (parameter, minimal input, worst element, base-vs-head rows, sub-operation,
   changed code, repro script and command);
5. run-level errors, warnings, selected operators and environment.

Everything is cut to ``limit`` bytes by priority (verdict line and failing rows first, then
their localisation, then the chart, then the rest), and a cut report says so and points at
the full one. All text from the report is escaped: in the ``workflow_run`` comment job the
report comes from an untrusted fork and must not inject HTML, mentions or fences."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..judge.verdict import IMPROVEMENT, PASS, REGRESSION, GateReport, VariantVerdict
from . import digest
from .common import (RUN_ICONS, SUMMARY_LIMIT, VARIANT_ICONS, changed_code, counts_line, deleted_text, diag, fmt_num, fmt_value, head_for_chart,
                     icon, is_failing, md_code, md_fence, md_text, minimal_input, one_line, ordered, repro_command,
                     short_sha, suboperation_text, verdict_ratio)

FOLD_PASSING_OVER = 15  # more passing rows than this fold into <details>
CHART_MAX = 24  # variants in the inline chart


@dataclass
class _Block:
    order: tuple  # position in the document
    priority: tuple  # inclusion order when cutting (smaller first)
    text: str

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8")) + 1


def _nbytes(s: str) -> int:
    return len(s.encode("utf-8"))


def verdict_line(report: GateReport) -> str:
    ic = RUN_ICONS.get(report.outcome, "•")
    return f"## {ic} dl-gate: **{md_text(report.outcome, 40)}** — {md_text(report.reason, 300)}"


def _meta_line(report: GateReport) -> str:
    parts = [md_text(counts_line(report), 300)]
    if report.head_sha:
        parts.append(f"head {md_code(short_sha(report.head_sha))}")
    if report.base_ref or report.base_sha:
        base = report.base_ref or ""
        if report.base_sha:
            base = f"{base} @ {short_sha(report.base_sha)}" if base else short_sha(report.base_sha)
        parts.append(f"base {md_code(base)}")
    if report.seed is not None:
        timed = "seconds" in ((report.env or {}).get("budget") or {})
        parts.append(f"seed {md_code(report.seed)}" + (" (a time budget: a rerun can reach other inputs; "
                                                        "`budget.evals` repeats them)" if timed else ""))
    if report.seconds:
        parts.append(f"{report.seconds:.0f}s")
    return " · ".join(parts)


def _table_header() -> str:
    return ("| | operator | variant | base error | head error | ratio | threshold | outcome |\n"
            "|---|---|---|---:|---:|---:|---:|---|")


def _row(report: GateReport, v: VariantVerdict) -> str:
    unit = f" {md_text(v.metric, 10)}" if v.metric else ""

    def err(x):
        return f"{fmt_num(x)}{unit}" if x is not None else "–"

    head, base = digest.sides(v)
    outcome = md_text(v.outcome, 30)
    if is_failing(report, v):
        outcome = f"**{outcome}**"
    ratio = verdict_ratio(v)
    key = v.key + (" · exhaustive" if v.details.get("search") == "exhaustive" else "")
    return (f"| {icon(report, v)} | {md_code(v.op, 80)} | {md_text(key, 80)} | "
            f"{md_text(base, 60)} | {md_text(head, 60)} | {ratio} | {err(v.threshold)} | {outcome} |")


def _chart_value(x: Optional[float], log: bool, inf_as: float) -> float:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return 0.0
    if math.isinf(x):
        x = inf_as
    x = max(float(x), 0.0)
    return round(math.log10(1.0 + x), 4) if log else float(f"{x:.4g}")


_CHART_SAFE = re.compile(r"[^A-Za-z0-9 ._/:\[\]()=+,-]")


def _chart_text(text: Any, max_len: int = 60) -> str:
    """Text inside the Mermaid block: one line of plain characters only. The report may come
    from an untrusted fork run, and a newline or backtick there would end the code block and
    put whatever follows (mentions, images) into the bot's comment."""
    return _CHART_SAFE.sub("_", one_line(text, max_len))


def mermaid_chart(report: GateReport, max_variants: int = CHART_MAX) -> Optional[str]:
    """A Mermaid xychart: head error as bars, base error and threshold as lines, per variant."""
    rows = [v for v in ordered(report) if v.head_error is not None or v.base_error is not None][:max_variants]
    if not rows:
        return None
    finite = [x for v in rows for x in (v.base_error, v.head_error, v.threshold)
              if x is not None and not math.isnan(x) and not math.isinf(x) and x > 0]
    heads = [head_for_chart(v) for v in rows]
    log = bool(finite) and (max(finite) / min(finite) > 100 or any(h is not None and math.isinf(h) for h in heads))
    metric = _chart_text(rows[0].metric or "error", 20)
    labels = ", ".join('"' + _chart_text(f"{v.op} {v.key}") + '"' for v in rows)
    y_title = f"log10(1 + {metric})" if log else metric

    inf_as = 10 * max(finite) if finite else 1e6  # drawn as the tallest bar, labelled ∞ in the table

    def series(values):
        return "[" + ", ".join(str(_chart_value(x, log, inf_as)) for x in values) + "]"

    lines = [
        "```mermaid",
        "xychart-beta",
        '    title "Error vs float64: head (bars), base and threshold (lines)"',
        f"    x-axis [{labels}]",
        f'    y-axis "{y_title}"',
        f"    bar {series(heads)}",
        f"    line {series([v.base_error for v in rows])}",
        f"    line {series([v.threshold for v in rows])}",
        "```",
    ]
    return "\n".join(lines)


def _table_rows(rows: List[List[Any]]) -> str:
    """A small Markdown table from localisation rows: a list of dicts (keys are the columns) or
    a list of lists (the first is the header)."""
    if not rows:
        return ""
    if all(isinstance(r, dict) for r in rows):
        cols: List[str] = []
        for r in rows:
            cols.extend(k for k in r if k not in cols)
        body = [[r.get(c, "") for c in cols] for r in rows]
    elif all(isinstance(r, (list, tuple)) for r in rows):
        cols, body = [str(c) for c in rows[0]], [list(r) for r in rows[1:]]
    else:
        return md_fence("\n".join(str(r) for r in rows))

    def cell(x):
        return fmt_num(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else md_text(x, 120)

    out = ["| " + " | ".join(md_text(c, 60) for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in body[:50]:
        out.append("| " + " | ".join(cell(x) for x in (list(r) + [""] * len(cols))[: len(cols)]) + " |")
    if len(body) > 50:
        out.append(f"\n…{len(body) - 50} more rows in report.json")
    return "\n".join(out)


def _link(repo_url: Optional[str], sha: Optional[str], path: str, line: Any) -> Optional[str]:
    if not repo_url or not sha or not path or path.startswith("/") or ".." in path.split("/"):
        return None
    try:
        ln = max(1, int(line or 1))
    except (TypeError, ValueError):
        ln = 1
    safe = "/".join(p for p in path.split("/") if p)
    return f"{repo_url}/blob/{sha}/{safe}#L{ln}"


def details_block(report: GateReport, v: VariantVerdict, repo_url: Optional[str] = None) -> str:
    """One collapsible section: the figures, then every localisation finding present."""
    d = diag(v)

    def err(x):
        return f"{fmt_num(x)} {md_text(v.metric, 10)}".rstrip() if x is not None else "–"

    lines = [f"<details><summary>{icon(report, v)} <b>{md_text(v.op, 80)}</b> [{md_text(v.key, 80)}]: "
             f"{md_text(v.reason, 200)}</summary>", ""]
    figs = []
    mi = minimal_input(v)
    shrunk = bool(d.get("minimal_input"))  # localised: the figures below are on the localiser's input
    if v.head_error is not None or v.base_error is not None:
        on = f" on the input as found, {md_code(v.input_summary, 200)}" if shrunk and v.input_summary else ""
        figs.append(f"- **Error:** head {err(v.head_error)}, base {err(v.base_error)} "
                    f"(ratio {verdict_ratio(v)}, threshold {err(v.threshold)}){on}")
    if v.head_nonfinite or v.base_nonfinite:
        figs.append(f"- **Non-finite outputs:** head {v.head_nonfinite}, base {v.base_nonfinite}")
    if v.head_crash:
        figs.append(f"- **Head crash:** {md_text(v.head_crash, 300)}")
    if v.base_crash:
        figs.append(f"- **Base crash:** {md_text(v.base_crash, 300)}")
    if v.seed is not None:
        figs.append(f"- **Seed:** {md_code(v.seed)}" + (f" ({v.evals} evaluations)" if v.evals else ""))
    if d.get("parameter"):
        figs.append(f"- **Responsible parameter:** {md_code(d['parameter'])}")
    if mi:
        # the localiser's input: the figures below (worst element, base vs head) are measured on it
        figs.append(f"- **{'Minimal input' if shrunk else 'Input'}** (each tensor as name[shape][min, max]): "
                    f"{md_code(mi, 400)}")
    if d.get("worst_element"):
        figs.append(f"- **Worst element{' of the minimal input' if shrunk else ''}:** {md_text(d['worst_element'], 300)}")
    sub = d.get("suboperation")
    if isinstance(sub, dict) and sub:
        figs.append(f"- **Sub-operation:** {md_code(suboperation_text(sub), 300)}")
    if v.source_file:
        src = f"{v.source_file}:{v.source_line or 1}"
        url = _link(repo_url, report.head_sha, v.source_file, v.source_line)
        figs.append("- **Operator source:** " + (f"[{md_text(src)}]({url})" if url else md_code(src)))
    lines.extend(figs)
    code = changed_code(v)
    if code:
        lines += ["", "**Changed code that reaches it** (most likely first):", ""]
        for i, c in enumerate(code[:10], 1):
            ref = f"{c.get('file')}:{c.get('line') or 1}"
            url = _link(repo_url, report.head_sha, str(c.get("file")), c.get("line"))
            sym = f" {md_code(c['symbol'])}" if c.get("symbol") else ""
            gone = f" ({md_text(deleted_text(c), 200)})" if c.get("deleted") else ""
            lines.append(f"{i}. " + (f"[{md_text(ref)}]({url})" if url else md_code(ref)) + sym + gone)
    bvh = d.get("base_vs_head")
    if isinstance(bvh, list) and bvh:
        lines += ["", f"**Base vs head on the {'minimal' if shrunk else 'same'} input:**", "", _table_rows(bvh)]
    rc = repro_command(v)
    if d.get("repro_script"):
        lines += ["", f"**Repro script:** {md_code(d['repro_script'])} (in the run's artifacts)"]
    if rc:
        lines += ["", "**Reproduce:**", "", md_fence(rc, "sh", 2000)]
    known = {"parameter", "minimal_input", "worst_element", "base_vs_head", "suboperation", "changed_code",
             "repro_script", "repro_command"}
    extra = {k: val for k, val in d.items() if k not in known}
    if extra:
        lines += ["", "**Other findings:**", "", md_fence(json.dumps(extra, indent=1, default=str), "json", 3000)]
    lines += ["", "</details>"]
    return "\n".join(lines)


def _list_section(title: str, items: List[Any], open_: bool = False, limit: int = 100) -> str:
    body = [f"- {md_text(x, 500)}" for x in items[:limit]]
    if len(items) > limit:
        body.append(f"- …{len(items) - limit} more in report.json")
    attr = " open" if open_ else ""
    return f"<details{attr}><summary>{md_text(title)}</summary>\n\n" + "\n".join(body) + "\n\n</details>"


def _reason_text(r: Any) -> str:
    """A selection reason: ``{kind, file, line, symbol}`` from the select stage, or text."""
    if not isinstance(r, dict):
        return str(r)
    where = f"{r.get('file')}:{r.get('line') or 1}" if r.get("file") else ""
    parts = [p for p in (where, str(r.get("symbol") or "")) if p]
    text = " ".join(parts) or str(r.get("kind") or "selected")
    return f"{text} ({r['kind']})" if r.get("kind") and parts else text


def _selected_section(report: GateReport) -> Optional[str]:
    if not report.selected:
        return None
    items = []
    for s in report.selected[:200]:
        if isinstance(s, dict):
            reasons = "; ".join(_reason_text(r) for r in (s.get("reasons") or [])[:5])
            items.append(f"{s.get('op')}: {reasons}" if reasons else str(s.get("op")))
        else:
            items.append(str(s))
    return _list_section(f"Operators selected ({len(report.selected)})", items)


def _env_section(report: GateReport) -> Optional[str]:
    if not report.env:
        return None
    rows = "\n".join(f"| {md_text(k, 60)} | {md_text(fmt_value(v, 300), 300)} |" for k, v in sorted(report.env.items()))
    return f"<details><summary>Environment</summary>\n\n| | |\n|---|---|\n{rows}\n\n</details>"


def _worth_details(report: GateReport, v: VariantVerdict) -> bool:
    if is_failing(report, v) or v.diagnosis:
        return True
    if v.outcome == PASS:
        return False
    return any(x is not None for x in (v.head_error, v.base_error, v.head_crash, v.base_crash)) or bool(
        v.head_nonfinite or v.base_nonfinite)


def _blocks(report: GateReport, repo_url: Optional[str], step: Optional[str] = None,
            out: str = digest.OUT) -> List[_Block]:
    blocks: List[_Block] = [
        _Block((0,), (0,), verdict_line(report)),
        _Block((1,), (0,), "\n" + _meta_line(report) + "\n"),
    ]
    for i, c in enumerate(digest.causes(report)):  # one root cause per changed line, first
        blocks.append(_Block((1, 1, i), (1, i), cause_block(report, i + 1, c, repo_url, out) + "\n"))
    if step:
        blocks.append(_Block((1, 2), (1, -1), step + "\n"))
    if report.errors:
        blocks.append(_Block((2,), (1,), _list_section(f"Harness errors ({len(report.errors)})", report.errors,
                                                          open_=True)))
    verdicts = ordered(report)
    passing = [v for v in verdicts if v.outcome == PASS and not is_failing(report, v)]
    fold = len(passing) > FOLD_PASSING_OVER
    passing_ids = {id(v) for v in passing}
    main_rows = [v for v in verdicts if not (fold and id(v) in passing_ids)]
    if main_rows:
        blocks.append(_Block((3, 0), (2, 0), _table_header()))
        for i, v in enumerate(main_rows):
            pri = (2, i) if (is_failing(report, v) or v.outcome != PASS) else (6, i)
            blocks.append(_Block((3, 1 + i), pri, _row(report, v)))
    if fold:
        blocks.append(_Block((4, 0), (6, 0), f"\n<details><summary>{len(passing)} passing variants</summary>\n\n"
                                            + _table_header()))
        for i, v in enumerate(passing):
            blocks.append(_Block((4, 1 + i), (6, 1 + i), _row(report, v)))
        blocks.append(_Block((4, 10 ** 9), (6, 0), "\n</details>"))
    chart = mermaid_chart(report)
    if chart:
        blocks.append(_Block((5,), (4,), "\n" + chart))
    for i, v in enumerate(verdicts):
        if not _worth_details(report, v):
            continue
        pri = (3, i) if is_failing(report, v) else (5, i)
        blocks.append(_Block((6, i), pri, "\n" + details_block(report, v, repo_url)))
    if report.warnings:
        blocks.append(_Block((7,), (5, -1), "\n" + _list_section(f"Warnings ({len(report.warnings)})",
                                                                 report.warnings)))
    sel = _selected_section(report)
    if sel:
        blocks.append(_Block((8,), (7,), "\n" + sel))
    env = _env_section(report)
    if env:
        blocks.append(_Block((9,), (7, 1), "\n" + env))
    return blocks


def _cut_note(rows: int, sections: int, full_report: Optional[str]) -> str:
    where = f" The full report: {full_report}." if full_report else " The full report is in the run's artifacts."
    return (f"\n\n> [!NOTE]\n> Cut to fit GitHub's size limit: {rows} table row(s) and {sections} section(s) "
            f"left out.{where}")


def render_markdown(report: GateReport, limit: int = SUMMARY_LIMIT, full_report: Optional[str] = None,
                    repo_url: Optional[str] = None, footer: str = "", run_id: Optional[str] = None,
                    repository: Optional[str] = None, out: str = digest.OUT) -> str:
    """The Markdown report, at most ``limit`` bytes (UTF-8; GitHub counts the comment limit in
    characters, which is never more). ``full_report`` (a URL or a path) is where a cut report
    points; ``repo_url`` (``https://github.com/OWNER/REPO``) turns source locations into links;
    ``out``: the folder the next steps name (the artifact's download folder, or where a local
    run wrote its report)."""
    step = next_step_block(digest.next_step(report, out=out, run_id=run_id, repository=repository), full_report)
    blocks = _blocks(report, repo_url, step, out)
    tail = ("\n" + footer) if footer else ""
    total = sum(b.size for b in blocks) + _nbytes(tail)
    if total <= limit:
        return "\n".join(b.text for b in blocks) + tail
    # (the folded table's "(N shown)", added once the rows are chosen, is budgeted here too)
    budget = limit - _nbytes(tail) - _nbytes(_cut_note(len(blocks), len(blocks), full_report)) - 2 - 32
    END = 10 ** 9
    # a table row needs its table's header (and closer): they come in with the first row
    frame: Dict[int, List[int]] = {}
    for i, b in enumerate(blocks):
        if len(b.order) == 2 and b.order[1] in (0, END):
            frame.setdefault(b.order[0], []).append(i)
    chosen: set = set()
    used = 0
    for i in sorted(range(len(blocks)), key=lambda i: blocks[i].priority):
        if i in chosen:
            continue
        b = blocks[i]
        extra = []
        if len(b.order) == 2:  # a row brings its table's header and closer; a header its closer
            extra = [j for j in frame.get(b.order[0], []) if j not in chosen and j != i]
        need = b.size + sum(blocks[j].size for j in extra)
        if used + need > budget:
            continue
        chosen.add(i)
        chosen.update(extra)
        used += need
    framing = {j for js in frame.values() for j in js}
    left = [i for i in range(len(blocks)) if i not in chosen and i not in framing]
    rows = sum(1 for i in left if len(blocks[i].order) == 2)
    note = _cut_note(rows, len(left) - rows, full_report)
    texts = {i: blocks[i].text for i in chosen}
    for i in chosen:  # the folded table says how many of its rows are shown
        if blocks[i].order == (4, 0):
            shown = sum(1 for j in chosen if blocks[j].order[0] == 4 and blocks[j].order[1] not in (0, END))
            total = sum(1 for b in blocks if b.order[0] == 4 and b.order[1] not in (0, END))
            if shown < total:
                texts[i] = texts[i].replace(" passing variants</summary>", f" passing variants ({shown} shown)</summary>")
    text = "\n".join(texts[i] for i in sorted(chosen, key=lambda i: blocks[i].order))
    out = text + note + tail
    if _nbytes(out) > limit:  # a single block larger than the whole budget: hard cut
        room = limit - _nbytes(note + tail) - 1
        out = text.encode("utf-8")[:max(room, 0)].decode("utf-8", "ignore") + note + tail
    return out


COMMENT_BUDGET = 6 * 1024  # bytes: the sticky comment is a digest; the job summary is the report
GRID_MAX_OPS = 12  # operators in the comment's grid (the job summary has every row)
GRID_ICONS = {REGRESSION: "❌", IMPROVEMENT: "📉", PASS: "✅"}


def _code_ref(report: GateReport, cause: digest.Cause, repo_url: Optional[str]) -> str:
    ref = cause.where
    url = _link(repo_url, report.head_sha, str(cause.file), cause.line) if cause.file else None
    text = f"[{md_text(ref, 120)}]({url})" if url else md_code(ref, 120)
    if not cause.located:
        return f"no changed line located: {md_code(cause.symbol, 80)} (operator at {text})"
    sym = f" {md_code(cause.symbol, 60)}" if cause.symbol else ""
    return ("deleted code above " if cause.deleted else "") + text + sym


def cause_block(report: GateReport, i: int, cause: digest.Cause, repo_url: Optional[str] = None,
                out: str = digest.OUT) -> str:
    """One root cause: the changed line, what fails because of it, the smallest input, head vs
    base, and the repro."""
    per_op = []
    for op in cause.ops:
        vs = [v for v in cause.verdicts if v.op == op]
        kinds: Dict[str, int] = {}
        for v in vs:
            kinds[digest.kind(v)] = kinds.get(digest.kind(v), 0) + 1
        what = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        per_op.append(f"{md_code(op, 60)} ({len(vs)}: {md_text(what, 80)})")
    lines = [f"**{i}. {_code_ref(report, cause, repo_url)}**", "",
             f"- **Fails:** " + ", ".join(per_op[:8]) + (f", …{len(per_op) - 8} more" if len(per_op) > 8 else "")]
    sm = cause.smallest
    mi = minimal_input(sm)
    if mi:
        lines.append(f"- **Smallest input:** {md_code(mi, 200)} on {md_code(sm.op, 60)} [{md_text(sm.key, 60)}]: "
                     f"{md_text(digest.head_vs_base(sm), 200)}")
    else:
        lines.append(f"- **{md_code(sm.op, 60)} [{md_text(sm.key, 60)}]:** {md_text(digest.head_vs_base(sm), 200)}")
    also = cause.also
    if also is not None:
        lines.append(f"- **Also {md_text(digest.kind(also), 20)}:** {md_code(also.op, 60)} [{md_text(also.key, 60)}]: "
                     f"{md_text(digest.head_vs_base(also), 200)}")
    script = digest.repro_in_artifact(sm, out)
    if script:
        lines.append(f"- **Reproduce** (exits 1 on head, 0 on base): {md_code('python ' + script, 200)}")
    return "\n".join(lines)


def grid_table(report: GateReport, max_ops: int = GRID_MAX_OPS) -> Optional[str]:
    """Operators x dtype (with the gradient and layout columns), the worst outcome per cell."""
    cols, rows = digest.grid(report)
    if not rows or (len(rows) == 1 and len(cols) == 1):
        return None
    out = ["| operator | " + " | ".join(md_text(c, 40) for c in cols) + " |", "|---|" + ":-:|" * len(cols)]
    for op, cells in rows[:max_ops]:
        shown = []
        for c in cols:
            outcome, text = digest.cell(report, cells.get(c, []))
            shown.append(f"{GRID_ICONS.get(outcome, VARIANT_ICONS.get(outcome, ''))} {md_text(text, 30)}".strip() or "·")
        out.append(f"| {md_code(op, 60)} | " + " | ".join(shown) + " |")
    if len(rows) > max_ops:
        out.append(f"\n…{len(rows) - max_ops} more operator(s) in the full report.")
    return "\n".join(out)


def improvements_line(report: GateReport, max_ops: int = 6) -> Optional[str]:
    """The improvements by name, one clause per operator: which variants, and what improved."""
    imp = digest.improvements(report)
    if not imp:
        return None
    by_op: Dict[str, Dict[str, List[str]]] = {}
    for v, _ in imp:
        fixed = (v.details or {}).get("fixed_inputs") or 0
        unit = f" {v.metric}" if v.metric else ""
        kinds = by_op.setdefault(v.op, {})
        if fixed:
            kinds.setdefault("NaN/Inf or a crash fixed", []).append(f"{v.key} ({fixed} input{'s' if fixed > 1 else ''})")
        else:
            kinds.setdefault("more precise", []).append(f"{v.key} {fmt_num(v.base_error)} → {fmt_num(v.head_error)}{unit}")
    by_op = {op: ["{}: {}".format(k, ", ".join(xs)) for k, xs in kinds.items()] for op, kinds in by_op.items()}
    items = [f"{md_code(op, 60)} ({md_text('; '.join(whats), 300)})" for op, whats in list(by_op.items())[:max_ops]]
    more = f"; …{len(by_op) - max_ops} more operator(s)" if len(by_op) > max_ops else ""
    return f"**Improved ({len(imp)} variant(s)):** " + "; ".join(items) + more


def next_step_block(step: Optional[digest.NextStep], full_report: Optional[str] = None) -> Optional[str]:
    if step is None:
        return None
    cmds = [c for c in (step.download, step.explain, step.repro) if c]
    page = f"; the artifact is also on the [run page]({full_report})" if full_report else ""
    what = ("download the report, explain the finding with the smallest input, run its repro" if step.download
            else "explain the finding with the smallest input, run its repro")
    return f"**Next step** ({what}{page}):\n\n" + md_fence("\n".join(cmds), "sh", 1000)


def _comment_verdict_line(report: GateReport, cs: List[digest.Cause]) -> str:
    """The comment's first line: with failing variants, how many and of which kinds (the full
    reason is the job summary's); otherwise the run's own verdict line."""
    if not cs:
        return verdict_line(report)
    kinds: Dict[str, int] = {}
    for c in cs:
        for v in c.verdicts:
            kinds[digest.kind(v)] = kinds.get(digest.kind(v), 0) + 1
    n = sum(kinds.values())
    ops = len({v.op for c in cs for v in c.verdicts})
    what = ", ".join(f"{k} ×{m}" for k, m in sorted(kinds.items(), key=lambda kv: -kv[1]))
    ic = RUN_ICONS.get(report.outcome, "•")
    return (f"## {ic} dl-gate: **{md_text(report.outcome, 40)}** — {n} variant{'s' if n > 1 else ''} of {ops} "
            f"operator{'s' if ops > 1 else ''} fail: {md_text(what, 120)}")


def render_comment(report: GateReport, full_report: Optional[str] = None, repo_url: Optional[str] = None,
                   footer: str = "", limit: int = COMMENT_BUDGET, run_id: Optional[str] = None,
                   repository: Optional[str] = None, out: str = digest.OUT) -> str:
    """The sticky PR comment, at most ``limit`` bytes whatever the run: the verdict line; one
    root-cause block per changed line (which operators and variants fail, the smallest input,
    head vs base, the repro); the operator x dtype grid; improvements by name; errors; and one
    next step (download the artifact, ``dl-gate explain``, the repro). What does not fit is
    counted, never cut mid-block: cause blocks beyond the first go first, then grid rows."""
    where = (f"Full report: [job summary and artifact]({full_report})" if full_report
             else f"Full report: the job summary and the run's `{digest.ARTIFACT}` artifact")
    tail = "\n" + where + (("\n" + footer) if footer else "")
    cs = digest.causes(report)
    failing = sum(len(c.verdicts) for c in cs)
    ops = len({v.op for c in cs for v in c.verdicts})
    step = next_step_block(digest.next_step(report, out=out, run_id=run_id, repository=repository), full_report)
    errors = [md_text(e, 300) for e in report.errors][:3]
    imp = improvements_line(report)

    def assemble(n_causes: int, grid_ops: int, with_imp: bool) -> str:
        parts = [_comment_verdict_line(report, cs), _meta_line(report)]
        if cs:
            lines = "changed line" if sum(c.located for c in cs) == 1 else "changed lines"
            located = sum(c.located for c in cs)
            head = (f"**{failing} failing variant(s) of {ops} operator(s)**, " +
                    (f"traced to {located} {lines}:" if located else "no changed line located:"))
            parts.append(head)
            parts += [cause_block(report, i + 1, c, repo_url, out) for i, c in enumerate(cs[:n_causes])]
            if n_causes < len(cs):
                parts.append(f"…{len(cs) - n_causes} more cause(s) "
                             f"({sum(len(c.verdicts) for c in cs[n_causes:])} variants) in the full report.")
        if grid_ops:
            g = grid_table(report, grid_ops)
            if g:
                parts.append(g)
        if with_imp and imp:
            parts.append(imp)
        if errors:
            parts.append("**Errors**\n\n" + "\n".join(f"- {e}" for e in errors))
        if step:
            parts.append(step)
        return "\n\n".join(parts) + "\n" + tail

    n_causes, grid_ops, with_imp = len(cs), GRID_MAX_OPS, True
    text = assemble(n_causes, grid_ops, with_imp)
    while _nbytes(text) > limit and (n_causes > 1 or grid_ops > 0 or with_imp):
        if n_causes > 1:
            n_causes -= 1
        elif with_imp:
            with_imp = False
        else:
            grid_ops = grid_ops - 1 if grid_ops > 3 else 0
        text = assemble(n_causes, grid_ops, with_imp)
    if _nbytes(text) > limit:  # only a pathological header is left: hard cut, still valid UTF-8
        room = limit - _nbytes(tail) - 2
        text = text.encode("utf-8")[:max(room, 0)].decode("utf-8", "ignore") + "\n" + tail
    return text
