"""The operator catalogue: built-in rows from ``catalog/*.yaml`` plus a user's own operators."""
from __future__ import annotations

import difflib
from importlib import resources
from typing import Dict, Iterable, List, Optional, Sequence

from ..backends import FRAMEWORKS
from ..errors import ConfigError, UnknownOpError
from ..serial import load_yaml
from .spec import OpSpec

BUILTIN_FILES = {fw: f"{fw}.yaml" for fw in FRAMEWORKS}


def load_table(text: str, origin: str = "builtin") -> List[OpSpec]:
    """Parse one catalogue table (a YAML document with ``framework``, ``defaults``,
    ``thresholds_by_kind`` and ``ops``)."""
    doc = load_yaml(text) or {}
    defaults = dict(doc.get("defaults") or {})
    if doc.get("framework"):
        defaults.setdefault("framework", doc["framework"])
    defaults["thresholds_by_kind"] = doc.get("thresholds_by_kind") or {}
    return [OpSpec.from_dict(row, defaults, origin=origin) for row in doc.get("ops") or []]


_BUILTIN_CACHE: Dict[str, List[OpSpec]] = {}


def load_builtin(frameworks: Sequence[str] = FRAMEWORKS) -> List[OpSpec]:
    out: List[OpSpec] = []
    for fw in frameworks:
        if fw not in _BUILTIN_CACHE:
            text = resources.files("gate.ops").joinpath("catalog", BUILTIN_FILES[fw]).read_text()
            _BUILTIN_CACHE[fw] = load_table(text)
        out.extend(_BUILTIN_CACHE[fw])
    return out


_DEFAULTS_CACHE: Dict[str, dict] = {}


def builtin_defaults(framework: str) -> dict:
    """Defaults (dtypes, modes, thresholds by kind) of a framework's built-in table."""
    if framework not in _DEFAULTS_CACHE:
        text = resources.files("gate.ops").joinpath("catalog", BUILTIN_FILES[framework]).read_text()
        doc = load_yaml(text) or {}
        d = dict(doc.get("defaults") or {})
        d["framework"] = framework
        d["thresholds_by_kind"] = doc.get("thresholds_by_kind") or {}
        _DEFAULTS_CACHE[framework] = d
    import copy

    return copy.deepcopy(_DEFAULTS_CACHE[framework])


class Catalog:
    def __init__(self, specs: Iterable[OpSpec]):
        self.specs: Dict[str, OpSpec] = {}
        for s in specs:
            if s.name in self.specs and self.specs[s.name].origin == s.origin:
                raise ConfigError(f"operator {s.name} is declared twice")
            self.specs[s.name] = s  # user rows override built-ins of the same name

    def __iter__(self):
        return iter(self.specs.values())

    def __len__(self) -> int:
        return len(self.specs)

    def __contains__(self, name: str) -> bool:
        return name in self.specs

    def names(self) -> List[str]:
        return sorted(self.specs)

    def get(self, name: str) -> OpSpec:
        if name in self.specs:
            return self.specs[name]
        # unique short name: "gelu" -> "torch.gelu" when only one framework has it
        matches = [n for n in self.specs if n.split(".", 1)[-1] == name or n.rsplit(".", 1)[-1] == name]
        if len(matches) == 1:
            return self.specs[matches[0]]
        if len(matches) > 1:
            raise UnknownOpError(f"operator {name!r} is ambiguous: {', '.join(sorted(matches))}")
        by_path = self._by_import_path(name)
        if by_path is not None:
            return by_path
        close = difflib.get_close_matches(name, list(self.specs), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else " (see `dl-gate ops`)"
        raise UnknownOpError(f"unknown operator {name!r}{hint}")

    def _by_import_path(self, name: str) -> Optional[OpSpec]:
        """The row whose callable is ``name`` (an import path such as
        ``torch.nn.functional.softmax``): first as written in the row, then as the same function
        object once both are imported (an alias such as ``torch.special.expit`` ->
        ``torch.sigmoid``). Only rows of the framework the path starts with are imported."""
        if "." not in name.replace(":", "."):
            return None
        norm = name.replace(":", ".")
        if norm.startswith("tf."):  # TensorFlow's conventional alias
            norm = name = "tensorflow." + norm[3:]
        rows = [s for s in self if (s.callable or "").replace(":", ".") == norm]
        if len(rows) == 1:
            return rows[0]
        root = norm.split(".", 1)[0]
        if rows or root not in FRAMEWORKS and root not in {
                (s.callable or "").split(".", 1)[0].split(":", 1)[0] for s in self}:
            return None
        from ..backends.base import resolve_callable  # imports the framework: only for a path

        try:
            target = resolve_callable(name)
        except Exception:
            return None
        found = []
        for s in self:
            if not s.callable or s.callable.replace(":", ".").split(".", 1)[0] != root:
                continue
            try:
                if resolve_callable(s.callable) is target:
                    found.append(s)
            except Exception:
                continue
        if len(found) == 1:
            return found[0]
        if found:
            return None
        # a thin wrapper of the framework (torch.nn.functional.relu calls torch.relu): the row of
        # the same framework whose callable or native kernel has the wrapper's name, if only one
        leaf = norm.rsplit(".", 1)[-1]
        same = [s for s in self if s.callable and s.callable.replace(":", ".").split(".", 1)[0] == root
                and (s.callable.replace(":", ".").rsplit(".", 1)[-1] == leaf
                     or any(n.split(".")[0] == leaf for n in s.native))]
        return same[0] if len(same) == 1 else None

    def select(self, names: Optional[Iterable[str]]) -> List[OpSpec]:
        if not names:
            return list(self)
        return [self.get(n) for n in names]

    def by_native(self, framework: str) -> Dict[str, List[OpSpec]]:
        """Native op name (ATen / TF registration) -> operators that reach it."""
        out: Dict[str, List[OpSpec]] = {}
        for s in self:
            if s.framework != framework:
                continue
            for n in s.native:
                out.setdefault(n.split(".")[0], []).append(s)
        return out


def load_catalog(user_ops: Iterable[OpSpec] = (), builtin: Sequence[str] = FRAMEWORKS) -> Catalog:
    return Catalog([*load_builtin(builtin), *user_ops])
