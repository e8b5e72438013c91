"""C, C++ and CUDA sources read with tree-sitter (``tree-sitter-cpp``, a maintained grammar that
tolerates unknown macros, ``__global__`` and ``<<<...>>>`` launches): functions and methods with
their extents, classes, top-level macros / variables / statements, and the operator
registrations PyTorch and TensorFlow write in C++:

* PyTorch: ``TORCH_IMPL_FUNC(kernel)``, ``TORCH_META_FUNC(op)``, ``REGISTER_*DISPATCH(stub, &fn)``,
  ``TORCH_LIBRARY``/``TORCH_LIBRARY_FRAGMENT`` blocks (``m.def``) and ``TORCH_LIBRARY_IMPL``
  blocks (``m.impl("op", fn)``);
* TensorFlow: ``REGISTER_OP("Name")``, ``REGISTER_KERNEL_BUILDER(Name("Name")..., Kernel<...>)``
  and the ``REGISTERn(Kernel, DEV, "Name", functor, types...)`` family, read after joining
  ``\\``-continued macro lines, so registrations inside ``#define`` bodies count.

Changed lines map to the innermost function, else class, else top-level item; a symbol whose
token stream (comments dropped) is the same on both sides is ``unchanged``."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .git import Git
from .model import ChangedFile, ChangedSymbol

CPP_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl", ".ipp",
                ".tpp")
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inl", ".ipp", ".tpp")
CPP_PATHSPECS = tuple(f"*{s}" for s in CPP_SUFFIXES)
_IDENT_TYPES = {"identifier", "field_identifier", "type_identifier", "namespace_identifier"}
_TORCH_LIB = ("TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_IMPL", "TORCH_LIBRARY_IMPL_ONLY")
_NAME_MACROS = ("TORCH_IMPL_FUNC", "TORCH_META_FUNC", "TORCH_META_FUNC2", "TORCH_PRECOMPUTE_META_FUNC",
                "TORCH_PRECOMPUTE_META_FUNC2")
_PRIMITIVE = {"float", "double", "int", "bool", "half", "char", "long", "short", "unsigned", "signed", "void",
              "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bfloat16", "complex64",
              "complex128", "Eigen", "std", "T", "type", "TYPE", "Type", "float16", "tstring", "qint8", "quint8",
              "qint32", "Name", "Device", "TypeConstraint", "HostMemory", "Label", "Priority", "AttrConstraint",
              "DEVICE_CPU", "DEVICE_GPU", "DEVICE_DEFAULT", "int32_t", "int64_t", "size_t"}

_parser = None


def is_cpp(path: Optional[str]) -> bool:
    return bool(path) and path.lower().endswith(CPP_SUFFIXES)  # type: ignore[union-attr]


def is_header(path: str) -> bool:
    return path.lower().endswith(HEADER_SUFFIXES)


def _get_parser():
    global _parser
    if _parser is None:
        import tree_sitter_cpp
        from tree_sitter import Language, Parser

        _parser = Parser(Language(tree_sitter_cpp.language()))
    return _parser


def _end_line(node) -> int:
    row, col = node.end_point
    return row + 1 if col > 0 or row == node.start_point[0] else row


@dataclass
class Registration:
    kind: str  # dispatch | tf_op | tf_kernel | torch_def | torch_impl | pybind_def
    start: int
    end: int
    ops: List[str] = field(default_factory=list)  # op names it registers (TF CamelCase; "ns::op" for torch)
    names: List[str] = field(default_factory=list)  # identifiers it binds to those ops (kernels, stubs)
    stub: Optional[str] = None  # for dispatch: the stub; names = [impl]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "start": self.start, "end": self.end, "ops": self.ops, "names": self.names,
                "stub": self.stub}


@dataclass
class CppSymbol:
    key: str  # unique within the file: "qual(params)" for functions, "class X", "macro X", ...
    kind: str  # function | method | class | macro | variable | statement | include | file
    name: str  # what users write: function name, class name (for methods too), macro name
    start: int
    end: int
    node: object = None
    internal: bool = False  # static / anonymous namespace: visible only in this file (and includers)
    macro: Optional[str] = None  # TORCH_IMPL_FUNC / TORCH_LIBRARY / ...
    macro_args: Tuple[str, ...] = ()
    cls: Optional[str] = None
    idents: Set[str] = field(default_factory=set)
    label: str = ""  # how reports show it
    _fp: Optional[str] = None

    def fingerprint(self) -> str:
        if self._fp is None:
            self._fp = _tokens(self.node) if self.node is not None else ""
        return self._fp


def _tokens(node) -> str:
    out: List[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "comment":
            continue
        if n.type == "preproc_arg":  # a macro body is one raw-text token: normalise it
            body = re.sub(r"\\\r?\n", " ", n.text.decode("utf-8", "replace"))
            body = re.sub(r"/\*.*?\*/|//[^\n]*", " ", body, flags=re.S)
            out.append(" ".join(body.split()))
        elif n.child_count == 0:
            out.append(n.text.decode("utf-8", "replace"))
        else:
            stack.extend(reversed(n.children))
    return " ".join(out)


def _idents(node) -> Set[str]:
    out: Set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in _IDENT_TYPES:
            if n.text:
                out.add(n.text.decode("utf-8", "replace"))
        elif n.child_count:
            stack.extend(n.children)
    return out


def _short(node, limit: int = 60) -> str:
    text = " ".join(node.text.decode("utf-8", "replace").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _macro_idents(node) -> Set[str]:
    """Identifiers of a ``#define`` (tree-sitter keeps its body as raw text): comments and string
    literals removed, ``\\``-continuations joined, macro parameters left out."""
    text = node.text.decode("utf-8", "replace")
    text = re.sub(r"\\\r?\n", " ", text)
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    params = node.child_by_field_name("parameters")
    skip = set(re.findall(r"[A-Za-z_]\w*", params.text.decode())) if params is not None else set()
    body = text.split(")", 1)[1] if params is not None and ")" in text else text
    return {w for w in re.findall(r"[A-Za-z_]\w*", body) if w not in skip and w != "define"}


def _strip_templates(s: str) -> str:
    prev = None
    while prev != s:
        prev = s
        s = re.sub(r"<[^<>]*>", "", s)
    return s


class CppFile:
    def __init__(self, path: str, src: bytes):
        self.path = path
        self.src = src
        self.symbols: List[CppSymbol] = []
        self.includes: List[Tuple[int, str]] = []
        self.macros: Dict[str, CppSymbol] = {}
        self.registrations: List[Registration] = []
        self.error: Optional[str] = None
        try:
            self.tree = _get_parser().parse(src)
        except Exception as exc:  # pragma: no cover - tree-sitter never raises on bad input
            self.tree = None
            self.error = str(exc)
            return
        self._walk(self.tree.root_node, [], False, None)
        seen: Dict[str, int] = {}
        for sym in self.symbols:  # keys are content-based (stable across sides); make them unique
            n = seen.get(sym.key, 0)
            seen[sym.key] = n + 1
            if n:
                sym.key = f"{sym.key} #{n + 1}"
            if not sym.label:
                sym.label = sym.key
        self.framework = self._framework()
        self._find_registrations()

    # -- structure -----------------------------------------------------------------------
    def _walk(self, node, scope: List[str], anon: bool, cls: Optional[str]) -> None:
        for ch in node.children:
            t = ch.type
            if t == "namespace_definition":
                name_node = ch.child_by_field_name("name")
                body = ch.child_by_field_name("body")
                name = name_node.text.decode() if name_node is not None else ""
                if body is not None:
                    self._walk(body, scope + ([name] if name else []), anon or not name, None)
            elif t == "linkage_specification":  # extern "C" { ... } / extern "C" void f() {...}
                body = ch.child_by_field_name("body")
                if body is not None and body.type == "declaration_list":
                    self._walk(body, scope, anon, cls)
                elif body is not None:
                    self._walk_one(body, scope, anon, cls)
            elif not ch.is_named or t in ("comment", "identifier", "preproc_defined", "string_literal"):
                continue
            elif t in ("preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef", "ERROR",
                       "declaration_list"):
                self._walk(ch, scope, anon, cls)
            elif t == "template_declaration":
                self._walk_template(ch, scope, anon, cls)
            else:
                self._walk_one(ch, scope, anon, cls)

    def _walk_template(self, node, scope, anon, cls) -> None:
        for ch in node.children:
            if ch.type in ("function_definition", "class_specifier", "struct_specifier", "declaration",
                           "template_declaration", "alias_declaration"):
                before = len(self.symbols)
                if ch.type == "template_declaration":
                    self._walk_template(ch, scope, anon, cls)
                else:
                    self._walk_one(ch, scope, anon, cls)
                for s in self.symbols[before:]:  # the template header belongs to the definition
                    if s.start == ch.start_point[0] + 1:
                        s.start = node.start_point[0] + 1
                        s.node = node if s.node is ch else s.node

    def _walk_one(self, ch, scope: List[str], anon: bool, cls: Optional[str]) -> None:
        t = ch.type
        start, end = ch.start_point[0] + 1, _end_line(ch)
        if t == "function_definition":
            self._add_function(ch, scope, anon, cls)
        elif t in ("class_specifier", "struct_specifier", "union_specifier"):
            self._add_class(ch, scope, anon, cls, ch)
        elif t in ("declaration", "field_declaration") and any(
                c.type in ("class_specifier", "struct_specifier") and c.child_by_field_name("body") is not None
                for c in ch.children):
            for c in ch.children:
                if c.type in ("class_specifier", "struct_specifier"):
                    self._add_class(c, scope, anon, cls, ch)
        elif t in ("preproc_def", "preproc_function_def"):
            name = ch.child_by_field_name("name").text.decode()
            sym = CppSymbol(key=f"macro {name}", kind="macro", name=name, start=start, end=end, node=ch, label=f"#define {name}",
                            idents=_macro_idents(ch) - {name})
            self.symbols.append(sym)
            self.macros[name] = sym
        elif t == "preproc_include":
            p = ch.child_by_field_name("path")
            if p is not None:
                self.includes.append((start, p.text.decode().strip('<>"')))
            self.symbols.append(CppSymbol(key=f"include {_short(ch)}", kind="include", name="", start=start, end=end,
                                          node=ch, label=_short(ch)))
        elif t in ("declaration", "alias_declaration", "type_definition", "enum_specifier", "using_declaration",
                   "field_declaration", "static_assert_declaration"):
            names = self._declared_names(ch)
            internal = anon or any(c.type == "storage_class_specifier" and c.text == b"static" for c in ch.children)
            name = names[0] if names else ""
            key = "::".join(scope + ([cls] if cls else []) + [name]) if name else f"decl {_short(ch, 200)}"
            has_init = any(c.type == "init_declarator" for c in ch.children) or t in (
                "alias_declaration", "type_definition", "enum_specifier")
            self.symbols.append(CppSymbol(key=key, kind="variable" if has_init or not names else "declaration",
                                          name=name, start=start, end=end, node=ch, internal=internal, cls=cls,
                                          idents=_idents(ch) - set(names)))
        elif t == "expression_statement":
            call = ch.named_children[0] if ch.named_children else None
            name = ""
            fn = call.child_by_field_name("function") if call is not None and call.type == "call_expression" else None
            if fn is not None and fn.type == "identifier":
                name = fn.text.decode()
            self.symbols.append(CppSymbol(key=f"stmt {_short(ch, 200)}", kind="statement", name=name, start=start,
                                          end=end, node=ch, idents=_idents(ch), label=_short(ch)))
        elif t in ("comment", ";", "{", "}", "#endif", "#else", "preproc_call", "access_specifier", "namespace",
                   "identifier", "namespace_identifier", "string_literal", "extern"):
            if t == "preproc_call":
                self.symbols.append(CppSymbol(key=f"pp {_short(ch, 200)}", kind="statement", name="", start=start,
                                              end=end, node=ch, idents=_idents(ch), label=_short(ch)))
        else:
            self.symbols.append(CppSymbol(key=f"{t} {_short(ch, 200)}", kind="statement", name="", start=start,
                                          end=end, node=ch, idents=_idents(ch), label=_short(ch)))

    def _declared_names(self, decl) -> List[str]:
        out = []
        for c in decl.children:
            if c.type in ("init_declarator", "identifier", "type_identifier", "function_declarator",
                          "pointer_declarator", "reference_declarator", "array_declarator", "field_identifier"):
                n = c
                while n is not None and n.type not in ("identifier", "type_identifier", "field_identifier",
                                                        "qualified_identifier"):
                    n = n.child_by_field_name("declarator") or (n.named_children[0] if n.named_children else None)
                if n is not None:
                    out.append(n.text.decode().split("::")[-1])
            elif c.type == "enumerator_list":
                out.extend(e.child_by_field_name("name").text.decode() for e in c.named_children
                           if e.type == "enumerator" and e.child_by_field_name("name") is not None)
        if decl.type == "enum_specifier":
            n = decl.child_by_field_name("name")
            if n is not None:
                out.insert(0, n.text.decode())
        return out

    def _add_class(self, node, scope, anon, outer: Optional[str], span_node) -> None:
        name_node = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if body is None:
            return
        name = _strip_templates(name_node.text.decode()).split("::")[-1] if name_node is not None else ""
        qual = "::".join(scope + ([outer] if outer else []) + [name])
        sym = CppSymbol(key=f"class {qual}", label=qual, kind="class", name=name or (outer or ""), start=span_node.start_point[0] + 1,
                        end=_end_line(span_node), node=node, internal=anon, cls=outer)
        # the class body without its methods' bodies (those are symbols of their own)
        sym.idents = set()
        self.symbols.append(sym)
        inner_scope = scope + ([outer] if outer else [])
        for c in body.children:
            if c.type == "function_definition":
                self._add_function(c, inner_scope, anon, name)
            elif c.type == "template_declaration":
                self._walk_template(c, inner_scope, anon, name)
            elif c.type in ("class_specifier", "struct_specifier"):
                self._add_class(c, inner_scope, anon, name, c)
            elif c.type == "field_declaration" and any(
                    x.type in ("class_specifier", "struct_specifier") for x in c.children):
                for x in c.children:
                    if x.type in ("class_specifier", "struct_specifier"):
                        self._add_class(x, inner_scope, anon, name, c)
            elif c.type not in ("{", "}", "access_specifier", "comment", ":"):
                sym.idents |= _idents(c)
        for c in node.children:
            if c.type == "base_class_clause":
                sym.idents |= _idents(c)

    def _add_function(self, node, scope, anon, cls: Optional[str]) -> None:
        decl = node.child_by_field_name("declarator")
        while decl is not None and decl.type in ("pointer_declarator", "reference_declarator", "attributed_declarator",
                                                 "parenthesized_declarator"):
            decl = decl.child_by_field_name("declarator") or (decl.named_children[-1] if decl.named_children else None)
        start, end = node.start_point[0] + 1, _end_line(node)
        macro, margs = None, ()
        params = ""
        if decl is None or decl.type != "function_declarator":
            name = decl.text.decode() if decl is not None else f"anon{start}"
        else:
            inner = decl.child_by_field_name("declarator")
            p = decl.child_by_field_name("parameters")
            params = " ".join(_tokens(p).split()) if p is not None else ""
            if inner is not None and inner.type == "function_declarator":  # MACRO(args)(params)
                macro = inner.child_by_field_name("declarator").text.decode()
                ip = inner.child_by_field_name("parameters")
                margs = tuple(a.strip() for a in ip.text.decode()[1:-1].split(",") if a.strip()) if ip is not None else ()
                name = margs[0] if margs else macro
            else:
                full = _strip_templates(inner.text.decode()) if inner is not None else f"anon{start}"
                parts = [x for x in full.replace(" ", "").split("::") if x]
                name = parts[-1] if parts else full
                if name in _TORCH_LIB:
                    macro = name
                    margs = tuple(a.strip() for a in params[1:-1].split(",") if a.strip())
                    name = f"{macro}({', '.join(margs)})"
                elif len(parts) > 1:  # an out-of-line definition: ns::Class::method
                    owner = parts[-2]
                    if cls is None and (owner[:1].isupper() or any(s.kind == "class" and s.name == owner for s in self.symbols)):
                        cls = owner
                    scope = parts[:-2] if cls == owner else parts[:-1]
        static = any(c.type == "storage_class_specifier" and c.text == b"static" for c in node.children)
        qual = "::".join(scope + ([cls] if cls else []) + [name])
        kind = "method" if cls else "function"
        sym = CppSymbol(key=f"{qual}{params}", label=qual, kind=kind, name=cls if cls else name, start=start, end=end, node=node,
                        internal=(anon or (static and not cls)), macro=macro, macro_args=margs, cls=cls,
                        idents=_idents(node))
        sym.idents.discard(name)
        sym.data_name = name  # type: ignore[attr-defined]
        self.symbols.append(sym)

    def _framework(self) -> Optional[str]:
        p = self.path
        incs = " ".join(i for _l, i in self.includes)
        if re.search(r"(^|/)(aten|ATen|c10|torch)/", p) or re.search(r"\b(ATen|c10|torch)/", incs):
            return "torch"
        if re.search(r"(^|/)tensorflow/", p) or "tensorflow/" in incs:
            return "tensorflow"
        return None

    # -- registrations -------------------------------------------------------------------
    def clean_text(self) -> str:
        """Source with comments blanked and ``\\``-newline joins turned into spaces (line numbers kept)."""
        b = bytearray(self.src)
        if self.tree is not None:
            stack = [self.tree.root_node]
            while stack:
                n = stack.pop()
                if n.type == "comment":
                    for i in range(n.start_byte, n.end_byte):
                        if b[i] not in (10,):
                            b[i] = 32
                elif n.child_count:
                    stack.extend(n.children)
        text = b.decode("utf-8", "replace")
        return re.sub(r"\\\r?\n", lambda m: " " * (len(m.group(0)) - 1) + "\n", text)

    def _find_registrations(self) -> None:
        text = self.clean_text()
        line_at = _LineIndex(text)
        self._dispatch_registrations(text, line_at)
        self._tf_registrations(text, line_at)
        self._pybind_registrations(text, line_at)
        self._torch_library_registrations(text, line_at)

    def _dispatch_registrations(self, text: str, line_at: _LineIndex) -> None:
        """``REGISTER_*DISPATCH(stub, &impl)``: a kernel behind an ATen dispatch stub."""
        for m in re.finditer(r"\b(?:ALSO_)?REGISTER_\w*DISPATCH\s*\(", text):
            args, stop = _call_args(text, m.end() - 1)
            if len(args) >= 2:
                impl = args[-1].strip().lstrip("&").strip()
                impl = _strip_templates(impl).split("::")[-1]
                stub = args[0].strip().split("::")[-1]
                if re.fullmatch(r"\w+", stub) and re.fullmatch(r"\w+", impl):
                    self.registrations.append(Registration("dispatch", line_at(m.start()), line_at(stop), names=[impl],
                                                           stub=stub))

    def _tf_registrations(self, text: str, line_at: _LineIndex) -> None:
        """``REGISTER_OP("Name")``, ``REGISTER_KERNEL_BUILDER(Name("Op")..., Kernel)`` and the
        ``REGISTERn(...)`` / ``REGISTER_*(...)`` macros that name TensorFlow ops by string."""
        for m in re.finditer(r"\bREGISTER_OP\s*\(\s*\"(\w+)\"\s*\)", text):
            stop = _statement_end(text, m.end())
            self.registrations.append(Registration("tf_op", line_at(m.start()), line_at(stop), ops=[m.group(1)]))
        for m in re.finditer(r"\bREGISTER_KERNEL_BUILDER\s*\(", text):
            args, stop = _call_args(text, m.end() - 1)
            if len(args) < 2:
                continue
            ops = re.findall(r"\bName\s*\(\s*\"(\w+)\"", args[0])
            if ops:
                names = [x for x in re.findall(r"[A-Za-z_]\w*", ",".join(args[1:])) if x not in _PRIMITIVE]
                self.registrations.append(Registration("tf_kernel", line_at(m.start()), line_at(stop), ops=ops,
                                                       names=list(dict.fromkeys(names))))
        for m in re.finditer(r"\b(REGISTER\d*|REGISTER_\w+)\s*\(", text):
            macro = m.group(1)
            if macro in ("REGISTER_OP", "REGISTER_KERNEL_BUILDER") or macro.endswith("DISPATCH"):
                continue
            if m.start() > 0 and text[:m.start()].rstrip().endswith("#define"):
                continue  # the definition of a registration macro, not a use
            args, stop = _call_args(text, m.end() - 1)
            ops = [a.strip()[1:-1] for a in args if re.fullmatch(r"\s*\"[A-Z_][A-Za-z0-9_]*\"\s*", a)]
            if ops:
                names = [x for a in args if '"' not in a for x in re.findall(r"[A-Za-z_]\w*", a) if x not in _PRIMITIVE]
                self.registrations.append(Registration("tf_kernel", line_at(m.start()), line_at(stop), ops=ops,
                                                       names=list(dict.fromkeys(names))))

    def _pybind_registrations(self, text: str, line_at: _LineIndex) -> None:
        """``m.def("name", &fn)`` inside ``PYBIND11_MODULE``."""
        for m in re.finditer(r"\bPYBIND11_MODULE\s*\(", text):
            # m.def("name", &fn, ...): a Python-visible function of a compiled extension module,
            # reached from Python as `pkg._C.name` (op ``pybind::name``)
            _args, stop = _call_args(text, m.end() - 1)
            brace = text.find("{", stop)
            end = _matching_brace(text, brace) if brace >= 0 else -1
            if end < 0:
                continue
            body = text[brace:end]
            for d in re.finditer(r"\.\s*def\s*\(", body):
                args, dstop = _call_args(body, d.end() - 1)
                lit = re.match(r"\s*\"(\w+)\"", args[0]) if args else None
                if not lit or len(args) < 2:
                    continue
                names = [_strip_templates(x).split("::")[-1] for x in re.findall(r"&\s*([A-Za-z_][\w:]*)", args[1])]
                if not names:
                    fn = re.match(r"\s*([A-Za-z_][\w:]*)\s*$", args[1])
                    names = [_strip_templates(fn.group(1)).split("::")[-1]] if fn else []
                if not names:  # a lambda: what it calls
                    names = [x for x in re.findall(r"\b([A-Za-z_]\w*)\s*\(", args[1]) if x not in _PRIMITIVE]
                self.registrations.append(Registration("pybind_def", line_at(brace + d.start()), line_at(brace + dstop),
                                                       ops=[f"pybind::{lit.group(1)}"], names=list(dict.fromkeys(names))))

    def _torch_library_registrations(self, text: str, line_at: _LineIndex) -> None:
        """``.def`` / ``.impl`` calls inside a ``TORCH_LIBRARY*`` block."""
        for sym in self.symbols:
            if sym.macro in _TORCH_LIB and sym.macro_args:
                ns = sym.macro_args[0]
                body = text[sym.node.start_byte:sym.node.end_byte] if sym.node is not None else ""
                base = sym.node.start_byte
                for m in re.finditer(r"\.\s*(def|impl)\s*\(", body):
                    args, stop = _call_args(body, m.end() - 1)
                    if not args:
                        continue
                    lit = re.match(r"\s*(?:TORCH_SELECTIVE_SCHEMA\s*\(|TORCH_SELECTIVE_NAME\s*\()?\s*\"([^\"]+)\"", args[0])
                    if not lit:
                        continue
                    opname = re.split(r"[(.]", lit.group(1).split("::")[-1], 1)[0].strip()
                    full = opname if ns == "aten" else f"{ns}::{opname}"
                    names = []
                    for a in args[1:]:
                        a = re.sub(r"^\s*TORCH_FN(?:_TYPE)?\s*\(", "", a)
                        fn = re.match(r"\s*&?\s*([A-Za-z_][\w:]*)", a)
                        if fn:
                            names.append(_strip_templates(fn.group(1)).split("::")[-1])
                    self.registrations.append(Registration(
                        "torch_def" if m.group(1) == "def" else "torch_impl",
                        line_at(base + m.start()), line_at(base + stop), ops=[full], names=names))

    # -- queries -------------------------------------------------------------------------
    def symbols_at(self, lines: Iterable[int]) -> Dict[str, Tuple[CppSymbol, int]]:
        """Symbol key -> (symbol, first line) for ``lines``; innermost function, then class,
        then top-level item; lines outside every item map to a ``file`` pseudo-symbol."""
        out: Dict[str, Tuple[CppSymbol, int]] = {}
        order = {"function": 0, "method": 0, "class": 1}
        for ln in sorted(set(lines)):
            best = None
            for s in self.symbols:
                if s.start <= ln <= s.end:
                    rank = (order.get(s.kind, 2), -(s.start))
                    if best is None or rank < best[0] or (rank[0] == best[0][0] and s.start >= best[1].start):
                        best = (rank, s)
            if best is None:
                sym = CppSymbol(key="<file>", kind="file", name="", start=ln, end=ln)
                out.setdefault("<file>", (sym, ln))
            else:
                out.setdefault(best[1].key, (best[1], ln))
        return out

    def symbol(self, key: str) -> Optional[CppSymbol]:
        for s in self.symbols:
            if s.key == key:
                return s
        return None

    def registrations_in(self, start: int, end: int) -> List[Registration]:
        return [r for r in self.registrations if r.start <= end and start <= r.end]


class _LineIndex:
    def __init__(self, text: str):
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def __call__(self, offset: int) -> int:
        import bisect

        return bisect.bisect_right(self.starts, offset)


def _call_args(text: str, open_paren: int) -> Tuple[List[str], int]:
    """Top-level comma-separated arguments of the call whose ``(`` is at ``open_paren``."""
    depth_p = depth_a = 0
    args: List[str] = []
    cur: List[str] = []
    i = open_paren
    n = len(text)
    in_str = None
    while i < n:
        c = text[i]
        if in_str:
            cur.append(c)
            if c == "\\":
                cur.append(text[i + 1] if i + 1 < n else "")
                i += 2
                continue
            if c == in_str:
                in_str = None
        elif c in "\"'":
            in_str = c
            cur.append(c)
        elif c in "([{":
            depth_p += 1
            if depth_p > 1:
                cur.append(c)
        elif c in ")]}":
            depth_p -= 1
            if depth_p == 0:
                args.append("".join(cur))
                return [a for a in args if a.strip()] if any(a.strip() for a in args) else [], i
            cur.append(c)
        elif c == "<" and depth_p == 1:
            depth_a += 1
            cur.append(c)
        elif c == ">" and depth_p == 1 and depth_a > 0:
            depth_a -= 1
            cur.append(c)
        elif c == "," and depth_p == 1 and depth_a == 0:
            args.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    return [], n - 1


def _matching_brace(text: str, open_brace: int) -> int:
    """Index just past the ``}`` that closes ``text[open_brace]`` (-1 when unbalanced)."""
    depth = 0
    for i in range(open_brace, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _statement_end(text: str, pos: int) -> int:
    depth = 0
    in_str = None
    i = pos
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == in_str:
                in_str = None
        elif c in "\"'":
            in_str = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ";" and depth <= 0:
            return i
        i += 1
    return len(text) - 1


class CppIndex:
    """The C/C++/CUDA files of one revision, parsed on demand; ``users_of`` finds the symbols that
    mention given identifiers (``git grep -w`` first, so only candidate files are parsed)."""

    def __init__(self, git: Git, rev: str):
        self.git = git
        self.rev = rev
        self._files: Dict[str, Optional[CppFile]] = {}
        self._includers: Dict[str, List[str]] = {}

    def file(self, path: str) -> Optional[CppFile]:
        if path not in self._files:
            data = self.git.show(self.rev, path)
            self._files[path] = None if data is None else CppFile(path, data)
        return self._files[path]

    def files_mentioning(self, names: Iterable[str], within: Optional[Sequence[str]] = None) -> List[str]:
        return self.git.grep_files(self.rev, names, list(within) if within else list(CPP_PATHSPECS), word=True)

    def includers(self, header: str, depth: int = 4) -> List[str]:
        """Files that include ``header``, transitively up to ``depth`` levels."""
        if header in self._includers:
            return self._includers[header]
        seen: Set[str] = set()
        frontier = [header]
        for _ in range(depth):
            bases = sorted({h.rsplit("/", 1)[-1] for h in frontier})
            nxt = []
            for path in self.git.grep_files(self.rev, bases, list(CPP_PATHSPECS), word=False):
                if path in seen or path == header:
                    continue
                f = self.file(path)
                if f is not None and any(_includes(path, inc, h) for _l, inc in f.includes for h in frontier):
                    seen.add(path)
                    nxt.append(path)
            if not nxt:
                break
            frontier = nxt
        self._includers[header] = sorted(seen)
        return self._includers[header]


def _includes(includer: str, inc: str, header: str) -> bool:
    """Does ``#include "inc"`` in ``includer`` name ``header`` (a repository path)?"""
    if header == inc or header.endswith("/" + inc):
        return True
    here = includer.rsplit("/", 1)[0] if "/" in includer else ""
    return (f"{here}/{inc}" if here else inc) == header


