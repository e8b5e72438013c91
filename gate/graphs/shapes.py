"""Which catalogue operators can sit inside a graph, and how their shapes are solved.

A node's *primary* input is its first positional float tensor. An edge ``a -> b`` is valid when
``b``'s dims (and parameters) can be solved so that ``b``'s primary input shape, evaluated from
the spec's shape expressions, equals ``a``'s output shape — a small constraint problem over the
spec's dim ranges, solved by backtracking (:func:`solve_dims`). Further float inputs whose shape
expression is the primary's (``atan2``'s ``other``) can be fed by the graph too; every other
input is a node-owned constant. Output shapes are not declared in specs: they are measured by
running the operator once in float64 through its backend (:class:`ShapeProbe`), cached.

Parameter value spaces are split into *branches* (the MCTS arm's second decision): each choice
value, and for int / float ranges the Opera value classes (ints ``<=-2, -1, 0, 1, >=2``; floats
``<0, 0, >0``) inside the range.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..backends import get_backend
from ..backends.base import flatten
from ..ops import expr
from ..ops.spec import OpSpec, ParamSpec, TensorSpec, arrange
from ..search.inputs import derived_params, draw_values, tensor_shape

#: most parameter branches per operator before falling back to one-parameter-at-a-time
MAX_BRANCHES = 16
#: dim size classes for shape coverage (length-dependent code paths: 1, short, vector width+)
DIM_CLASSES = (("1", 1, 1), ("2..7", 2, 7), (">=8", 8, math.inf))


def dim_class(n: int) -> str:
    for name, lo, hi in DIM_CLASSES:
        if lo <= n <= hi:
            return name
    return DIM_CLASSES[0][0] if n < 1 else DIM_CLASSES[-1][0]


# ---------------------------------------------------------------------------------------
# parameter classes and branches
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParamClass:
    """One value class of one parameter: a fixed value, or an interval to draw from."""

    param: str
    label: str
    value: Any = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    kind: str = "value"  # value | int | float

    def draw(self, rng: np.random.Generator) -> Any:
        if self.kind == "value":
            return self.value
        if self.kind == "int":
            return int(rng.integers(int(self.lo), int(self.hi) + 1))
        return float(rng.uniform(self.lo, self.hi))


def value_label(v: Any) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, str):
        return v
    return repr(v)


def param_classes(p: ParamSpec) -> List[ParamClass]:
    """The classes a parameter's value space splits into (empty for derived parameters)."""
    if p.kind == "expr":
        return []
    if p.kind == "choice":
        out, seen = [], set()
        for c in p.choices or ():
            lab = value_label(c)
            if lab not in seen:
                seen.add(lab)
                out.append(ParamClass(p.name, lab, value=c))
        return out
    lo, hi = float(p.lo), float(p.hi)
    if p.kind == "int":
        lo_i, hi_i = int(math.ceil(lo)), int(math.floor(hi))
        out = []
        if lo_i <= -2:
            out.append(ParamClass(p.name, "<=-2", lo=lo_i, hi=min(hi_i, -2), kind="int"))
        for v in (-1, 0, 1):
            if lo_i <= v <= hi_i:
                out.append(ParamClass(p.name, str(v), value=v))
        if hi_i >= 2:
            out.append(ParamClass(p.name, ">=2", lo=max(lo_i, 2), hi=hi_i, kind="int"))
        return out
    out = []
    if lo < 0:
        out.append(ParamClass(p.name, "<0", lo=lo, hi=min(hi, -1e-12), kind="float"))
    if lo <= 0.0 <= hi:
        out.append(ParamClass(p.name, "0", value=0.0))
    if hi > 0:
        out.append(ParamClass(p.name, ">0", lo=max(lo, 1e-12), hi=hi, kind="float"))
    return out


@dataclass(frozen=True)
class Branch:
    classes: Tuple[ParamClass, ...]

    @property
    def label(self) -> str:
        return ",".join(f"{c.param}={c.label}" for c in self.classes) or "default"

    def draw(self, rng: np.random.Generator) -> Dict[str, Any]:
        return {c.param: c.draw(rng) for c in self.classes}


