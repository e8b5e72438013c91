"""Select: a pull request's changes + the operator catalogue + ``.dl-gate.yml`` -> the operators
whose numerics the diff can change, each with its reasons (file:line of the changed symbol and the
path from it to the operator). The gate spends its budget on exactly these.

    from gate.select import select_ops
    sel = select_ops(repo, "origin/main", "HEAD", catalog, config)
    sel.op_names()        # ["mylib.gelu", ...]

Nothing is dropped silently: a changed symbol that reaches no operator is ``cleared`` (with why),
a changed file nothing maps to is ``unmapped``, a native op that changed but that no catalogue
row declares is ``uncovered_native``, and a change that reaches an operator the configuration
lists under ``not_gated:`` (what ``dl-gate init`` could not build a row for) is ``not_gated``, with
the reason it is not gated."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..changes import ChangeSet, CodeBase, collect_changes
from ..changes.git import Git
from ..changes.model import ChangedSymbol
from ..errors import ConfigError
from .aten import NativeFunctions
from .globs import first_match, match
from .model import Cleared, NotGated, Reason, SelectedOp, Selection, UncoveredNative, Unmapped
from .native import NativePropagator, op_label
from .python import display, entry_node, native_targets, reach
from .tfnames import tf_snake

NOT_REACHABLE = "not reachable from any operator in the catalogue"
NO_REGISTRATION = "no operator registration or ATen kernel reaches it"
MAX_REASONS = 25


def python_roots(repo_root: Path, config) -> List[str]:
    """``python_path`` entries of the config as repository-relative directories ("" = root)."""
    raw = (getattr(config, "raw", None) or {}).get("python_path") or ["."]
    croot = Path(getattr(config, "root", repo_root) or repo_root).resolve()
    out = []
    for p in raw:
        full = (croot / p).resolve()
        try:
            rel = full.relative_to(repo_root.resolve())
        except ValueError:
            continue
        out.append("" if str(rel) == "." else rel.as_posix())
    return out or [""]


class _Acc:
    def __init__(self):
        self.ops: Dict[str, List[Reason]] = {}

    def add(self, op: str, reason: Reason) -> None:
        lst = self.ops.setdefault(op, [])
        key = (reason.file, reason.line, reason.symbol, reason.kind)
        for i, r in enumerate(lst):
            if (r.file, r.line, r.symbol, r.kind) == key:
                if len(reason.path) < len(r.path):
                    lst[i] = reason
                return
        if len(lst) < MAX_REASONS:
            lst.append(reason)


def select_ops(repo: os.PathLike, base: str, head: str, catalog, config, changes: Optional[ChangeSet] = None) -> Selection:
    """The operators a diff reaches, each with the reasons it was chosen; every changed file is
    accounted for (selected through, cleared, uncovered native, or unmapped)."""
    repo = Path(repo)
    git = Git(repo)
    roots = python_roots(git.root, config)
    cs = changes if changes is not None else collect_changes(repo, base, head, python_path=roots)
    cb = cs.codebase if isinstance(cs.codebase, CodeBase) else CodeBase(git, cs.merge_base, cs.head_sha, roots)
    gmap, all_globs, ignore, cap = _select_config(config, catalog)
    sel = Selection(base=cs.base, head=cs.head, base_sha=cs.base_sha, head_sha=cs.head_sha, merge_base=cs.merge_base,
                    files_changed=len(cs.files))
    sel.notes.extend(cs.notes)
    acc = _Acc()
    accounted: set = set()
    ignored = _ignored(cs, ignore)
    syms = [s for s in cs.symbols if s.file not in ignored]
    for s in syms:
        accounted.add(s.file)
        if not s.semantic:
            sel.cleared.append(Cleared(s.file, s.line, s.symbol, s.why))
    unreached: List[Tuple[ChangedSymbol, str]] = []  # semantic changes no analysis attributed
    changed_natives = _cpp_natives(syms, cb, git, sel, unreached)
    _aten_yaml_natives(syms, changed_natives)
    python_covered = _python_reach(syms, cb, catalog, changed_natives, sel, acc, unreached)
    not_gated = _not_gated(syms, cb, config, sel)
    _natives_to_rows(changed_natives, python_covered, catalog, sel, acc)
    mapped_files, all_hits = _globs(cs, syms, ignored, gmap, all_globs, catalog, acc)
    _unreached(cs, syms, unreached, catalog, sel, acc, mapped_files, not_gated)
    accounted |= mapped_files
    if all_hits:
        _select_all(all_hits, acc, catalog, cap, sel)
    return _finish(cs, ignored, accounted, acc, sel)


def _select_config(config, catalog) -> Tuple[Dict[str, List[str]], List[str], List[str], Optional[int]]:
    """(select.map, select.all, select.ignore, select.cap), the map's operators checked."""
    scfg = dict(getattr(config, "select", None) or {})
    gmap: Dict[str, List[str]] = dict(scfg.get("map") or {})
    all_globs: List[str] = list(scfg.get("all") or [])
    ignore: List[str] = list(scfg.get("ignore") or [])
    cap: Optional[int] = scfg.get("cap")
    for pattern, names in gmap.items():
        for n in names:
            if n not in catalog:
                try:
                    catalog.get(n)
                except Exception as exc:
                    raise ConfigError(f"select.map '{pattern}': {exc}") from None
    return gmap, all_globs, ignore, cap


