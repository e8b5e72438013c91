"""Correctly rounded references (the true value, not the operator run in float64).

A float64 run of an approximating operator is still the approximation; for elementwise math the
true value is cheap with mpmath. Each function here maps real arguments to the mathematically
exact result, evaluated with mpmath at a working precision that is raised until the float64
rounding of the result is certain (Ziv's strategy: the value at ``p`` bits, widened by its error
bound, must round to one float64), so the reference is the float64 nearest to the true value.

Conventions at the edges are IEEE/C99's, as frameworks implement them: a NaN argument gives NaN;
a result that is not real (``log(-1)``) gives NaN; a pole gives NaN ("undefined", never judged:
the precision oracle does not measure elements whose reference is NaN); limits at ±inf are the
function's limits (``erf(inf) = 1``, ``exp(-inf) = 0``).

Names: every entry of :data:`FUNCTIONS` (``erf``, ``gelu``, ``lgamma`` ...; parameters by the
operator's own names, ``approximate``, ``exponent``), or ``mpmath.NAME`` for any mpmath function
of real arguments (a user's ``reference: mpmath.erf``).

For the exhaustive 16-bit sets the values of all 65,536 bit patterns are computed once and
cached on disk (``$DL_GATE_CACHE`` or ``~/.cache/dl-gate``, ``references/``), keyed by function,
parameters and dtype.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

#: cache layout version: bump when a function's definition changes
CACHE_VERSION = 1
START_PREC = 80  # bits; Ziv's loop doubles it while the float64 rounding is ambiguous
MAX_PREC = 2560


def _mp():
    try:
        import mpmath
    except ImportError:  # pragma: no cover - mpmath ships with torch (sympy)
        from ..errors import ConfigError

        raise ConfigError("correctly rounded references need mpmath (pip install mpmath)") from None
    return mpmath


# -- 16-bit value sets -------------------------------------------------------------------------
def dtype_values(dtype: str) -> np.ndarray:
    """Every value of a 16-bit ``dtype``, one per bit pattern 0..65535 in order (finite, subnormal,
    ±0, ±inf and every NaN pattern), as float64."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    if dtype == "float16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        with np.errstate(invalid="ignore"):
            return (bits << 16).view(np.float32).astype(np.float64)
    raise ValueError(f"no exhaustive value set for {dtype} (16-bit dtypes only: float16, bfloat16)")


