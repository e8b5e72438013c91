"""The changed code that reaches a regressed operator, ranked by how close it is to the
sub-operation where the error jumps.

Changed lines come from ``git diff -U0 merge-base head`` (parsed with ``unidiff``); each hunk is
attributed to its innermost enclosing definition in head's version of the file (``ast``). The
selection stage's reasons (changed symbol -> ... -> operator) restrict the hunks to the code that
reaches this operator; without them (operators forced with ``--ops``) every changed Python file
counts. Distance, smallest first:

* 0 - a changed line is the sub-operation's own line;
* 2k - a changed line is the call site of the k-th enclosing frame of the sub-operation
  (k = 1: the line in the caller that leads to it);
* 2k + 1 - the change sits elsewhere in the k-th frame's function (k = 0: the sub-operation's
  own function), or the changed function is called on the k-th frame's line (a helper that
  computes the sub-operation's input and no longer calls anything traced);
* beyond the call stack: 2·depth + 2 + the length of the selection path from the changed
  symbol to the operator (unrelated to the traced path: least likely).
"""
from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple


@dataclass
class Change:
    file: str
    lines: List[int]  # changed lines on head's side (for a pure deletion: the line after it)
    symbol: Optional[str] = None  # innermost enclosing definition (qualified name) or None: module level
    start: int = 0  # the definition's line range on head
    end: int = 0
    text: Dict[int, str] = field(default_factory=dict)
    #: a pure deletion's line (the one that now follows it) -> the code removed just above it
    deleted: Dict[int, List[str]] = field(default_factory=dict)


def _git(repo: Path, *args: str) -> Optional[str]:
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, encoding="utf-8", errors="replace")
    return res.stdout if res.returncode == 0 else None


def _definitions(source: str) -> List[Tuple[int, int, str]]:
    """(start, end, qualname) of every function/class, outer before inner."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: List[Tuple[int, int, str]] = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                q = f"{prefix}{child.name}"
                out.append((start, child.end_lineno or child.lineno, q))
                visit(child, q + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _docstring_lines(source: str) -> set:
    """Lines that belong to docstrings (module, class, function)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    out: set = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                out.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return out


def changed_code(repo: Path, base: str, head: str, files: Optional[Sequence[str]] = None) -> List[Change]:
    """Hunks of the diff base..head in Python files, one :class:`Change` per (file, definition)."""
    from unidiff import PatchSet

    args = ["diff", "-U0", "--no-color", "--no-ext-diff", "-M", base, head, "--"]
    args += list(files) if files else ["*.py"]
    text = _git(repo, *args)
    if not text:
        return []
    try:
        patch = PatchSet(text)
    except Exception:
        return []
    out: List[Change] = []
    for pf in patch:
        path = pf.target_file[2:] if pf.target_file.startswith("b/") else pf.target_file
        if pf.is_removed_file or not path.endswith(".py"):
            continue
        src = _git(repo, "show", f"{head}:{path}") or ""
        src_lines = src.splitlines()
        defs = _definitions(src)
        docs = _docstring_lines(src)
        by_def: Dict[Tuple[Optional[str], int, int], Change] = {}

        def is_code(n: int) -> bool:
            return n not in docs and 0 < n <= len(src_lines) and bool(src_lines[n - 1].strip()) \
                and not src_lines[n - 1].strip().startswith("#")

        for h in pf:
            lines = [ln.target_line_no for ln in h if ln.is_added and ln.target_line_no]
            # code lines first: a docstring, comment or blank line is named only when nothing else changed
            code = [n for n in lines if is_code(n)]
            lines = code or lines
            removed: List[str] = []
            if not lines:  # a pure deletion: point at the line that now follows it, with what was removed
                lines = [max(1, h.target_start + (1 if h.target_length == 0 else 0))]
                removed = [ln.value.strip() for ln in h if ln.is_removed]
                removed = [t for t in removed if t and not t.startswith("#")]  # a comment removed: no code change
                if not removed:  # nor is the code line that now follows it (deep-spin/entmax's revert named
                    continue  # `f_lo = ...` as changed code: only the comment above it was deleted)
            for ln in lines:
                enclosing = [d for d in defs if d[0] <= ln <= d[1]]
                d = enclosing[-1] if enclosing else (0, 0, None)
                key = (d[2], d[0], d[1])
                ch = by_def.get(key)
                if ch is None:
                    ch = by_def[key] = Change(file=path, lines=[], symbol=d[2], start=d[0], end=d[1])
                if ln not in ch.lines:
                    ch.lines.append(ln)
                    if 0 < ln <= len(src_lines):
                        ch.text[ln] = src_lines[ln - 1].strip()
                if removed:
                    ch.deleted.setdefault(ln, []).extend(removed)
        for ch in by_def.values():  # and across hunks: a comment edited beside the code is not named
            code = [n for n in ch.lines if is_code(n) or n in ch.deleted]
            if code and len(code) < len(ch.lines):
                ch.lines, ch.text = code, {n: t for n, t in ch.text.items() if n in code}
        out.extend(by_def.values())
    return out


