"""Operator specs inferred from what is known about a callable: the calls the library's own
tests make (harvested, :mod:`gate.search.harvest`), its signature (defaults, annotations), and,
where neither says enough, a list of small shapes of a few ranks to probe in that order.

Everything here is data in, spec dicts out (the ``.dl-gate.yml`` row form); nothing imports
the library or a framework. :func:`candidates` gives the specs to try, best first."""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..search.seeds import CallRecord, Opaque, TensorArg, TensorSeq

#: annotations that mean "not a tensor" (a required parameter with one of them and no default
#: cannot be probed with tensors)
SCALAR_ANNOTATIONS = {"int", "float", "bool", "str", "Optional[int]", "Optional[float]", "Optional[str]",
                      "Tuple[int, int]", "tuple", "list", "dict", "List[int]", "Sequence[int]", "Callable"}
#: parameter names that mean a file or a place: never probed (probing must not write files)
PATH_NAMES = {"path", "filename", "file", "fname", "filepath", "url", "dir", "directory", "folder", "root"}
#: dims of the probed shapes: small, so one evaluation is milliseconds
PROBE_DIMS = {"N": [1, 8], "L": [1, 16], "D": [1, 64], "C": [1, 4], "H": [1, 16], "W": [1, 16]}
PROBE_SHAPES: List[Tuple[list, Dict[str, list]]] = [
    (["N", "D"], {}),
    (["D"], {}),
    (["N", "L", "D"], {}),
    (["N", "C", "H", "W"], {}),
    (["N", 3], {}),
    (["N", 4], {}),
    (["N", 3, 3], {}),
    (["N", 3, "H", "W"], {}),
    (["N", 4, 4], {}),
]
PROBE_DOMAINS = [None, "prob"]