def cpp_changes(files: List[ChangedFile], base: CppIndex, head: CppIndex) -> Tuple[List[ChangedSymbol], List[str]]:
    out: List[ChangedSymbol] = []
    notes: List[str] = []
    for f in files:
        if f.binary or not (is_cpp(f.at_base) or is_cpp(f.at_head)):
            continue
        bf = base.file(f.at_base) if is_cpp(f.at_base) else None
        hf = head.file(f.at_head) if is_cpp(f.at_head) else None
        direct_old, direct_new = f.lines("old"), f.lines("new")
        if f.status == "added" and hf is not None:
            direct_new = set(range(1, hf.src.count(b"\n") + 2))
        if f.status == "deleted" and bf is not None:
            direct_old = set(range(1, bf.src.count(b"\n") + 2))
        cands: Dict[str, list] = {}  # key -> [base sym, head sym, base line, head line, near, base lines, head lines]
        for side, cf, direct, near in (("old", bf, direct_old, f.neighbour_lines("old")),
                                       ("new", hf, direct_new, f.neighbour_lines("new"))):
            if cf is None:
                continue
            for lines, is_near in ((direct, False), (near, True)):
                for ln in sorted(lines):
                    for key, (sym, _ln) in cf.symbols_at([ln]).items():
                        cur = cands.setdefault(key, [None, None, None, None, True, set(), set()])
                        if side == "old":
                            cur[0] = cur[0] or sym
                            cur[2] = cur[2] or ln
                            cur[5].add(ln)
                        else:
                            cur[1] = cur[1] or sym
                            cur[3] = cur[3] or ln
                            cur[6].add(ln)
                        cur[4] = cur[4] and is_near
        for key, (bs, hs, bl, hl, near, blines, hlines) in cands.items():
            # a symbol touched on one side only still exists on the other: look it up there
            if bs is None and bf is not None and key != "<file>":
                bs = bf.symbol(key)
            if hs is None and hf is not None and key != "<file>":
                hs = hf.symbol(key)
            sym = hs or bs
            cf = hf if hs is not None else bf
            regs = []  # registrations on the changed lines themselves
            for fobj, lines in ((bf, blines), (hf, hlines)):
                if fobj is not None:
                    for ln in sorted(lines):
                        regs += [r.to_dict() for r in fobj.registrations_in(ln, ln)]
            rec = ChangedSymbol(
                file=f.path, line=(hl or bl or 1), symbol=sym.label if key != "<file>" else f"{f.path}:<file>", lang="cpp",
                kind=sym.kind, change="modified", side="head" if hs is not None else "base", name=sym.name,
                neighbour_only=near,
                data={"key": key, "internal": sym.internal, "macro": sym.macro, "macro_args": list(sym.macro_args),
                      "framework": (cf.framework if cf else None), "header": is_header(f.path),
                      "regs": _dedup(regs), "fn": getattr(sym, "data_name", sym.name)})
            if key == "<file>":
                rec.change, rec.why = "unchanged", "comment/blank lines outside every definition"
                if regs:
                    rec.change, rec.why = "modified", ""
            elif bs is not None and hs is not None:
                if bs.fingerprint() == hs.fingerprint():
                    rec.change = "unchanged"
                    rec.why = ("only next to an inserted/deleted line; tokens unchanged" if near else
                               "comment/format-only change (tokens unchanged)")
            elif hs is not None:
                rec.change = "added"
            else:
                rec.change = "deleted"
            out.append(rec)
    return out, notes


def _dedup(regs: List[dict]) -> List[dict]:
    seen, out = set(), []
    for r in regs:
        k = (r["kind"], tuple(r["ops"]), tuple(r["names"]), r["stub"])
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out
