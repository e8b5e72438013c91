"""``.dl-gate.yml``: loaded, validated against ``config_schema.json`` (errors name the key and
the line), and turned into user operator specs."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import jsonschema
import yaml

from .errors import ConfigError, SetupError
from .ops.catalog import builtin_defaults
from .ops.spec import OpSpec

CONFIG_NAMES = (".dl-gate.yml", ".dl-gate.yaml")

#: the fuzz stage's seconds where neither ``--budget`` nor ``budget.total`` says
DEFAULT_BUDGET_TOTAL = 120.0


@dataclass
class Config:
    path: Optional[Path]
    root: Path
    raw: Dict[str, Any] = field(default_factory=dict)
    ops: List[OpSpec] = field(default_factory=list)

    # convenient views with defaults ------------------------------------------------------
    @property
    def builtin(self) -> Sequence[str]:
        b = self.raw.get("builtin", False if self.ops else True)
        if b is True:
            from .backends import FRAMEWORKS

            return FRAMEWORKS
        if b is False:
            return ()
        return tuple(b)

    @property
    def budget(self) -> dict:
        return dict(self.raw.get("budget") or {})

    @property
    def gate(self) -> dict:
        return dict(self.raw.get("gate") or {})

    @property
    def select(self) -> dict:
        return dict(self.raw.get("select") or {})

    @property
    def seed(self) -> int:
        return int(self.raw.get("seed", 0))

    @property
    def threads(self) -> Optional[int]:
        """CPU threads per operator call (``threads:``; None: not set, 1 by default)."""
        t = self.raw.get("threads")
        return None if t is None else int(t)

    @property
    def baselines_dir(self) -> Path:
        return self.root / self.raw.get("baselines", "baselines")

    def activate(self) -> None:
        """Make the user's operator library importable, as it is on disk now: its directories go
        to the front of the import path, and modules of the same top-level names imported
        earlier (an older version, or a namesake from another tree) are forgotten."""
        import importlib

        tops = set()
        for p in reversed(self.raw.get("python_path") or ["."]):
            d = (self.root / p).resolve()
            full = str(d)
            while full in sys.path:  # to the front: this library wins over any earlier one
                sys.path.remove(full)
            sys.path.insert(0, full)
            if d.is_dir():
                for child in d.iterdir():
                    if child.suffix == ".py":
                        tops.add(child.stem)
                    elif (child / "__init__.py").exists():
                        tops.add(child.name)
        from .backends import configure_threads
        from .backends.triton_support import prepare_tree

        configure_threads(self.threads)  # before any backend or worker starts
        from .backends.sandbox import allow

        allow(self.raw.get("env"))  # the variables the workers get on top of the allow-list

        # Triton reads TRITON_INTERPRET when a kernel is decorated: decide before any import
        prepare_tree([(self.root / p).resolve() for p in (self.raw.get("python_path") or ["."])])
        tops -= {"gate", "torch", "tensorflow", "numpy", "tests", "conftest", "setup"}
        for name in list(sys.modules):
            if name.split(".")[0] in tops:
                del sys.modules[name]
        importlib.invalidate_caches()


def read_text(path: Path) -> str:
    """A config file's text; one line naming the file when it is not UTF-8 text."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}): save the config as UTF-8") from None


def _schema() -> dict:
    """The schema file, with the oracle names taken from the rules of ``oracles.yaml`` (an
    oracle added as a rule is accepted without editing the schema)."""
    schema = json.loads(resources.files("gate").joinpath("config_schema.json").read_text())
    from .plan import FUZZ_ORACLES

    from .backends import FRAMEWORKS

    schema.setdefault("$defs", {})["oracle"] = {"enum": list(FUZZ_ORACLES)}
    _set_frameworks(schema, list(FRAMEWORKS))
    return schema


