"""The torch -> TensorFlow translation table (``catalog/xfw.yaml``) as data, and the pure
translation of one torch candidate into the arguments of its TensorFlow twin.

Translation works on float64 NumPy arrays whose values are already exactly representable in
the dtype under test (permutations and padding move values, never round them), so both sides
see identical numbers. No framework is imported here: the differential runner
(:mod:`gate.oracles.differential`) turns the result into tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..errors import ConfigError
from ..serial import load_yaml
from . import expr
from .spec import OpSpec, ParamSpec


class Untranslatable(Exception):
    """This candidate has no TF equivalent through the table (a value without a mapping)."""


@dataclass(frozen=True)
class InputMap:
    source: str
    permute: Optional[tuple] = None
    pad_axes: tuple = ()
    pad_amount: Any = None  # expression over params and dims
    pad_value: float = 0.0


@dataclass(frozen=True)
class ParamMap:
    source: Optional[str] = None
    mapping: Optional[Mapping] = None
    expr: Optional[str] = None
    value: Any = None
    constant: bool = False


@dataclass(frozen=True)
class Allow:
    when: Mapping[str, tuple]
    reason: str

    def matches(self, params: Mapping[str, Any]) -> bool:
        return all(k in params and _member(params[k], vs) for k, vs in self.when.items())


@dataclass(frozen=True)
class TwinCall:
    """Everything the TF side needs: arrays (float64) by TF input name, keyword arguments,
    an optional tensor to add to the output, and the permutation back to torch's layout."""

    arrays: List[Tuple[str, np.ndarray]]
    kwargs: Dict[str, Any]
    post_add: Optional[Tuple[np.ndarray, int]] = None
    out_permute: Optional[tuple] = None


