"""Inputs: a :class:`Candidate` is one concrete call of an operator (dims, parameter values and
float64 arrays). Generation follows the spec's value spaces; nothing here knows a framework."""
from __future__ import annotations

import functools
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ..errors import ConfigError
from ..ops import expr
from ..ops.spec import Domain, ImportRef, OpSpec, TensorSpec
from . import randoms
from .score import ulp


@dataclass
class Candidate:
    dims: Dict[str, int]
    params: Dict[str, Any]
    arrays: Dict[str, np.ndarray]
    origin: str = "seed"

    def copy(self, origin: Optional[str] = None) -> "Candidate":
        return Candidate(
            dims=dict(self.dims),
            params=dict(self.params),
            arrays={k: v.copy() for k, v in self.arrays.items()},
            origin=origin or self.origin,
        )

    def derive(self, origin: Optional[str] = None, /, **arrays: np.ndarray) -> "Candidate":
        """A child with ``arrays`` replaced and the other arrays *shared* with this candidate
        (no copy: arrays are values, never written in place once in a candidate). ``origin`` is
        positional only: an input may be called ``self`` or ``origin`` (torchfields' functions
        take the field as ``self``; as a keyword it crashed the run)."""
        return Candidate(dims=dict(self.dims), params=dict(self.params), arrays={**self.arrays, **arrays},
                         origin=origin or self.origin)

    @property
    def size(self) -> int:
        return int(sum(a.size for a in self.arrays.values()))

    def summary(self) -> str:
        parts = []
        for name, a in self.arrays.items():
            if a.size and a.dtype.kind == "f":
                fin = a[np.isfinite(a)]
                rng = f"[{fin.min():.3g}, {fin.max():.3g}]" if fin.size else "[non-finite]"
            else:
                rng = ""
            parts.append(f"{name}{list(a.shape)}{rng}")
        ps = ", ".join(f"{k}={_fmt(v)}" for k, v in self.params.items())
        return "; ".join(parts) + (f"; {ps}" if ps else "")

    # -- persistence ----------------------------------------------------------------------
    def to_bytes(self, compress: bool = True) -> bytes:
        """The ``.npz`` form. Compressed where it is kept (baselines' corpus, the report's inputs,
        saved worst inputs); ``compress=False`` for a file that only carries an input to a worker
        and is deleted after: zlib on float data costs ~5 ms an input and saves little (the
        localisation of one run wrote ~500 of them: 3 s of the judge's CPU)."""
        buf = io.BytesIO()
        meta = json.dumps({"dims": self.dims, "params": _jsonify(self.params), "origin": self.origin})
        save = np.savez_compressed if compress else np.savez
        save(buf, __meta__=np.frombuffer(meta.encode(), dtype=np.uint8), **self.arrays)
        return buf.getvalue()

    def save(self, path, compress: bool = True) -> None:
        with open(path, "wb") as fh:
            fh.write(self.to_bytes(compress))

    @classmethod
    def load(cls, path_or_bytes) -> "Candidate":
        src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else path_or_bytes
        with np.load(src, allow_pickle=False) as z:
            meta = json.loads(bytes(z["__meta__"]).decode())
            arrays = {k: z[k].copy() for k in z.files if k != "__meta__"}
        return cls(dims=meta["dims"], params=_unjsonify(meta["params"]), arrays=arrays, origin=meta.get("origin", "replay"))


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


def _jsonify(params: Mapping[str, Any]) -> dict:
    out = {}
    for k, v in params.items():
        if isinstance(v, ImportRef):
            out[k] = {"__import__": str(v)}
        elif isinstance(v, tuple):
            out[k] = {"__tuple__": [_jsonify({"x": x})["x"] for x in v]}
        elif isinstance(v, float) and not math.isfinite(v):
            out[k] = {"__float__": repr(v)}
        elif isinstance(v, (np.integer,)):
            out[k] = int(v)
        elif isinstance(v, (np.floating,)):
            out[k] = float(v)
        else:
            out[k] = v
    return out