def bit_index(x: np.ndarray, dtype: str) -> Optional[np.ndarray]:
    """The 16-bit pattern of each value of ``x`` (float64 values exactly representable in
    ``dtype``), or ``None`` when some value is not."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float16":
            h = x.astype(np.float16)
            back = h.astype(np.float64)
            idx = h.view(np.uint16).astype(np.int64)
        elif dtype == "bfloat16":
            f = x.astype(np.float32)
            u = f.view(np.uint32)
            back = f.astype(np.float64)
            if np.any((u & 0xFFFF)[~np.isnan(f)] != 0):  # more than bfloat16's 8 significant bits
                return None
            idx = (u >> 16).astype(np.int64)
        else:
            return None
    same = (back == x) | (np.isnan(back) & np.isnan(x))
    return idx if bool(np.all(same)) else None


# -- the functions -----------------------------------------------------------------------------
def _real(v):
    """A real mpf from an mpmath result; NaN for a complex one with non-zero imaginary part."""
    mp = _mp()
    if isinstance(v, mp.mpc):
        return v.real if v.imag == 0 else mp.nan
    return v


def _f_sigmoid(mp, x, **_):
    return 1 / (1 + mp.exp(-x)) if x > -mp.inf else mp.mpf(0)


def _f_gelu(mp, x, approximate="none", **_):
    if str(approximate).lower() in ("tanh", "true"):
        if not mp.isfinite(x):
            return x if x > 0 else mp.mpf(0)
        c = mp.sqrt(2 / mp.pi)
        z = c * (x + mp.mpf(0.044715) * x ** 3)
        return x / (1 + mp.exp(-2 * z))  # = x/2 (1 + tanh z), without its cancellation for z << 0
    if not mp.isfinite(x):
        return x if x > 0 else mp.mpf(0)
    return x / 2 * mp.erfc(-x / mp.sqrt(2))


def _f_silu(mp, x, **_):
    if not mp.isfinite(x):
        return x if x > 0 else mp.mpf(0)
    return x / (1 + mp.exp(-x))


def _f_mish(mp, x, **_):
    if not mp.isfinite(x):
        return x if x > 0 else mp.mpf(0)
    return x * mp.tanh(mp.log1p(mp.exp(x)))


def _f_softplus(mp, x, beta=1.0, threshold=None, **_):
    beta = mp.mpf(beta)
    if threshold is not None and x * beta > mp.mpf(threshold):  # torch's definition: linear above it
        return x
    if not mp.isfinite(x):
        return mp.mpf(0)
    return mp.log1p(mp.exp(beta * x)) / beta


def _f_logsigmoid(mp, x, **_):
    if x == mp.inf:
        return mp.mpf(0)
    if x == -mp.inf:
        return x
    return -mp.log1p(mp.exp(-x))


def _f_elu(mp, x, alpha=1.0, **_):
    return x if x > 0 else mp.mpf(alpha) * mp.expm1(x)


# constants as the frameworks hold them (float64), so every precision means the same function
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _f_selu(mp, x, **_):
    s, a = mp.mpf(_SELU_SCALE), mp.mpf(_SELU_ALPHA)
    return s * x if x > 0 else s * a * mp.expm1(x)


def _f_lgamma(mp, x, **_):
    if mp.isinf(x):
        return mp.inf
    if x <= 0 and x == mp.floor(x):
        return mp.inf  # log|Γ| at a pole: +inf (C99 lgamma)
    return _real(mp.loggamma(x)) if x > 0 else mp.re(mp.loggamma(x))


def _f_digamma(mp, x, **_):
    if x == mp.inf:
        return mp.inf
    if x == -mp.inf or (x <= 0 and x == mp.floor(x)):
        return mp.nan  # a pole (or no limit): undefined, never judged
    return mp.digamma(x)


def _f_rsqrt(mp, x, **_):
    if x == 0:
        return mp.ninf if mp.sign(x) < 0 else mp.inf
    if x < 0:
        return mp.nan
    return 1 / mp.sqrt(x)


def _f_pow(mp, x, exponent=None, y=None, **_):
    e = mp.mpf(exponent if exponent is not None else y)
    return _real(mp.power(x, e))


def _f_atan2(mp, y, x, **_):
    return mp.atan2(y, x)


def _f_log(mp, x, **_):
    return mp.ninf if x == 0 else (mp.nan if x < 0 else mp.log(x))


def _f_log1p(mp, x, **_):
    return mp.ninf if x == -1 else (mp.nan if x < -1 else mp.log1p(x))


def _f_sqrt(mp, x, **_):
    return mp.nan if x < 0 else mp.sqrt(x)


def _f_erfinv(mp, x, **_):
    if abs(x) > 1:
        return mp.nan
    if abs(x) == 1:
        return mp.inf * x
    return mp.erfinv(x)


def _f_tanh(mp, x, **_):
    return mp.tanh(x) if mp.isfinite(x) else mp.sign(x)


def _f_erf(mp, x, **_):
    return mp.erf(x) if mp.isfinite(x) else mp.sign(x)


def _f_relu(mp, x, **_):
    return x if x > 0 else mp.mpf(0)


def _f_leaky_relu(mp, x, negative_slope=0.01, alpha=None, **_):
    return x if x > 0 else mp.mpf(alpha if alpha is not None else negative_slope) * x


def _f_hardswish(mp, x, **_):
    return x * min(max(x + 3, 0), 6) / 6


def _f_hardtanh(mp, x, min_val=-1.0, max_val=1.0, **_):
    return min(max(x, mp.mpf(min_val)), mp.mpf(max_val))


def _unary(name: str) -> Callable:
    def f(mp, x, **_):  # limits at ±inf by mpmath's own handling (exp(-inf) = 0)
        return _real(getattr(mp, name)(x))
    f.__name__ = f"_f_{name}"
    return f


#: name -> (function of mpmath context and arguments, the operator parameters it reads)
FUNCTIONS: Dict[str, Tuple[Callable, Tuple[str, ...]]] = {
    "exp": (_unary("exp"), ()),
    "expm1": (_unary("expm1"), ()),
    "log": (_f_log, ()),
    "log1p": (_f_log1p, ()),
    "sqrt": (_f_sqrt, ()),
    "rsqrt": (_f_rsqrt, ()),
    "erf": (_f_erf, ()),
    "erfinv": (_f_erfinv, ()),
    "lgamma": (_f_lgamma, ()),
    "digamma": (_f_digamma, ()),
    "tanh": (_f_tanh, ()),
    "sin": (_unary("sin"), ()),
    "cos": (_unary("cos"), ()),
    "sigmoid": (_f_sigmoid, ()),
    "gelu": (_f_gelu, ("approximate",)),
    "silu": (_f_silu, ()),
    "mish": (_f_mish, ()),
    "softplus": (_f_softplus, ("beta", "threshold")),
    "logsigmoid": (_f_logsigmoid, ()),
    "elu": (_f_elu, ("alpha",)),
    "selu": (_f_selu, ()),
    "relu": (_f_relu, ()),
    "leaky_relu": (_f_leaky_relu, ("negative_slope", "alpha")),
    "hardswish": (_f_hardswish, ()),
    "hardtanh": (_f_hardtanh, ("min_val", "max_val")),
    "pow": (_f_pow, ("exponent", "y")),
    "atan2": (_f_atan2, ()),
}

#: f(-0) where it differs from f(+0) (IEEE: rsqrt(-0) = -inf); mpmath has no signed zero
NEG_ZERO = {"rsqrt": -math.inf}

_PREFIXES = ("gate.oracles.references:", "gate.oracles.references.")


def is_true_reference(path: Optional[str]) -> bool:
    """``path`` names a correctly rounded reference (a :data:`FUNCTIONS` entry or ``mpmath.F``)."""
    if not path:
        return False
    p = str(path)
    for pre in _PREFIXES:
        if p.startswith(pre):
            p = p[len(pre):]
    if p in FUNCTIONS:
        return True
    return p.replace(":", ".").startswith("mpmath.")


_TO_FLOAT = None


def _load_to_float():
    global _TO_FLOAT
    from mpmath.libmp import to_float as _tf

    _TO_FLOAT = _tf
    return _tf


def to_float(v, mp) -> float:
    """Round an mpf to the nearest float64 (mpmath's own float() rounds down)."""
    if _TO_FLOAT is None:
        _load_to_float()
    if isinstance(v, (int, float)):
        return float(v)
    if mp.isnan(v):
        return math.nan
    return _TO_FLOAT(mp.mpf(v)._mpf_, rnd="n")


def rounding_is_certain(v, prec: int, mp) -> bool:
    """Whether every value within ``v``'s error bound at ``prec`` bits (2^-(prec-12) relative)
    rounds to the same float64: the bits of ``v`` below float64's 53 must not be within the
    bound of the midpoint between two float64s (integer arithmetic on the mantissa)."""
    sign, man, exp, bc = v._mpf_
    if bc <= 53:
        return True  # v is a float64 (or a float64 wider in range: to_float decides)
    if not -1021 < exp + bc < 1024:  # float64 subnormal or overflow: compare the roundings
        eps = mp.ldexp(abs(v), -(prec - 12))
        return to_float(v - eps, mp) == to_float(v + eps, mp)
    shift = bc - 53
    low = man & ((1 << shift) - 1)
    err = 1 << max(0, bc - prec + 12)
    return abs(low - (1 << (shift - 1))) > err


class TrueReference:
    """The correctly rounded values of one function on NumPy arrays (float64), memoised per
    argument tuple in this process and, for complete 16-bit value sets, cached on disk."""

    def __init__(self, name: str, fn: Callable, params: Tuple[str, ...] = (), generic: bool = False):
        self.name = name
        self.fn = fn
        self.param_names = params
        self.generic = generic  # an mpmath function called with the arguments alone
        self._memo: Dict[Tuple, float] = {}

    def __repr__(self) -> str:
        return f"TrueReference({self.name})"

    # -- scalars -------------------------------------------------------------------------
    def own_params(self, params: Mapping[str, Any]) -> Dict[str, Any]:
        return {k: params[k] for k in self.param_names if k in params and params[k] is not None}

    def scalar(self, args: Sequence[float], params: Mapping[str, Any]) -> float:
        """The float64 nearest to f(*args) (correct rounding by Ziv's loop)."""
        mp = _mp()
        if any(math.isnan(a) for a in args):
            return math.nan
        if len(args) == 1 and args[0] == 0 and self.name in NEG_ZERO and math.copysign(1.0, args[0]) < 0:
            return NEG_ZERO[self.name]  # mpmath has no signed zero
        prec = START_PREC
        mpf, mpc = mp.mpf, mp.mpc
        ctx = mp.mp
        saved = ctx.prec
        try:
            while True:
                ctx.prec = prec
                xs = [mpf(a) for a in args]
                try:
                    v = _real(self.fn(*xs)) if self.generic else self.fn(mp, *xs, **params)
                except (ValueError, ZeroDivisionError):
                    return math.nan  # a pole: undefined
                except Exception as exc:  # mpmath's ComplexResult and friends
                    if type(exc).__name__ == "ComplexResult":
                        return math.nan
                    raise
                if type(v) is not mpf:
                    v = mpf(_real(v)) if isinstance(v, mpc) else mpf(v)
                if v._mpf_[1] == 0:  # zero, ±inf or NaN: exact
                    return to_float(v, mp)
                # the value's error bound at this precision: a few ulps of p bits, generously
                if prec >= MAX_PREC or rounding_is_certain(v, prec, mp):
                    return (_TO_FLOAT or _load_to_float())(v._mpf_, rnd="n")
                prec *= 2
        finally:
            ctx.prec = saved

    # -- arrays --------------------------------------------------------------------------
    def values(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any], dtype: Optional[str] = None) -> np.ndarray:
        """f applied elementwise to ``arrays`` (broadcast), float64. A single array holding
        values of a 16-bit ``dtype`` is answered from that dtype's cached table."""
        own = self.own_params(params)
        arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
        if len(arrays) == 1 and dtype in ("float16", "bfloat16") and arrays[0].size > 4096:
            idx = bit_index(arrays[0], dtype)
            if idx is not None:
                return self.table(dtype, own)[idx].reshape(arrays[0].shape)
        b = np.broadcast_arrays(*arrays)
        shape = b[0].shape
        flat = [x.reshape(-1) for x in b]
        out = np.empty(flat[0].size if flat else 0, dtype=np.float64)
        pkey = tuple(sorted((k, str(v)) for k, v in own.items()))
        if len(flat) == 1:
            # unique by bit pattern: -0.0 and 0.0 are different arguments (rsqrt)
            uniq, inv = np.unique(np.ascontiguousarray(flat[0]).view(np.int64), return_inverse=True)
            vals = np.array([self._memoised((float(u),), own, pkey) for u in uniq.view(np.float64)], dtype=np.float64)
            out = vals[inv.reshape(-1)] if uniq.size else out
        else:
            for i in range(out.size):
                out[i] = self._memoised(tuple(float(x[i]) for x in flat), own, pkey)
        return out.reshape(shape)

    def _memoised(self, args: Tuple[float, ...], params, pkey) -> float:
        key = (tuple(a.hex() for a in args), pkey)  # by bit pattern: -0.0 is not 0.0
        v = self._memo.get(key)
        if v is None:
            v = self.scalar(args, params)
            if len(self._memo) < 1_000_000:
                self._memo[key] = v
        return v

    # -- the cached tables of 16-bit value sets -----------------------------------------------
    def cache_key(self, dtype: str, params: Mapping[str, Any]) -> str:
        ptxt = json.dumps({k: str(v) for k, v in sorted(params.items())}, sort_keys=True)
        h = hashlib.sha256(f"{self.name}|{ptxt}|{dtype}|v{CACHE_VERSION}".encode()).hexdigest()[:16]
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.name)
        return f"{safe}-{dtype}-{h}"

    def table(self, dtype: str, params: Mapping[str, Any]) -> np.ndarray:
        """f at every value of ``dtype`` (index = bit pattern), from the disk cache or computed
        once and stored there."""
        name = f"{self.cache_key(dtype, params)}.npy"
        dirs = cache_dirs()
        for d in dirs:
            try:
                arr = np.load(d / name, allow_pickle=False)
                if arr.shape == (1 << 16,) and arr.dtype == np.float64:
                    return arr
            except (OSError, ValueError):
                pass
        xs = dtype_values(dtype)
        out = np.full(xs.shape, np.nan)
        pkey = tuple(sorted((k, str(v)) for k, v in params.items()))
        for i in np.flatnonzero(~np.isnan(xs)):
            out[i] = self._memoised((float(xs[i]),), params, pkey)
        for d in dirs:  # the cache, else a temporary directory (isolated workers read either)
            try:
                d.mkdir(parents=True, exist_ok=True)
                tmp = d / f"{name}.{os.getpid()}.tmp.npy"
                np.save(tmp, out, allow_pickle=False)
                os.replace(tmp, d / name)  # atomic: a concurrent reader never sees half a table
                break
            except OSError:
                continue
        return out