@dataclass
class Operator:
    """One discovered operator: where it lives and what the child process said it is."""

    name: str  # the gate's name for it (package.qualname)
    module: str
    qualname: str
    kind: str  # function | module | autograd_function | layer | custom_op | method (of a class: qualname Cls.meth)
    file: str
    line: int
    framework: str = "torch"
    params: List[dict] = field(default_factory=list)  # the call signature (self/ctx dropped)
    init: List[dict] = field(default_factory=list)  # constructor signature of a class
    loss: bool = False  # a Keras Loss class (kind layer): computes at its dtype=, no mixed policy of its own
    method: str = "call"  # the method a Keras layer is called through (``__call__`` where it overrides it)

    @property
    def callable(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def class_name(self) -> str:
        """The class a class operator or a method builds (``SPD`` of ``SPD.norm``)."""
        return self.qualname.rsplit(".", 1)[0] if self.kind == "method" else self.qualname

    @property
    def class_path(self) -> Optional[str]:
        """The class whose construction the recorder records (a class operator's, a method's)."""
        if self.kind in ("module", "layer"):
            return self.callable
        if self.kind == "method":
            return self.callable.rsplit(".", 1)[0]
        return None

    @property
    def harvest_target(self) -> str:
        """The attribute the recorder wraps: a class's ``forward`` / ``call`` / ``apply``."""
        if self.kind == "module":
            return f"{self.module}:{self.qualname}.forward"
        if self.kind == "layer":
            return f"{self.module}:{self.qualname}.{self.method}"
        if self.kind == "autograd_function":
            return f"{self.module}:{self.qualname}.apply"
        return self.callable

    def required_init(self) -> List[str]:
        return [p["name"] for p in self.init if not p["has_default"] and p["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD")]


def _literal(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and all(_literal(x) for x in v)


def _yaml_value(v: Any) -> Any:
    return [_yaml_value(x) for x in v] if isinstance(v, (list, tuple)) else v


def bind_init(op: Operator, rec: CallRecord) -> Tuple[Optional[Dict[str, Any]], str]:
    """A recorded construction's arguments by name, as a row's ``construct`` (None, why) when
    one cannot be written down: a tensor or an object, or extra positional arguments."""
    names = [p["name"] for p in op.init if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    if len(rec.args) > len(names):
        return None, f"{op.qualname}(...) takes {len(rec.args) - len(names)} positional argument(s) beyond its named ones"
    kw = dict(zip(names, rec.args))
    kw.update(rec.kwargs)
    required = set(op.required_init())
    out = {}
    for k, v in kw.items():
        if isinstance(v, TensorArg) or not _literal(v):
            if k not in required and any(p["name"] == k for p in op.init):
                # an object for an argument with a default (a Keras layer's gamma_constraint=UnitNorm(),
                # a regulariser): training-time settings the forward pass does not read; the
                # construction keeps its literal arguments (GroupNormalization(groups=4))
                continue
            if isinstance(v, (TensorArg, TensorSeq)):
                return None, f"the tests construct it with a tensor ({k})"
            return None, f"the tests construct it with an object ({k}={v!r})"
        out[k] = _yaml_value(v)
    return out, ""


def constructed(op: Operator, records: Sequence[CallRecord]) -> Tuple[Optional[Dict[str, Any]], List[CallRecord], str]:
    """A class operator whose constructor needs arguments, built as the library's tests build it:
    the recorded construction whose instances the tests called most that can be written down
    (literal arguments), with the calls of those instances; (None, [], why) when there is none."""
    need = ", ".join(op.required_init())
    inits = [r for r in records if r.kind == "init"]
    calls = [r for r in records if r.kind == "call"]
    how = ("give it a row with construct: {name: value}: docs/config.md, 'A module whose constructor "
           "needs arguments'")
    if not inits:
        return None, [], f"its constructor needs {need} and no test constructs it ({how})"
    uses = collections.Counter(r.ctor for r in calls if r.ctor)
    why = ""
    for rec in sorted(inits, key=lambda r: -uses.get(r.ctor, 0)):  # stable: the tests' order among equals
        kw, bad = bind_init(op, rec)
        if kw is None:
            why = why or bad
            continue
        mine = [r for r in calls if r.ctor == rec.ctor]
        if mine:
            return kw, mine, ""
        why = why or "the tests construct it but never call what they built"
    if why.startswith("the tests construct it with a"):  # a tensor or an object: no YAML value says it
        how = ("a value a row's construct cannot hold: write a function that builds it from its input and "
               "point a row's callable at it: docs/config.md, 'A module whose constructor needs arguments'")
    return None, [], f"its constructor needs {need}: {why} ({how})"


def _is_setting(v: Any) -> bool:
    """A constructor argument that picks a code path rather than a size: a flag, a mode's name,
    None (``weight=None`` against a given weight)."""
    return v is None or isinstance(v, (bool, str))


def other_construction(op: Operator, records: Sequence[CallRecord], primary: Dict[str, Any]
                       ) -> Optional[Tuple[Dict[str, Any], List[CallRecord], List[str]]]:
    """Another construction of a class operator beside ``primary`` (the one its row is built
    with), where the tests build it with other *settings*: ``(construct, calls, settings)`` of
    the recorded construction (or, for a constructor that needs no argument, the default one)
    whose flags, mode names and None arguments differ from ``primary``'s in the most places
    (the default construction first among equals, then the one whose instances the tests called
    most), with the calls to replay (those made on its instances; every call for the default
    one) and the differing arguments in signature order; None where every construction has
    ``primary``'s settings (sizes alone pick no other path).

    A class is often built two ways that run different code: deel-lip's ``KR(multi_gpu=True)``
    calls ``_kr_multi_gpu``, ``KR()`` calls ``_kr``; its tests call the first more, and a fix
    of ``_kr`` (28a867d) changed nothing the row built as ``KR(multi_gpu=True)`` computes."""
    defaults = {p["name"]: p["default"] for p in op.init if p["has_default"] and not isinstance(p["default"], dict)}
    order = [p["name"] for p in op.init]
    base = {**defaults, **primary}

    def differing(kw: Dict[str, Any]) -> List[str]:
        full = {**defaults, **kw}
        keys = [k for k in order if k in full or k in base] + sorted((set(full) | set(base)) - set(order))
        return [k for k in keys if (_is_setting(full.get(k)) or _is_setting(base.get(k)))
                and (k in full) == (k in base) and full.get(k) != base.get(k)]

    inits = [r for r in records if r.kind == "init"]
    calls = [r for r in records if r.kind == "call"]
    uses = collections.Counter(r.ctor for r in calls if r.ctor)
    options: List[Tuple[int, int, int, int, Dict[str, Any], List[CallRecord]]] = []
    if not op.required_init() and calls:
        options.append((len(differing({})), 1, len(calls), 0, {}, calls))
    for i, rec in enumerate(inits):
        kw, _ = bind_init(op, rec)
        mine = [r for r in calls if r.ctor == rec.ctor]
        if kw is None or not mine:
            continue
        options.append((len(differing(kw)), 0, uses.get(rec.ctor, 0), -(i + 1), kw, mine))
    options = [o for o in options if o[0] > 0]
    if not options:
        return None
    best = max(options, key=lambda o: o[:4])
    return best[4], best[5], differing(best[4])


def _positional_names(op: Operator) -> List[str]:
    return [p["name"] for p in op.params if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]


def bind(op: Operator, rec: CallRecord) -> Optional[Dict[str, Any]]:
    """The record's arguments by parameter name (``None`` when they do not fit the signature)."""
    names = _positional_names(op)
    args = list(rec.args)
    if op.kind in ("module", "layer", "method") and args and isinstance(args[0], Opaque):
        args = args[1:]  # the recorded forward's (method's) self
    star = next((p["name"] for p in op.params if p["kind"] == "VAR_POSITIONAL"), None)
    extra = args[len(names):]
    if extra and (star is None or not all(isinstance(a, TensorArg) for a in extra)):
        return None
    out = dict(zip(names, args))
    if extra:  # the function's *args, all tensors: an input pack passed one by one
        out["*" + star] = TensorSeq(extra)
    for k, v in rec.kwargs.items():
        if k in out:
            return None
        out[k] = v
    return unpack(out)


#: the most tensors of one list argument init gates as an input pack
MAX_PACK = 8


class PackItem(TensorArg):
    """A tensor of a list argument (``quat_composition([q0, q1, q2])``), bound as an input of
    its own: ``pack`` is the argument's name, ``index`` its place in the list."""

    def __init__(self, t: TensorArg, pack: str, index: int):
        super().__init__(t.shape, t.dtype, t.values, t.cls)
        self.pack, self.index = pack, index


def unpack(bound: Dict[str, Any]) -> Dict[str, Any]:
    """``bound`` with each list-of-tensors argument (at most :data:`MAX_PACK` of them) replaced by
    its tensors, named ``ARG_0``, ``ARG_1``... in the argument's place: the inputs of one pack
    (a list of another length is another tensor signature)."""
    out: Dict[str, Any] = {}
    for k, v in bound.items():
        base = k.lstrip("*")  # "*features": the function's *features
        if isinstance(v, TensorSeq) and 0 < len(v) <= MAX_PACK and not any(f"{base}_{i}" in bound for i in range(len(v))):
            for i, t in enumerate(v):
                out[f"{base}_{i}"] = PackItem(t, k, i)
        elif not k.startswith("*"):
            out[k] = v
    return out


def _tensor_kind(t: TensorArg) -> str:
    d = t.dtype.lower()
    if "bool" in d:
        return "bool"
    if "int" in d or "long" in d:
        return "index"
    if "complex" in d:
        return "complex"
    return "float"


def _domain(values: List[np.ndarray]) -> Optional[Any]:
    vals = [v for v in values if v is not None and v.size]
    if not vals:
        return None
    lo = min(float(np.nanmin(v)) for v in vals)
    hi = max(float(np.nanmax(v)) for v in vals)
    if lo >= 0.0 and hi <= 1.0:
        return "prob" if lo > 0.0 or hi < 1.0 else {"name": "prob", "lo": 0.0, "hi": 1.0}
    if lo >= 0.0:
        return "nonneg"
    std = max(float(np.nanstd(v)) for v in vals)
    scale = max(abs(lo), abs(hi), std)
    if scale > 2.0:
        return {"name": "real", "scale": float(f"{min(std if std > 0 else scale, 1e4):.2g}")}
    return None


def _label_values(name: str, values: List[Optional[np.ndarray]]) -> Optional[dict]:
    """A set domain for a target the tests passed as signed labels: a label-like argument
    (:data:`LABEL_NAMES`) that every recorded call filled with at most three distinct values,
    repeated in at least one call (a batch of labels, not a few real numbers), -1 or another
    negative value among them; the set is every value those calls passed. deel-lip's KR losses
    take ``y_true`` of 1 and 0, or 1 and -1 (and, scaled for several GPUs, about -2 and 2), and
    select a class with ``y_true == 1``: drawn from real values no element is a label, every draw
    is NaN, and init left the loss out. Labels of 0 and 1 alone keep the closed [0, 1] of
    :func:`_domain` (soft labels are what focal and cross-entropy losses take there)."""
    if not _label_like(name):
        return None
    seen: set = set()
    repeated = False
    for v in values:
        if v is None or not v.size:
            continue  # not recorded (too large): no evidence either way
        u = np.unique(v)
        if u.size > 3 or not np.isfinite(u).all():
            return None
        repeated |= v.size >= 2 * u.size
        seen.update(float(x) for x in u)
    if not repeated or len(seen) < 2 or min(seen) >= 0.0 or len(seen) > MAX_LABEL_VALUES:
        return None
    return {"name": "labels", "values": sorted(seen)}


#: the most values a label set init writes may hold (the union of the tests' label sets)
MAX_LABEL_VALUES = 16


def _dim_name(i: int, used: set) -> str:
    letters = "NCDHWLKMPQRSTUVXYZ"
    for ch in letters:
        if ch not in used:
            used.add(ch)
            return ch
    name = f"D{i}"
    used.add(name)
    return name


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


@dataclass
class Inferred:
    spec: Optional[dict]  # a spec dict, or None
    why: str  # where it came from, or why there is none
    calls: int = 0  # test calls it is built from


def _signature(b: Dict[str, Any]) -> tuple:
    """The tensor signature of one bound call: (name, rank, kind) of each tensor argument."""
    return tuple((k, len(v.shape), _tensor_kind(v)) for k, v in b.items() if isinstance(v, TensorArg))


def _shared_dims(best: tuple, calls: List[Dict[str, Any]]) -> Tuple[Dict[tuple, Any], Dict[str, list],
                                                                     Dict[str, List[int]]]:
    """Axis positions whose sizes agree in every call share a name; a size that never changes
    stays a literal. Returns the shape entry of each (input, axis), the dims' ranges and the
    sizes each dim took, call by call."""
    positions = [(k, ax) for k, rank, _ in best for ax in range(rank)]
    sizes = {p: [int(c[p[0]].shape[p[1]]) for c in calls] for p in positions}
    groups: List[List[tuple]] = []
    for p in positions:
        for g in groups:
            if sizes[g[0]] == sizes[p]:
                g.append(p)
                break
        else:
            groups.append([p])
    used: set = set()
    shape_of: Dict[tuple, Any] = {}
    dims: Dict[str, list] = {}
    dim_values: Dict[str, List[int]] = {}
    for g in groups:
        vals = sizes[g[0]]
        if len(set(vals)) == 1:
            for p in g:
                shape_of[p] = vals[0]
            continue
        name = _dim_name(len(dims), used)
        dims[name] = [max(1, min(vals)), max(vals)]
        dim_values[name] = vals
        for p in g:
            shape_of[p] = name
    return shape_of, dims, dim_values


def _input_rows(op: Operator, best: tuple, calls: List[Dict[str, Any]], shape_of: Dict[tuple, Any]) -> List[dict]:
    """The spec's ``inputs``: one row per tensor of the signature, with its shape, kind, index
    bound or value domain, and whether it is passed by keyword."""
    names = [k for k, _, _ in best]
    inputs = []
    positional = _positional_names(op)
    order = [p["name"] for p in op.params]
    packs = {k: calls[0][k].pack for k in names if isinstance(calls[0][k], PackItem)}
    for i, (k, rank, kind) in enumerate(best):
        row: Dict[str, Any] = {"name": k, "shape": [shape_of[(k, ax)] for ax in range(rank)]}
        if k in packs:
            row["pack"] = packs[k]
        if kind != "float":
            row["kind"] = kind
        if kind == "index":
            hi = min(int(np.max(c[k].values)) + 1 if c[k].values is not None and c[k].values.size else 1 for c in calls)
            row["index_hi"] = max(1, hi)
        if kind == "float":
            dom = _label_values(k, [c[k].values for c in calls]) or _domain([c[k].values for c in calls])
            if dom is not None:
                row["domain"] = dom
        classes = {c[k].cls for c in calls}
        if len(classes) == 1 and None not in classes:  # the library's own tensor subclass, in every call
            row["subclass"] = classes.pop()
        # positional only while every parameter before it is a positional tensor input (or a
        # pack of them); the function's *args always
        arg = packs.get(k, k)
        given = set(names[:i]) | {packs[n] for n in names[:i] if n in packs}
        before = order[: order.index(arg)] if arg in order else []
        if not arg.startswith("*") and (arg not in positional or any(b not in given for b in before)):
            row["keyword"] = True
        inputs.append(row)
    return inputs


def _param_rows(op: Operator, calls: List[Dict[str, Any]], dim_values: Dict[str, List[int]],
                others: Sequence[Dict[str, Any]] = ()) -> Tuple[Dict[str, Any], List[str]]:
    """The spec's ``params``: each non-tensor argument's observed values as a value or choices
    (most common first, at most 6), or an ``expr`` where it equals a dim in every call; and the
    names of those dropped because a value is an object the gate cannot replay. ``others``: the
    calls whose tensors have another signature (ranks, names): their tensors are not replayed,
    their parameter values are (a test of ``gamma=2.0`` on a small hand-written tensor is still a
    setting the operator is meant for)."""
    params: Dict[str, Any] = {}
    dropped: List[str] = []
    tensors = {k for c in calls for k, v in c.items() if isinstance(v, TensorArg)}  # the replayed inputs
    every = list(calls) + list(others)
    for k in sorted({k for c in every for k, v in c.items() if not isinstance(v, TensorArg)} - tensors):
        values = [c.get(k, "__absent__") for c in calls]
        # another signature's tensor argument is not a setting (nor an absence: no default)
        seen = values + [c.get(k, "__absent__") for c in others if not isinstance(c.get(k), TensorArg)]
        if any(isinstance(v, Opaque) or (isinstance(v, (list, tuple)) and any(isinstance(x, (Opaque, TensorArg)) for x in v))
               for v in seen):
            dropped.append(k)
            continue
        present = [_plain(v) for v in seen if v != "__absent__"]
        if not present:
            continue
        default = next((p for p in op.params if p["name"] == k), {})
        if "__absent__" in seen and default.get("has_default"):
            present.append(_plain(default.get("default")))
        if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            # a size: tied to a dim of the replayed calls (another signature's sizes are not a setting)
            tied = [d for d, dv in dim_values.items()
                    if len(dv) == len(values) and all(v == x for v, x in zip(values, dv))]
            if tied:
                params[k] = {"expr": tied[0]}
                continue
        uniq: List[Any] = []
        for v in present:
            if v not in uniq:
                uniq.append(v)
        counts = collections.Counter(repr(v) for v in present)
        uniq.sort(key=lambda v: -counts[repr(v)])
        uniq = uniq[:6]
        if len(uniq) == 1:
            params[k] = uniq[0] if not isinstance(uniq[0], list) else {"value": uniq[0]}
        else:
            params[k] = {"choices": uniq}
    return params, dropped


def from_records(op: Operator, records: Sequence[CallRecord], framework: str, sources: List[str]) -> Inferred:
    """A spec built from the test calls of ``op``: the most common tensor signature (names,
    ranks, kinds), dims shared where sizes agree in every call (a size that never changes stays
    a literal), observed ranges and value domains, observed parameter values as choices."""
    bound = [b for b in (bind(op, r) for r in records) if b]
    if not bound:
        return Inferred(None, "no test call fits its signature")
    sig_count: Dict[tuple, int] = collections.Counter()
    for b in bound:
        sig = _signature(b)
        if sig:
            sig_count[sig] += 1
    if not sig_count:
        return Inferred(None, "its test calls pass no tensor")
    best = max(sig_count.items(), key=lambda kv: (kv[1], -len(kv[0])))[0]
    if any(kind == "complex" for _, _, kind in best):
        return Inferred(None, "complex tensors (the gate compares real outputs)")
    names = [k for k, _, _ in best]
    calls = [b for b in bound if _signature(b) == best]
    shape_of, dims, dim_values = _shared_dims(best, calls)
    inputs = _input_rows(op, best, calls, shape_of)
    params, dropped = _param_rows(op, calls, dim_values, others=[b for b in bound if _signature(b) != best])
    required = [p["name"] for p in op.params if not p["has_default"] and p["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD")]
    packed = {calls[0][k].pack for k in names if isinstance(calls[0][k], PackItem)}
    missing = [r for r in required if r not in names and r not in params and r not in packed]
    if missing:
        return Inferred(None, f"required argument {missing[0]} is not replayable from the test calls "
                              f"({'an object' if missing[0] in dropped else 'absent'})")
    spec = {"name": op.name, "callable": op.callable, "kind": "composite", "sources": sources}
    if framework != "torch":
        spec["framework"] = framework
    if params:
        spec["params"] = params
    if dims:
        spec["dims"] = dims
    spec["inputs"] = inputs
    return Inferred(spec, f"{len(calls)} test call(s)", calls=len(calls))


def widen(spec: dict) -> Optional[dict]:
    """``spec`` with the float inputs' bounded domains (what the tests happened to draw, e.g.
    ``torch.rand``) opened to real values; ``None`` when nothing is bounded. A [0, 1] the tests
    reached at both ends (0/1 labels and masks: fvcore's focal loss targets, ``randint(0, 2)``)
    is what the input means, not what a draw happened to give: it stays (a target of -65504
    makes every loss overflow on both sides and hides what the PR changed)."""
    import copy

    out = copy.deepcopy(spec)
    changed = False
    for t in out["inputs"]:
        dom = t.get("domain")
        name = dom.get("name") if isinstance(dom, dict) else dom
        if isinstance(dom, dict) and name == "prob" and dom.get("lo") == 0.0 and dom.get("hi") == 1.0:
            continue
        if name == "prob" and _label_like(t["name"]):
            continue  # soft labels the tests drew with torch.rand (kornia's binary focal loss target)
        if name in ("prob", "nonneg") and t["name"].lower() in NONNEG_NAMES:
            continue  # weights of samples or classes: Keras rejects a negative sample_weight outright
        if t.get("kind", "float") == "float" and name in ("prob", "nonneg"):
            del t["domain"]
            changed = True
    return out if changed else None


#: argument names of targets and masks: values in [0, 1] are what they mean (labels, soft
#: labels, masks), however the tests drew them; a target of -2.0 asks a loss a question no
#: caller asks, and a fix that clamps it reads as a behaviour change
LABEL_NAMES = frozenset({"target", "targets", "label", "labels", "y_true", "gt", "ground_truth", "mask", "masks"})


#: argument names of weights that are never negative by what they mean (a loss's per-sample and
#: per-class weights; not a layer's ``weight``, which is any real matrix): a [0, ...) the tests
#: passed stays (tensorflow/model-remediation's MMDLoss: "`sample_weight` cannot contain any
#: negative weights", every widened spec rejected, the loss left out)
NONNEG_NAMES = frozenset({"sample_weight", "sample_weights", "class_weight", "class_weights", "pos_weight"})


#: argument names of probabilities: a [0, 1] the tests drew is what the argument means (a fix
#: that clips a sampling probability into (0, 1], tensorflow/recommenders 406f8e1, would read as
#: a behaviour change on probabilities of -3 or 7)
PROB_SUFFIXES = ("prob", "probs", "probability", "probabilities", "proba")


def _label_like(name: str) -> bool:
    n = name.lower()
    return n in LABEL_NAMES or n.endswith(("_target", "_targets", "_label", "_labels", "_mask")) \
        or n.split("_")[-1] in PROB_SUFFIXES


#: bool parameters never flipped: they change what is computed on, not how (in-place writes,
#: the output's structure, training-mode randomness)
BOOL_KEEP = ("inplace", "in_place", "out", "training", "deterministic")


def hinted_options(op: Operator, spec: dict) -> Dict[str, list]:
    """Other values of parameters no test call set, from their type hints and defaults: the
    members of a ``Literal[...]``, a bool's other value. Each is tried by the probe before it
    becomes a choice."""
    import ast
    import re

    taken = set(spec.get("params") or {}) | {t["name"] for t in spec["inputs"]}
    out: Dict[str, list] = {}
    for p in op.params:
        if not p["has_default"] or p["name"] in taken or isinstance(p["default"], dict):
            continue
        ann = (p.get("annotation") or "").replace("typing.", "").replace("typing_extensions.", "")
        default = p["default"]
        values: List[Any] = []
        m = re.fullmatch(r"(?:Optional\[)?Literal\[(.*)\]\]?", ann)
        if m:
            try:
                values = list(ast.literal_eval(f"[{m.group(1)}]"))
            except (ValueError, SyntaxError):
                values = []
        elif isinstance(default, bool) and (ann in ("", "bool")) and p["name"] not in BOOL_KEEP \
                and not p["name"].startswith(("return_", "keep")):
            values = [not default]
        values = [v for v in values if v != default and isinstance(v, (bool, int, float, str))][:6]
        if values:
            out[p["name"]] = values
    return out


#: int parameters that name an axis: another value is another function, not another size
AXIS_NAMES = frozenset({"dim", "axis", "dims", "axes", "start_dim", "end_dim", "dim0", "dim1"})


def widened_options(op: Operator, spec: dict) -> Dict[str, list]:
    """Other values of the numeric parameters the tests set, so that one value seen in a test does
    not pin the row (a function tested only at ``alpha=1.5`` is also gated at its default, where
    a fast path may live): the signature's default, then for a float half and twice each value
    (kept inside (0, 1) for a value there: a probability, a momentum), for an int (a size, a
    count, a window: ``k``, ``groups``, ``kernel_size``) half and twice each value of 2 or more.
    Axes (``dim``, ``axis``) keep the tests' values. Each is tried by the probe before it becomes
    a choice (an int that does not fit the input's shape is dropped there)."""
    out: Dict[str, list] = {}
    defaults = {p["name"]: p["default"] for p in op.params if p["has_default"]}
    for name, raw in (spec.get("params") or {}).items():
        seen = raw.get("choices") if isinstance(raw, dict) else [raw]
        if not isinstance(seen, list) or not seen:
            continue
        is_float = all(isinstance(v, float) for v in seen)
        is_int = all(isinstance(v, int) and not isinstance(v, bool) for v in seen) and name not in AXIS_NAMES
        if not (is_float or is_int):
            continue
        new: list = []
        d = defaults.get(name)
        if is_float and isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d):
            new.append(float(d))
        elif is_int and isinstance(d, int) and not isinstance(d, bool):
            new.append(d)
        for v in seen:
            if is_int:
                new += [v // 2, v * 2] if v >= 2 else []
                continue
            if not math.isfinite(v) or v == 0.0:
                continue
            new += [v / 2, (1 + v) / 2] if 0.0 < v < 1.0 else [v / 2, v * 2]
        uniq = [v for i, v in enumerate(new) if v not in seen and v not in new[:i]]
        if uniq:
            out[name] = uniq[:3]
    return out


def tensor_params(op: Operator) -> Tuple[Optional[List[str]], str]:
    """The parameters a probe feeds tensors to (required ones with no non-tensor annotation), or
    ``(None, why)`` when a required parameter cannot be a tensor."""
    out = []
    for p in op.params:
        if p["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD") or p["has_default"]:
            continue
        ann = (p.get("annotation") or "").replace("typing.", "")
        if p["name"].lower() in PATH_NAMES:
            return None, f"takes a {p['name']} (never probed: it could write files)"
        if ann in SCALAR_ANNOTATIONS or ann.startswith(("int", "float", "str", "bool", "Callable")):
            return None, f"required argument {p['name']}: {ann} has no default, and probing passes tensors only"
        out.append(p["name"])
    if not out:
        return None, "takes no required argument to feed a tensor to"
    return out, ""


def probe_specs(op: Operator, framework: str, sources: List[str]) -> Tuple[List[dict], str]:
    """Specs to probe, in order: every required tensor parameter gets the same small shape, of a
    few ranks and sizes, with real then (0, 1) values."""
    names, why = tensor_params(op)
    if names is None:
        return [], why
    positional = _positional_names(op)
    out = []
    for dom in PROBE_DOMAINS:
        for shape, _ in PROBE_SHAPES:
            dims = {d: list(PROBE_DIMS[d]) for d in shape if isinstance(d, str)}
            inputs = []
            for i, n in enumerate(names):
                row: Dict[str, Any] = {"name": n, "shape": list(shape)}
                if dom:
                    row["domain"] = dom
                if n not in positional or positional.index(n) != i:
                    row["keyword"] = True
                inputs.append(row)
            spec = {"name": op.name, "callable": op.callable, "kind": "composite", "sources": sources}
            if framework != "torch":
                spec["framework"] = framework
            spec["dims"] = dims
            spec["inputs"] = inputs
            out.append(spec)
    return out, ""


__all__ = ["Operator", "Inferred", "bind", "from_records", "hinted_options", "probe_specs", "tensor_params",
           "widen"]
