"""Inputs: a :class:`Candidate` is one concrete call of an operator (dims, parameter values and
float64 arrays). Generation follows the spec's value spaces; nothing here knows a framework."""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import numpy as np

from ..errors import ConfigError
from ..ops import expr
from ..ops.spec import Domain, OpSpec, TensorSpec
from ..oracles.precision import ulp


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
    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        meta = json.dumps({"dims": self.dims, "params": _jsonify(self.params), "origin": self.origin})
        np.savez_compressed(buf, __meta__=np.frombuffer(meta.encode(), dtype=np.uint8), **self.arrays)
        return buf.getvalue()

    def save(self, path) -> None:
        with open(path, "wb") as fh:
            fh.write(self.to_bytes())

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
        if isinstance(v, tuple):
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
    for name, (lo_e, hi_e) in spec.dims:
        lo, hi = int(expr.evaluate(lo_e, env)), int(expr.evaluate(hi_e, env))
        if lo > hi:
            return None
        if fixed and name in fixed and lo <= fixed[name] <= hi:
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
    n = rng.standard_normal(shape) * domain.scale
    lo, hi = domain.lo, domain.hi
    if lo is not None and hi is not None:
        u = rng.uniform(0.0, 1.0, shape)
        return lo + (hi - lo) * (0.02 + 0.96 * u)
    if lo is not None:
        return lo + np.abs(n) + 1e-3 * domain.scale
    if hi is not None:
        return hi - np.abs(n) - 1e-3 * domain.scale
    return n


def project(arr: np.ndarray, domain: Domain) -> np.ndarray:
    """Bring values back into the open domain by mirroring at its bounds, then clipping."""
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
    """After rounding to ``dtype`` a value may land on an open bound: step it one ulp inside."""
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
            arrays[t.name] = rng.integers(0, max(hi, 1), size=shape).astype(np.int64)
        elif t.kind == "bool":
            arrays[t.name] = (rng.random(shape) < 0.5).astype(np.int64)
        elif like is not None and t.name in like and like[t.name].size and like[t.name].dtype.kind == "f":
            src = like[t.name].ravel()
            arrays[t.name] = src[rng.integers(0, src.size, size=shape)] if shape else np.asarray(src[0])
        else:
            arrays[t.name] = draw_values(t.domain, shape, rng)
    return arrays


def draw(spec: OpSpec, rng: np.random.Generator, *, fixed_params: Optional[Mapping[str, Any]] = None,
         fixed_dims: Optional[Mapping[str, int]] = None, like: Optional[Mapping[str, np.ndarray]] = None,
         size_scale: float = 1.0, origin: str = "seed") -> Candidate:
    """A fresh candidate from the spec's value spaces."""
    for _ in range(50):
        params = draw_params(spec, rng, fixed_params)
        dims = draw_dims(spec, params, rng, fixed_dims, size_scale)
        if dims is None:
            fixed_params = None
            continue
        params = derived_params(spec, params, dims)
        arrays = build_arrays(spec, dims, params, rng, like)
        return Candidate(dims=dims, params=params, arrays=arrays, origin=origin)
    raise ConfigError(f"operator {spec.name}: its parameter and dim ranges admit no valid shape")
