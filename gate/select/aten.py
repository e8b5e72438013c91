"""ATen's operator table, ``native_functions.yaml``: C++ kernel name -> the ops it implements.

Read from the repository under test when it is a PyTorch tree
(``aten/src/ATen/native/native_functions.yaml``), else from the copy the torch wheel ships in
``torchgen/packaged/`` (found without importing torch). Per entry: ``dispatch`` maps backends to
kernel names; an entry with neither ``dispatch`` nor ``structured_delegate`` has the implicit
CompositeImplicitAutograd kernel named after the op; ``structured_delegate: gelu.out`` makes
``gelu`` and ``gelu_`` run ``gelu.out``'s kernel (its ``TORCH_IMPL_FUNC``) and meta function."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Dict, List, Optional, Set

import yaml

REPO_YAML = "aten/src/ATen/native/native_functions.yaml"

_CACHE: Dict[str, "NativeFunctions"] = {}


def _base(func_name: str) -> str:
    return func_name.split(".", 1)[0]


class NativeFunctions:
    def __init__(self, entries: List[dict], origin: str):
        self.origin = origin
        self.kernels: Dict[str, Set[str]] = {}  # kernel name -> full op names (name.overload)
        self.delegates: Dict[str, Set[str]] = {}  # "gelu.out" -> {"gelu", "gelu_"} (full names)
        self.by_base: Dict[str, Set[str]] = {}  # "gelu" -> full names
        for e in entries:
            func = str(e.get("func", ""))
            full = func.split("(", 1)[0].strip()
            if not full:
                continue
            self.by_base.setdefault(_base(full), set()).add(full)
            disp = e.get("dispatch")
            if isinstance(disp, dict):
                for kernel in disp.values():
                    self.kernels.setdefault(str(kernel).split("::")[-1], set()).add(full)
            elif not e.get("structured_delegate"):
                self.kernels.setdefault(_base(full), set()).add(full)  # CompositeImplicitAutograd
            if e.get("structured_delegate"):
                self.delegates.setdefault(str(e["structured_delegate"]), set()).add(full)

    # -- loading -------------------------------------------------------------------------
    @classmethod
    def from_text(cls, text: str, origin: str) -> "NativeFunctions":
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return cls(yaml.load(text, Loader=loader) or [], origin)

    @classmethod
    def load(cls, git=None, rev: Optional[str] = None) -> Optional["NativeFunctions"]:
        """The repository's own table if it has one at ``rev``, else the torch wheel's."""
        if git is not None and rev is not None:
            text = git.text(rev, REPO_YAML)
            if text is not None:
                key = f"repo:{rev}"
                if key not in _CACHE:
                    _CACHE[key] = cls.from_text(text, f"{REPO_YAML} at {rev[:12]}")
                return _CACHE[key]
        path = wheel_yaml()
        if path is None:
            return None
        key = str(path)
        if key not in _CACHE:
            _CACHE[key] = cls.from_text(path.read_text(), str(path))
        return _CACHE[key]

    # -- queries -------------------------------------------------------------------------
    def _with_delegates(self, fulls: Set[str]) -> Set[str]:
        out = set(fulls)
        for f in fulls:
            out |= self.delegates.get(f, set())
        return out

    def ops_for_kernel(self, kernel: str) -> Set[str]:
        """Base op names whose kernel (or structured delegate's kernel) is ``kernel``."""
        return {_base(f) for f in self._with_delegates(self.kernels.get(kernel, set()))}

    def ops_for_meta(self, op: str, overload: Optional[str] = None) -> Set[str]:
        """``TORCH_META_FUNC(op)`` / ``TORCH_META_FUNC2(op, overload)``: the structured op and
        every op delegating to it."""
        fulls = {f for f in self.by_base.get(op, set()) if overload is None or f == f"{op}.{overload}"}
        structured = {f for f in fulls if f in self.delegates} or fulls
        return {_base(f) for f in self._with_delegates(structured)}

    def is_op(self, name: str) -> bool:
        return name in self.by_base


def wheel_yaml() -> Optional[Path]:
    try:
        spec = importlib.util.find_spec("torchgen")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "packaged" / "ATen" / "native" / "native_functions.yaml"
    return p if p.exists() else None
