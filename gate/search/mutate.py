"""Mutation operators. Each takes (candidate, spec, rng) and returns a new candidate or
``None`` when it does not apply. Predoo's constant perturbation is here alongside wider value,
scale, edge, regime, parameter and shape mutations. The table :data:`MUTATORS` is the extension
point.

A mutator may also declare keyword-only parameters, which :func:`bind` fills in:
``dtype`` (the dtype under test: edge values and value regimes depend on it) and ``choose``
(``choose(options) -> option``: which class to aim at, decided by the scheduler's second level,
see :mod:`gate.search.schedule`; uniform when the scheduler has none)."""
from __future__ import annotations

import inspect
import math
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..ops.spec import OpSpec
from . import randoms
from .coverage import dim_envelope, feasible_values, param_universe, realise_param, realise_size, size_classes_between
from .inputs import (Candidate, build_arrays, derived_params, draw, draw_dims, draw_params, edge_values,
                     pick_positions, project, regime_values)

Mutator = Callable[[Candidate, OpSpec, np.random.Generator], Optional[Candidate]]

#: edge values where operator bugs hide (FIELD_GUIDE §3), filtered by each tensor's domain
EDGE_VALUES = np.array(
    [0.0, 1e-8, -1e-8, 1e-7, 1e-6, -1e-6, 1e-5, 6.1e-5, 1e-4, 0.5, -0.5,
     1.0, -1.0, 1 - 2.0**-11, -(1 - 2.0**-11), 1 - 2.0**-24, 1 + 2.0**-10, -1 - 2.0**-10,
     2.0, 10.0, -10.0, 88.0, -88.0, 1e4, -1e4, 6.0e4, -6.0e4, 1e30, 6e-8, 1e-40]
)


def _float_inputs(spec: OpSpec, cand: Candidate) -> List[str]:
    return [t.name for t in spec.inputs if t.kind == "float" and cand.arrays.get(t.name) is not None
            and cand.arrays[t.name].size > 0]


def _pick_tensor(spec: OpSpec, cand: Candidate, rng: np.random.Generator) -> Optional[str]:
    names = _float_inputs(spec, cand)
    return names[int(rng.integers(len(names)))] if names else None


def _domain(spec: OpSpec, name: str):
    return next(t.domain for t in spec.inputs if t.name == name)


def perturb(theta: float) -> Mutator:
    """Predoo: add one constant δ ∈ [0, θ] to every element of one input."""

    def mutate(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
        name = _pick_tensor(spec, cand, rng)
        if name is None:
            return None
        return cand.derive(f"perturb_{theta:g}",
                           **{name: project(cand.arrays[name] + rng.uniform(0.0, theta), _domain(spec, name))})

    return mutate


def scale(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Multiply one input by 2^k, k in [-20, 20] (magnitude search)."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    return cand.derive("scale", **{name: project(cand.arrays[name] * 2.0 ** int(rng.integers(-20, 21)),
                                                 _domain(spec, name))})


