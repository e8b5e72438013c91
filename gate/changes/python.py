"""Changed Python symbols: ``-U0`` hunks -> enclosing definitions on base and head -> compared by
normalised AST.

A symbol whose normalised AST is identical on both sides (docstrings, comments, annotations,
formatting) is reported with ``change="unchanged"``. References to other definitions in the
repository are compared by *what they resolve to*, so moving a module (``git mv``) or renaming a
helper, with every caller updated, changes nothing either: a definition deleted on one side and
added on the other with an identical body is paired as a rename."""
from __future__ import annotations

import ast

from typing import Dict, List, Optional, Tuple

from .model import ChangedFile, ChangedSymbol
from .pyindex import PyIndex
from .pysrc import MAIN, MODULE, Chain, PyModule, fingerprint

FORMAT_ONLY = "docstring/comment/annotation/format-only change (normalised AST unchanged)"
NEIGHBOUR_ONLY = "only next to an inserted/deleted line; normalised AST unchanged"
RENAMED_REFS = "only references to moved/renamed definitions changed (they resolve to the same code)"
MAIN_ONLY = "inside `if __name__ == '__main__'`: never runs when the module is imported"


def is_python(path: Optional[str]) -> bool:
    return bool(path) and path.endswith(".py")  # type: ignore[union-attr]


class _Resolver:
    """Canonical name of what a reference resolves to, identical across base and head when the
    target only moved or was renamed."""

    def __init__(self, index: PyIndex, mod: PyModule, cls: Optional[str], renames: Dict[str, str], mod_renames: Dict[str, str]):
        self.index, self.mod, self.cls = index, mod, cls
        self.renames, self.mod_renames = renames, mod_renames

    def __call__(self, chain: Chain) -> Optional[str]:
        if chain[0] in ("self", "cls", "super()"):
            return None
        try:
            ent = self.index.resolve_chain(self.mod, chain, self.cls)
        except RecursionError:  # pragma: no cover - pathological import cycles
            return None
        if ent is None or ent.kind in ("ext", "native"):
            return None
        node = ent.node(self.index)
        if node is None:
            return None
        return "@" + canonical(node, self.renames, self.mod_renames)


def canonical(node: str, renames: Dict[str, str], mod_renames: Dict[str, str]) -> str:
    if node in renames:
        return renames[node]
    mod, _, key = node.partition(":")
    if mod in mod_renames:
        return f"{mod_renames[mod]}:{key}"
    return node


def _cls_of(mod: PyModule, key: str) -> Optional[str]:
    d = mod.defs.get(key)
    if d is None:
        return None
    return d.qual if d.kind == "class" else d.cls


def _fp(index: PyIndex, mod: PyModule, key: str, renames, mod_renames, drop_name=False) -> str:
    if mod.kind_of(key) == "import":
        ent = index.resolve_name(mod, key)
        node = ent.node(index) if ent is not None else None
        if node is not None and ent.kind not in ("ext", "native"):
            return "import->" + canonical(node, renames, mod_renames)
        return "import->" + (ent.key if ent is not None else "?")
    res = _Resolver(index, mod, _cls_of(mod, key), renames, mod_renames)
    stmts = mod.statements(key)
    if key == MODULE:  # the module docstring and other bare strings at top level do nothing
        stmts = [st for st in stmts if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)
                                            and isinstance(st.value.value, str))]
    return fingerprint(stmts, rename=res, drop_name=drop_name)