def cache_dir() -> Path:
    root = os.environ.get("DL_GATE_CACHE") or Path.home() / ".cache" / "dl-gate"
    return Path(root) / "references"


def cache_dirs() -> List[Path]:
    """Where tables are looked for and stored: the cache, then a temporary directory (a
    read-only home in a container must not make every isolated worker recompute them)."""
    import tempfile

    return [cache_dir(), Path(tempfile.gettempdir()) / f"dl-gate-references-{os.getuid()}"]


_RESOLVED: Dict[str, TrueReference] = {}


def resolve(path: Optional[str]) -> Optional[TrueReference]:
    """The :class:`TrueReference` ``path`` names (``erf``, ``gate.oracles.references:gelu``,
    ``mpmath.erf``), or ``None`` when it names none; one-line error for an mpmath name that
    does not exist."""
    if not is_true_reference(path):
        return None
    p = str(path)
    for pre in _PREFIXES:
        if p.startswith(pre):
            p = p[len(pre):]
    if p in _RESOLVED:
        return _RESOLVED[p]
    if p in FUNCTIONS:
        fn, params = FUNCTIONS[p]
        ref = TrueReference(p, fn, params)
    else:
        mp = _mp()
        attr = p.replace(":", ".").split(".", 1)[1]
        fn = getattr(mp, attr, None)
        if not callable(fn):
            from ..errors import ConfigError

            raise ConfigError(f"reference {path!r}: mpmath has no function {attr!r}")
        ref = TrueReference(f"mpmath.{attr}", fn, generic=True)
    _RESOLVED[p] = ref
    return ref


__all__ = ["FUNCTIONS", "TrueReference", "resolve", "is_true_reference", "dtype_values", "bit_index", "cache_dir"]
