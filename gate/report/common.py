"""Shared wording, ordering and escaping for every reporter (JUnit, Markdown, comment,
annotations, plot). Pure functions over :class:`~gate.judge.verdict.GateReport`; no framework
imports, no I/O."""
from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from ..judge.verdict import (BEHAVIOUR_CHANGE, ERROR, IMPROVEMENT, NEEDS_BASELINE, NOT_COMPARABLE,
                             NOT_COVERED, NOT_MEASURED, PASS, REGRESSION, UNDER_SEARCHED, UNSUPPORTED,
                             GateReport, VariantVerdict)

# GitHub's limits (docs: "Adding a job summary", "Workflow commands", issue comments API).
COMMENT_LIMIT = 65_536  # characters in one issue comment
SUMMARY_LIMIT = 1024 * 1024  # bytes of GITHUB_STEP_SUMMARY per step
ANNOTATIONS_PER_STEP = 10  # error annotations (and, separately, warnings) shown per step

# Display order: what a reader must see first.
SEVERITY = {
    REGRESSION: 0,
    BEHAVIOUR_CHANGE: 1,
    ERROR: 2,
    UNDER_SEARCHED: 2,
    NOT_MEASURED: 2,
    NEEDS_BASELINE: 3,
    NOT_COMPARABLE: 4,
    NOT_COVERED: 5,
    UNSUPPORTED: 6,
    IMPROVEMENT: 7,
    PASS: 8,
}
SKIPPED_OUTCOMES = (NEEDS_BASELINE, NOT_COMPARABLE, NOT_COVERED, UNSUPPORTED)

RUN_ICONS = {"pass": "✅", "regression": "❌", "needs-baseline": "🆕", "error": "⚠️"}
VARIANT_ICONS = {
    REGRESSION: "❌",
    BEHAVIOUR_CHANGE: "🔀",
    ERROR: "⚠️",
    UNDER_SEARCHED: "⏳",
    NOT_MEASURED: "🚫",
    NEEDS_BASELINE: "🆕",
    NOT_COMPARABLE: "⏭️",
    NOT_COVERED: "⏭️",
    UNSUPPORTED: "⏭️",
    IMPROVEMENT: "📉",
    PASS: "✅",
}


def fail_set(report: GateReport) -> set:
    return set(report.fail_outcomes or [REGRESSION])


def fmt_value(v: Any, max_len: int = 200) -> str:
    """An env/details value in one line: mappings as ``k=v, …``."""
    if isinstance(v, dict):
        return ", ".join(f"{k}={fmt_value(x)}" for k, x in v.items())[:max_len]
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_value(x) for x in v)[:max_len]
    return str(v)[:max_len]


def is_failing(report: GateReport, v: VariantVerdict) -> bool:
    # a behaviour change that came with a stability fix, or a refinement, is reported, not failed
    return v.outcome in fail_set(report) and not v.reported_only


def icon(report: GateReport, v: VariantVerdict) -> str:
    if v.outcome == BEHAVIOUR_CHANGE and is_failing(report, v):
        return "❌"
    return VARIANT_ICONS.get(v.outcome, "•")


def sort_key(report: GateReport, v: VariantVerdict):
    sev = -1 if is_failing(report, v) else SEVERITY.get(v.outcome, 9)
    ratio = v.ratio
    r = -(ratio if ratio is not None and not math.isnan(ratio) else 0.0)
    return (sev, r, v.framework, v.op, v.key)


def ordered(report: GateReport) -> List[VariantVerdict]:
    return sorted(report.verdicts, key=lambda v: sort_key(report, v))


def counts_line(report: GateReport) -> str:
    counts = report.counts()
    parts = [f"{n} {o}" for o, n in sorted(counts.items(), key=lambda kv: SEVERITY.get(kv[0], 9))]
    return ", ".join(parts) if parts else "no operator variant judged"


def fmt_num(x: Optional[float]) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if isinstance(x, (int, float)):
        if x == 0:
            return "0"
        return f"{x:.3g}"
    return str(x)