def _unjsonify(params: Mapping[str, Any]) -> dict:
    out = {}
    for k, v in params.items():
        if isinstance(v, dict) and "__tuple__" in v:
            out[k] = tuple(_unjsonify({"x": x})["x"] for x in v["__tuple__"])
        elif isinstance(v, dict) and "__float__" in v:
            out[k] = float(v["__float__"])
        elif isinstance(v, dict) and "__import__" in v:
            out[k] = ImportRef(v["__import__"])
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------------------------------
# drawing
# ---------------------------------------------------------------------------------------
def draw_params(spec: OpSpec, rng: np.random.Generator, fixed: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    fixed = dict(fixed or {})
    params: Dict[str, Any] = {}
    for p in spec.params:
        if p.kind == "expr":
            continue
        if p.name in fixed:
            params[p.name] = fixed[p.name]
        elif p.kind == "choice":
            params[p.name] = p.choices[int(rng.integers(len(p.choices)))]
        elif p.kind == "int":
            params[p.name] = int(rng.integers(int(p.lo), int(p.hi) + 1))
        else:
            params[p.name] = float(rng.uniform(float(p.lo), float(p.hi)))
    return params


def draw_dims(spec: OpSpec, params: Mapping[str, Any], rng: np.random.Generator,
              fixed: Optional[Mapping[str, int]] = None, scale: float = 1.0) -> Optional[Dict[str, int]]:
    """Dims in declaration order; ``None`` when the parameters admit no valid shape."""
    env: Dict[str, Any] = dict(params)
    dims: Dict[str, int] = {}
    reach = dict(spec.reach)
    for name, (lo_e, hi_e) in spec.dims:
        lo, hi = int(expr.evaluate(lo_e, env)), int(expr.evaluate(hi_e, env))
        if lo > hi:
            return None
        if fixed and name in fixed and lo <= fixed[name] <= max(hi, reach.get(name, hi)):
            v = int(fixed[name])
        else:
            # favour small sizes (fast evaluations) but reach the top of the range
            top = lo + max(0, int(round((hi - lo) * scale)))
            if rng.random() < 0.5:
                v = int(rng.integers(lo, top + 1))
            else:
                v = int(round(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(max(top, 1)) + 1e-9))))
                v = min(max(v, lo), hi)
        dims[name] = v
        env[name] = v
    return dims


#: the most elements one input of a candidate holds when a dim is past its drawn range (aimed at
#: its reach, 4096): [2, 4096, 8] fits; a 4096 beside others drawn large would make one evaluation
#: of a 3-d input 10^10 values (at 2^20, keras-cv's acceptance refresh took 8 s a variant with every
#: image layer's dims reaching 4096: the large evaluations are the likely cause, not profiled).
#: Draws inside the declared ranges are not capped (as before reach).
MAX_ELEMENTS = 1 << 16


def largest_input(spec: OpSpec, params: Mapping[str, Any], dims: Mapping[str, int]) -> int:
    env = {**params, **dims}
    try:
        derived = derived_params(spec, params, dims)
        env.update(derived)
        return max((math.prod(tensor_shape(t, env)) for t in spec.inputs), default=0)
    except Exception:
        return 0  # a shape the spec cannot size here: left to the operator to refuse


