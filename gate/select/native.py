"""Changed C/C++/CUDA symbols -> the native operators they can change.

Breadth-first over identifiers, starting from each changed symbol's name:
  * an ATen kernel name (``native_functions.yaml`` ``dispatch``, the implicit composite kernel,
    ``TORCH_IMPL_FUNC``) or ``TORCH_META_FUNC`` -> ATen ops (plus their structured delegates);
  * ``REGISTER_*DISPATCH(stub, &fn)`` with ``fn`` reached -> the ``stub`` is reached, then every
    function that calls the stub;
  * ``m.impl("op", fn)`` / ``m.def("op", fn)`` in ``TORCH_LIBRARY*`` blocks -> the custom op;
  * ``REGISTER_KERNEL_BUILDER(Name("Op")..., Kernel<...>)`` / ``REGISTERn(Kernel, DEV, "Op", functor, ...)``
    with the kernel class or functor reached -> TF op ``Op`` (one kernel class may serve several);
  * otherwise the symbols whose bodies mention the name (found with ``git grep -w``, then parsed)
    are reached: a function by its name, a method by its class, a ``#define`` by its macro name.
A symbol with internal linkage (``static`` / anonymous namespace) is looked up only in its own
file and, for a header, the files that include it. Registrations written on the changed lines
count directly; a header change outside every definition reaches what its includers register."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ..changes.cpp import CppFile, CppIndex
from ..changes.model import ChangedSymbol
from .aten import NativeFunctions

MAX_NAMES = 4000  # identifiers one changed symbol may reach before the search stops (noted)
MAX_DEPTH = 12


@dataclass
class NativeHit:
    framework: str  # torch | tensorflow
    op: str  # "gelu", "myops::gelu2", "Relu"
    path: List[str]  # changed symbol -> ... -> "aten::gelu" / "tf::Relu"
    symbol: ChangedSymbol = field(repr=False, default=None)  # type: ignore[assignment]


def op_label(framework: str, op: str) -> str:
    if framework == "tensorflow":
        return f"tf::{op}"
    return op if "::" in op else f"aten::{op}"


class NativePropagator:
    def __init__(self, index: CppIndex, natives: Optional[NativeFunctions]):
        self.index = index
        self.natives = natives
        self.notes: List[str] = []

    # -- direct mappings -----------------------------------------------------------------
    def _regs_ops(self, regs: Sequence[dict]) -> Tuple[List[Tuple[str, str]], List[str]]:
        """Ops registered by ``regs`` directly, and stubs they bind (to search further)."""
        ops, stubs = [], []
        for r in regs:
            if r["kind"] in ("tf_op", "tf_kernel"):
                ops += [("tensorflow", o) for o in r["ops"]]
            elif r["kind"] in ("torch_def", "torch_impl", "pybind_def"):
                ops += [("torch", o) for o in r["ops"]]
            elif r["kind"] == "dispatch" and r.get("stub"):
                stubs.append(r["stub"])
        return ops, stubs

    def _aten_of(self, name: str, macro: Optional[str], margs: Sequence[str]) -> Set[str]:
        if self.natives is None:
            return set()
        if macro in ("TORCH_META_FUNC", "TORCH_PRECOMPUTE_META_FUNC"):
            return self.natives.ops_for_meta(margs[0]) if margs else set()
        if macro in ("TORCH_META_FUNC2", "TORCH_PRECOMPUTE_META_FUNC2"):
            return self.natives.ops_for_meta(margs[0], margs[1] if len(margs) > 1 else None) if margs else set()
        return self.natives.ops_for_kernel(name)

    # -- search --------------------------------------------------------------------------
    def propagate(self, sym: ChangedSymbol) -> List[NativeHit]:
        data = sym.data
        hits: List[NativeHit] = []
        start = f"{sym.file}:{sym.line} {sym.symbol}"
        ops, stubs = self._regs_ops(data.get("regs", []))
        for fw, op in ops:
            hits.append(NativeHit(fw, op, [start, op_label(fw, op)], sym))
        torchy = data.get("framework") in ("torch", None)
        seeds: List[Tuple[str, List[str]]] = [(s, [start, s]) for s in stubs]
        kind = sym.kind
        macro = data.get("macro")
        if kind == "function" and macro and macro.startswith("TORCH_LIBRARY"):
            pass  # only its changed m.def / m.impl lines count (handled above)
        elif kind in ("function", "method", "class", "macro", "variable", "declaration") and sym.name:
            fn = data.get("fn") or sym.name
            if torchy and kind == "function":
                for op in sorted(self._aten_of(fn, macro, data.get("macro_args") or [])):
                    hits.append(NativeHit("torch", op, [start, op_label("torch", op)], sym))
            if kind == "macro" and data.get("regs"):
                pass  # a changed registration line inside a macro: exactly those registrations
            elif not (macro or "").startswith("TORCH_META"):
                seeds.append((sym.name, [start]))
                if kind == "method" and fn and fn != sym.name and macro:
                    seeds.append((fn, [start]))
        elif kind in ("statement", "include", "file"):
            f = self.index.file(sym.file) if sym.side == "head" else None
            if sym.kind in ("include", "file") and not ops and not stubs:
                hits += self._file_level(sym, start)
            elif f is not None:
                # a statement using a macro defined in this file (TF_CALL_half(REGISTER_KERNELS))
                stmt = next((s for s in f.symbols if s.start <= sym.line <= s.end and s.kind == "statement"), None)
                if stmt is not None:
                    for ident in sorted(stmt.idents & set(f.macros)):
                        seeds.append((ident, [start, ident]))
        scope: Optional[List[str]] = None
        if data.get("internal"):
            scope = [sym.file] + (self.index.includers(sym.file) if data.get("header") else [])
        hits += self._bfs(seeds, scope, sym)
        return _dedup(hits)

    def _file_level(self, sym: ChangedSymbol, start: str) -> List[NativeHit]:
        """A change outside every definition (an ``#include``, a ``using``): what the file
        registers, and for a header what every file including it registers."""
        files = [sym.file] + (self.index.includers(sym.file) if sym.data.get("header") else [])
        hits: List[NativeHit] = []
        seeds: List[Tuple[str, List[str]]] = []
        for path in files:
            f = self.index.file(path)
            if f is None:
                continue
            via = [start] + ([f"{path} (includes {sym.file})"] if path != sym.file else [])
            for r in f.registrations:
                ops, stubs = self._regs_ops([r.to_dict()])
                hits += [NativeHit(fw, op, via + [op_label(fw, op)], sym) for fw, op in ops]
                seeds += [(s, via + [s]) for s in stubs]
            if f.framework in ("torch", None):
                for s in f.symbols:
                    if s.kind == "function":
                        fn = getattr(s, "data_name", s.name)
                        for op in sorted(self._aten_of(fn, s.macro, s.macro_args)):
                            hits.append(NativeHit("torch", op, via + [f"{path}:{s.start} {fn}", op_label("torch", op)], sym))
        return hits + self._bfs(seeds, None, sym)

    def _bfs(self, seeds: List[Tuple[str, List[str]]], scope: Optional[List[str]], sym: ChangedSymbol) -> List[NativeHit]:
        hits: List[NativeHit] = []
        paths: Dict[str, List[str]] = {}  # identifier reached -> how (changed symbol -> ... -> it)
        frontier: List[str] = []
        for name, path in seeds:
            if name and name not in paths:
                last = path[-1] if path else ""
                paths[name] = path if (last == name or last.endswith(("::" + name, " " + name))) else path + [name]
                frontier.append(name)
        depth = 0
        while frontier and depth < MAX_DEPTH:
            depth += 1
            if len(paths) > MAX_NAMES:
                self.notes.append(f"{sym.file}:{sym.line} {sym.symbol}: search stopped after {MAX_NAMES} identifiers")
                break
            want = set(frontier)
            files = self.index.files_mentioning(want)
            if scope is not None:
                files = [p for p in files if p in scope]
            nxt: List[str] = []

            def reach(name: str, via: str, label: str) -> None:
                if name and name not in paths:
                    paths[name] = paths[via] + ([label] if label else []) + ([name] if not label.endswith(" " + name) else [])
                    nxt.append(name)

            for path in files:
                f = self.index.file(path)
                if f is None:
                    continue
                for n, ops in self._file_hits(f, want):
                    for fw, op in ops:
                        hits.append(NativeHit(fw, op, paths[n] + [op_label(fw, op)], sym))
                for n, stub in self.stubs_for(f, want):
                    reach(stub, n, f"{path} REGISTER_DISPATCH({stub}, {n})")
                for s in f.symbols:
                    used = s.idents & want
                    if not used:
                        continue
                    via = sorted(used)[0]
                    label = f"{path}:{s.start} "
                    if s.kind == "function":
                        fn = getattr(s, "data_name", s.name)
                        if s.macro and s.macro.startswith("TORCH_LIBRARY"):
                            continue  # its m.impl / m.def names are registrations (above)
                        if f.framework in ("torch", None):
                            for op in sorted(self._aten_of(fn, s.macro, s.macro_args)):
                                hits.append(NativeHit("torch", op, paths[via] + [label + fn, op_label("torch", op)], sym))
                        if not (s.macro or "").startswith("TORCH_META"):
                            reach(fn, via, label + fn)
                    elif s.kind == "macro" and any(s.start <= r.start and r.end <= s.end for r in f.registrations):
                        continue  # a registration macro: its registrations that use the name count (above)
                    elif s.kind in ("method", "class", "macro", "variable") and s.name:
                        reach(s.name, via, label + s.name)
            frontier = list(dict.fromkeys(nxt))
            scope = None  # what a file-local symbol reaches is visible from anywhere
        return hits

    def _file_hits(self, f: CppFile, want: Set[str]) -> List[Tuple[str, List[Tuple[str, str]]]]:
        """Registrations in ``f`` that bind one of ``want`` (directly, or inside a macro named in it)."""
        out = []
        for r in f.registrations:
            names = set(r.names)
            inside = [m for m in f.macros.values() if m.start <= r.start and r.end <= m.end and m.name in want]
            hit = sorted(names & want) or [m.name for m in inside]
            if not hit:
                continue
            if r.kind == "dispatch":
                continue  # handled below as a stub
            fw = "tensorflow" if r.kind.startswith("tf_") else "torch"
            out.append((hit[0], [(fw, o) for o in r.ops]))
        return out

    def stubs_for(self, f: CppFile, want: Set[str]) -> List[Tuple[str, str]]:
        return [(n, r.stub) for r in f.registrations if r.kind == "dispatch" and r.stub for n in r.names if n in want]


def _dedup(hits: List[NativeHit]) -> List[NativeHit]:
    seen: Set[Tuple[str, str]] = set()
    out = []
    for h in sorted(hits, key=lambda h: len(h.path)):
        if (h.framework, h.op) not in seen:
            seen.add((h.framework, h.op))
            out.append(h)
    return out