def new_nonfinite(v: VariantVerdict) -> bool:
    """Head produced NaN/Inf where base did not: its finite error figure says nothing then. The
    judge says which kind of finding failed a verdict (``details['kind']``); a report of an
    older gate falls back to the counts."""
    kind = (v.details or {}).get("kind")
    if kind is not None:
        return kind == "nonfinite"
    return bool(v.head_nonfinite) and not v.base_nonfinite


def head_for_chart(v: VariantVerdict) -> Optional[float]:
    """The head error as charts draw it: infinite when head has new NaN/Inf outputs or raises."""
    return math.inf if new_nonfinite(v) or v.head_crash else v.head_error


def fmt_ratio(x: Optional[float]) -> str:
    if x is None:
        return "–"
    if math.isinf(x):
        return "×∞"
    if math.isnan(x):
        return "–"
    return f"×{x:.3g}"


def verdict_ratio(v: VariantVerdict) -> str:
    """head/base as the tables show it; ``NaN/Inf`` when head's finite error says nothing."""
    return "NaN/Inf" if new_nonfinite(v) else fmt_ratio(v.ratio)


def short_sha(sha: Optional[str]) -> str:
    return (sha or "")[:12]


def one_line(text: Any, max_len: int = 500) -> str:
    """Collapse whitespace and cap the length (the reason lines are meant to be one line)."""
    s = " ".join(str(text if text is not None else "").split())
    return s if len(s) <= max_len else s[: max_len - 1] + "…"


def md_text(text: Any, max_len: int = 500) -> str:
    """Text safe inside a Markdown table cell or paragraph: one line, HTML escaped, pipes
    escaped, @mentions defused (the report may come from an untrusted fork run)."""
    s = html.escape(one_line(text, max_len), quote=False)
    return s.replace("|", "\\|").replace("@", "&#64;").replace("`", "&#96;")


def md_code(text: Any, max_len: int = 200) -> str:
    """Inline code span that its content cannot break out of."""
    s = one_line(text, max_len)
    fence = "`" * (_longest_backtick_run(s) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}".replace("|", "\\|")


def md_fence(text: Any, lang: str = "", max_len: int = 4000) -> str:
    """Fenced code block whose fence is longer than any backtick run inside."""
    s = str(text if text is not None else "")
    if len(s) > max_len:
        s = s[: max_len - 1] + "…"
    fence = "`" * max(3, _longest_backtick_run(s) + 1)
    return f"{fence}{lang}\n{s}\n{fence}"


def _longest_backtick_run(s: str) -> int:
    longest = cur = 0
    for ch in s:
        cur = cur + 1 if ch == "`" else 0
        longest = max(longest, cur)
    return longest


def diag(v: VariantVerdict) -> Dict[str, Any]:
    return v.diagnosis if isinstance(v.diagnosis, dict) else {}


def minimal_input(v: VariantVerdict) -> Optional[str]:
    d = diag(v)
    return d.get("minimal_input") or v.input_summary


def repro_command(v: VariantVerdict) -> Optional[str]:
    d = diag(v)
    return d.get("repro_command") or v.repro_command


def relpath(path: Optional[str], root: Optional[os.PathLike]) -> Optional[str]:
    """``path`` relative to ``root`` when it lies under it; relative paths are kept; an absolute
    path outside ``root`` gives None (GitHub cannot point at it)."""
    if not path:
        return None
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    if root is None:
        return p.as_posix()
    try:
        return p.resolve().relative_to(Path(root).resolve()).as_posix()
    except (ValueError, OSError):
        return None


def changed_code(v: VariantVerdict) -> List[Dict[str, Any]]:
    rows = diag(v).get("changed_code") or []
    return [r for r in rows if isinstance(r, dict) and r.get("file")]


