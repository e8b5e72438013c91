"""Writing ``.dl-gate.yml`` with comments, and updating it without losing the user's edits.

The file is read and written with ruamel.yaml's round-trip mode, which keeps comments, key
order, quoting and flow style. The merge rule is simple and stated in the file's header: a row
whose ``name`` is already in the file is the user's and is never touched; new operators are
appended; operators the library no longer has are reported, not deleted (the user may have
renamed the callable); top-level keys the user set are kept."""
from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

HEADER = """\
dl-gate configuration, written by `dl-gate init` ({when}).
Every key and parameter form: docs/config.md. Re-running `dl-gate init` adds new operators at
the end and reports removed ones; it never changes a row that is already here, so edit freely.
To keep an operator out for good, delete its row and add a line `# dl-gate init: skip NAME`.
"""

SKIP = re.compile(r"^\s*#\s*dl-gate init:\s*skip\s+(.+?)\s*$", re.M)


def skipped(text: str) -> set:
    """Operators the user keeps out (``# dl-gate init: skip NAME [NAME...]`` lines)."""
    return {n.strip(",") for m in SKIP.finditer(text) for n in m.group(1).split()}


def float_text(value: float) -> str:
    """``value`` as YAML 1.1 and 1.2 readers both take for a float: ``1e-07`` is a string to
    PyYAML (YAML 1.1 wants a dot in the mantissa), so it is written ``1.0e-07``."""
    if value != value:
        return ".nan"
    if value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    text = repr(float(value))
    mant, _, exp = text.partition("e")
    return f"{mant}.0e{exp}" if exp and "." not in mant else text


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 110
    y.preserve_quotes = True
    y.representer.add_representer(type(None), lambda r, d: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    # new values only: a float read from the user's file keeps its own spelling (ScalarFloat)
    y.representer.add_representer(float, lambda r, d: r.represent_scalar("tag:yaml.org,2002:float", float_text(d)))
    return y


def _same(want: Any, got: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got or (isinstance(want, bool) and isinstance(got, bool) and want == got)
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return want == got or (want != want and got != got)
    if isinstance(want, dict):
        return isinstance(got, dict) and set(map(str, want)) == set(map(str, got)) and \
            all(_same(v, got.get(k, got.get(str(k)))) for k, v in want.items())
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(want) == len(got) and all(map(_same, want, got))
    return want == got


def read_back_errors(text: str, rows: Sequence[dict]) -> List[str]:
    """Each value of ``rows`` (operator rows as written) that the gate's own reader (PyYAML, YAML
    1.1) reads back as something else: ``ops.NAME.KEY: written V, read back W``."""
    import yaml

    doc = yaml.safe_load(text) or {}
    back = {r.get("name"): r for r in doc.get("ops") or [] if isinstance(r, dict)}
    out = []
    for row in rows:
        got = back.get(row["name"]) or {}
        for key, want in row.items():
            if not _same(want, got.get(key)):
                out.append(f"ops.{row['name']}.{key}: written {want!r}, read back {got.get(key)!r}")
    return out


def _flow(v: Any) -> Any:
    """Small lists and mappings in flow style (``shape: [N, D]``), as people write them."""
    if isinstance(v, dict):
        m = CommentedMap()
        for k, x in v.items():
            m[k] = _flow(x)
        if all(not isinstance(x, (dict, list)) or (isinstance(x, list) and len(x) <= 6) for x in v.values()) \
                and len(v) <= 6:
            m.fa.set_flow_style()
        return m
    if isinstance(v, list):
        s = CommentedSeq(_flow(x) for x in v)
        if all(not isinstance(x, (dict, list)) for x in v):
            s.fa.set_flow_style()
        return s
    return v


def op_row(spec: dict, comment: Optional[str]) -> CommentedMap:
    row = CommentedMap()
    for key in ("name", "callable", "kind", "sources", "params", "dims", "dtypes", "modes", "layouts", "grad", "inputs"):
        if key not in spec:
            continue
        v = spec[key]
        if key == "inputs":
            seq = CommentedSeq(_flow(t) for t in v)
            row[key] = seq
        elif key == "params":
            pm = CommentedMap()
            for pk, pv in v.items():
                pm[pk] = _flow(pv)
            if len(v) <= 3 and all(not isinstance(x, dict) or len(x) == 1 for x in v.values()):
                pm.fa.set_flow_style()
            row[key] = pm
        else:
            row[key] = _flow(v)
    for key, v in spec.items():
        if key not in row:
            row[key] = _flow(v)
    if comment:
        row.yaml_set_start_comment(comment, indent=2)
    return row


def new_document(top: Dict[str, Any], rows: Sequence[Tuple[dict, str]], header: str,
                 top_comments: Dict[str, str]) -> CommentedMap:
    doc = CommentedMap()
    for k, v in top.items():
        doc[k] = _flow(v) if k != "ops" else v
    doc["ops"] = CommentedSeq(op_row(spec, comment) for spec, comment in rows)
    doc.yaml_set_start_comment(header)
    for k, c in top_comments.items():
        if k in doc:
            doc.yaml_add_eol_comment(c, k, column=32)
    return doc


def not_gated_list(entries: Sequence[Dict[str, str]]) -> CommentedSeq:
    """The ``not_gated:`` list, one flow mapping (name, callable, why) a line."""
    seq = CommentedSeq()
    for e in entries:
        m = CommentedMap((k, str(e[k])) for k in ("name", "callable", "why") if e.get(k) is not None)
        m.fa.set_flow_style()
        seq.append(m)
    return seq


def comment_block(text: str) -> str:
    """``text`` as a YAML comment block (appended after the last row)."""
    return "\n" + "\n".join("# " + line if line.strip() else "#" for line in text.rstrip().splitlines()) + "\n"


def load(path: Path) -> CommentedMap:
    return _yaml().load(path.read_text(encoding="utf-8"))


def dump(doc: Any) -> str:
    buf = io.StringIO()
    _yaml().dump(doc, buf)
    return buf.getvalue()


def merge(doc: CommentedMap, rows: Sequence[Tuple[dict, str]], found: Sequence[str]
          ) -> Tuple[List[str], List[str], List[str]]:
    """Append the rows whose names are new to ``doc`` (in place); returns (added, kept, removed):
    names appended, names already in the file (left as the user has them), and names in the file
    that the library no longer has (reported only)."""
    ops = doc.get("ops")
    if ops is None:
        ops = doc["ops"] = CommentedSeq()
    existing = [r.get("name") for r in ops if isinstance(r, dict)]
    added, kept = [], []
    for spec, comment in rows:
        if spec["name"] in existing:
            kept.append(spec["name"])
            continue
        ops.append(op_row(spec, comment))
        added.append(spec["name"])
    found_set = set(found)
    removed = [n for n in existing if n and n not in found_set]
    return added, kept, removed
