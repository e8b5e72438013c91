"""Operator specs as data (after PyTorch's OpInfo).

One :class:`OpSpec` row declares everything the gate knows about an operator: how to call it,
which inputs and parameters it takes (as value spaces the fuzzer samples), which dtypes, devices,
modes and layouts to test, how to compute its reference, its thresholds and where its source lives.
Rows come from the YAML catalogues in ``gate/ops/catalog/`` and from a user's ``.dl-gate.yml``;
adding an operator is adding a row, never a code path.

Specs are immutable and serialise to plain dicts (``to_dict``/``from_dict``) so that every later
stage can be run, cached and sharded alone.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
LOW_DTYPES = ("float16", "bfloat16", "float32")
MODES = ("input", "operator", "tf32", "reduced")
#: CUDA-only modes (math-mode flags, not properties of an operator): planned on a CUDA device
#: whenever asked for (``--mode tf32``), whatever the operator's own ``modes`` say
CUDA_MODES = {"tf32": ("float32",), "reduced": ("float16", "bfloat16")}
DOMAINS = {
    # name: (lo, hi) open interval
    "real": (None, None),
    "positive": (0.0, None),
    "nonneg": (0.0, None),
    "unit": (-1.0, 1.0),
    "prob": (0.0, 1.0),
    "gt_minus1": (-1.0, None),
    "ge1": (1.0, None),
}


@dataclass(frozen=True)
class Domain:
    """Open interval of valid input values (``None`` = unbounded), or a finite set of values
    (``values``: labels such as -1 and 1, which a loss compares with ``==``; every value the
    search gives such an input is one of them, and ``lo``/``hi`` are then unset)."""

    lo: Optional[float] = None
    hi: Optional[float] = None
    scale: float = 1.0  # std of the bulk distribution
    name: str = "real"
    values: tuple = ()  # sorted, distinct; () for an interval

    @classmethod
    def parse(cls, raw: Any) -> "Domain":
        if raw is None:
            return cls()
        if isinstance(raw, str):
            if raw not in DOMAINS:
                raise ConfigError(f"unknown value domain {raw!r} (known: {', '.join(DOMAINS)})")
            lo, hi = DOMAINS[raw]
            return cls(lo=lo, hi=hi, name=raw)
        if isinstance(raw, Mapping) and raw.get("values") is not None:
            vals = raw["values"]
            if not isinstance(vals, (list, tuple)) or not vals \
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vals):
                raise ConfigError(f"bad value domain {dict(raw)!r}: 'values' must be a non-empty list of finite numbers")
            if any(raw.get(k) is not None for k in ("lo", "hi", "scale")):
                raise ConfigError(f"bad value domain {dict(raw)!r}: a set of 'values' takes no lo, hi or scale")
            return cls(name=str(raw.get("name", "values")), values=tuple(sorted({float(v) for v in vals})))
        if isinstance(raw, Mapping):
            # "custom": a domain given by its bounds (what to_dict writes for one)
            base = cls() if raw.get("name") in (None, "custom") else cls.parse(raw["name"])
            lo = raw.get("lo", base.lo)
            hi = raw.get("hi", base.hi)
            return cls(
                lo=None if lo is None else float(lo),
                hi=None if hi is None else float(hi),
                scale=float(raw.get("scale", 1.0)),
                name=str(raw.get("name", "custom")),
            )
        raise ConfigError(f"bad value domain {raw!r}")

    def to_dict(self) -> dict:
        if self.values:
            return {"name": self.name, "values": list(self.values)}
        return {"lo": self.lo, "hi": self.hi, "scale": self.scale, "name": self.name}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple  # ints or dim names / expressions
    domain: Domain = field(default_factory=Domain)
    kind: str = "float"  # float | index | bool
    keyword: bool = False  # pass as keyword argument instead of positionally
    index_hi: Any = None  # for kind=index: exclusive upper bound expression
    #: a float input that keeps this dtype whatever the variant's (mixed precision)
    dtype: Optional[str] = None
    #: ``"module:Class"``: the input is made an instance of this torch tensor subclass (the
    #: library's own: torchfields' DisplacementField, whose methods are its operators)
    subclass: Optional[str] = None
    #: the input is the next item of the list argument of this name (``quat_composition([q0,
    #: q1, q2])``, a decoder's ``forward(features)``): the inputs of one pack are consecutive in
    #: ``inputs`` and passed together as one list, positionally or (``keyword``) by that name;
    #: ``*NAME``: passed one by one, the function's ``*NAME`` (a decoder's ``forward(*features)``)
    pack: Optional[str] = None

    def dtype_at(self, variant_dtype: str) -> str:
        return self.dtype or variant_dtype

    @classmethod
    def from_dict(cls, raw: Mapping) -> "TensorSpec":
        if "name" not in raw or "shape" not in raw:
            raise ConfigError(f"tensor spec needs 'name' and 'shape': {dict(raw)!r}")
        return cls(
            name=str(raw["name"]),
            shape=tuple(raw["shape"]),
            domain=Domain.parse(raw.get("domain")),
            kind=str(raw.get("kind", "float")),
            keyword=bool(raw.get("keyword", False)),
            index_hi=raw.get("index_hi"),
            dtype=raw.get("dtype"),
            subclass=raw.get("subclass"),
            pack=None if raw.get("pack") is None else str(raw["pack"]),
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "domain": self.domain.to_dict(),
            "kind": self.kind,
            "keyword": self.keyword,
            "index_hi": self.index_hi,
            **({"dtype": self.dtype} if self.dtype else {}),
            **({"subclass": self.subclass} if self.subclass else {}),
            **({"pack": self.pack} if self.pack else {}),
        }


def arrange(placed: Iterable[Tuple["TensorSpec", Any]], kwargs: Dict[str, Any]) -> list:
    """The positional arguments of one call from ``(input, value)`` pairs in the spec's order;
    keyword inputs go into ``kwargs``. The inputs of one ``pack`` become one list, at the place
    of the pack's first item (or ``kwargs[pack]``): what every caller of an operator (the
    oracles, the graph and export builders, a repro script) passes."""
    args: list = []
    last: Optional[str] = None  # the positional pack the previous input went into
    for t, v in placed:
        if t.pack and t.pack.startswith("*"):  # the function's *args: one by one
            args.append(v)
            last = None
            continue
        if t.pack:
            if t.keyword:
                kwargs.setdefault(t.pack, []).append(v)
            elif last == t.pack:
                args[-1].append(v)
            else:
                args.append([v])
            last = None if t.keyword else t.pack
            continue
        last = None
        if t.keyword:
            kwargs[t.name] = v
        else:
            args.append(v)
    return args


def check_packs(name: str, inputs: Sequence["TensorSpec"]) -> None:
    """A one-line error unless every pack's inputs are consecutive, all positional or all by
    keyword, and named apart from the other inputs."""
    seen: Dict[str, int] = {}
    names = {t.name for t in inputs}
    prev: Optional[str] = None
    for i, t in enumerate(inputs):
        if t.pack and t.pack.startswith("*"):
            if t.keyword:
                raise ConfigError(f"operator {name}: pack {t.pack!r} (the function's *args) cannot be passed by keyword")
            if any(not u.keyword and u.pack != t.pack for u in inputs[i + 1:]):
                raise ConfigError(f"operator {name}: pack {t.pack!r} (the function's *args) must be the last "
                                  "positional inputs")
        if t.pack:
            if t.pack.lstrip("*") in names:
                raise ConfigError(f"operator {name}: pack {t.pack!r} has the name of an input")
            if t.pack in seen and prev != t.pack:
                raise ConfigError(f"operator {name}: the inputs of pack {t.pack!r} are not consecutive")
            first = next(u for u in inputs if u.pack == t.pack)
            if first.keyword != t.keyword:
                raise ConfigError(f"operator {name}: pack {t.pack!r} mixes positional and keyword inputs")
            seen.setdefault(t.pack, i)
        prev = t.pack


class ImportRef(str):
    """A parameter value given by import path (``{import: pkg.Enum.A}``): an enum member or any
    object a JSON value cannot be. It travels as its path and is resolved where the operator is
    called (:func:`resolve_params`)."""

    def __repr__(self) -> str:
        return f"<{str(self)}>"


def _import_value(raw: Any) -> Any:
    if isinstance(raw, Mapping) and set(raw) == {"import"}:
        return ImportRef(str(raw["import"]))
    return raw


def check_imports(spec: "OpSpec") -> None:
    """Import every object the operator's parameters name (``{import: ...}``), so that a typo is
    one :class:`ConfigError` where the operator is first loaded, not an evaluation that fails
    on the choices that carry it while the others run."""
    for p in spec.params:
        refs = {c for c in (p.choices or ()) if isinstance(c, ImportRef)}
        if isinstance(p.default, ImportRef):
            refs.add(p.default)
        for ref in sorted(refs, key=str):
            resolve_params({p.name: ref}, spec.name)


def resolve_params(params: Mapping[str, Any], op: str = "") -> dict:
    """``params`` with every :class:`ImportRef` replaced by the object it names; one-line
    :class:`ConfigError` naming the operator, the parameter and the path when it cannot."""
    import importlib

    out = {}
    for k, v in params.items():
        if isinstance(v, ImportRef):
            path = str(v)
            mod, _, attr = path.partition(":") if ":" in path else (None, None, None)
            obj = None
            try:
                if mod is not None:
                    obj = importlib.import_module(mod)
                    for part in attr.split("."):
                        obj = getattr(obj, part)
                else:
                    parts = path.split(".")
                    for i in range(len(parts) - 1, 0, -1):
                        try:
                            obj = importlib.import_module(".".join(parts[:i]))
                        except ImportError:
                            continue
                        for part in parts[i:]:
                            obj = getattr(obj, part)
                        break
                    else:
                        raise ImportError(f"no module in {path}")
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"{op}: parameter {k}: cannot import {path} ({type(exc).__name__}: {exc})") from None
            v = obj
        out[k] = v
    return out


@dataclass(frozen=True)
class ParamSpec:
    """A parameter's value space: ``choices``, an int/float range, or a derived ``expr``."""

    name: str
    choices: Optional[tuple] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    kind: str = "choice"  # choice | int | float | expr
    default: Any = None
    expr: Any = None  # evaluated after dims are drawn (e.g. normalized_shape: "(D,)")

    @classmethod
    def from_dict(cls, name: str, raw: Any) -> "ParamSpec":
        if not isinstance(raw, Mapping):  # a bare constant
            return cls(name=name, choices=(raw,), kind="choice", default=raw)
        if "import" in raw:  # an object by import path (an enum member)
            ref = _import_value({"import": raw["import"]})
            return cls(name=name, choices=(ref,), kind="choice", default=ref)
        if "expr" in raw:
            return cls(name=name, kind="expr", expr=raw["expr"])
        if "choices" in raw:
            choices = tuple(_import_value(c) for c in raw["choices"])
            if not choices:
                raise ConfigError(f"parameter {name!r} has no choices")
            return cls(name=name, choices=choices, kind="choice", default=_import_value(raw.get("default", choices[0])))
        if "range" in raw:
            lo, hi = raw["range"]
            kind = "int" if isinstance(lo, int) and isinstance(hi, int) and not raw.get("float") else "float"
            return cls(name=name, lo=lo, hi=hi, kind=kind, default=raw.get("default", lo))
        if "value" in raw:
            return cls(name=name, choices=(raw["value"],), kind="choice", default=raw["value"])
        raise ConfigError(f"parameter {name!r} needs one of choices/range/expr/value")

    def to_dict(self) -> dict:
        if self.kind == "expr":
            return {"expr": self.expr}
        if self.kind == "choice":
            def out(v):
                return {"import": str(v)} if isinstance(v, ImportRef) else v

            return {"choices": [out(c) for c in self.choices or ()], "default": out(self.default)}
        return {"range": [self.lo, self.hi], "default": self.default, "float": self.kind == "float"}


