"""Plain-text rendering of a diagnosis (``dl-gate explain``). Reads JSON only: no framework."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

from ..plan import Variant
from .model import fmt


def _table(rows: List[dict], cols) -> List[str]:
    data = [[str(r.get(c, "")) for c in cols] for r in rows]
    w = [max([len(c)] + [len(d[i]) for d in data]) for i, c in enumerate(cols)]
    w = [min(x, 60) for x in w]
    out = ["  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(cols))]
    for d in data:
        out.append("  " + "  ".join((v if len(v) <= 60 else v[:59] + "…").ljust(w[i]) for i, v in enumerate(d)))
    return out


def render(verdict: dict, details: Optional[dict] = None, verbose: bool = False) -> str:
    """The sections of a verdict's diagnosis, in reading order."""
    d = verdict.get("diagnosis") or {}
    vid = f"{verdict.get('op')}[{_key(verdict.get('variant') or {})}]"
    lines = [f"{vid}: {verdict.get('outcome')}: {verdict.get('reason')}"]

    def sec(title, value):
        if value not in (None, "", [], {}):
            lines.append(f"  {title + ':':<16}{value}")

    if not d:
        lines.append("  (no diagnosis: the localise stage did not run for this verdict)")
        return "\n".join(lines)
    if d.get("error"):
        sec("error", d["error"])
    v = d.get("variant") or verdict.get("variant") or {}
    sec("variant", ", ".join(f"{k}={v[k]}" for k in ("dtype", "device", "mode", "layout") if k in v))
    sec("kind", d.get("kind"))
    sec("parameter", d.get("parameter"))
    sec("evidence", d.get("parameter_evidence"))
    sec("minimal input", d.get("minimal_input"))
    sec("worst element", d.get("worst_element"))
    sub = d.get("suboperation")
    if isinstance(sub, dict) and sub:
        s = f"{sub.get('call')} at {sub.get('file')}:{sub.get('line')}"
        extra = []
        if sub.get("rate") is not None:
            extra.append(f"change rate {fmt(sub['rate'])}")
        if sub.get("delta") is not None:
            extra.append(f"δ {fmt(sub['delta'])}" + (" ulp" if not isinstance(sub["delta"], str) else ""))
        if isinstance(sub.get("base"), dict) and sub["base"].get("call"):
            b = sub["base"]
            extra.append(f"base: {b.get('call')} at {b.get('site')} δ {fmt(b.get('delta'))}")
        sec("sub-operation", s + (f" ({'; '.join(extra)})" if extra else ""))
        if sub.get("how"):
            sec("", sub["how"])
        if sub.get("stack"):
            sec("call stack", " > ".join(sub["stack"]))
    code = d.get("changed_code") or []
    for i, c in enumerate(code[:8]):
        txt = f"{i + 1}. {c.get('file')}:{c.get('line')} {c.get('symbol') or ''} (distance {c.get('distance')}: {c.get('why')})"
        if c.get("text"):
            txt += f"\n{'':18}| {c['text']}"
        sec("changed code" if i == 0 else "", txt)
    bvh = d.get("base_vs_head") or []
    if bvh:
        lines.append("  base vs head on the minimal input:")
        lines.extend("  " + x for x in _table(bvh, ("name", "base", "head")))
    sec("repro", d.get("repro_command"))
    sec("repro data", d.get("repro_data"))
    if d.get("truncated"):
        sec("truncated", "yes: the localisation budget ran out (budget.localise); results are the best so far")
    for n in d.get("notes") or []:
        sec("note", n)
    sec("time", f"{d.get('seconds', 0)}s")
    if details:
        var = details.get("variations") or []
        if var:
            lines.append("  variations (one at a time; holds = the finding reproduces):")
            lines.extend("  " + x for x in _table(var, ("axis", "value", "holds", "head", "base")))
        tr = (details.get("trace") or {}).get("table") or []
        if tr:
            lines.append("  sub-operations (head, in call order):")
            cols = ("index", "call", "site", "delta", "rate", "base", "base_delta") if "delta" in tr[0] else \
                ("index", "call", "site", "divergence", "rate", "base") if "divergence" in tr[0] else ("index", "call", "site", "error")
            shown = tr if verbose else tr[:40]
            lines.extend("  " + x for x in _table([{k: (fmt(v) if isinstance(v, float) else v) for k, v in r.items()}
                                                   for r in shown], cols))
            if len(tr) > len(shown):
                lines.append(f"    … {len(tr) - len(shown)} more (--verbose)")
        sh = details.get("shrink")
        if sh:
            sec("shrinking", f"{sh.get('from')} -> {sh.get('to')} elements, {sh.get('evaluated')} inputs tried; "
                + "; ".join(sh.get("log") or []))
    return "\n".join(lines)


def _key(v: dict) -> str:
    return Variant.from_dict({"dtype": "?", **v}).key


def verdict_id(v: dict) -> str:
    return f"{v.get('op')}[{_key(v.get('variant') or {})}]"


def load_details(report_dir: Path, verdict: dict) -> Optional[dict]:
    d = verdict.get("diagnosis") or {}
    cands = []
    if d.get("details_file"):
        p = Path(d["details_file"])
        cands += [p, report_dir / "findings" / p.name]
    for p in cands:
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            continue
    return None
