"""Mutation operators. Each takes (candidate, spec, rng) and returns a new candidate or
``None`` when it does not apply. Predoo's constant perturbation is here alongside wider value,
scale, edge, parameter and shape mutations. The table :data:`MUTATORS` is the extension point."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np

from ..ops.spec import OpSpec
from .inputs import Candidate, build_arrays, derived_params, draw, draw_dims, draw_params, project

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
        new = cand.copy(origin=f"perturb_{theta:g}")
        new.arrays[name] = project(new.arrays[name] + rng.uniform(0.0, theta), _domain(spec, name))
        return new

    return mutate


def scale(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Multiply one input by 2^k, k in [-20, 20] (magnitude search)."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    new = cand.copy(origin="scale")
    new.arrays[name] = project(new.arrays[name] * 2.0 ** int(rng.integers(-20, 21)), _domain(spec, name))
    return new


def noise(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Relative gaussian noise on one input (local search around the parent)."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    new = cand.copy(origin="noise")
    a = new.arrays[name]
    rel = 10.0 ** rng.uniform(-4, -1)
    new.arrays[name] = project(a + rng.standard_normal(a.shape) * rel * (np.abs(a) + 1e-12), _domain(spec, name))
    return new


def edge(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Set a few elements (or all) of one input to edge values inside its domain."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    dom = _domain(spec, name)
    vals = EDGE_VALUES
    if dom.lo is not None:
        vals = vals[vals > dom.lo]
    if dom.hi is not None:
        vals = vals[vals < dom.hi]
    if dom.lo is not None and dom.hi is not None:
        w = dom.hi - dom.lo
        vals = np.concatenate([vals, [dom.lo + w * 1e-6, dom.hi - w * 1e-6, dom.hi - w * 2.0**-11]])
    if vals.size == 0:
        return None
    new = cand.copy(origin="edge")
    a = new.arrays[name].copy()
    flat = a.reshape(-1)
    k = max(1, int(flat.size * rng.choice([0.0, 0.05, 0.3, 1.0])))
    idx = rng.choice(flat.size, size=min(k, flat.size), replace=False)
    flat[idx] = rng.choice(vals, size=idx.size)
    new.arrays[name] = flat.reshape(a.shape)
    return new


def shift(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Large mean, small variance: x -> c + s·x (cancellation in normalisations)."""
    name = _pick_tensor(spec, cand, rng)
    if name is None:
        return None
    new = cand.copy(origin="shift")
    c = float(rng.choice([-1, 1]) * 10.0 ** rng.uniform(0, 4))
    s = float(10.0 ** rng.uniform(-4, 0))
    new.arrays[name] = project(c + s * new.arrays[name], _domain(spec, name))
    return new


def param(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Redraw one parameter; shapes are redrawn only if the old ones became invalid."""
    free = [p.name for p in spec.params if p.kind != "expr"]
    if not free:
        return None
    which = free[int(rng.integers(len(free)))]
    fixed = {k: v for k, v in cand.params.items() if k != which}
    params = draw_params(spec, rng, fixed)
    dims = draw_dims(spec, params, rng, fixed=cand.dims)
    if dims is None:
        return None
    params = derived_params(spec, params, dims)
    new = Candidate(dims=dims, params=params, arrays={}, origin="param")
    if dims == cand.dims:
        new.arrays = {k: v.copy() for k, v in cand.arrays.items()}
    else:
        new.arrays = build_arrays(spec, dims, params, rng, like=cand.arrays)
    return new


def reshape(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """New dims, values resampled from the parent (length-dependent code paths)."""
    if not spec.dims:
        return None
    base = {k: v for k, v in cand.params.items() if k in {p.name for p in spec.params if p.kind != "expr"}}
    new = draw(spec, rng, fixed_params=base, like=cand.arrays, origin="reshape")
    return new


MUTATORS: Dict[str, Mutator] = {
    "perturb_1e-4": perturb(1e-4),
    "perturb_1e-6": perturb(1e-6),
    "perturb_1e-8": perturb(1e-8),
    "scale": scale,
    "noise": noise,
    "edge": edge,
    "shift": shift,
    "param": param,
    "reshape": reshape,
}

PREDOO_MUTATORS = ("perturb_1e-4", "perturb_1e-6", "perturb_1e-8")
