"""All Python modules of one revision, loaded lazily, with name resolution across modules and a
call/reference graph over their symbols.

Graph nodes (strings):
  ``mod:key``       a symbol of module ``mod`` (function, method ``C.m``, class body ``C``, a
                    top-level bound name, ``<module>``)
  ``mod:C.*``       class ``C`` as a whole: its body, every method, nested classes, base classes
                    (what calling / instantiating / subclassing ``C`` can run)
  ``native:torch:NAME`` / ``native:tf:snake_name``  an ATen / custom torch op, or a TF op reached
                    through its generated ``gen_*_ops`` wrapper
Edges point from a symbol to what it uses. Re-exports (``from .ops import gelu`` in a package
``__init__``), aliases (``F = torch.nn.functional``), ``self.method`` inside a class (through its
bases in the repository) and ``super()`` are followed."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .git import Git
from .pysrc import MODULE, Chain, ImportBinding, PyModule, attr_chain, references

NATIVE_DECORATORS = ("register_decomposition", "custom_op", "register_kernel", "register_autograd", "impl",
                     "register_lowering")
EXPORT_DECORATORS = ("tf_export", "keras_export", "estimator_export")
_CUSTOM_OP = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.\w+)?$")


@dataclass(frozen=True)
class Entity:
    kind: str  # module | def | var | ext | native
    module: str = ""
    key: str = ""  # def qualname / var name / ext dotted path / native node

    def node(self, index: "PyIndex") -> Optional[str]:
        if self.kind == "def":
            d = index.module(self.module).defs[self.key]  # type: ignore[union-attr]
            return f"{self.module}:{self.key}.*" if d.kind == "class" else f"{self.module}:{self.key}"
        if self.kind == "var":
            return f"{self.module}:{self.key}"
        if self.kind == "module":
            return f"{self.module}:{MODULE}"
        if self.kind == "native":
            return self.key
        if self.kind == "ext":
            return native_node(self.key) or index.compiled_node(self.key)
        return None


def native_node(dotted: str) -> Optional[str]:
    """``torch.ops.aten.gelu.default`` / ``aten.gelu`` -> ``native:torch:gelu``;
    ``torch.ops.myns.op`` -> ``native:torch:myns::op``; ``...gen_nn_ops.relu`` -> ``native:tf:relu``."""
    parts = dotted.split(".")
    for i, p in enumerate(parts):
        if p == "aten" and i + 1 < len(parts) and (i == 0 or parts[i - 1] == "ops"):
            return f"native:torch:{parts[i + 1]}"
        if p == "ops" and i >= 1 and parts[i - 1] == "torch" and i + 2 < len(parts) and parts[i + 1] not in ("aten", "load_library"):
            return f"native:torch:{parts[i + 1]}::{parts[i + 2]}"
        if re.fullmatch(r"gen_\w+_ops", p) and i + 1 < len(parts):
            return f"native:tf:{parts[i + 1].lstrip('_')}"
    return None


def module_name(path: str, roots: Sequence[str]) -> Tuple[str, bool]:
    """Dotted module name of ``path`` under the longest matching root ("" = repo root)."""
    best = ""
    for r in roots:
        r = r.strip("/")
        if r in ("", ".") or path.startswith(r + "/"):
            r = "" if r in ("", ".") else r
            if len(r) >= len(best):
                best = r
    rel = path[len(best) + 1:] if best else path
    parts = rel[:-3].split("/") if rel.endswith(".py") else rel.split("/")
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


class PyIndex:
    def __init__(self, git: Git, rev: str, roots: Sequence[str] = ("",), files: Optional[Iterable[str]] = None):
        self.git = git
        self.rev = rev
        self.roots = list(roots) or [""]
        self.path_of: Dict[str, str] = {}
        self.name_of: Dict[str, str] = {}
        self.pkg: Set[str] = set()
        for path in (files if files is not None else git.ls_files(rev, (".py",))):
            name, is_pkg = module_name(path, self.roots)
            if not name or not all(p.isidentifier() for p in name.split(".")):
                continue
            # a module under a python_path root wins over the same file seen from the repo root
            if name not in self.path_of or len(path) < len(self.path_of[name]):
                self.path_of[name] = path
            self.name_of[path] = name
            if is_pkg:
                self.pkg.add(name)
        self._mods: Dict[str, Optional[PyModule]] = {}
        self._edges: Dict[str, List[str]] = {}
        self._native_impls: Optional[Dict[str, List[str]]] = None
        self._exports: Dict[str, Optional[str]] = {}

    # -- modules -------------------------------------------------------------------------
    def has_module(self, name: str) -> bool:
        return name in self.path_of

    def module(self, name: str) -> Optional[PyModule]:
        if name not in self._mods:
            path = self.path_of.get(name)
            src = self.git.text(self.rev, path) if path else None
            self._mods[name] = None if src is None else PyModule.parse(name, path, src, is_pkg=name in self.pkg)
        return self._mods[name]

    def module_at(self, path: str) -> Optional[PyModule]:
        name = self.name_of.get(path)
        return self.module(name) if name else None

    # -- resolution ----------------------------------------------------------------------
    def resolve_name(self, mod: PyModule, name: str, seen: Optional[Set] = None) -> Optional[Entity]:
        seen = seen if seen is not None else set()
        if (mod.name, name) in seen:
            return None
        seen.add((mod.name, name))
        if name in mod.defs:
            return Entity("def", mod.name, name)
        if name in mod.imports and not [s for s in mod.assigns.get(name, []) if not isinstance(s, (ast.Import, ast.ImportFrom))]:
            return self.resolve_import(mod.imports[name], seen)
        if name in mod.assigns:
            alias = self._alias(mod, name, seen)
            return alias or Entity("var", mod.name, name)
        for star in mod.stars:
            sm = self.module(star)
            if sm is not None and (sm.all is None or name in sm.all) and not name.startswith("_"):
                ent = self.resolve_name(sm, name, seen)
                if ent is not None:
                    return ent
        if self.has_module(f"{mod.name}.{name}") and mod.is_pkg:
            return Entity("module", f"{mod.name}.{name}")
        return None

    def _alias(self, mod: PyModule, name: str, seen: Set) -> Optional[Entity]:
        """``F = torch.nn.functional`` / ``aten = torch.ops.aten``: a single plain alias."""
        stmts = mod.assigns[name]
        if len(stmts) == 1 and isinstance(stmts[0], ast.Assign) and len(stmts[0].targets) == 1 \
                and isinstance(stmts[0].targets[0], ast.Name):
            ch = attr_chain(stmts[0].value) if isinstance(stmts[0].value, (ast.Attribute, ast.Name)) else None
            if ch and ch[0] != name:
                ent = self.resolve_chain(mod, ch, None, seen)
                if ent is not None and ent.kind in ("module", "ext", "native"):
                    return ent
        return None

    def compiled_node(self, dotted: str) -> Optional[str]:
        """``pkg._C.fn`` where ``pkg`` is a package of this repository and ``pkg._C`` has no
        Python source (a compiled extension, ``PYBIND11_MODULE``): ``native:torch:pybind::fn``."""
        parts = dotted.split(".")
        for i in range(1, len(parts) - 1):
            if self.has_module(".".join(parts[:i])) and ".".join(parts[:i]) in self.pkg \
                    and not self.has_module(".".join(parts[:i + 1])):
                return f"native:torch:pybind::{parts[-1]}" if i + 2 == len(parts) else None
        return None

    def resolve_import(self, b: ImportBinding, seen: Optional[Set] = None) -> Optional[Entity]:
        if b.attr is None:
            return Entity("module", b.module) if self.has_module(b.module) else Entity("ext", b.module, b.module)
        sub = f"{b.module}.{b.attr}"
        if self.has_module(sub):
            return Entity("module", sub)
        m = self.module(b.module) if self.has_module(b.module) else None
        if m is not None and m.error is None:
            ent = self.resolve_name(m, b.attr, seen)
            if ent is None and m.is_pkg:  # `from pkg import _C`: a compiled extension module of the package
                return Entity("ext", sub, sub)
            return ent
        if m is None:
            return Entity("ext", sub, sub)
        return None

    def member(self, ent: Entity, attr: str, seen: Optional[Set] = None) -> Optional[Entity]:
        if ent.kind == "module":
            sub = f"{ent.module}.{attr}"
            if self.has_module(sub):
                return Entity("module", sub)
            m = self.module(ent.module)
            return self.resolve_name(m, attr, seen) if m is not None and m.error is None else None
        if ent.kind == "def":
            m = self.module(ent.module)
            d = m.defs.get(ent.key) if m else None
            if d is not None and d.kind == "class":
                return self.class_member(m, ent.key, attr)
            return None
        if ent.kind == "ext":
            dotted = f"{ent.key}.{attr}"
            nat = native_node(dotted)
            return Entity("native", "", nat) if nat else Entity("ext", dotted, dotted)
        return None

    def class_member(self, mod: PyModule, cls: str, attr: str, depth: int = 0) -> Optional[Entity]:
        """``cls.attr`` through the class's bases defined in this repository (MRO, depth-first)."""
        if f"{cls}.{attr}" in mod.defs:
            return Entity("def", mod.name, f"{cls}.{attr}")
        if depth > 20:
            return None
        for base in self.bases(mod, cls):
            if base.kind == "def":
                bm = self.module(base.module)
                if bm is not None:
                    found = self.class_member(bm, base.key, attr, depth + 1)
                    if found is not None:
                        return found
        return None

    def bases(self, mod: PyModule, cls: str) -> List[Entity]:
        node = mod.defs[cls].node
        out = []
        for b in getattr(node, "bases", []):
            ch = attr_chain(b)
            if ch:
                ent = self.resolve_chain(mod, ch, None)
                if ent is not None and ent.kind == "def":
                    out.append(ent)
        return out

    def resolve_chain(self, mod: PyModule, chain: Chain, cls: Optional[str], seen: Optional[Set] = None) -> Optional[Entity]:
        head = chain[0]
        if head in ("self", "cls") and cls is not None and len(chain) > 1:
            found = self.class_member(mod, cls, chain[1])
            return found if found is not None else Entity("def", mod.name, cls)
        if head == "super()" and cls is not None and len(chain) > 1:
            for base in self.bases(mod, cls):
                bm = self.module(base.module)
                if bm is not None:
                    found = self.class_member(bm, base.key, chain[1])
                    if found is not None:
                        return found
            return None
        ent = self.resolve_name(mod, head, set(seen) if seen else None)
        if ent is None:
            nat = native_node(".".join(chain))
            return Entity("native", "", nat) if nat else None
        for attr in chain[1:]:
            nxt = self.member(ent, attr)
            if nxt is None:
                break
            ent = nxt
            if ent.kind == "native":
                break
        return ent

    def split_dotted(self, dotted: str) -> Tuple[str, List[str]]:
        """``pkg.mod:Qual.name`` / ``pkg.mod.Qual.name`` -> (longest module in the index, rest)."""
        if ":" in dotted:
            modname, qual = dotted.split(":", 1)
            return modname, qual.split(".")
        parts_all = dotted.split(".")
        for i in range(len(parts_all), 0, -1):
            if self.has_module(".".join(parts_all[:i])):
                return ".".join(parts_all[:i]), parts_all[i:]
        return "", parts_all

    def entry(self, dotted: str) -> Optional[str]:
        """Graph node where calling catalogue callable ``dotted`` starts; a re-export
        (``from .ops import gelu`` in ``pkg/__init__``) is kept as its own first hop."""
        modname, parts = self.split_dotted(dotted)
        if modname and len(parts) == 1:
            m = self.module(modname)
            if m is not None and not m.error and parts[0] in m.imports and parts[0] not in m.defs:
                return f"{modname}:{parts[0]}"
        ent = self.resolve_dotted(dotted)
        if (ent is None or ent.kind == "ext") and "." in dotted.split(":")[-1]:
            # ``LogSigmoid.apply`` (an autograd.Function), a method a class inherits from the
            # framework: the class defined here is where the operator's code lives
            owner = self.resolve_dotted(dotted.rsplit(".", 1)[0])
            if owner is not None and owner.kind == "def" and \
                    self.module(owner.module).defs[owner.key].kind == "class":  # type: ignore[union-attr]
                return owner.node(self)
            return None
        if ent is None or ent.kind == "ext":
            return None
        owner = self.resolve_dotted(dotted.rsplit(".", 1)[0]) if "." in dotted.split(":")[-1] else None
        if ent.kind == "def" and owner is not None and owner.kind == "def" and owner.module is not None:
            om = self.module(owner.module)
            if om is not None and not om.error and om.defs.get(owner.key) is not None and \
                    om.defs[owner.key].kind == "class" and ent.key != f"{owner.key}.{dotted.rsplit('.', 1)[1]}":
                # a method the class inherits (geoopt's SPD.norm before 71c7f63: Manifold.norm): its
                # self.inner is the class's own inner, not the base's; the class as a whole
                return owner.node(self)
        return ent.node(self)

    def resolve_dotted(self, dotted: str) -> Optional[Entity]:
        """A catalogue callable (``pkg.mod:Qual.name`` or ``pkg.mod.name``) -> its definition."""
        if ":" in dotted:
            modname, qual = dotted.split(":", 1)
            parts = qual.split(".")
        else:
            parts_all = dotted.split(".")
            modname, parts = "", parts_all
            for i in range(len(parts_all), 0, -1):
                if self.has_module(".".join(parts_all[:i])):
                    modname, parts = ".".join(parts_all[:i]), parts_all[i:]
                    break
        if not modname or not self.has_module(modname):
            exp = self.export(dotted.replace(":", "."))
            return exp
        ent: Optional[Entity] = Entity("module", modname)
        for p in parts:
            ent = self.member(ent, p) if ent is not None else None
        return ent

    # -- exports (tf_export / keras_export) ------------------------------------------------
    def export(self, dotted: str) -> Optional[Entity]:
        """``tensorflow.nn.relu`` -> the definition decorated ``@tf_export("nn.relu")``."""
        if dotted in self._exports:
            node = self._exports[dotted]
            return _entity_of(node, self) if node else None
        names = _export_names(dotted)
        found: Optional[str] = None
        if names:
            files = self.git.grep_files(self.rev, [f'"{n}"' for n in names], ["*.py"], word=False)
            for path in files:
                m = self.module_at(path)
                if m is None or m.error:
                    continue
                for qual, d in m.defs.items():
                    if d.kind == "method":
                        continue
                    for dec in d.node.decorator_list:
                        if _decorator_name(dec) in EXPORT_DECORATORS and names & set(_string_args(dec)):
                            found = f"{m.name}:{qual}"
                            break
                    if found:
                        break
                if found:
                    break
        self._exports[dotted] = found
        return _entity_of(found, self) if found else None

    # -- natives implemented in Python (decompositions, custom ops) ----------------------
    def native_impls(self) -> Dict[str, List[str]]:
        """``native:torch:gelu`` -> symbols that implement it (``@register_decomposition(aten.gelu)``,
        ``@torch.library.custom_op("ns::op")``, ``@torch.library.register_kernel("ns::op", ...)``)."""
        if self._native_impls is not None:
            return self._native_impls
        out: Dict[str, List[str]] = {}
        files = self.git.grep_files(self.rev, NATIVE_DECORATORS, ["*.py"], word=True)
        for path in files:
            m = self.module_at(path)
            if m is None or m.error:
                continue
            for qual, d in m.defs.items():
                for dec in d.node.decorator_list:
                    if _decorator_name(dec) not in NATIVE_DECORATORS or not isinstance(dec, ast.Call):
                        continue
                    for nat in self._decorator_natives(m, dec):
                        out.setdefault(nat, []).append(f"{m.name}:{qual}")
        self._native_impls = out
        return out

    def _decorator_natives(self, m: PyModule, dec: ast.Call) -> List[str]:
        found = []
        for arg in [*dec.args, *(k.value for k in dec.keywords)]:
            for node in ast.walk(arg):
                if isinstance(node, ast.Attribute):
                    ch = attr_chain(node)
                    if ch:
                        ent = self.resolve_chain(m, ch, None)
                        nat = ent.node(self) if ent is not None and ent.kind in ("native", "ext") else native_node(".".join(ch))
                        if nat and nat.startswith("native:"):
                            found.append(nat)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _CUSTOM_OP.match(node.value):
                    ns, op = node.value.split("::", 1)
                    op = op.split(".")[0]
                    found.append(f"native:torch:{op}" if ns == "aten" else f"native:torch:{ns}::{op}")
        return list(dict.fromkeys(found))

    # -- graph ---------------------------------------------------------------------------
    def edges(self, node: str) -> List[str]:
        if node in self._edges:
            return self._edges[node]
        out: List[str] = []
        if not node.startswith("native:"):
            modname, key = node.split(":", 1)
            m = self.module(modname)
            if m is not None and m.error is None:
                out = self._edges_of(m, key)
        out = [n for n in dict.fromkeys(out) if n != node]
        self._edges[node] = out
        return out

    def _edges_of(self, m: PyModule, key: str) -> List[str]:
        out: List[str] = []
        if key.endswith(".*"):
            cls = key[:-2]
            if cls not in m.defs:
                return out
            out.append(f"{m.name}:{cls}")
            for q, d in m.defs.items():
                if d.cls == cls:
                    out.append(f"{m.name}:{q}.*" if d.kind == "class" else f"{m.name}:{q}")
            for b in self.bases(m, cls):
                n = b.node(self)
                if n:
                    out.append(n)
            # what the module sets on the class at its top level (``Cls.forward = fast_forward``):
            # the class runs it, though the module's own statements no longer carry what they
            # only name (below)
            for st in m.statements(MODULE):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(
                    st, (ast.AugAssign, ast.AnnAssign)) else []
                if any(isinstance(t, ast.Attribute) and (attr_chain(t) or ())[:1] == (cls,) for t in targets) \
                        and getattr(st, "value", None) is not None:
                    for ch in sorted(references([st.value])):
                        ent = self.resolve_chain(m, ch, None)
                        n = ent.node(self) if ent is not None else None
                        if n:
                            out.append(n)
            return out
        d = m.defs.get(key)
        cls_ctx = None
        if d is not None:
            cls_ctx = d.qual if d.kind == "class" else d.cls
        pieces = m.statements(key)
        if d is not None and d.kind == "method" and d.cls and d.cls in m.defs:
            # what the class statement runs around the method: its decorators and metaclass (the
            # members it reads are self.X / cls.X chains, resolved below through its bases; not
            # the bases as a whole: a method reaches the base methods it calls, not all of them)
            cnode = m.defs[d.cls].node
            pieces = list(pieces) + [*cnode.decorator_list, *(k.value for k in cnode.keywords)]
        chains = references(pieces, skip_nested_defs=d is not None and d.kind == "class")
        called = _called_chains(pieces) if key == MODULE else None
        for ch in sorted(chains):
            first = ch[0]
            if first in m.assigns and first not in m.defs and first != key:
                out.append(f"{m.name}:{first}")  # the binding itself (import / assignment line)
            ent = self.resolve_chain(m, ch, cls_ctx)
            if ent is not None and called is not None and ent.kind == "def" and not _is_called(ch, called):
                # a top-level statement that names a function or class without calling it
                # (``Cls.alias = staticmethod(fn)``, ``register(Cls)``) does the same whatever
                # their bodies: every definition of the module depends on its top-level
                # statements, so such an edge made a changed method reach every operator of
                # the file (lucidrains/hyper-connections: ten operators of one file selected
                # for a change in one class, and the run's budget spent on eight unchanged helpers)
                continue
            if ent is not None:
                n = ent.node(self)
                if n:
                    out.append(n)
        if key in m.imports:
            ent = self.resolve_import(m.imports[key])
            n = ent.node(self) if ent is not None else None
            if n:
                out.append(n)
        if key != MODULE:
            out.append(f"{m.name}:{MODULE}")
        return out