def _ignored(cs: ChangeSet, ignore: List[str]) -> Dict[str, str]:
    """Changed file -> the select.ignore pattern it matches."""
    ignored: Dict[str, str] = {}
    for f in cs.files:
        pat = first_match(f.path, ignore) or (first_match(f.old_path, ignore) if f.old_path else "")
        if pat:
            ignored[f.path] = pat
    return ignored


def _cpp_natives(syms, cb, git, sel: Selection, unreached: list) -> Dict[Tuple[str, str], list]:
    """Changed C/C++/CUDA symbols -> the native ops they reach: (framework, op) -> [(path, symbol)]."""
    # 1. C/C++/CUDA -> native ops ---------------------------------------------------------
    changed_natives: Dict[Tuple[str, str], List[Tuple[List[str], ChangedSymbol]]] = {}
    cpp_syms = [s for s in syms if s.lang == "cpp" and s.semantic]
    if cpp_syms:
        props: Dict[str, NativePropagator] = {}
        for s in cpp_syms:
            if s.side not in props:
                rev = cb.revs[s.side]
                natives = NativeFunctions.load(git, rev)
                if natives is None:
                    sel.notes.append("native_functions.yaml not found (no torch wheel, not a PyTorch tree): "
                                     "ATen kernels are not mapped to ops")
                props[s.side] = NativePropagator(cb.cpp(s.side), natives)
            hits = props[s.side].propagate(s)
            if not hits:
                unreached.append((s, NO_REGISTRATION))
            for h in hits:
                changed_natives.setdefault((h.framework, h.op), []).append((h.path, s))
        for p in props.values():
            sel.notes.extend(p.notes)

    return changed_natives


def _aten_yaml_natives(syms, changed_natives: dict) -> None:
    # 1b. native_functions.yaml entries -> their ops ------------------------------------------
    for s in syms:
        if s.lang == "aten-yaml" and s.semantic and s.data.get("op"):
            changed_natives.setdefault(("torch", str(s.data["op"])), []).append(
                ([f"{s.file}: {s.data['func']} ({s.change})"], s))


def _python_reach(syms, cb, catalog, changed_natives: dict, sel: Selection, acc: "_Acc", unreached: list) -> set:
    """Changed Python symbols -> native ops they implement and catalogue entry points that reach
    them (or a changed native op); returns the native ops some Python entry point covers."""
    # 2. Python: implementations of native ops, then catalogue entry points -------------------
    py_syms = [s for s in syms if s.lang == "python" and s.semantic]
    targets = {side: {f"{s.data['module']}:{s.data['key']}": s for s in py_syms if s.side == side} for side in ("head", "base")}
    reached: set = set()
    python_covered: set = set()
    if py_syms:
        for side in ("head", "base"):
            if not targets[side]:
                continue
            idx = cb.py(side)
            for nat, impls in sorted(idx.native_impls().items()):
                fw, op = "torch", nat.split(":", 2)[2]
                for impl in impls:
                    for t, path in reach(idx, impl, set(targets[side])).items():
                        sym = targets[side][t]
                        reached.add(id(sym))
                        changed_natives.setdefault((fw, op), []).append(
                            ([display(n) for n in path] + [op_label(fw, op)], sym))
    python_covered = _python_entries(py_syms, targets, reached, cb, catalog, changed_natives, sel, acc)
    for s in py_syms:
        if id(s) not in reached:
            unreached.append((s, NOT_REACHABLE))
    return python_covered