@dataclass(frozen=True)
class XfwPair:
    torch: str
    tf: str
    inputs: Mapping[str, InputMap] = field(default_factory=dict)
    params: Mapping[str, ParamMap] = field(default_factory=dict)
    drop: Mapping[str, str] = field(default_factory=dict)
    post_add: Optional[Tuple[str, int]] = None
    out_permute: Optional[tuple] = None
    allow: Tuple[Allow, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping) -> "XfwPair":
        raw = dict(raw)
        if "torch" not in raw or "tf" not in raw:
            raise ConfigError(f"xfw pair needs 'torch' and 'tf': {raw!r}")
        unknown = set(raw) - {"torch", "tf", "inputs", "params", "drop", "post", "out_permute", "allow"}
        if unknown:
            raise ConfigError(f"xfw pair {raw['torch']}: unknown key(s) {', '.join(sorted(unknown))}")
        inputs = {}
        for name, m in dict(raw.get("inputs") or {}).items():
            m = dict(m)
            pad = dict(m.get("pad") or {})
            inputs[str(name)] = InputMap(
                source=str(m["from"]),
                permute=tuple(m["permute"]) if m.get("permute") is not None else None,
                pad_axes=tuple(pad.get("axes") or ()),
                pad_amount=pad.get("amount"),
                pad_value=float(pad.get("value", 0.0)),
            )
        params = {}
        for name, m in dict(raw.get("params") or {}).items():
            m = dict(m)
            if "value" in m:
                params[str(name)] = ParamMap(value=m["value"], constant=True)
            elif "from" in m:
                params[str(name)] = ParamMap(source=str(m["from"]), mapping=m.get("map"), expr=m.get("expr"))
            else:
                raise ConfigError(f"xfw pair {raw['torch']}: parameter {name} needs 'from' or 'value'")
        post = dict(raw.get("post") or {})
        post_add = None
        if post:
            if set(post) != {"add"}:
                raise ConfigError(f"xfw pair {raw['torch']}: post supports only 'add'")
            post_add = (str(post["add"]["from"]), int(post["add"].get("axis", -1)))
            if post_add[1] >= 0:
                raise ConfigError(f"xfw pair {raw['torch']}: post.add.axis must be negative (from the end)")
        allow = []
        for a in raw.get("allow") or ():
            when = {str(k): tuple(v) if isinstance(v, list) else (v,) for k, v in dict(a["when"]).items()}
            allow.append(Allow(when=when, reason=" ".join(str(a["reason"]).split())))
        return cls(
            torch=str(raw["torch"]),
            tf=str(raw["tf"]),
            inputs=inputs,
            params=params,
            drop={str(k): str(v) for k, v in dict(raw.get("drop") or {}).items()},
            post_add=post_add,
            out_permute=tuple(raw["out_permute"]) if raw.get("out_permute") is not None else None,
            allow=tuple(allow),
        )

    # -- what the pair says about a candidate ---------------------------------------------
    def allowed(self, params: Mapping[str, Any]) -> Optional[str]:
        """The documented reason the outputs may differ for these parameters, if any."""
        for a in self.allow:
            if a.matches(params):
                return a.reason
        return None

    def restrict(self, spec: OpSpec) -> OpSpec:
        """``spec`` with single-parameter allow-listed values removed from the search space
        (when some value remains), so that the search does not spend evaluations on them."""
        params = []
        for p in spec.params:
            if p.kind == "choice" and p.choices:
                banned = [v for a in self.allow if set(a.when) == {p.name} for v in a.when[p.name]]
                keep = tuple(c for c in p.choices if not _member(c, banned))
                if keep and len(keep) != len(p.choices):
                    p = ParamSpec(name=p.name, choices=keep, kind="choice",
                                  default=p.default if _member(p.default, keep) else keep[0])
            params.append(p)
        return spec.replace(params=tuple(params))

    def translate(self, torch_spec: OpSpec, tf_spec: OpSpec, dims: Mapping[str, int],
                  params: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> TwinCall:
        env = {**dims, **params}
        out_arrays: List[Tuple[str, np.ndarray]] = []
        torch_inputs = [t.name for t in torch_spec.inputs]
        for i, t in enumerate(tf_spec.inputs):
            m = self.inputs.get(t.name)
            if m is None:
                if i >= len(torch_inputs):
                    raise ConfigError(f"xfw pair {self.torch}: TF input {t.name} has no torch source")
                m = InputMap(source=torch_inputs[i])
            if m.source not in arrays:
                raise ConfigError(f"xfw pair {self.torch}: torch input {m.source!r} does not exist")
            a = np.asarray(arrays[m.source])
            if m.permute is not None:
                a = np.transpose(a, m.permute)
            if m.pad_axes:
                amount = int(expr.evaluate(m.pad_amount, env))
                if amount:
                    widths = [(0, 0)] * a.ndim
                    for ax in m.pad_axes:
                        widths[ax] = (amount, amount)
                    a = np.pad(a, widths, constant_values=m.pad_value)
            out_arrays.append((t.name, np.ascontiguousarray(a)))
        kwargs: Dict[str, Any] = {}
        for name, m in self.params.items():
            if m.constant:
                kwargs[name] = m.value
                continue
            if m.source in params:
                v = params[m.source]
            else:  # a seed (e.g. an OpInfo sample) that leaves a parameter at its default
                decl = next((p for p in torch_spec.params if p.name == m.source), None)
                if decl is None:
                    raise ConfigError(f"xfw pair {self.torch}: torch parameter {m.source!r} does not exist")
                if decl.default is None:
                    raise Untranslatable(f"{m.source} is not set and its row declares no default")
                v = decl.default
            if m.mapping is not None:
                hit = [tv for k, tv in m.mapping.items() if _same(k, v)]
                if not hit:
                    raise Untranslatable(f"{m.source}={v!r} has no TensorFlow equivalent in xfw.yaml")
                v = hit[0]
            if m.expr is not None:
                v = expr.evaluate(m.expr, {**env, "v": v})
            kwargs[name] = v
        post = None
        if self.post_add is not None:
            src, axis = self.post_add
            b = np.asarray(arrays[src])
            post = (b.reshape(b.shape + (1,) * (-axis - 1)), axis)
        return TwinCall(arrays=out_arrays, kwargs=kwargs, post_add=post, out_permute=self.out_permute)

    def unaccounted(self, torch_spec: OpSpec) -> List[str]:
        """Torch parameters the pair neither maps, pads with, nor drops with a reason."""
        used = {m.source for m in self.params.values() if not m.constant}
        used |= set(self.drop)
        for m in self.inputs.values():
            used |= expr.names(m.pad_amount) if m.pad_amount is not None else set()
        return [p.name for p in torch_spec.params if p.name not in used]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (type(a) is type(b) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isinf(a) and math.isinf(b) and (a > 0) == (b > 0))
    return a == b


def _member(v: Any, vs) -> bool:
    return any(_same(v, x) for x in vs)


@dataclass(frozen=True)
class XfwTable:
    pairs: Tuple[XfwPair, ...]

    def pair_for(self, op_name: str) -> Optional[XfwPair]:
        for p in self.pairs:
            if op_name in (p.torch, p.tf):
                return p
        return None

    def __len__(self) -> int:
        return len(self.pairs)


def parse_table(text: str) -> XfwTable:
    doc = load_yaml(text) or {}
    pairs = tuple(XfwPair.from_dict(r) for r in doc.get("pairs") or ())
    seen: Dict[str, str] = {}
    for p in pairs:
        for n in (p.torch, p.tf):
            if n in seen:
                raise ConfigError(f"xfw.yaml: operator {n} appears in two pairs")
            seen[n] = p.torch
    return XfwTable(pairs)


_TABLE: Optional[XfwTable] = None


def load_table() -> XfwTable:
    global _TABLE
    if _TABLE is None:
        _TABLE = parse_table(resources.files("gate.ops").joinpath("catalog", "xfw.yaml").read_text())
    return _TABLE


def pair_specs(pair: XfwPair) -> Tuple[OpSpec, OpSpec]:
    """The built-in rows of both sides of ``pair`` (torch, tensorflow)."""
    from .catalog import load_builtin

    by_name = {s.name: s for s in load_builtin(("torch", "tensorflow"))}
    missing = [n for n in (pair.torch, pair.tf) if n not in by_name]
    if missing:
        raise ConfigError(f"xfw.yaml names operator(s) missing from the catalogue: {', '.join(missing)}")
    return by_name[pair.torch], by_name[pair.tf]