def within_elements(spec: OpSpec, params: Mapping[str, Any], dims: Dict[str, int],
                    fixed: Optional[Mapping[str, int]] = None) -> Optional[Dict[str, int]]:
    """``dims`` where one is past its drawn range (its reach): the largest input at most
    :data:`MAX_ELEMENTS`, the largest dims not asked for (``fixed``) halved first, then the asked
    ones; each kept in its range (``None`` when a dependent bound no longer holds). Dims inside
    their ranges are returned as they are."""
    if not spec.reach or not _past_range(spec, params, dims) or largest_input(spec, params, dims) <= MAX_ELEMENTS:
        return dims
    dims = dict(dims)
    lows: Dict[str, int] = {}
    env: Dict[str, Any] = dict(params)
    for name, (lo_e, _) in spec.dims:
        lows[name] = int(expr.evaluate(lo_e, env))
        env[name] = dims[name]
    for _ in range(64 * len(dims)):
        if largest_input(spec, params, dims) <= MAX_ELEMENTS:
            break
        free = [d for d in dims if dims[d] > max(lows.get(d, 1), 1)]
        if not free:
            break
        d = min(free, key=lambda d: (bool(fixed and d in fixed), -dims[d]))
        dims[d] = max(lows.get(d, 1), 1, dims[d] // 2)
    env = dict(params)
    for name, (lo_e, hi_e) in spec.dims:  # dependent bounds (D: [1, N]) still hold?
        lo, hi = int(expr.evaluate(lo_e, env)), int(expr.evaluate(hi_e, env))
        top = max(hi, dict(spec.reach).get(name, hi))
        if not lo <= dims[name] <= top:
            return None
        env[name] = dims[name]
    return dims


def _past_range(spec: OpSpec, params: Mapping[str, Any], dims: Mapping[str, int]) -> bool:
    env: Dict[str, Any] = dict(params)
    for name, (_, hi_e) in spec.dims:
        if dims[name] > int(expr.evaluate(hi_e, env)):
            return True
        env[name] = dims[name]
    return False


def derived_params(spec: OpSpec, params: Mapping[str, Any], dims: Mapping[str, int]) -> Dict[str, Any]:
    env = {**params, **dims}
    out = dict(params)
    for p in spec.params:
        if p.kind == "expr":
            val = expr.evaluate(p.expr, env)
            out[p.name] = val
            env[p.name] = val
    return out


def tensor_shape(t: TensorSpec, env: Mapping[str, Any]) -> tuple:
    shape = tuple(int(expr.evaluate(d, env)) for d in t.shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative size in shape of {t.name}: {shape}")
    return shape


def draw_values(domain: Domain, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Uniform inside a bounded domain, else normal of the domain's scale (folded at a bound);
    one of a set domain's values each (uniformly); a large array's random numbers come from
    :mod:`gate.search.randoms`."""
    if domain.values:
        return np.array(randoms.resample(rng, np.asarray(domain.values, dtype=np.float64), shape), dtype=np.float64)
    lo, hi = domain.lo, domain.hi
    if lo is not None and hi is not None:
        w = hi - lo
        return randoms.uniform(rng, lo + 0.02 * w, lo + 0.98 * w, shape)
    n = randoms.standard_normal(rng, shape)
    n *= domain.scale
    if lo is not None:
        np.abs(n, out=n)
        n += lo + 1e-3 * domain.scale
    elif hi is not None:
        np.abs(n, out=n)
        np.subtract(hi - 1e-3 * domain.scale, n, out=n)
    return n


def pick_positions(rng: np.random.Generator, n: int, k: int) -> Optional[np.ndarray]:
    """``k`` random positions out of ``n`` (drawn with repetition: a few collide, but no O(n)
    permutation on a large tensor); ``None`` when ``k >= n`` means every position."""
    if k >= n:
        return None
    return randoms.integers(rng, n, k)


def nearest_values(arr: np.ndarray, values: tuple) -> np.ndarray:
    """Each element of ``arr`` replaced by the nearest of the sorted ``values`` (the lower one
    at a midpoint; -inf the least, +inf and NaN the greatest): what a set domain's input holds
    after a mutation moved it (a label nudged by noise is still the label it was nearest)."""
    v = np.asarray(values, dtype=np.float64)
    a = np.asarray(arr, dtype=np.float64)
    if v.size == 1:
        return np.full(a.shape, v[0])
    return v[np.searchsorted((v[:-1] + v[1:]) / 2, a, side="left")]


def project(arr: np.ndarray, domain: Domain) -> np.ndarray:
    """Bring values back into the open domain by mirroring at its bounds, then clipping (a
    set domain: each to the nearest of its values)."""
    if domain.values:
        return nearest_values(arr, domain.values)
    lo, hi = domain.lo, domain.hi
    if lo is None and hi is None:
        return arr
    out = np.array(arr, dtype=np.float64, copy=True)
    bad = ~np.isfinite(out)
    if lo is not None:
        m = out <= lo
        out[m] = lo + (lo - out[m])
    if hi is not None:
        m = out >= hi
        out[m] = hi - (out[m] - hi)
    if lo is not None and hi is not None:
        width = hi - lo
        out = np.clip(out, lo + width * 1e-3, hi - width * 1e-3)
    elif lo is not None:
        out = np.maximum(out, lo + max(abs(lo), 1.0) * 1e-6)
    elif hi is not None:
        out = np.minimum(out, hi - max(abs(hi), 1.0) * 1e-6)
    out[bad] = arr[bad] if lo is None or hi is None else out[bad]
    return out


def inside_after_rounding(q: np.ndarray, domain: Domain, dtype: str) -> np.ndarray:
    """After rounding to ``dtype`` a value may land on an open bound: step it one ulp inside.
    A set domain's input: every element one of its values (as ``dtype`` holds them), whatever
    made it (a mutation, an edge value, a regime: one place that every evaluated input passes)."""
    if domain.values:
        held = _values_at(domain.values, dtype)
        if q.size and np.isin(q, held).all():
            return q
        return nearest_values(q, held)
    lo, hi = domain.lo, domain.hi
    if lo is not None:
        m = q <= lo
        if np.any(m):
            q = q.copy()
            q[m] = lo + ulp(np.full(np.count_nonzero(m), lo), dtype)
    if hi is not None:
        m = q >= hi
        if np.any(m):
            q = q.copy()
            q[m] = hi - ulp(np.full(np.count_nonzero(m), hi), dtype)
    return q


@functools.lru_cache(maxsize=None)
def _values_at(values: tuple, dtype: str) -> tuple:
    """A set domain's values as ``dtype`` holds them (rounded as an input is; labels such as -1,
    0 and 1 are exact in every format)."""
    from ..backends.base import numpy_quantize

    return tuple(sorted({float(x) for x in numpy_quantize(np.asarray(values, dtype=np.float64), dtype)}))


def build_arrays(spec: OpSpec, dims: Mapping[str, int], params: Mapping[str, Any], rng: np.random.Generator,
                 like: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """Arrays for every tensor input. With ``like``, values are resampled from the given
    arrays (keeping their value distribution while the shape changes)."""
    env = {**params, **dims}
    arrays: Dict[str, np.ndarray] = {}
    for t in spec.inputs:
        shape = tensor_shape(t, env)
        if t.kind == "index":
            hi = int(expr.evaluate(t.index_hi, env)) if t.index_hi is not None else 2
            arrays[t.name] = randoms.integers_shaped(rng, max(hi, 1), shape).astype(np.int64)
        elif t.kind == "bool":
            arrays[t.name] = randoms.random(rng, shape) < 0.5  # np.bool_: a mask reaches the operator as torch.bool / tf.bool
        elif like is not None and t.name in like and like[t.name].size and like[t.name].dtype.kind == "f":
            src = like[t.name].ravel()
            arrays[t.name] = randoms.resample(rng, src, shape) if shape else np.asarray(src[0])
        else:
            arrays[t.name] = draw_values(t.domain, shape, rng)
    return arrays


def draw(spec: OpSpec, rng: np.random.Generator, *, fixed_params: Optional[Mapping[str, Any]] = None,
         fixed_dims: Optional[Mapping[str, int]] = None, like: Optional[Mapping[str, np.ndarray]] = None,
         size_scale: float = 1.0, origin: str = "seed") -> Candidate:
    """A fresh candidate from the spec's value spaces (its largest input within MAX_ELEMENTS)."""
    for _ in range(50):
        params = draw_params(spec, rng, fixed_params)
        dims = draw_dims(spec, params, rng, fixed_dims, size_scale)
        if dims is None:
            fixed_params = None
            continue
        dims = within_elements(spec, params, dims, fixed_dims)
        if dims is None:
            fixed_params = None
            continue
        params = derived_params(spec, params, dims)
        arrays = build_arrays(spec, dims, params, rng, like)
        return Candidate(dims=dims, params=params, arrays=arrays, origin=origin)
    raise ConfigError(f"operator {spec.name}: its parameter and dim ranges admit no valid shape")


# ---------------------------------------------------------------------------------------
# edge values and value regimes (FIELD_GUIDE §3): where operator bugs hide
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def float_facts(dtype: str) -> Dict[str, float]:
    """Landmarks of a float format: ``eps`` (spacing above 1), ``below_one`` (the largest
    value below 1), ``min_normal``, ``min_subnormal``, ``max`` and ``log_max`` (where exp
    overflows)."""
    from ..backends.base import FLOAT_FORMATS

    p, emin, emax = FLOAT_FORMATS[dtype]
    big = math.ldexp(2.0 - math.ldexp(1.0, -(p - 1)), emax)
    return {
        "p": p,
        "eps": math.ldexp(1.0, -(p - 1)),
        "below_one": 1.0 - math.ldexp(1.0, -p),
        "min_normal": math.ldexp(1.0, emin),
        "min_subnormal": math.ldexp(1.0, emin - (p - 1)),
        "max": big,
        "log_max": math.log(big),
        "sqrt_max": math.sqrt(big),
    }


def _all_inside(flat: np.ndarray, domain: Domain) -> bool:
    """Every value finite and strictly inside the open domain (two reductions; NaN: False)."""
    if flat.size == 0:
        return True
    lo, hi = float(flat.min()), float(flat.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    return (domain.lo is None or lo > domain.lo) and (domain.hi is None or hi < domain.hi)


def inside(vals: np.ndarray, domain: Domain) -> np.ndarray:
    """The values strictly inside the open domain."""
    vals = np.asarray(vals, dtype=np.float64)
    keep = np.isfinite(vals)
    if domain.lo is not None:
        keep &= vals > domain.lo
    if domain.hi is not None:
        keep &= vals < domain.hi
    return vals[keep]


def neighbours(spec: OpSpec, cand: Candidate, dtype: str, rng: np.random.Generator, n: int = 4,
               steps: int = 2) -> List[Candidate]:
    """``n`` inputs a few ulps from ``cand``: each finite, nonzero element of a float tensor moved
    by a random whole number of ulps of its dtype in ``[-steps, steps]`` (zeros, NaN/Inf, integer
    and bool tensors, parameters and a move that would leave the domain are kept as they are).

    The same point up to the rounding of its values: where an operator amplifies rounding (terms
    that cancel, a composite loss summing parts of opposite sign), its error there is a draw from
    a distribution, different for every rounding of the same values. Replayed on head and base
    beside the search's worst input, they show how far base's own error reaches there, so that a
    draw where base was lucky (MONAI's GeneralizedDiceFocalLoss: base 19 ulp, head 67 on one
    input, both the cancellation of two O(1) losses) is not all base is held to, while a real
    loss (head worse on every rounding of the point) still is."""
    out = []
    for k in range(n):
        arrays = {}
        for t in spec.inputs:
            a = cand.arrays.get(t.name)
            if a is None or t.kind != "float" or a.size == 0 or a.dtype.kind != "f":
                continue
            d = t.dtype if (t.dtype and dtype != "float64") else dtype
            move = rng.integers(-steps, steps + 1, size=a.shape).astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                b = a + move * ulp(a, d)
                keep = ~np.isfinite(a) | (a == 0) | ~np.isfinite(b)
                if t.domain.lo is not None:
                    keep |= b <= t.domain.lo
                if t.domain.hi is not None:
                    keep |= b >= t.domain.hi
            arrays[t.name] = np.where(keep, a, b)
        if arrays:
            out.append(cand.derive(f"neighbour:{k}", **arrays))
    return out


def degenerate_inputs(spec: OpSpec, like: Candidate) -> List[Candidate]:
    """Inputs where guards matter (an ``eps`` under a square root, a max-shift, an empty-row
    check): every float input all zeros, and every float input one constant (a bool mask all
    False with the zeros, all True with the constant); the dims and
    params of ``like``. A value outside a tensor's domain is replaced by the nearest one inside
    (zeros) or the domain's middle (constant)."""
    out = []
    for tag, value in (("zeros", 0.0), ("constant", 1.0)):
        arrays = {}
        for t in spec.inputs:
            a = like.arrays.get(t.name)
            if a is not None and t.kind == "bool" and a.size:
                # a mask: everything masked out (a padding row, an empty selection) with the zeros,
                # nothing masked with the constant
                arrays[t.name] = np.full(a.shape, tag == "constant", dtype=a.dtype)
                continue
            if a is None or t.kind != "float" or a.size == 0:
                continue
            v = value
            if inside(np.array([v]), t.domain).size == 0:
                lo, hi = t.domain.lo, t.domain.hi
                if tag == "zeros":
                    v = lo + max(abs(lo), 1.0) * 1e-3 if lo is not None and lo >= 0 else hi - max(abs(hi), 1.0) * 1e-3
                elif lo is not None and hi is not None:
                    v = (lo + hi) / 2
                else:
                    v = lo + 1.0 if lo is not None else hi - 1.0
            arrays[t.name] = np.full(a.shape, float(v))
        if arrays:
            out.append(like.derive(f"degenerate:{tag}", **arrays))
    return out


def structured_inputs(spec: OpSpec, like: Candidate) -> List[Candidate]:
    """Rows real data has and random draws rarely do, from ``like`` (its dims and params): one
    dominant value per row (softmax/entmax/top-k inputs after training: peaked), ties (every
    row of two repeated values: argmax/sort/bisection tie-breaking), and a wide dynamic range
    (magnitudes from 1e-6 to 1e6 in one row: cancellation, scaling). Values are kept inside
    each input's domain."""
    out = []
    rng = np.random.default_rng(0x5EED)
    for tag in ("peaked", "ties", "wide"):
        arrays = {}
        for t in spec.inputs:
            a = like.arrays.get(t.name)
            if a is None or t.kind != "float" or a.size == 0:
                continue
            a = np.array(a, dtype=np.float64)
            scale = max(t.domain.scale, 1e-3)
            if tag == "peaked":
                rows = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
                rows[:] = rng.standard_normal(rows.shape) * scale
                rows[np.arange(rows.shape[0]), rng.integers(rows.shape[1], size=rows.shape[0])] += 30.0 * scale
                b = rows.reshape(a.shape)
            elif tag == "ties":
                b = np.where(rng.random(a.shape) < 0.5, scale, -scale)
            else:
                b = rng.choice([-1.0, 1.0], size=a.shape) * 10.0 ** rng.uniform(-6, 6, size=a.shape)
            lo, hi = t.domain.lo, t.domain.hi
            if lo is not None or hi is not None:  # inside the open domain
                span = (hi - lo) if lo is not None and hi is not None else max(abs(lo if lo is not None else hi), 1.0)
                eps = 1e-3 * span
                b = np.clip(b, None if lo is None else lo + eps, None if hi is None else hi - eps)
            arrays[t.name] = b
        if arrays:
            out.append(like.derive(f"structured:{tag}", **arrays))
    return out


def accumulation_inputs(spec: OpSpec, like: Candidate, dtype: str) -> List[Candidate]:
    """Where the dtype a reduction accumulates in shows (pytorch #2391: float16 sums that do not
    accumulate in float32 overflow to inf; tinygrad #3005 "use float for acc dtype for half tensor
    sum"): each row of every float input, from ``like`` (its dims and params), half ``+v`` then
    half ``-v``, ``v`` half ``dtype``'s largest finite value (inside the input's domain; a domain
    of one sign gives no such row). Its partial sums pass the range from the third element on, its
    total is 0 or ``v``: an accumulator wider than ``dtype`` returns it, one in ``dtype`` an
    infinity. Origin ``accumulate``: not an ordinary input (a fix seen only there is at the
    range's end, where a changed constant can move an overflow by accident)."""
    from ..backends.base import FLOAT_FORMATS

    if dtype not in FLOAT_FORMATS or dtype == "float64":
        return []
    arrays = {}
    for t in spec.inputs:
        a = like.arrays.get(t.name)
        if a is None or t.kind != "float" or a.ndim == 0 or a.size == 0:
            continue
        lo, hi = t.domain.lo, t.domain.hi
        if (lo is not None and lo >= 0) or (hi is not None and hi <= 0):
            continue
        v = float_facts(dtype)["max"] / 2
        for bound in (lo, hi):
            if bound is not None:
                v = min(v, abs(bound) * (1 - 1e-3))
        d = a.shape[-1]
        row = np.where(np.arange(d) < (d + 1) // 2, v, -v)
        arrays[t.name] = np.broadcast_to(row, a.shape).copy()
    return [like.derive("accumulate:cancel", **arrays)] if arrays else []


def edge_values(domain: Domain, dtype: str = "float32") -> np.ndarray:
    """Scalar edge values of ``dtype`` inside ``domain``: tiny magnitudes, subnormals, values
    next to ±1 and the largest float below 1, exp/square overflow edges, near-overflow
    magnitudes, and (for bounded domains) values next to the bounds."""
    f = float_facts(dtype)
    eps = f["eps"]
    mags = [
        1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3,
        f["min_subnormal"], f["min_normal"] - f["min_subnormal"], f["min_normal"],
        0.5, 1.0, f["below_one"], 1.0 - eps, 1.0 + eps, 1.0 + 4 * eps, 2.0, 10.0,
        f["log_max"] - 0.5, f["log_max"], f["log_max"] + 0.5,
        f["sqrt_max"] / 2, f["sqrt_max"], 1e4, f["max"] / 16, f["max"] / 2, f["max"],
    ]
    mags = [m for m in mags if 0 < m <= f["max"]]
    vals = [0.0] + mags + [-m for m in mags]
    lo, hi = domain.lo, domain.hi
    if lo is not None and hi is not None:
        w = hi - lo
        vals += [lo + w * 1e-6, hi - w * 1e-6, (lo + hi) / 2, hi - w * eps, lo + w * eps]
    if lo is not None:
        vals += [lo + max(abs(lo), 1.0) * eps, lo + max(abs(lo), 1.0) * 4 * eps, lo + 1e-3]
    if hi is not None:
        vals += [hi - max(abs(hi), 1.0) * eps, hi - max(abs(hi), 1.0) * 4 * eps, hi - 1e-3]
    return np.unique(inside(np.array(vals), domain))


#: whole-tensor value regimes a generator can aim at (see :func:`regime_values`); the same
#: names are the value classes of :mod:`gate.search.coverage`
REGIMES = ("bulk", "zero", "subnormal", "tiny", "all_tiny", "near_one", "large", "near_max",
           "constant", "shifted", "negative")


def _signed(mags: np.ndarray, domain: Domain, rng: np.random.Generator) -> np.ndarray:
    """Give magnitudes random signs where the domain allows both, else the allowed sign."""
    pos_ok = domain.hi is None or domain.hi > 0
    neg_ok = domain.lo is None or domain.lo < 0
    if pos_ok and neg_ok:
        return randoms.signed(rng, mags)
    return mags if pos_ok else -mags


@functools.lru_cache(maxsize=None)
def element_bands(dtype: str) -> Dict[str, tuple]:
    """Magnitude bands ``a <= |x| < b`` of the element value classes (shared with
    :mod:`gate.search.coverage`, so that a generated value lands in the class it aims at)."""
    f = float_facts(dtype)
    return {
        "subnormal": (f["min_subnormal"], f["min_normal"]),
        "tiny": (f["min_normal"], 1e-3),
        "bulk": (1e-3, 1e4),
        "near_one": (1.0 - 4 * f["eps"], 1.0 + 4 * f["eps"]),
        "large": (1e4, f["max"] / 2),
        "near_max": (f["max"] / 2, f["max"] * (1 + f["eps"] / 4)),
    }


def band_intervals(a: float, b: float, domain: Domain) -> list:
    """Signed intervals ``(l, h)`` of the values with ``a <= |x| < b`` inside ``domain``."""
    lo = -math.inf if domain.lo is None else domain.lo
    hi = math.inf if domain.hi is None else domain.hi
    out = []
    pl, ph = max(a, lo), min(b, hi)
    if pl < ph:
        out.append((pl, ph))
    nl, nh = max(-b, lo), min(-a, hi)
    if nl < nh:
        out.append((nl, nh))
    return out


def sample_band(a: float, b: float, domain: Domain, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` values log-uniform in magnitude with ``a <= |x| < b``, strictly inside ``domain``
    and away from the band's ends (so rounding to the dtype keeps them in the band)."""
    ivs = band_intervals(a, b, domain)
    if not ivs or n <= 0:
        return np.zeros(0)
    if len(ivs) == 1 and n >= randoms.MIN_ELEMENTS:  # one interval: no choice, no masks
        (l, h), = ivs
        t = _log_uniform(abs(l), abs(h), rng, n)
        return t if l >= 0 else np.negative(t, out=t)
    if len(ivs) == 2 and n >= randoms.MIN_ELEMENTS and ivs[1] == (-ivs[0][1], -ivs[0][0]):
        # mirror images (either sign allowed): a magnitude and a random sign, as likely as
        # choosing one of the two intervals, without a mask per interval
        return randoms.signed(rng, _log_uniform(ivs[0][0], ivs[0][1], rng, n))
    which = randoms.integers(rng, len(ivs), n)
    out = np.empty(n)
    for k, (l, h) in enumerate(ivs):
        m = which == k
        if not np.any(m):
            continue
        mag = _log_uniform(abs(l), abs(h), rng, int(m.sum()))
        out[m] = mag if l >= 0 else -mag
    return out


def _log_uniform(a: float, b: float, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` magnitudes log-uniform between ``a`` and ``b``, 5 % away from either end."""
    ml, mh = sorted((a, b))
    ml = max(ml, np.finfo(np.float64).tiny)
    t = randoms.uniform(rng, 0.05, 0.95, n)
    if n < randoms.MIN_ELEMENTS:
        return np.exp(math.log(ml) + t * (math.log(mh) - math.log(ml)))
    t *= math.log(mh) - math.log(ml)
    t += math.log(ml)
    return np.exp(t, out=t)


def _feature_scalars(feature: str, domain: Domain, dtype: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` values of one element class inside ``domain`` (empty when the class and the
    domain do not meet)."""
    if feature == "zero":
        return inside(np.zeros(n), domain)
    bands = element_bands(dtype)
    if feature == "near_one":
        f = float_facts(dtype)
        vals = 1.0 + (randoms.integers(rng, 9, n) - 4 if n >= randoms.MIN_ELEMENTS
                      else rng.integers(-4, 5, n)) * f["eps"] / 2
        vals[randoms.random(rng, n) < 0.3] = f["below_one"]
        vals = inside(_signed(vals, domain, rng), domain)
        if vals.size:
            return vals[rng.integers(vals.size, size=n)]
    a, b = bands["tiny" if feature == "all_tiny" else feature]
    return sample_band(a, b, domain, rng, n)


def regime_values(regime: str, domain: Domain, shape: tuple, rng: np.random.Generator,
                  dtype: str = "float32", base: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
    """An array of ``shape`` in one value regime, inside ``domain``; ``None`` when the regime
    does not intersect the domain. Element regimes (zero, subnormal, tiny, near_one, large,
    near_max) replace a random share of ``base`` (default: a bulk draw); whole-tensor regimes
    (all_tiny, constant, shifted, negative) replace everything."""
    size = int(np.prod(shape)) if shape else 1
    has_base = base is not None and base.shape == tuple(shape)
    if size >= randoms.MIN_ELEMENTS and regime in ("all_tiny", "shifted", "negative"):
        # every element is replaced: no copy of the base, no draw (for a large array; a small one
        # keeps its draws, so its candidates stay as they were)
        arr = np.empty(tuple(shape))
    else:
        arr = (np.array(base, dtype=np.float64, copy=True) if has_base else draw_values(domain, shape, rng))
    if regime == "bulk" or size == 0:
        return arr
    flat = arr.reshape(-1)
    if regime in ("zero", "subnormal", "tiny", "near_one", "large", "near_max"):
        share = float(rng.choice([0.0, 0.1, 0.5, 1.0]))
        k = min(size, max(1, int(round(size * share))))
        vals = _feature_scalars(regime, domain, dtype, rng, k)
        if vals.size == 0:
            return None
        idx = pick_positions(rng, size, vals.size)
        if idx is None:
            flat[:] = vals
        else:
            flat[idx] = vals
    elif regime == "all_tiny":
        vals = _feature_scalars("tiny", domain, dtype, rng, size)
        if vals.size < size:
            return None
        flat[:] = vals
    elif regime == "constant":
        edges = edge_values(domain, dtype)
        if size >= randoms.MIN_ELEMENTS and _all_inside(flat, domain):
            # the same pick as below without a filtered copy of the tensor: every value is in the pool
            i = int(rng.integers(size + edges.size))
            flat[:] = flat[i] if i < size else edges[i - size]
            return flat.reshape(arr.shape)
        pool = np.concatenate([inside(flat, domain), edges])
        if pool.size == 0:
            return None
        flat[:] = pool[int(rng.integers(pool.size))]
    elif regime == "shifted":
        lo, hi = domain.lo, domain.hi
        if lo is None and hi is None:
            c = float(rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(1, 4))
        elif lo is not None and hi is not None:
            c = float(lo + (hi - lo) * rng.uniform(0.2, 0.8))
        elif lo is not None:
            c = float(lo + 10.0 ** rng.uniform(1, 4))
        else:
            c = float(hi - 10.0 ** rng.uniform(1, 4))
        step = float(ulp(np.asarray(c), dtype))
        s = max(abs(c) * 10.0 ** rng.uniform(-5, -2.5), 2 * step)
        if lo is not None and hi is not None:
            s = min(s, (hi - lo) * 0.05)
        if size >= randoms.MIN_ELEMENTS:
            z = randoms.standard_normal(rng, size)
            z *= s
            z += c
            flat[:] = project(z, domain)
        else:
            flat[:] = c + s * rng.standard_normal(size)
            flat[:] = project(flat, domain)
    elif regime == "negative":
        if domain.lo is not None and domain.lo >= 0:
            return None
        hi = 0.0 if domain.hi is None else min(domain.hi, 0.0)
        if size >= randoms.MIN_ELEMENTS:
            if domain.lo is not None:
                z = randoms.uniform(rng, 0.02, 0.98, size)
                z *= hi - domain.lo
                z += domain.lo
            else:
                z = randoms.standard_normal(rng, size)
                np.abs(z, out=z)
                z *= domain.scale
                np.subtract(hi, z, out=z)
                z -= 1e-3 * domain.scale
            flat[:] = z
        elif domain.lo is not None:
            flat[:] = domain.lo + (hi - domain.lo) * rng.uniform(0.02, 0.98, size)
        else:
            flat[:] = hi - np.abs(rng.standard_normal(size)) * domain.scale - 1e-3 * domain.scale
    else:
        raise ValueError(f"unknown value regime {regime!r} (known: {', '.join(REGIMES)})")
    return flat.reshape(arr.shape)