def _not_gated(syms, cb, config, sel: Selection) -> set:
    """Changed Python symbols that reach an operator listed under the configuration's
    ``not_gated:`` (``{name, callable, why}``): recorded in ``sel.not_gated`` (the run says the
    change is not gated, and why); returns their ids (such a change is not "cleared" as reaching
    nothing; a row's ``sources`` still pick it up, as any change the analysis did not attribute)."""
    raw = getattr(config, "raw", None) or {}
    entries = [e for e in raw.get("not_gated") or [] if isinstance(e, dict) and e.get("callable") and e.get("name")]
    py_syms = [s for s in syms if s.lang == "python" and s.semantic]
    hit: set = set()
    if not entries or not py_syms:
        return hit
    seen: set = set()
    for side in ("head", "base"):
        targets = {f"{s.data['module']}:{s.data['key']}": s for s in py_syms if s.side == side}
        if not targets:
            continue
        idx = cb.py(side)
        for e in entries:
            node = entry_node(idx, str(e["callable"]))
            if node is None:
                continue
            found = reach(idx, node, set(targets))
            for t in found:
                hit.add(id(targets[t]))
            if found and e["name"] not in seen:
                seen.add(e["name"])
                t = min(found, key=lambda k: len(found[k]))
                sym = targets[t]
                sel.not_gated.append(NotGated(str(e["name"]), str(e.get("why") or ""), sym.file, sym.line, sym.symbol))
    return hit


def _python_entries(py_syms, targets, reached: set, cb, catalog, changed_natives: dict, sel: Selection,
                    acc: "_Acc") -> set:
    """Catalogue entry points whose call graph reaches a changed symbol or a changed native op."""
    python_covered: set = set()
    nat_nodes = native_targets(changed_natives)
    if py_syms or nat_nodes:
        for side in ("head", "base"):
            tset = dict(targets[side])
            if side == "head":
                tset.update({n: None for n in nat_nodes})
            if not tset:
                continue
            idx = cb.py(side)
            only_native = not targets[side]
            for spec in catalog:
                if only_native and spec.origin != "user":
                    continue  # built-in rows reach native ops through their declared `native` names
                node = entry_node(idx, spec.callable)
                if node is None:
                    if spec.origin == "user" and side == "head" and _in_repo(idx, spec.callable):
                        sel.notes.append(f"operator {spec.name}: callable {spec.callable} not found in the repository")
                    continue
                for t, path in reach(idx, node, set(tset)).items():
                    chain = [display(n) for n in path]
                    if t in nat_nodes:
                        fw, op = nat_nodes[t]
                        npath, nsym = min(changed_natives[(fw, op)], key=lambda x: len(x[0]))
                        python_covered.add((fw, op))
                        acc.add(spec.name, Reason(nsym.file, nsym.line, nsym.symbol,
                                                  npath + [f"{display(n)}" for n in reversed(path[1:])] + [spec.name],
                                                  _native_kind(fw, op)))
                    else:
                        sym = tset[t]
                        reached.add(id(sym))
                        acc.add(spec.name, Reason(sym.file, sym.line, sym.symbol, chain + [spec.name], "python"))
    return python_covered