def branches(spec: OpSpec, cap: int = MAX_BRANCHES) -> List[Branch]:
    """Parameter branches of ``spec``: the product of its parameters' classes, or, when that
    exceeds ``cap``, the first class of each with one parameter varied at a time (every class
    still appears in some branch)."""
    per = [param_classes(p) for p in spec.params]
    per = [cs for cs in per if cs]
    if not per:
        return [Branch(())]
    total = 1
    for cs in per:
        total *= len(cs)
    if total <= cap:
        return [Branch(tuple(combo)) for combo in itertools.product(*per)]
    base = [cs[0] for cs in per]
    out = [Branch(tuple(base))]
    for i, cs in enumerate(per):
        for c in cs[1:]:
            combo = list(base)
            combo[i] = c
            out.append(Branch(tuple(combo)))
    return out


# ---------------------------------------------------------------------------------------
# eligibility
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GraphOp:
    """A catalogue operator as a graph node: its primary input, the inputs the graph may feed,
    its parameter branches."""

    spec: OpSpec
    primary: TensorSpec
    feedable: Tuple[TensorSpec, ...]  # graph-feedable inputs, primary first
    branches: Tuple[Branch, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def rank(self) -> int:
        return len(self.primary.shape)


def graph_op(spec: OpSpec, dtypes: Sequence[str] = ()) -> Tuple[Optional[GraphOp], str]:
    """``spec`` as a graph node, or ``None`` and why not."""
    if any(d not in spec.dtypes for d in dtypes):
        return None, f"does not support {', '.join(d for d in dtypes if d not in spec.dtypes)}"
    if any(t.pack for t in spec.inputs):
        return None, "takes a list of tensors (a graph edge feeds one tensor)"
    floats = [t for t in spec.inputs if t.kind == "float"]
    positional = [t for t in floats if not t.keyword]
    if not positional:
        return None, "no positional float input"
    primary = positional[0]
    if len(primary.shape) == 0:
        return None, "scalar primary input"
    feedable = tuple([primary] + [t for t in floats if t is not primary and tuple(t.shape) == tuple(primary.shape)])
    return GraphOp(spec=spec, primary=primary, feedable=feedable, branches=tuple(branches(spec))), ""


# ---------------------------------------------------------------------------------------
# shape solving
# ---------------------------------------------------------------------------------------
def _draw_free(lo: int, hi: int, rng: np.random.Generator) -> int:
    """A value for a dim nothing constrains: small sizes favoured, as the fuzzer does."""
    if rng.random() < 0.5:
        return int(rng.integers(lo, hi + 1))
    v = int(round(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(max(hi, 1)) + 1e-9))))
    return min(max(v, lo), hi)