def _set_frameworks(node, frameworks: list) -> None:
    """Every framework enum of the schema file (it lists the shipped ones) -> ``frameworks``."""
    if isinstance(node, dict):
        if node.get("enum") == ["torch", "tensorflow"]:
            node["enum"] = list(frameworks)
        for v in node.values():
            _set_frameworks(v, frameworks)
    elif isinstance(node, list):
        for v in node:
            _set_frameworks(v, frameworks)


def _line_of(node: yaml.Node, path: Sequence[Any]) -> Optional[int]:
    """Line (1-based) of the YAML node at ``path`` (deepest existing one)."""
    cur, mark = node, (node.start_mark if node is not None else None)
    for key in path:
        nxt = None
        if isinstance(cur, yaml.MappingNode):
            for k, v in cur.value:
                if k.value == str(key):
                    nxt, mark = v, k.start_mark  # the key's line: a block value starts on the next one
                    break
        elif isinstance(cur, yaml.SequenceNode) and isinstance(key, int) and key < len(cur.value):
            nxt = cur.value[key]
            mark = nxt.start_mark
        if nxt is None:
            break
        cur = nxt
    return mark.line + 1 if mark is not None else None


def parse_config(text: str, path: Optional[Path] = None, root: Optional[Path] = None) -> Config:
    where = str(path) if path else "config"
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}{line}: invalid YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}:1: the config must be a mapping, not {type(raw).__name__}")
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        path = list(err.absolute_path)
        msg = err.message
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = set((err.schema or {}).get("properties", {}))
            extra = sorted(k for k in err.instance if k not in allowed)
            if extra:
                path.append(extra[0])
                msg = f"unknown key (allowed: {', '.join(sorted(allowed))})"
        keypath = ".".join(str(p) for p in path) or "(top level)"
        line = _line_of(node, path) if node is not None else None
        raise ConfigError(f"{where}:{line or 1}: {keypath}: {msg}")
    if raw.get("env"):
        from .backends.sandbox import check_names, env_names

        names = env_names(raw["env"])
        reason = check_names(names)
        if reason is not None:
            bad = next(i for i, n in enumerate(names) if check_names([n]))
            key = names[bad] if isinstance(raw["env"], dict) else bad
            raise ConfigError(f"{where}:{_line_of(node, ['env', key]) or 1}: env: {reason}")
    root = root or (path.parent if path else Path.cwd())
    framework = raw.get("framework", "torch")
    ops: List[OpSpec] = []
    for i, row in enumerate(raw.get("ops") or []):
        fw = row.get("framework", framework)
        defaults = builtin_defaults(fw)
        defaults["devices"] = ["cpu", "cuda"]
        try:
            ops.append(OpSpec.from_dict({"framework": fw, **row}, defaults, origin="user"))
        except ConfigError as exc:
            line = _line_of(node, ["ops", i])
            raise ConfigError(f"{where}:{line}: ops.{i}: {exc}") from None
    names = [o.name for o in ops]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"{where}: operator {sorted(dup)[0]} is declared twice")
    return Config(path=path, root=root.resolve(), raw=raw, ops=ops)


def load_config(path: Optional[os.PathLike] = None, search_from: Optional[Path] = None,
                up_to: Optional[Path] = None, root: Optional[Path] = None) -> Config:
    """Load ``path`` (its paths relative to ``root``, else to its directory), or the first
    ``.dl-gate.yml`` in ``search_from`` (cwd) or, with ``up_to`` (a repository root), in its
    parents up to that root; an empty config (built-in catalogue only) if there is none."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SetupError(f"config file {p} does not exist" if not p.exists() else f"config file {p} is not a file")
        return parse_config(read_text(p), p, root or p.parent)
    base = Path(search_from or Path.cwd()).resolve()
    dirs = [base]
    if up_to is not None:
        top = Path(up_to).resolve()
        d = base
        while d != top and top in d.parents:
            d = d.parent
            dirs.append(d)
    for d in dirs:
        for name in CONFIG_NAMES:
            if (d / name).exists():
                return parse_config(read_text(d / name), d / name, d)
    return Config(path=None, root=(Path(up_to).resolve() if up_to is not None else base), raw={}, ops=[])