def _natives_to_rows(changed_natives: dict, python_covered: set, catalog, sel: Selection, acc: "_Acc") -> None:
    # 3. native ops -> catalogue rows -------------------------------------------------------
    by_native = {fw: catalog.by_native(fw) for fw in ("torch", "tensorflow")}
    for (fw, op), found in sorted(changed_natives.items()):
        specs = list(by_native[fw].get(op.split(".")[0], []))
        if fw == "tensorflow":
            snake = tf_snake(op).lstrip("_")
            specs += [s for s in catalog if s.framework == "tensorflow" and not s.native
                      and s.callable.replace(":", ".").rsplit(".", 1)[-1] == snake and s not in specs]
        for spec in specs:
            for path, sym in sorted(found, key=lambda x: len(x[0]))[:MAX_REASONS]:
                acc.add(spec.name, Reason(sym.file, sym.line, sym.symbol, path + [spec.name], _native_kind(fw, op)))
        if not specs and (fw, op) not in python_covered:
            sel.uncovered_native.append(UncoveredNative(op=op, framework=fw, reasons=[
                Reason(sym.file, sym.line, sym.symbol, path, _native_kind(fw, op))
                for path, sym in sorted(found, key=lambda x: len(x[0]))[:MAX_REASONS]]))
    _fold_inplace(sel, acc, by_native)


def _globs(cs: ChangeSet, syms, ignored: Dict[str, str], gmap, all_globs, catalog, acc: "_Acc"):
    """(files a glob accounted for, select.all hits): select.map, catalogue sources, select.all."""
    # 4. globs: select.map, catalogue sources, select.all -------------------------------------
    # select.map always applies to a file with a real change; a row's ``sources`` decide alone
    # only for files no analyser reads, and otherwise pick up what the analysis left unattributed.
    semantic_files = {s.file for s in syms if s.semantic}
    analysed_files = {s.file for s in syms}
    all_hits: List[Tuple[str, str, int]] = []
    mapped_files: set = set()
    for f in cs.files:
        if f.path in ignored:
            continue
        if f.path in analysed_files and f.path not in semantic_files:
            continue  # every change in it is format-only: no glob fires on it
        paths = [f.path] + ([f.old_path] if f.old_path else [])
        line = f.line_of("new" if f.status != "deleted" else "old")
        for pattern, names in gmap.items():
            if any(match(p, pattern) for p in paths):
                mapped_files.add(f.path)
                for n in names:
                    op = catalog.get(n).name
                    acc.add(op, Reason(f.path, line, f.path, [f.path, f"select.map '{pattern}'", op], "glob"))
        if f.path not in analysed_files:
            for spec in catalog:
                src = next((g for g in spec.sources if any(match(p, g) for p in paths)), None)
                if src:
                    mapped_files.add(f.path)
                    acc.add(spec.name, Reason(f.path, line, f.path, [f.path, f"sources '{src}'", spec.name], "sources"))
        for pattern in all_globs:
            if any(match(p, pattern) for p in paths):
                mapped_files.add(f.path)
                all_hits.append((f.path, pattern, line))
                break
    return mapped_files, all_hits


def _unreached(cs: ChangeSet, syms, unreached: list, catalog, sel: Selection, acc: "_Acc", mapped_files: set,
               not_gated: set = frozenset()) -> None:
    """Semantic changes no analysis attributed: a row's sources pick them up, else they are cleared."""
    # a whole new / deleted file none of whose symbols matters is one line, not one per symbol
    status = {f.path: f.status for f in cs.files}
    by_file: Dict[str, List[Tuple[ChangedSymbol, str]]] = {}
    for s, why in unreached:
        by_file.setdefault(s.file, []).append((s, why))
    semantic_count: Dict[str, int] = {}
    for s in syms:
        if s.semantic:
            semantic_count[s.file] = semantic_count.get(s.file, 0) + 1
    collapsed = {p for p, lst in by_file.items()
                 if status.get(p) in ("added", "deleted") and len(lst) > 1 and len(lst) == semantic_count.get(p)
                 and not any(match(p, g) for spec in catalog for g in spec.sources)}
    for p in sorted(collapsed):
        lst = by_file[p]
        whys = sorted({w for _s, w in lst})
        sel.cleared.append(Cleared(p, 1, f"{p}:<file>", f"{status[p]} file: none of its {len(lst)} symbols matters "
                                   f"({'; '.join(whys)})"))
    unreached = [(s, w) for s, w in unreached if s.file not in collapsed]
    for s, why in unreached:
        hit = False
        for spec in catalog:
            src = next((g for g in spec.sources if match(s.file, g)), None)
            if src:
                hit = True
                acc.add(spec.name, Reason(s.file, s.line, s.symbol, [s.symbol, f"sources '{src}'", spec.name], "sources"))
        if not hit and s.file not in mapped_files and id(s) not in not_gated:
            sel.cleared.append(Cleared(s.file, s.line, s.symbol, why))