def solve_dims(spec: OpSpec, shape_exprs: Sequence[Any], target: Sequence[int], params: Mapping[str, Any],
               rng: np.random.Generator, max_steps: int = 4000) -> Optional[Dict[str, int]]:
    """Dims of ``spec`` (within their declared ranges, given ``params``) that make the shape
    expressions ``shape_exprs`` evaluate to ``target``; ``None`` when there are none.

    Dims that appear bare in the shape are fixed by the target; dims inside an expression
    (``G*Cg``) are searched; dims the shape does not mention are drawn like the fuzzer draws
    them. Backtracking, with each shape entry checked as soon as its names are known."""
    if len(shape_exprs) != len(target):
        return None
    dim_names = [d for d, _ in spec.dims]
    bare: Dict[str, int] = {}
    for e, t in zip(shape_exprs, target):
        if isinstance(e, int):
            if e != t:
                return None
        elif isinstance(e, str) and e in dim_names:
            if bare.get(e, t) != t:
                return None
            bare[e] = int(t)
    in_expr = set()
    for e in shape_exprs:
        if isinstance(e, str) and e not in dim_names:
            in_expr |= expr.names(e) & set(dim_names)
    entries = [(e, int(t), expr.names(e) if isinstance(e, str) else set()) for e, t in zip(shape_exprs, target)]
    steps = [0]

    def check(env: Mapping[str, Any]) -> bool:
        for e, t, names in entries:
            if isinstance(e, str) and names <= env.keys():
                try:
                    if int(expr.evaluate(e, env)) != t:
                        return False
                except (ValueError, ZeroDivisionError, TypeError):
                    return False
        return True

    def rec(i: int, env: Dict[str, Any], dims: Dict[str, int]) -> Optional[Dict[str, int]]:
        steps[0] += 1
        if steps[0] > max_steps:
            return None
        if i == len(spec.dims):
            return dict(dims)
        name, (lo_e, hi_e) = spec.dims[i]
        try:
            lo, hi = int(expr.evaluate(lo_e, env)), int(expr.evaluate(hi_e, env))
        except (ValueError, ZeroDivisionError, TypeError):
            return None
        if lo > hi:
            return None
        if name in bare:
            cands = [bare[name]] if lo <= bare[name] <= hi else []
        elif name in in_expr:
            cands = list(range(lo, hi + 1))
            if len(cands) > 64:
                cands = sorted(set([lo, hi] + [int(v) for v in rng.integers(lo, hi + 1, size=62)]))
            rng.shuffle(cands)
        else:
            cands = [_draw_free(lo, hi, rng)]
        for v in cands:
            env[name] = v
            dims[name] = v
            if check(env):
                out = rec(i + 1, env, dims)
                if out is not None:
                    return out
            del env[name], dims[name]
        return None

    return rec(0, dict(params), {})


# ---------------------------------------------------------------------------------------
# output shapes, by running the operator once in float64
# ---------------------------------------------------------------------------------------
class ShapeProbe:
    """Output shape of an operator call, measured by running it in float64 on values drawn
    from its domains (cached per operator, parameters and dims)."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._cache: Dict[Tuple, Optional[Tuple[int, ...]]] = {}
        self.errors: Dict[str, str] = {}

    def __call__(self, spec: OpSpec, params: Mapping[str, Any], dims: Mapping[str, int]) -> Optional[Tuple[int, ...]]:
        key = (spec.name, tuple(sorted((k, repr(v)) for k, v in params.items())), tuple(sorted(dims.items())))
        if key in self._cache:
            return self._cache[key]
        shape = None
        try:
            shape = self._run(spec, params, dims)
        except Exception as exc:  # the combination is invalid for the operator
            self.errors[spec.name] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        self._cache[key] = shape
        return shape

    def _run(self, spec: OpSpec, params: Mapping[str, Any], dims: Mapping[str, int]) -> Optional[Tuple[int, ...]]:
        backend = get_backend(spec.framework)
        rng = np.random.default_rng(0)
        env = {**params, **dims}
        placed: list = []
        kwargs: Dict[str, Any] = dict(params)
        for t in spec.inputs:
            shape = tensor_shape(t, env)
            if t.kind == "index":
                hi = int(expr.evaluate(t.index_hi, env)) if t.index_hi is not None else 2
                arr = rng.integers(0, max(hi, 1), size=shape).astype(np.int64)
            elif t.kind == "bool":
                arr = rng.random(shape) < 0.5
            else:
                arr = draw_values(t.domain, shape, rng)
            placed.append((t, backend.to_native(arr, "float64", self.device)))
        args = arrange(placed, kwargs)
        fn = backend.resolve(spec.callable, spec.construct)
        result = backend.call(fn, args, kwargs, mode="input", dtype="float64", device=self.device)
        first = flatten(result)[:1]
        outs = backend.to_outputs(first)
        if not outs or not outs[0].is_float:
            return None
        return tuple(int(s) for s in np.shape(outs[0].array))


def node_params(op: GraphOp, branch: Branch, dims: Mapping[str, int], drawn: Mapping[str, Any]) -> Dict[str, Any]:
    """Concrete parameters: the branch's drawn values plus parameters derived from dims."""
    return derived_params(op.spec, dict(drawn), dims)


__all__ = [
    "GraphOp", "Branch", "ParamClass", "graph_op", "branches", "param_classes", "solve_dims", "ShapeProbe",
    "dim_class", "DIM_CLASSES", "node_params",
]
