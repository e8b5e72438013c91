"""One Python module, read with ``ast``: its definitions (functions, classes, methods), the names
its top-level statements bind, which symbol each line belongs to, the references each symbol
makes, and a *normalised* fingerprint per symbol (docstrings, bare strings, annotations, type
comments and formatting removed) so that a docstring- or format-only edit compares equal.

Symbol keys inside a module: a definition's qualified name (``f``, ``C``, ``C.m``, ``C.Inner.m``;
anything nested in a function belongs to that function), a top-level bound name (``EPS``, an
imported ``np``), or ``<module>`` for top-level statements that bind nothing (and comments or
blank lines outside every statement)."""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

MODULE = "<module>"
MAIN = "<main>"  # `if __name__ == "__main__":` blocks: never run on import

Chain = Tuple[str, ...]  # a dotted reference: ("np", "exp") for np.exp


@dataclass
class PyDef:
    qual: str  # "f", "C", "C.m"
    kind: str  # function | method | class
    node: ast.AST
    start: int  # first decorator line
    end: int
    cls: Optional[str] = None  # enclosing class for methods / nested classes


@dataclass
class ImportBinding:
    module: str  # absolute module name
    attr: Optional[str]  # None: the name is bound to the module itself
    star: bool = False


@dataclass
class PyModule:
    name: str
    path: str
    is_pkg: bool
    source: str
    error: Optional[str] = None
    defs: Dict[str, PyDef] = field(default_factory=dict)
    assigns: Dict[str, List[ast.stmt]] = field(default_factory=dict)  # top-level name -> binding stmts
    imports: Dict[str, ImportBinding] = field(default_factory=dict)
    stars: List[str] = field(default_factory=list)  # modules imported with *
    other: List[ast.stmt] = field(default_factory=list)  # top-level stmts binding no name
    main: List[ast.stmt] = field(default_factory=list)
    all: Optional[List[str]] = None
    spans: List[Tuple[int, int, Tuple[str, ...]]] = field(default_factory=list)  # (start, end, keys)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def parse(cls, name: str, path: str, source: str, is_pkg: bool = False) -> "PyModule":
        mod = cls(name=name, path=path, is_pkg=is_pkg, source=source)
        try:
            tree = ast.parse(source, filename=path)
        except (SyntaxError, ValueError) as exc:
            mod.error = f"{type(exc).__name__}: {getattr(exc, 'msg', exc)} (line {getattr(exc, 'lineno', '?')})"
            return mod
        mod._walk_top(tree.body)
        return mod

    def _walk_top(self, body: Sequence[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._add_def(stmt, "")
            elif _is_main_guard(stmt):
                self.main.append(stmt)
                self.spans.append((stmt.lineno, stmt.end_lineno or stmt.lineno, (MAIN,)))
            elif isinstance(stmt, (ast.If, ast.Try, ast.With)) and _has_defs_or_bindings(stmt):
                # conditional definitions (try: import x / except ImportError: ...): the header
                # belongs to <module>, the bodies are top-level statements of their own
                self.other.append(_header_only(stmt))
                hdr_end = _header_end(stmt)
                self.spans.append((stmt.lineno, hdr_end, (MODULE,)))
                for sub in _bodies(stmt):
                    self._walk_top(sub)
            else:
                names = _bound_names(stmt)
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    self._add_import(stmt)
                if names:
                    for n in names:
                        self.assigns.setdefault(n, []).append(stmt)
                    if "__all__" in names:
                        self.all = _literal_names(stmt)
                else:
                    self.other.append(stmt)
                self.spans.append((stmt.lineno, stmt.end_lineno or stmt.lineno, tuple(names) or (MODULE,)))

    def _add_def(self, node, prefix: str, cls: Optional[str] = None) -> None:
        qual = f"{prefix}{node.name}"
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        kind = "class" if isinstance(node, ast.ClassDef) else ("method" if cls else "function")
        self.defs[qual] = PyDef(qual=qual, kind=kind, node=node, start=start, end=node.end_lineno or node.lineno, cls=cls)
        if not prefix:
            self.assigns.setdefault(node.name, [])
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self._add_def(stmt, qual + ".", qual)

    def _add_import(self, stmt) -> None:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    self.imports[a.asname] = ImportBinding(a.name, None)
                else:  # `import a.b.c` binds `a`
                    top = a.name.split(".")[0]
                    self.imports.setdefault(top, ImportBinding(top, None))
            return
        base = resolve_relative(self.name, self.is_pkg, stmt.module, stmt.level)
        if base is None:
            return
        for a in stmt.names:
            if a.name == "*":
                self.stars.append(base)
            else:
                self.imports[a.asname or a.name] = ImportBinding(base, a.name)

    # -- queries -------------------------------------------------------------------------
    def keys(self) -> Set[str]:
        return set(self.defs) | set(self.assigns) | {MODULE} | ({MAIN} if self.main else set())

    def symbols_at(self, lines: Iterable[int]) -> Dict[str, int]:
        """Symbol key -> first of ``lines`` that falls in it (innermost definition wins)."""
        out: Dict[str, int] = {}
        defs = sorted(self.defs.values(), key=lambda d: (d.start, -d.end))
        for ln in sorted(set(lines)):
            key = None
            for d in defs:  # definitions nest, so the last containing one is the innermost
                if d.start <= ln <= d.end:
                    key = d.qual
            if key is None:
                for s, e, keys in self.spans:
                    if s <= ln <= e:
                        for k in keys:
                            out.setdefault(k, ln)
                        break
                else:
                    out.setdefault(MODULE, ln)  # comment / blank line outside every statement
                continue
            out.setdefault(key, ln)
        return out

    def line_of(self, key: str) -> int:
        if key in self.defs:
            return self.defs[key].node.lineno
        for s, _e, keys in self.spans:
            if key in keys:
                return s
        return 1

    def kind_of(self, key: str) -> str:
        if key in self.defs:
            return self.defs[key].kind
        if key in (MODULE, MAIN):
            return "module"
        if key in self.imports and not [s for s in self.assigns.get(key, []) if not isinstance(s, (ast.Import, ast.ImportFrom))]:
            return "import"
        return "variable"

    def methods_of(self, cls: str) -> List[str]:
        return [q for q, d in self.defs.items() if d.cls == cls]

    def statements(self, key: str) -> List[ast.AST]:
        """The AST pieces that make up symbol ``key`` (for fingerprints and references)."""
        out: List[ast.AST] = []
        if key in self.defs:
            out.append(self.defs[key].node)
        if key in self.assigns and "." not in key:
            out.extend(self.assigns[key])
        if key == MODULE:
            out.extend(self.other)
        if key == MAIN:
            out.extend(self.main)
        return out

    def decorator_calls(self, key: str) -> List[ast.expr]:
        d = self.defs.get(key)
        return list(d.node.decorator_list) if d else []


# -- normalisation -----------------------------------------------------------------------
class _Normaliser(ast.NodeTransformer):
    """Drop what cannot change behaviour: docstrings and bare string statements, annotations,
    type comments; nested definitions inside classes (they are symbols of their own)."""

    def __init__(self, rename: Optional[Callable[[Chain], Optional[str]]] = None, strip_class_defs: bool = False):
        self.rename = rename
        self.strip_class_defs = strip_class_defs

    def _body(self, body: List[ast.stmt]) -> List[ast.stmt]:
        out = []
        for s in body:
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
                continue
            out.append(s)
        return out or [ast.Pass()]

    def generic_visit(self, node):
        for fld in ("body", "orelse", "finalbody"):
            if isinstance(getattr(node, fld, None), list) and getattr(node, fld) and isinstance(getattr(node, fld)[0], ast.stmt):
                setattr(node, fld, self._body(getattr(node, fld)))
        if hasattr(node, "type_comment"):
            node.type_comment = None
        return super().generic_visit(node)

    def visit_arg(self, node):
        node.annotation = None
        node.type_comment = None
        return node

    def _func(self, node):
        node.returns = None
        if hasattr(node, "type_params"):
            node.type_params = []
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _func

    def visit_ClassDef(self, node):
        if self.strip_class_defs:
            node.body = [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        return self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is None:  # a bare annotation declares a name (dataclass field): keep the name
            return ast.Expr(value=ast.Name(id=_target_text(node.target), ctx=ast.Load()))
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value, lineno=0))

    def visit_Name(self, node):
        if self.rename is not None and isinstance(node.ctx, ast.Load):
            tok = self.rename((node.id,))
            if tok is not None:
                return ast.Name(id=tok, ctx=ast.Load())
        return node

    def visit_Attribute(self, node):
        if self.rename is not None and isinstance(node.ctx, ast.Load):
            chain = attr_chain(node)
            if chain is not None:
                tok = self.rename(chain)
                if tok is not None:
                    return ast.Name(id=tok, ctx=ast.Load())
        return self.generic_visit(node)


def fingerprint(pieces: Sequence[ast.AST], rename: Optional[Callable[[Chain], Optional[str]]] = None,
                drop_name: bool = False) -> str:
    """Normalised dump of ``pieces``; ``drop_name`` ignores a definition's own name (renames)."""
    parts = []
    for p in pieces:
        node = copy.deepcopy(p)
        is_class = isinstance(node, ast.ClassDef)
        if drop_name and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.name = "_"
        elif drop_name and isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        n.id = "_"
        if isinstance(node, ast.Module):
            node = ast.Module(body=node.body, type_ignores=[])
        node = _Normaliser(rename, strip_class_defs=is_class).visit(node)
        parts.append(ast.dump(node, annotate_fields=False, include_attributes=False))
    return "\n".join(parts)


# -- references --------------------------------------------------------------------------
def attr_chain(node: ast.AST) -> Optional[Chain]:
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        parts.append("super()")
        return tuple(reversed(parts))
    return None


def references(pieces: Sequence[ast.AST], skip_nested_defs: bool = False) -> Set[Chain]:
    """Free dotted references made by ``pieces`` (names bound locally in a function are skipped)."""
    out: Set[Chain] = set()
    for piece in pieces:
        if skip_nested_defs and isinstance(piece, ast.ClassDef):
            roots: List[ast.AST] = [*piece.decorator_list, *piece.bases, *(k.value for k in piece.keywords)]
            roots += [s for s in piece.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            local: Set[str] = set()
        elif isinstance(piece, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            roots = [piece]
            local = _local_names(piece)
            first = [*piece.args.posonlyargs, *piece.args.args][:1]
            if first and first[0].arg in ("self", "cls"):
                # a method's ``self.inner(x)``: resolved in the class's context (PyIndex.resolve_chain)
                local.discard(first[0].arg)
        else:
            roots = [piece]
            local = set()
        for root in roots:
            for node in ast.walk(root):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    ch = attr_chain(node)
                    if ch and ch[0] not in local:
                        out.add(ch)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
                    out.add((node.id,))
    # keep only maximal chains' prefixes implicitly: resolution walks each chain as far as it goes
    return out


def _local_names(fn) -> Set[str]:
    local: Set[str] = set()
    glob: Set[str] = set()
    a = fn.args
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]:
        local.add(arg.arg)
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                glob.update(node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                local.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                local.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for al in node.names:
                    local.add((al.asname or al.name).split(".")[0])
            elif isinstance(node, ast.arg):
                local.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                local.add(node.name)
    return local - glob


# -- helpers -----------------------------------------------------------------------------
def resolve_relative(modname: str, is_pkg: bool, target: Optional[str], level: int) -> Optional[str]:
    if not level:
        return target
    parts = modname.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if level - 1 > len(parts):
        return None
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    if target:
        return f"{base}.{target}" if base else target
    return base or None


def _bound_names(stmt: ast.stmt) -> List[str]:
    names: List[str] = []
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        for a in stmt.names:
            if a.name != "*":
                names.append((a.asname or a.name).split(".")[0] if isinstance(stmt, ast.Import) else (a.asname or a.name))
        return names
    targets: List[ast.AST] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.append(n.id)
    return list(dict.fromkeys(names))


def _literal_names(stmt: ast.stmt) -> Optional[List[str]]:
    value = getattr(stmt, "value", None)
    if isinstance(value, (ast.List, ast.Tuple)):
        return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def _is_main_guard(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    t = stmt.test
    sides = [t.left, *t.comparators]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _bodies(stmt: ast.stmt) -> List[List[ast.stmt]]:
    if isinstance(stmt, ast.If):
        return [stmt.body, stmt.orelse]
    if isinstance(stmt, ast.Try):
        return [stmt.body, *[h.body for h in stmt.handlers], stmt.orelse, stmt.finalbody]
    if isinstance(stmt, ast.With):
        return [stmt.body]
    return []


def _has_defs_or_bindings(stmt: ast.stmt) -> bool:
    for body in _bodies(stmt):
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
                return True
            if _bound_names(s) or (isinstance(s, (ast.If, ast.Try, ast.With)) and _has_defs_or_bindings(s)):
                return True
    return False


def _header_only(stmt: ast.stmt) -> ast.stmt:
    """The compound statement with its bodies emptied (its test / handlers' types stay)."""
    node = copy.copy(stmt)
    if isinstance(node, ast.If):
        node.body, node.orelse = [ast.Pass()], []
    elif isinstance(node, ast.Try):
        node.body, node.orelse, node.finalbody = [ast.Pass()], [], []
        node.handlers = [ast.ExceptHandler(type=h.type, name=h.name, body=[ast.Pass()]) for h in stmt.handlers]
    elif isinstance(node, ast.With):
        node.body = [ast.Pass()]
    return node


def _header_end(stmt: ast.stmt) -> int:
    first = _bodies(stmt)[0]
    return max(stmt.lineno, (first[0].lineno - 1) if first else stmt.lineno)


def _target_text(t: ast.AST) -> str:
    try:
        return ast.unparse(t)
    except Exception:  # pragma: no cover
        return "_"