def _called_chains(pieces) -> Set[Chain]:
    """The dotted names called anywhere in ``pieces`` (``f()``, ``Cls.setup()``)."""
    out: Set[Chain] = set()
    for piece in pieces:
        for n in ast.walk(piece):
            if isinstance(n, ast.Call):
                ch = attr_chain(n.func)
                if ch:
                    out.add(ch)
    return out


def _is_called(ch: Chain, called: Set[Chain]) -> bool:
    """Is ``ch`` called, or a member of it (``Cls`` in ``Cls.setup()``)?"""
    return any(c[:len(ch)] == ch for c in called)


def _entity_of(node: str, index: PyIndex) -> Optional[Entity]:
    modname, key = node.split(":", 1)
    return Entity("def", modname, key)


def _export_names(dotted: str) -> Set[str]:
    parts = dotted.split(".")
    out = set()
    if parts[0] in ("tensorflow", "tf") and len(parts) > 1:
        rest = parts[1:]
        if rest[0] == "compat" and len(rest) > 2 and rest[1] in ("v1", "v2"):
            rest = rest[2:]
        out.add(".".join(rest))
        if rest[0] == "keras":
            out.add(".".join(rest))
    elif parts[0] == "keras":
        out.add(dotted)
    return out


def _decorator_name(dec: ast.expr) -> str:
    target = dec.func if isinstance(dec, ast.Call) else dec
    ch = attr_chain(target)
    return ch[-1] if ch else ""


def _string_args(dec: ast.expr) -> List[str]:
    if not isinstance(dec, ast.Call):
        return []
    out = []
    for a in [*dec.args, *(k.value for k in dec.keywords)]:
        for n in ast.walk(a):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                out.append(n.value)
    return out