def facts(v: VariantVerdict) -> List[tuple]:
    """(label, value) pairs describing one verdict in plain text, in reading order."""
    out: List[tuple] = [("outcome", v.outcome), ("diagnosis", one_line(v.reason))]
    unit = f" {v.metric}" if v.metric else ""
    if v.head_error is not None or v.base_error is not None:
        out.append(("error", f"head {fmt_num(v.head_error)}{unit}, base {fmt_num(v.base_error)}{unit}, "
                             f"ratio {verdict_ratio(v)}, threshold {fmt_num(v.threshold)}{unit}"))
    if v.head_nonfinite or v.base_nonfinite:
        out.append(("non-finite outputs", f"head {v.head_nonfinite}, base {v.base_nonfinite}"))
    if v.head_crash:
        out.append(("head crash", one_line(v.head_crash)))
    if v.base_crash:
        out.append(("base crash", one_line(v.base_crash)))
    if v.seed is not None:
        out.append(("seed", str(v.seed)))
    if v.evals:
        out.append(("evaluations", f"{v.evals} in {v.seconds:.1f}s"))
    ex = v.details.get("exhaustive")
    if isinstance(ex, dict) and ex.get("values"):
        out.append(("exhaustive", f"every {ex.get('dtype')} value ({ex['values']} inputs) against "
                                  f"{ex.get('reference')}: exact max {fmt_num(ex.get('max_ulp'))} ulp at "
                                  f"x = {ex.get('worst_input')!r}"))
    mi = minimal_input(v)
    d = diag(v)
    if mi:
        out.append(("minimal input" if d.get("minimal_input") else "input", one_line(mi, 1000) + " (name[shape][min, max])"))
    if d.get("worst_element"):
        out.append(("worst element of it" if d.get("minimal_input") else "worst element", one_line(d["worst_element"])))
    if d.get("parameter"):
        out.append(("responsible parameter", one_line(d["parameter"])))
    sub = d.get("suboperation")
    if isinstance(sub, dict) and sub:
        out.append(("sub-operation", suboperation_text(sub)))
    for i, c in enumerate(changed_code(v)[:5]):
        out.append(("changed code" if i == 0 else "", code_ref_text(c)))
    if v.source_file:
        out.append(("operator source", f"{v.source_file}:{v.source_line or 1}"))
    rc = repro_command(v)
    if rc:
        out.append(("repro", one_line(rc, 1000)))
    if d.get("repro_script"):
        out.append(("repro script", one_line(d["repro_script"])))
    return out


def facts_text(v: VariantVerdict) -> str:
    lines = [f"{v.id}: {one_line(v.reason)}"]
    for label, value in facts(v)[2:]:
        lines.append(f"{label + ':' if label else ' ' * 14}{' ' if label else ''}{value}")
    return "\n".join(lines)


def suboperation_text(sub: Dict[str, Any]) -> str:
    s = str(sub.get("call") or "?")
    if sub.get("file"):
        s += f" at {sub['file']}:{sub.get('line') or 1}"
    if sub.get("rate") is not None:
        rate = sub["rate"]
        s += f" (change rate {fmt_num(rate) if isinstance(rate, (int, float)) else rate})"
    return s


def code_ref_text(c: Dict[str, Any]) -> str:
    s = f"{c.get('file')}:{c.get('line') or 1}"
    if c.get("symbol"):
        s += f" ({c['symbol']})"
    if c.get("deleted"):
        s += " - " + deleted_text(c)
    return s


def deleted_text(c: Dict[str, Any]) -> str:
    """What a pure deletion's row says: its line is where code was removed, not a change."""
    gone = list(c.get("deleted") or [])
    return f"code deleted above it: {one_line('; '.join(gone), 160)}" if gone else ""


def has_news(report: GateReport) -> bool:
    """Something worth a new PR comment: anything but a clean pass."""
    if report.outcome != "pass" or report.errors or report.warnings:
        return True
    return any(v.outcome not in (PASS, IMPROVEMENT, NOT_COVERED, UNSUPPORTED) for v in report.verdicts)


def counts_by(report: GateReport, outcomes: Iterable[str]) -> int:
    c = report.counts()
    return sum(c.get(o, 0) for o in outcomes)