def _select_all(all_hits: list, acc: "_Acc", catalog, cap: Optional[int], sel: Selection) -> None:
    order = list(acc.ops) + [s.name for s in sorted(catalog, key=lambda s: s.origin != "user")]
    limit = cap or len(catalog)
    fpath, pattern, line = all_hits[0]
    for name in dict.fromkeys(order):
        if name in acc.ops:
            continue
        if len(acc.ops) < limit:
            acc.add(name, Reason(fpath, line, fpath, [fpath, f"select.all '{pattern}'", name], "select-all"))
        else:
            sel.capped.append(name)
    for fpath, pattern, _line in all_hits:
        sel.notes.append(f"{fpath} matches select.all '{pattern}': every operator is selected"
                         + (f" up to cap {cap} ({len(sel.capped)} left out, listed in 'capped')" if sel.capped else ""))


def _finish(cs: ChangeSet, ignored: Dict[str, str], accounted: set, acc: "_Acc", sel: Selection) -> Selection:
    # 5. whatever is left is unmapped, never lost ----------------------------------------------
    for r in [r for lst in acc.ops.values() for r in lst] + [r for u in sel.uncovered_native for r in u.reasons]:
        accounted.add(r.file)
    accounted.update(n.file for n in sel.not_gated)
    for f in cs.files:
        if f.path in ignored:
            sel.unmapped.append(Unmapped(f.path, f"ignored by select.ignore '{ignored[f.path]}'"))
        elif f.path not in accounted:
            sel.unmapped.append(Unmapped(f.path, _unmapped_why(f)))

    sel.selected = [SelectedOp(op=name, reasons=sorted(rs, key=lambda r: (r.kind == "select-all", len(r.path), r.file, r.line)))
                    for name, rs in sorted(acc.ops.items())]
    sel.cleared.sort(key=lambda c: (c.file, c.line, c.symbol))
    sel.uncovered_native.sort(key=lambda u: (u.framework, u.op))
    sel.notes = list(dict.fromkeys(sel.notes))
    return sel


def _native_kind(fw: str, op: str) -> str:
    if fw == "tensorflow":
        return "tf-op"
    return "torch-library" if "::" in op else "aten"


def _in_repo(idx, callable_path: str) -> bool:
    top = callable_path.replace(":", ".").split(".")[0]
    return idx.has_module(top)


def _fold_inplace(sel: Selection, acc: _Acc, by_native) -> None:
    """An uncovered in-place / out variant (``gelu_``) of an op that is covered (``gelu``) is the
    same kernel: say so in a note instead of listing it as uncovered."""
    keep = []
    uncovered = {(u.framework, u.op) for u in sel.uncovered_native}
    for u in sel.uncovered_native:
        base = u.op[:-1] if u.framework == "torch" and u.op.endswith("_") and not u.op.endswith("__") else None
        if base and (by_native[u.framework].get(base) or (u.framework, base) in uncovered):
            continue
        keep.append(u)
    sel.uncovered_native = keep


def _unmapped_why(f) -> str:
    if f.binary:
        return "binary file"
    if f.status == "renamed" and not f.hunks:
        return "renamed without a content change; no select.map glob matches"
    if not f.hunks:
        return "mode or metadata change only; no select.map glob matches"
    return "no analyser reads this file type and no select.map / sources / select.all glob matches"


__all__ = ["select_ops", "Selection", "SelectedOp", "Reason", "Cleared", "Unmapped", "UncoveredNative", "python_roots"]