def python_changes(files: List[ChangedFile], base: PyIndex, head: PyIndex) -> Tuple[List[ChangedSymbol], List[str]]:
    """Changed symbols of every changed ``.py`` file, and notes on files that could not be parsed:
    the candidates the hunks touch, pass 1 pairs renamed definitions, pass 2 compares what is on
    both sides with references resolved."""
    notes: List[str] = []
    # (file, key) -> (base module, head module, base line, head line, neighbour_only)
    cands: Dict[Tuple[str, str], list] = {}
    mod_renames: Dict[str, str] = {}
    moved: List[ChangedSymbol] = []
    for f in files:
        _file_candidates(f, base, head, cands, mod_renames, moved, notes)
    renames, paired = _pair_renames(cands, base, head, mod_renames)
    out: List[ChangedSymbol] = list(moved)
    for (path, key), (bm, hm, bl, hl, near) in sorted(cands.items(), key=lambda kv: (kv[0][0], kv[1][3] or kv[1][2] or 0)):
        in_b = bm is not None and not bm.error and key in bm.keys()
        in_h = hm is not None and not hm.error and key in hm.keys()
        mod = hm if in_h else bm
        kind = mod.kind_of(key) if mod is not None else "module"
        sym = ChangedSymbol(file=path, line=hl or bl or 1, symbol=f"{mod.name if mod else path}:{key}", lang="python",
                            kind=kind, change="modified", side="head" if in_h else "base", name=key,
                            neighbour_only=near, data={"module": mod.name if mod else "", "key": key})
        _judge_symbol(sym, path, key, bm, hm, in_b, in_h, kind, near, paired, renames, mod_renames, base, head)
        out.append(sym)
    return out, notes


def _file_candidates(f: ChangedFile, base: PyIndex, head: PyIndex, cands: dict, mod_renames: Dict[str, str],
                     moved: List[ChangedSymbol], notes: List[str]) -> None:
    """The symbols of one changed file its hunks touch (or all of them, for an added, deleted or
    unparsable file), into ``cands``; a file renamed without a change is one moved module."""
    if f.binary or not (is_python(f.at_base) or is_python(f.at_head)):
        return
    bm = base.module_at(f.at_base) if is_python(f.at_base) else None
    hm = head.module_at(f.at_head) if is_python(f.at_head) else None
    if bm is not None and hm is not None and bm.name != hm.name:
        mod_renames[bm.name] = hm.name
    for side, mod in (("old", bm), ("new", hm)):
        if mod is not None and mod.error:
            notes.append(f"{mod.path}: cannot parse at {'base' if side == 'old' else 'head'} ({mod.error}); "
                         "every definition in it counts as changed")
    direct_old, direct_new = f.lines("old"), f.lines("new")
    near_old, near_new = f.neighbour_lines("old"), f.neighbour_lines("new")
    if f.status == "renamed" and not f.hunks and bm is not None and hm is not None:
        moved.append(ChangedSymbol(file=f.path, line=1, symbol=f"{hm.name}:{MODULE}", lang="python", kind="module",
                                   change="unchanged", name=MODULE, why=f"moved from {f.old_path} ({bm.name}); content unchanged",
                                   data={"module": hm.name, "key": MODULE}))
        return
    if f.status == "added" and hm is not None:
        direct_new = set(range(1, hm.source.count("\n") + 2))
    if f.status == "deleted" and bm is not None:
        direct_old = set(range(1, bm.source.count("\n") + 2))
    for side, mod, direct, near in (("old", bm, direct_old, near_old), ("new", hm, direct_new, near_new)):
        if mod is None:
            continue
        if mod.error:  # unparsable: the other side's definitions all count
            other = hm if side == "old" else bm
            if other is not None and not other.error:
                for key in other.keys():
                    _cand(cands, f.path, key, side == "new", bm, hm, other.line_of(key), False)
            continue
        for key, ln in mod.symbols_at(direct).items():
            _cand(cands, f.path, key, side == "new", bm, hm, ln, False)
        for key, ln in mod.symbols_at(near).items():
            _cand(cands, f.path, key, side == "new", bm, hm, ln, True)