def noise(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Relative gaussian noise on one input (local search around the parent)."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    rel = 10.0 ** rng.uniform(-4, -1)
    step = randoms.noise(rng, cand.arrays[name], rel)  # a + rel·(|a| + 1e-12)·N(0, 1), one pass
    return cand.derive("noise", **{name: project(step, _domain(spec, name))})


def edge(cand: Candidate, spec: OpSpec, rng: np.random.Generator, *, dtype: Optional[str] = None) -> Optional[Candidate]:
    """Set a few elements (or all) of one input to edge values of the dtype inside its domain."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    dom = _domain(spec, name)
    if dtype is None:
        vals = EDGE_VALUES
        if dom.lo is not None:
            vals = vals[vals > dom.lo]
        if dom.hi is not None:
            vals = vals[vals < dom.hi]
        if dom.lo is not None and dom.hi is not None:
            w = dom.hi - dom.lo
            vals = np.concatenate([vals, [dom.lo + w * 1e-6, dom.hi - w * 1e-6, dom.hi - w * 2.0**-11]])
    else:
        vals = edge_values(dom, dtype)
    if vals.size == 0:
        return None
    a = cand.arrays[name]
    k = max(1, int(a.size * rng.choice([0.0, 0.05, 0.3, 1.0])))
    idx = pick_positions(rng, a.size, k)
    if idx is None:  # every element: no copy of the parent to overwrite
        return cand.derive("edge", **{name: randoms.choice(rng, vals, a.size).reshape(a.shape)})
    flat = a.copy().reshape(-1)
    flat[idx] = randoms.choice(rng, vals, idx.size)
    return cand.derive("edge", **{name: flat.reshape(a.shape)})


def regime(cand: Candidate, spec: OpSpec, rng: np.random.Generator, *, dtype: str = "float32",
           choose: Optional[Callable[[Sequence[str]], Optional[str]]] = None) -> Optional[Candidate]:
    """Move one input into a value regime (tiny, subnormal, near ±1, large, near overflow,
    constant, large mean with small variance, ...) feasible in its domain."""
    names = _float_inputs(spec, cand)
    if not names:
        return None
    options = []
    for n in names:
        size = cand.arrays[n].size
        options += [f"{n}:{r}" for r in feasible_values(_domain(spec, n), dtype, (size, size))
                    if r not in ("bulk", "empty")]
    if not options:
        return None
    pick = choose(options) if choose else options[int(rng.integers(len(options)))]
    if pick is None:
        return None
    name, which = pick.split(":", 1)
    arr = regime_values(which, _domain(spec, name), cand.arrays[name].shape, rng, dtype, base=cand.arrays[name])
    if arr is None:
        return None
    return cand.derive(f"regime:{which}", **{name: arr})


def shift(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Large mean, small variance: x -> c + s·x (cancellation in normalisations)."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    c = float(rng.choice([-1, 1]) * 10.0 ** rng.uniform(0, 4))
    s = float(10.0 ** rng.uniform(-4, 0))
    return cand.derive("shift", **{name: project(c + s * cand.arrays[name], _domain(spec, name))})


def param(cand: Candidate, spec: OpSpec, rng: np.random.Generator, *,
          choose: Optional[Callable[[Sequence[str]], Optional[str]]] = None) -> Optional[Candidate]:
    """Redraw one parameter (aimed at one value class when ``choose`` is given); shapes are
    redrawn only if the old ones became invalid."""
    free = [p for p in spec.params if p.kind != "expr"]
    if not free:
        return None
    fixed = None
    if choose is not None:
        options = [f"{p.name}={c}" for p in free for c in param_universe(p)]
        pick = choose(options) if options else None
        if pick is not None:
            pname, cls = pick.split("=", 1)
            value = realise_param(next(p for p in free if p.name == pname), cls, rng)
            if value is not None:
                fixed = {**{k: v for k, v in cand.params.items() if k != pname}, pname: value}
    if fixed is None:
        which = free[int(rng.integers(len(free)))].name
        fixed = {k: v for k, v in cand.params.items() if k != which}
    params = draw_params(spec, rng, fixed)
    params.update({k: v for k, v in cand.params.items() if k not in params and k not in {p.name for p in spec.params}})
    dims = draw_dims(spec, params, rng, fixed=cand.dims)
    if dims is None:
        return None
    params = derived_params(spec, params, dims)
    new = Candidate(dims=dims, params=params, arrays={}, origin="param")
    if dims == cand.dims:
        new.arrays = dict(cand.arrays)  # shared: a candidate's arrays are never written in place
    else:
        new.arrays = build_arrays(spec, dims, params, rng, like=cand.arrays)
    return new


def reshape(cand: Candidate, spec: OpSpec, rng: np.random.Generator, *,
            choose: Optional[Callable[[Sequence[str]], Optional[str]]] = None) -> Optional[Candidate]:
    """New dims, values resampled from the parent (length-dependent code paths); with
    ``choose``, one dim is aimed at a size class (1, 7, 8, 9, >= 4096, ...)."""
    if not spec.dims:
        return None
    base = {k: v for k, v in cand.params.items() if k in {p.name for p in spec.params if p.kind != "expr"}}
    fixed_dims = None
    if choose is not None:
        env = dim_envelope(spec)
        options = [f"{d}={c}" for d, (lo, hi) in env.items() for c in size_classes_between(lo, hi)]
        pick = choose(options) if options else None
        if pick is not None:
            d, cls = pick.split("=", 1)
            v = realise_size(cls, *env[d], rng)
            if v is not None:
                keep = {k: n for k, n in cand.dims.items() if k != d and rng.random() < 0.5}
                fixed_dims = {**keep, d: v}
    elif spec.reach and rng.random() < 0.25:
        # past the drawn range, up to the dim's reach (log-uniform): sizes the tests never used
        d, top = spec.reach[int(rng.integers(len(spec.reach)))]
        lo = max(2, dim_envelope(spec)[d][0])
        if top >= lo:
            v = int(round(math.exp(rng.uniform(math.log(lo), math.log(top)))))
            fixed_dims = {d: min(max(v, int(lo)), int(top))}
    return draw(spec, rng, fixed_params=base, fixed_dims=fixed_dims, like=cand.arrays, origin="reshape")


def bind(mutator: Mutator, spec: OpSpec, *, dtype: str = "float32",
         choose: Optional[Callable[[str, Sequence[str], np.random.Generator], Optional[str]]] = None,
         name: str = "") -> Callable[[Candidate, np.random.Generator], Optional[Candidate]]:
    """``mutator`` as ``(candidate, rng) -> candidate`` for the engine, with its declared
    keyword-only parameters (``dtype``, ``choose``) filled in."""
    try:
        wants = set(inspect.signature(mutator).parameters)
    except (TypeError, ValueError):
        wants = set()

    def run(cand: Candidate, rng: np.random.Generator) -> Optional[Candidate]:
        kw = {}
        if "dtype" in wants:
            kw["dtype"] = dtype
        if "choose" in wants:
            if choose is not None:
                kw["choose"] = lambda options: choose(name, options, rng)
        return mutator(cand, spec, rng, **kw)

    return run


MUTATORS: Dict[str, Mutator] = {
    "perturb_1e-4": perturb(1e-4),
    "perturb_1e-6": perturb(1e-6),
    "perturb_1e-8": perturb(1e-8),
    "scale": scale,
    "noise": noise,
    "edge": edge,
    "regime": regime,
    "shift": shift,
    "param": param,
    "reshape": reshape,
}

PREDOO_MUTATORS = ("perturb_1e-4", "perturb_1e-6", "perturb_1e-8")