def _parse_frame(s: str) -> Tuple[str, int, str]:
    loc, _, fn = s.partition(" ")
    f, _, ln = loc.rpartition(":")
    try:
        return f, int(ln), fn
    except ValueError:
        return loc, 0, fn


def _reason_matches(ch: Change, reasons: Sequence[dict]) -> Optional[dict]:
    for r in reasons:
        if r.get("file") != ch.file:
            continue
        sym = str(r.get("symbol") or "")
        if r.get("kind") in ("sources", "glob", "select-all") or sym == ch.file:
            return r
        tail = sym.split(":")[-1]
        if ch.symbol is None or tail == ch.symbol or tail.split(".")[-1] == (ch.symbol or "").split(".")[-1] \
                or (ch.symbol or "").startswith(tail + "."):
            return r
    return None


def source_lines(repo: Path, rev: str) -> Callable[[str, int], str]:
    """``(file, line) -> text`` of ``rev``'s version of a file (cached; "" when unknown)."""
    cache: Dict[str, List[str]] = {}

    def get(path: str, line: int) -> str:
        if path not in cache:
            cache[path] = (_git(repo, "show", f"{rev}:{path}") or "").splitlines()
        lines = cache[path]
        return lines[line - 1] if 0 < line <= len(lines) else ""

    return get


def rank(changes: Sequence[Change], stack: Sequence[str], reasons: Sequence[dict],
         line_text: Optional[Callable[[str, int], str]] = None) -> List[dict]:
    """Changed code nearest to the sub-operation first (``stack``: its library frames,
    outermost first, as "file:line function"); ``reasons``: the selection's for this op;
    ``line_text(file, line)``: head's source, to see which functions a frame's line calls."""
    frames = [_parse_frame(s) for s in reversed(list(stack))]  # innermost first
    file_reasons = [r for r in reasons if r.get("file")]
    pool = list(changes)
    if file_reasons:
        kept = [c for c in pool if _reason_matches(c, file_reasons)]
        pool = kept
    rows: List[dict] = []
    depth = len(frames)
    for ch in pool:
        best: Optional[Tuple[int, int, int, str]] = None  # (distance, |line gap|, line, why)
        for k, (f, ln, fn) in enumerate(frames):
            if f != ch.file:
                continue
            if ln in ch.lines:
                cand = (2 * k, 0, ln, "the sub-operation's own line" if k == 0 else
                        f"the call {k} level{'s' if k > 1 else ''} up the stack that leads to the sub-operation ({fn})")
            elif ch.start <= ln <= ch.end and ch.symbol is not None:
                near = min(ch.lines, key=lambda x: abs(x - ln))
                cand = (2 * k + 1, abs(near - ln), near, "in the sub-operation's own function" if k == 0 else
                        f"in {fn}, {k} level{'s' if k > 1 else ''} up the stack from the sub-operation")
            else:
                continue
            if best is None or cand[:2] < best[:2]:
                best = cand
        name = (ch.symbol or "").split(".")[-1]
        for k, (f, ln, fn) in enumerate(frames if line_text is not None and name else []):
            if best is not None and best[0] <= 2 * k + 1:
                break
            if re.search(rf"\b{re.escape(name)}\s*\(", line_text(f, ln) or ""):
                best = (2 * k + 1, 0, ch.lines[0], f"{ch.symbol} is called on the sub-operation's line ({f}:{ln})" if k == 0
                        else f"{ch.symbol} is called on {f}:{ln} ({fn}), {k} level{'s' if k > 1 else ''} up the stack")
                break
        r = _reason_matches(ch, file_reasons) if file_reasons else None
        path = list(r.get("path") or []) if r else []
        if best is None:
            dist = 2 * depth + 2 + (len(path) if path else 10)
            why = ("reaches the operator: " + " -> ".join(path)) if path else "changed in this diff, not on the traced path"
            best = (dist, 0, ch.lines[0], why)
        row = {"file": ch.file, "line": best[2], "symbol": ch.symbol or "<module>", "distance": best[0], "why": best[3],
               "lines": sorted(ch.lines)[:50], "text": ch.text.get(best[2], "")}
        if best[2] in ch.deleted:  # the line names where code was removed, not a change of its own
            row["deleted"] = ch.deleted[best[2]][:20]
            row["text"] = "deleted above this line: " + "; ".join(ch.deleted[best[2]])[:300]
        if path:
            row["path"] = path
        rows.append(row)
    rows.sort(key=lambda r: (r["distance"], r["file"], r["line"]))
    # reasons the diff could not be attributed to (e.g. a native kernel): keep them, after the rest
    if file_reasons:
        have = {(r["file"], r["symbol"]) for r in rows}
        for rs in file_reasons:
            if not any(rs["file"] == f for f, _ in have):
                rows.append({"file": rs["file"], "line": rs.get("line"), "symbol": rs.get("symbol"),
                             "distance": 2 * depth + 2 + len(rs.get("path") or []) + 10,
                             "why": "selected: " + " -> ".join(rs.get("path") or []), "path": list(rs.get("path") or [])})
    return rows