def _pair_renames(cands: dict, base: PyIndex, head: PyIndex, mod_renames: Dict[str, str]):
    """(renames old -> new, (file, key) -> why it is unchanged): deletions paired with additions
    of an identical body (renamed definitions), then imports through those renames."""
    renames: Dict[str, str] = {}
    added, deleted = [], []
    for (path, key), (bm, hm, bl, hl, _near) in cands.items():
        in_b = bm is not None and not bm.error and key in bm.keys() and key not in (MODULE, MAIN)
        in_h = hm is not None and not hm.error and key in hm.keys() and key not in (MODULE, MAIN)
        if in_h and not in_b:
            added.append((path, key, hm))
        elif in_b and not in_h:
            deleted.append((path, key, bm))
    paired: Dict[Tuple[str, str], str] = {}
    # definitions and variables first (by body, name ignored), then imports (by what they name,
    # through the renames just found)
    for kinds in (("function", "method", "class", "variable"), ("import",)):
        afp: Dict[tuple, list] = {}
        for path, key, hm in added:
            if (path, key) not in paired and hm.kind_of(key) in kinds:
                fp = _fp(head, hm, key, {}, {}, drop_name=True)
                afp.setdefault((hm.kind_of(key), fp), []).append((path, key, hm))
        for path, key, bm in deleted:
            if (path, key) in paired or bm.kind_of(key) not in kinds:
                continue
            hit = afp.get((bm.kind_of(key), _fp(base, bm, key, renames, mod_renames, drop_name=True)))
            if hit:
                hpath, hkey, hm = hit.pop(0)
                renames[f"{bm.name}:{key}"] = f"{hm.name}:{hkey}"
                if key in bm.defs and bm.defs[key].kind == "class":
                    renames[f"{bm.name}:{key}.*"] = f"{hm.name}:{hkey}.*"
                what = "now imported as" if kinds == ("import",) else "renamed to"
                paired[(path, key)] = f"{what} {hm.name}:{hkey}; " + (
                    "same target" if kinds == ("import",) else "body unchanged")
                paired[(hpath, hkey)] = ("import renamed from " if kinds == ("import",) else "renamed from ") + \
                    f"{bm.name}:{key}; " + ("same target" if kinds == ("import",) else "body unchanged")

    return renames, paired


def _judge_symbol(sym: ChangedSymbol, path: str, key: str, bm, hm, in_b: bool, in_h: bool, kind: str, near: bool,
                  paired: dict, renames: dict, mod_renames: dict, base: PyIndex, head: PyIndex) -> None:
    """Whether a candidate really changed (and why not): set ``sym.change`` and ``sym.why``."""
    broken = (bm is not None and bm.error) or (hm is not None and hm.error)
    if key == MAIN:
        sym.change, sym.why = "unchanged", MAIN_ONLY
    elif (path, key) in paired:
        sym.change, sym.why = "unchanged", paired[(path, key)]
    elif broken:
        sym.change = "modified"
        sym.why = "file cannot be parsed on one side"
    elif key == MODULE and (in_b or in_h) and bm is not None and hm is not None:
        # module-level statements that exist on one side only (a module docstring added or
        # removed): compared with "nothing" on the other side, normalised like any symbol
        fb = _fp(base, bm, key, renames, mod_renames) if in_b else fingerprint([])
        fh = _fp(head, hm, key, {}, {}) if in_h else fingerprint([])
        if fb == fh:
            sym.change, sym.why = "unchanged", FORMAT_ONLY
    elif in_b and in_h:
        fb = _fp(base, bm, key, renames, mod_renames)
        fh = _fp(head, hm, key, {}, {})
        if fb == fh:
            sym.change = "unchanged"
            if near:
                sym.why = NEIGHBOUR_ONLY
            elif kind == "import" and fb.startswith("import->"):
                sym.why = f"import now resolves to the same definition ({fb[8:]}): moved or renamed"
            elif fingerprint(bm.statements(key)) != fingerprint(hm.statements(key)):
                sym.why = RENAMED_REFS
            else:
                sym.why = FORMAT_ONLY
    elif in_h:
        sym.change = "added"
    elif in_b:
        sym.change = "deleted"
    else:  # a comment-only line in a module that exists on neither side (cannot happen) or <module>
        sym.change, sym.why = "unchanged", FORMAT_ONLY
    if sym.change == "unchanged" and key == MODULE and not sym.why:
        sym.why = FORMAT_ONLY


def _cand(cands, path, key, head_side: bool, bm, hm, line, near: bool) -> None:
    cur = cands.get((path, key))
    if cur is None:
        cur = cands[(path, key)] = [bm, hm, None, None, True]
    if head_side:
        cur[3] = cur[3] or line
    else:
        cur[2] = cur[2] or line
    cur[4] = cur[4] and near
