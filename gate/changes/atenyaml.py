"""Changes to ATen's operator table (``native_functions.yaml``): which entries a diff touches.

An entry is one ``- func: name.overload(...) -> ...`` item with its keys (``dispatch``,
``structured_delegate``, ``variants``, ...). Both sides are parsed with PyYAML and compared
entry by entry (keyed by the ``func`` signature's name), so a changed dispatch kernel, default
argument, delegate or tag is a ``modified`` entry, a new or removed entry is ``added`` /
``deleted``, and an edit of comments or layout whose entries parse the same is ``unchanged``.
The select stage maps an entry's op name to catalogue rows like a kernel change."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import yaml

from .model import ChangedFile, ChangedSymbol

FILE_NAME = "native_functions.yaml"
_FUNC_LINE = re.compile(r"^-\s*func:\s*([A-Za-z0-9_.]+)\s*\(")


def is_aten_yaml(path: Optional[str]) -> bool:
    return bool(path) and path.rsplit("/", 1)[-1] == FILE_NAME


def _entries(text: Optional[str]) -> Optional[Dict[str, dict]]:
    if text is None:
        return {}
    try:
        raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or []
    except yaml.YAMLError:
        return None
    out: Dict[str, dict] = {}
    for e in raw if isinstance(raw, list) else []:
        if isinstance(e, dict) and isinstance(e.get("func"), str):
            out[e["func"].split("(", 1)[0].strip()] = e
    return out


def _lines(text: Optional[str]) -> List[Tuple[int, str]]:
    """(1-based line, op full name) of every ``- func:`` line."""
    out = []
    for i, ln in enumerate((text or "").splitlines(), 1):
        m = _FUNC_LINE.match(ln)
        if m:
            out.append((i, m.group(1)))
    return out


def _owner(starts: List[Tuple[int, str]], line: int) -> Optional[str]:
    """The entry whose block holds ``line``."""
    owner = None
    for start, name in starts:
        if start > line:
            break
        owner = name
    return owner


def aten_yaml_changes(f: ChangedFile, base_text: Optional[str], head_text: Optional[str]) -> Tuple[List[ChangedSymbol], List[str]]:
    base, head = _entries(base_text), _entries(head_text)
    if base is None or head is None:
        return [], [f"{f.path}: not valid YAML on the {'base' if base is None else 'head'} side; entries not compared"]
    head_starts, base_starts = _lines(head_text), _lines(base_text)
    touched = {_owner(head_starts, ln) for ln in f.lines("new")} | {_owner(base_starts, ln) for ln in f.lines("old")}
    touched.discard(None)
    head_line = {name: ln for ln, name in head_starts}
    base_line = {name: ln for ln, name in base_starts}
    syms: List[ChangedSymbol] = []
    for name in sorted(touched | {n for n in head if n not in base} | {n for n in base if n not in head}):
        if name in head and name in base:
            change = "modified" if head[name] != base[name] else "unchanged"
        else:
            change = "added" if name in head else "deleted"
        side = "base" if change == "deleted" else "head"
        line = (base_line if side == "base" else head_line).get(name, 1)
        why = "the entry parses the same on both sides (comments or layout)" if change == "unchanged" else \
            f"native_functions.yaml entry {name} {change}"
        syms.append(ChangedSymbol(file=f.path, line=line, symbol=f"aten::{name}", lang="aten-yaml", kind="registration",
                                  change=change, side=side, name=name.split(".", 1)[0], why=why,
                                  data={"op": name.split(".", 1)[0], "func": name}))
    if not syms:  # an edit outside every entry (a leading comment)
        syms.append(ChangedSymbol(file=f.path, line=min(f.lines("new") or {1}), symbol=f.path, lang="aten-yaml",
                                  kind="file", change="unchanged" if head == base else "modified", side="head",
                                  why="every entry parses the same on both sides (comments or layout)",
                                  data={"op": "", "func": ""}))
    return syms, []