@dataclass(frozen=True)
class LayoutSpec:
    """An equivalent data layout: parameter overrides plus input/output permutations
    (TF ``data_format``) or a memory format (torch ``channels_last``)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    permute: Mapping[str, tuple] = field(default_factory=dict)
    out_permute: Optional[tuple] = None
    memory_format: Optional[str] = None
    #: added by default (not declared): planned at one dtype only, to keep the default cheap
    auto: bool = False

    @classmethod
    def from_dict(cls, name: str, raw: Mapping) -> "LayoutSpec":
        return cls(
            name=name,
            params=dict(raw.get("params", {})),
            permute={k: tuple(v) for k, v in dict(raw.get("permute", {})).items()},
            out_permute=tuple(raw["out_permute"]) if raw.get("out_permute") is not None else None,
            memory_format=raw.get("memory_format"),
            auto=bool(raw.get("auto", False)),
        )

    def to_dict(self) -> dict:
        return {
            "params": dict(self.params),
            "permute": {k: list(v) for k, v in self.permute.items()},
            "out_permute": list(self.out_permute) if self.out_permute else None,
            "memory_format": self.memory_format,
            **({"auto": True} if self.auto else {}),
        }


@dataclass(frozen=True)
class Threshold:
    """Absolute floor of the gate for one dtype: errors below it never fail."""

    ulp: float = math.inf
    abs: float = math.inf

    def to_dict(self) -> dict:
        return {"ulp": self.ulp, "abs": self.abs}


@dataclass(frozen=True)
class OpSpec:
    name: str
    framework: str  # torch | tensorflow
    callable: str  # import path: "pkg.mod.func" or "pkg.mod:obj.attr"
    inputs: tuple  # of TensorSpec
    params: tuple = ()  # of ParamSpec
    dims: tuple = ()  # ((name, (lo_expr, hi_expr)), ...) in draw order
    #: ((name, size), ...): how far past ``hi`` a dim may be aimed (``dims: {C: [1, 4, 4096]}``):
    #: draws stay in [lo, hi] (fast evaluations); the search's size mutation reaches up to it
    #: (a position past 2048 in float16, a reduction of 4096 terms) within MAX_ELEMENTS
    reach: tuple = ()
    dtypes: tuple = LOW_DTYPES
    devices: tuple = ("cpu", "cuda")
    modes: tuple = ("input",)
    layouts: tuple = ()  # of LayoutSpec (alternatives to the default layout)
    reference: Optional[str] = None  # import path; default: the same op in float64
    #: each output element depends only on the same element of the inputs: with one float input,
    #: every 16-bit input value is run (gate.fuzz.exhaustive) instead of a sample
    elementwise: bool = False
    #: correctly rounded reference for the exhaustive sets (gate.oracles.references: ``erf``,
    #: ``mpmath.erf``); the search keeps the fast float64 run. A ``reference:`` that names an
    #: mpmath function is a true reference everywhere.
    truth: Optional[str] = None
    thresholds: Mapping[str, Threshold] = field(default_factory=dict)
    kind: str = "elementwise"
    exact: bool = False
    ulp_floor: str = "output"  # output: ulp of the output's magnitude; dtype: smallest normal
    sources: tuple = ()
    native: tuple = ()  # native op names (ATen / TF op registrations)
    twin: Optional[str] = None  # cross-framework twin op name
    opinfo: Optional[str] = None  # PyTorch OpInfo entry whose sample inputs seed the search
    batch_dim: Optional[int] = None  # inputs are batch-separable along this dim
    grad: bool = False
    oracles: Optional[tuple] = None  # explicit oracle list; None: the rules table decides
    oracle_args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-oracle options
    #: a class's constructor arguments ((name, value), ...): ``callable`` names an ``nn.Module`` /
    #: Keras ``Layer`` the gate builds with them (what the library's tests construct)
    construct: tuple = ()
    tags: tuple = ()
    description: str = ""
    origin: str = "builtin"  # builtin | user
    #: the row says how its errors are scaled (``kind:`` or ``ulp_floor:``); a user row that does
    #: not is elementwise by default, and the gate checks that on base's worker before judging
    #: its gradients (gate.judge.structure)
    floor_declared: bool = True

    # -- helpers -------------------------------------------------------------------------
    def threshold(self, dtype: str) -> Threshold:
        return self.thresholds.get(dtype, Threshold())

    def layout(self, name: Optional[str]) -> Optional[LayoutSpec]:
        if not name or name == "default":
            return None
        for lay in self.layouts:
            if lay.name == name:
                return lay
        raise ConfigError(f"operator {self.name} has no layout {name!r}")

    @property
    def module(self) -> str:
        path = self.callable
        if ":" in path:
            return path.split(":", 1)[0]
        return path.rsplit(".", 1)[0]

    @property
    def qualname(self) -> str:
        path = self.callable
        if ":" in path:
            return path.split(":", 1)[1]
        return path.rsplit(".", 1)[1]

    # -- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "framework": self.framework,
            "callable": self.callable,
            "inputs": [t.to_dict() for t in self.inputs],
            "params": {p.name: p.to_dict() for p in self.params},
            "dims": {n: list(r) + ([dict(self.reach)[n]] if n in dict(self.reach) else []) for n, r in self.dims},
            "dtypes": list(self.dtypes),
            "devices": list(self.devices),
            "modes": list(self.modes),
            "layouts": {lay.name: lay.to_dict() for lay in self.layouts},
            "reference": self.reference,
            **({"elementwise": True} if self.elementwise else {}),
            **({"truth": self.truth} if self.truth else {}),
            "thresholds": {d: t.to_dict() for d, t in self.thresholds.items()},
            "kind": self.kind,
            "exact": self.exact,
            "ulp_floor": self.ulp_floor,
            "sources": list(self.sources),
            "native": list(self.native),
            "twin": self.twin,
            "opinfo": self.opinfo,
            "batch_dim": self.batch_dim,
            "grad": self.grad,
            "oracles": list(self.oracles) if self.oracles is not None else None,
            "oracle_args": {k: dict(v) for k, v in self.oracle_args.items()},
            **({"construct": dict(self.construct)} if self.construct else {}),
            "tags": list(self.tags),
            "description": self.description,
            "origin": self.origin,
            **({} if self.floor_declared else {"floor_declared": False}),
        }

    @classmethod
    def from_dict(cls, raw: Mapping, defaults: Optional[Mapping] = None, origin: str = "builtin") -> "OpSpec":
        defaults = dict(defaults or {})
        merged = {**defaults, **dict(raw)}
        name = merged.get("name")
        if not name:
            raise ConfigError(f"operator without a name: {dict(raw)!r}")
        for key in ("framework", "callable", "inputs"):
            if key not in merged:
                raise ConfigError(f"operator {name}: missing key '{key}'")
        kind = merged.get("kind", "elementwise")
        thresholds = {}
        kind_thr = dict((defaults.get("thresholds_by_kind") or {}).get(kind, {}))
        for dtype, thr in {**kind_thr, **dict(merged.get("thresholds") or {})}.items():
            thresholds[dtype] = Threshold(
                ulp=float(thr.get("ulp", math.inf)), abs=float(thr.get("abs", math.inf))
            )
        dims_raw = merged.get("dims") or {}
        dims = tuple((str(k), tuple(v[:2]) if isinstance(v, (list, tuple)) else (v, v)) for k, v in dims_raw.items())
        reach = tuple((str(k), int(v[2])) for k, v in dims_raw.items() if isinstance(v, (list, tuple)) and len(v) > 2)
        layouts_raw = merged.get("layouts")
        user_torch = origin == "user" and merged.get("framework") == "torch"
        if layouts_raw is None and user_torch and any(len(t.get("shape") or ()) >= 1 for t in merged.get("inputs") or ()):
            # what real callers pass: non-contiguous tensors (a transposed or sliced view); a
            # `.view(-1)` that breaks on them is found by default ("layouts: {}" turns it off)
            layouts_raw = {"noncontiguous": {"memory_format": "noncontiguous", "auto": True}}
        layouts_raw = layouts_raw or {}
        try:
            spec = cls(
                name=str(name),
                framework=str(merged["framework"]),
                callable=str(merged["callable"]),
                inputs=tuple(TensorSpec.from_dict(t) for t in merged["inputs"]),
                params=tuple(ParamSpec.from_dict(k, v) for k, v in dict(merged.get("params") or {}).items()),
                dims=dims,
                reach=reach,
                dtypes=tuple(merged.get("dtypes", LOW_DTYPES)),
                devices=tuple(merged.get("devices", ("cpu", "cuda"))),
                modes=tuple(merged.get("modes", ("input",))),
                layouts=tuple(LayoutSpec.from_dict(k, v) for k, v in dict(layouts_raw).items()),
                reference=merged.get("reference"),
                elementwise=bool(merged.get("elementwise", False)),
                truth=merged.get("truth"),
                thresholds=thresholds,
                kind=kind,
                exact=bool(merged.get("exact", False)),
                ulp_floor=str(merged.get("ulp_floor", "dtype" if kind == "elementwise" else "output")),
                sources=tuple(merged.get("sources", ())),
                native=tuple(merged.get("native", ())),
                twin=merged.get("twin"),
                opinfo=merged.get("opinfo"),
                batch_dim=merged.get("batch_dim"),
                # user operators: gradients are checked by default ("grad: false" turns it off): a
                # dropped epsilon under a norm is a backward-only NaN in TensorFlow as in PyTorch
                # (tensorflow/model-remediation 6a7ea561)
                grad=bool(merged.get("grad", origin == "user" and merged.get("framework") in ("torch", "tensorflow"))),
                oracles=tuple(merged["oracles"]) if merged.get("oracles") is not None else None,
                oracle_args={str(k): dict(v or {}) for k, v in dict(merged.get("oracle_args") or {}).items()},
                construct=_construct(name, merged.get("construct")),
                tags=tuple(merged.get("tags", ())),
                description=str(merged.get("description", "")),
                origin=origin,
                floor_declared=bool(merged.get("floor_declared", "kind" in merged or "ulp_floor" in merged)),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"operator {name}: {exc}") from exc
        check_packs(spec.name, spec.inputs)
        for dt in spec.dtypes:
            if dt not in FLOAT_DTYPES:
                raise ConfigError(f"operator {name}: unsupported dtype {dt!r} (use {', '.join(FLOAT_DTYPES)})")
        for m in spec.modes:
            if m not in MODES:
                raise ConfigError(f"operator {name}: unknown mode {m!r} (use {', '.join(MODES)})")
        from ..backends import FRAMEWORKS

        if spec.framework not in FRAMEWORKS:
            raise ConfigError(f"operator {name}: framework must be {' or '.join(FRAMEWORKS)}, not {spec.framework!r}")
        return spec

    def replace(self, **changes) -> "OpSpec":
        return dataclasses.replace(self, **changes)


def _literal(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and all(_literal(x) for x in v)


def _construct(name: str, raw: Any) -> tuple:
    """A row's ``construct`` mapping as ((argument, value), ...): literal values only (numbers,
    strings, booleans, null and lists of them; a list is passed as a tuple, as sizes are)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"operator {name}: construct must map constructor arguments to values, not {raw!r}")
    out = []
    for k, v in raw.items():
        if not _literal(v):
            raise ConfigError(f"operator {name}: construct.{k} must be a number, string, boolean, null or a list "
                              f"of them, not {v!r} (a tensor argument needs a function that builds the module)")
        out.append((str(k), _frozen(v)))
    return tuple(out)


def _frozen(v: Any) -> Any:
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v
