"""Standalone repro: ``repro/<op>_<variant>.py`` + ``.npz`` that need only NumPy, the framework
and the operator library (no dl-gate).

The script loads the (minimal) input, runs the operator at the variant's dtype (same layout,
memory format and computation mode as the gate) and at float64 on the same values, and prints
the max error in ULPs of the dtype (with the gate's floor), the worst element, NaN/Inf counts,
or the exception. For a behaviour change it compares the float64 output with base's, stored in
the ``.npz``; a gradient finding runs backward with the gate's upstream gradient; a hang waits as
long as the gate did and, if the call has not returned, prints where it is and exits 1; a new NaN/Inf
is counted against base's output stored in the ``.npz`` (the judge's definition). Exit status 1
when the finding reproduces, 0 when it does not, 2 when the library cannot be imported.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from ..backends.base import FLOAT_FORMATS, intra_op_threads
from ..search.inputs import Candidate
from ..oracles.base import float_input_names
from ..oracles.gradients import normalised_scale
from ..ops.spec import ImportRef, OpSpec, arrange
from ..plan import Variant
from ..backends.repro_text import repro_prelude


_COMMON = r'''
FORMATS = {FORMATS}


def ulp(x, dtype):
    """Unit in the last place of |x| in ``dtype`` (subnormal spacing near zero; beyond the
    dtype's range, the same digits as if its exponent went on)."""
    p, emin, emax = FORMATS[dtype]
    x = np.abs(np.asarray(x, dtype=np.float64))
    with np.errstate(all="ignore"):
        _, e = np.frexp(np.where(np.isfinite(x), x, 0.0))
    e = np.where(x == 0, emin, np.where(np.isfinite(x), e - 1, 1023))
    return np.ldexp(1.0, (np.clip(e, emin, 1023) - (p - 1)).astype(np.int32))


def overflow_bound(dtype):
    p, _, emax = FORMATS[dtype]
    return float(np.ldexp(2.0 - np.ldexp(1.0, -p), emax))


def residue_magnitude(mag, scale, dtype):
    """As the gate's oracle: an output zero in exact arithmetic (every reference value below one
    rounding unit of the computation's scale) is judged in ulps of that scale, not of its residue."""
    if scale > 0 and np.isfinite(scale) and mag < np.ldexp(scale, -FORMATS[dtype][0]):
        return scale
    return mag


def largest(arrays):
    m = 0.0
    for a in arrays:
        a = np.asarray(a)
        if a.size and a.dtype.kind == "f" and np.isfinite(a).any():
            m = max(m, float(np.max(np.abs(a[np.isfinite(a)]))))
    return m


def errors(out, ref, dtype, floor_kind, ftz=False, scale=0.0):
    """(ulp error per element, NaN/Inf count) as the gate's precision oracle computes them."""
    a, b = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    ovf = overflow_bound(dtype)
    ref_ok = np.isfinite(b) & (np.abs(b) < ovf)
    exact = (np.isfinite(b) & ~ref_ok & np.isinf(a) & (np.sign(a) == np.sign(b))) | (~np.isfinite(b) & (a == b))
    if ftz:  # output and reference both below the smallest normal number: not judged
        tiny = np.ldexp(1.0, FORMATS[dtype][1])
        exact |= (np.abs(a) < tiny) & (np.abs(b) < tiny)
    judged = np.isfinite(b) & np.isfinite(a) & ~exact
    mag = float(np.max(np.abs(b[ref_ok]))) if np.any(ref_ok) else 0.0
    if floor_kind == "output":
        mag = residue_magnitude(mag, scale, dtype)
    # an all-zero reference counts in ulps of 1 (as the gate's oracle does)
    floor = float(ulp(mag if mag > 0 else 1.0, dtype)) if floor_kind == "output" else float(ulp(0.0, dtype))
    with np.errstate(all="ignore"):
        err = np.where(judged, np.abs(a - b) / np.maximum(ulp(np.where(np.isfinite(b), b, 0.0), dtype), floor), 0.0)
    return err, int(np.count_nonzero(ref_ok & ~np.isfinite(a)))


def upstream(k, shape):
    """The upstream gradient of output ``k`` as the gate's gradient oracle uses it: the stored
    one, else (an input shrunk to another shape) the one it derives from the input values."""
    import zlib

    u = DATA.get(f"in___upstream{k}__")
    if u is not None and tuple(u.shape) == tuple(shape):
        UPSTREAMS.append(np.asarray(u, np.float64))
        return UPSTREAMS[-1]
    h = (k + 1) & 0xFFFFFFFF
    for n in FLOAT_INPUTS:
        a = DATA.get("in_" + n)
        if a is not None:
            h = zlib.crc32(np.ascontiguousarray(a).tobytes(), h)
            h = zlib.crc32(repr(a.shape).encode(), h)
    UPSTREAMS.append(quantize(np.random.default_rng(h).standard_normal(shape), DTYPE))
    return UPSTREAMS[-1]


UPSTREAMS = []  # the upstream gradients the script used (their scale is the gradient's)


def resolve(path):
    if ":" in path:
        mod, attr = path.split(":", 1)
        obj = importlib.import_module(mod)
    else:
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            attr = ".".join(parts[i:])
            break
        else:
            raise ImportError(path)
    owner = None
    for part in attr.split("."):
        owner, obj = obj, getattr(obj, part)
    if isinstance(owner, type) and isinstance(inspect.getattr_static(owner, part), types.FunctionType):
        return Method(owner, part)  # a method operator: called on an instance built as the gate builds it
    return obj


class Method:
    """``Class.method`` named as the operator: the method of an instance built with CONSTRUCT."""

    def __init__(self, cls, name):
        self.cls, self.name = cls, name


def mpmath_reference(path):
    """``reference: mpmath.F``: the true value of F at each input element, rounded to float64."""
    import mpmath
    from mpmath.libmp import to_float

    f = resolve(path)
    arrays = np.broadcast_arrays(*[np.asarray(DATA["in_" + name], dtype=np.float64) for name in INPUTS])
    out = np.empty(arrays[0].shape)
    with mpmath.workprec(160):
        for i, xs in enumerate(zip(*(a.reshape(-1) for a in arrays))):
            try:
                v = f(*[mpmath.mpf(float(x)) for x in xs]) if not np.isnan(xs).any() else mpmath.nan
            except (ValueError, ZeroDivisionError):
                v = mpmath.nan
            if isinstance(v, mpmath.mpc):
                v = v.real if v.imag == 0 else mpmath.nan
            out.flat[i] = float("nan") if mpmath.isnan(v) else to_float(mpmath.mpf(v)._mpf_, rnd="n")
    return out


def subclass(path):
    mod, attr = path.split(":", 1)
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def build(dtype, low):
    kwargs = {k: resolve(v["__import__"]) if isinstance(v, dict) and "__import__" in v else v for k, v in PARAMS.items()}
    if low:
        kwargs.update(LAYOUT_PARAMS)

    def tensor(name):
        arr = DATA["in_" + name]
        if low and name in PERMUTE:
            arr = np.ascontiguousarray(np.transpose(arr, PERMUTE[name]))
        own = INPUT_DTYPES.get(name) if dtype != "float64" else None  # an input that keeps its dtype
        t = to_native(arr, own or dtype, MEMORY_FORMAT if low else None)
        if name in SUBCLASSES:  # the library's own tensor subclass (torch)
            t = t.as_subclass(subclass(SUBCLASSES[name]))
        return t

    def place(slot):  # an input's name, or a list argument's names (gate.ops.spec.arrange)
        return [tensor(n) for n in slot] if isinstance(slot, list) else tensor(slot)

    kwargs.update({k: place(slot) for k, slot in CALL_KWARGS.items()})
    return [place(slot) for slot in CALL_ARGS], kwargs


def new_nonfinite_mask(o, b, r, rb, dtype):
    """This checkout's new NaN/Inf as the gate's judge defines it (gate.judge.decide's
    new_nonfinite_masks; a test holds the two equal): NaN/Inf where base's stored output ``b`` is
    finite, except an infinity that stands for a value at the range's end (its float64 value ``r``
    in the top binade or beyond, same sign) where base's value is no answer either (half its
    digits off its float64 run ``rb``, or inside the range where the true value is beyond it),
    and overflows at the range's end that moved (base has as many on the same input at elements
    this checkout keeps finite)."""
    o = np.asarray(o)
    mask = ~np.isfinite(o) & np.isfinite(b)
    if not mask.any() or r is None:
        return mask
    rb = r if rb is None or np.shape(rb) != o.shape else np.asarray(rb, np.float64)
    ovf = overflow_bound(dtype)
    with np.errstate(all="ignore"):
        edge = np.isinf(o) & np.isfinite(r) & (np.abs(r) >= ovf / 2) & (np.sign(o) == np.sign(r))
        off = np.abs(b - np.where(np.isfinite(rb), rb, 0.0)) / ulp(np.where(np.isfinite(rb), rb, 0.0), dtype)
        noise = off >= 2.0 ** (FORMATS[dtype][0] / 2)
        beyond_inside = (np.abs(r) >= ovf) & (np.abs(b) < ovf)
        mask &= ~(edge & np.isfinite(rb) & (noise | beyond_inside))
        top = ovf / 2
        mine = mask & np.isinf(o) & np.isfinite(r) & (np.abs(r) >= top)
        theirs = np.isinf(b) & np.isfinite(o) & np.isfinite(rb) & (np.abs(rb) >= top)
    if mine.any() and np.count_nonzero(theirs) >= np.count_nonzero(mine):
        mask &= ~mine
    return mask


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--repo", default=os.environ.get("DL_GATE_REPO", DEFAULT_REPO),
                    help="checkout of the operator library (default: the one the gate ran on)")
    args = ap.parse_args(argv)
    for p in reversed(PYTHON_PATH):
        sys.path.insert(0, os.path.join(args.repo, p))
    try:  # a library that cannot be imported is a broken environment, not a reproduction
        fn = resolve(CALLABLE)
        ref_fn = resolve(REFERENCE) if REFERENCE else fn
    except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, an error at import time
        print(f"cannot import {CALLABLE} from {args.repo}: {type(exc).__name__}: {exc} (environment broken: exit 2)")
        return 2
    print(f"{OP} [{VARIANT}] on {SUMMARY}")
    grad = ORACLE == "grad"
    if HANG_AFTER:  # a hang: a call that has not returned after this long reproduces it
        import faulthandler

        print(f"{DTYPE}: the gate's call did not return within {HANG_AFTER:g}s; waiting as long "
              "(a hang prints where it is and exits 1)", flush=True)
        faulthandler.dump_traceback_later(HANG_AFTER, exit=True)  # its watchdog needs no GIL: exits 1
    try:
        if grad:  # backward at the variant dtype, the same upstream gradient as the gate's
            low = outputs(call_grad(fn, *build(DTYPE, False), dtype=DTYPE), False)
        else:
            low = outputs(call(fn, *build(INPUT_DTYPE, True), mode=MODE, dtype=DTYPE), True)
        if HANG_AFTER:
            faulthandler.cancel_dump_traceback_later()
            print(f"{DTYPE}: returned within {HANG_AFTER:g}s: the hang does not reproduce")
            return 0
    except Exception as exc:
        if HANG_AFTER:
            faulthandler.cancel_dump_traceback_later()
        msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        print(f"{DTYPE}: raises {msg}")
        return 1 if KIND == "crash" else 0
    try:
        if grad:
            ref = outputs(call_grad(ref_fn, *build("float64", False), dtype="float64"), False)
        elif REFERENCE and REFERENCE.replace(":", ".").startswith("mpmath."):
            ref = [mpmath_reference(REFERENCE)]  # the true value, as the gate measured it
        else:
            ref = outputs(call(ref_fn, *build("float64", False), mode="input", dtype="float64"), False)
    except Exception as exc:  # the float64 run fails: outside the domain, nothing to compare
        print(f"float64: raises {type(exc).__name__}: {exc}")
        ref = [np.full(np.shape(o), np.nan) for o in low]
    if KIND == "behaviour":
        worst = 0.0
        for k, r in enumerate(ref):
            b = DATA.get(f"base_ref_{k}")
            if b is None or b.shape != r.shape:
                continue
            err, _ = errors(r, b, DTYPE, ULP_FLOOR)
            if err.size:
                i = int(np.argmax(err))
                if err.flat[i] > worst:
                    worst = float(err.flat[i])
                    where = (k, np.unravel_index(i, err.shape), float(r.flat[i]), float(b.flat[i]))
        print(f"float64 output differs from base's by {worst:.4g} {DTYPE} ulp (tolerance {THRESHOLD_ULP:g})")
        if worst > 0:
            k, idx, hv, bv = where
            print(f"  output[{k}][{', '.join(map(str, idx))}]: this checkout {hv!r}, base {bv!r}")
        return 1 if worst > THRESHOLD_ULP else 0
    scale = 0.0
    if grad and ULP_FLOOR == "output":  # as the gate's gradient oracle: the upstream times the inputs and outputs
        try:
            forward = outputs(call(ref_fn, *build("float64", False), mode="input", dtype="float64"), False)
        except Exception:  # noqa: BLE001 - the gradient ran; its forward is only the scale's
            forward = []
        scale = largest(UPSTREAMS) * max(largest(DATA["in_" + n] for n in FLOAT_INPUTS if "in_" + n in DATA),
                                         largest(forward), NORMALISED)
    worst, nonfinite, where = 0.0, 0, None
    for k, (o, r) in enumerate(zip(low, ref)):
        if o.shape != r.shape:
            print(f"output {k}: shape {o.shape} vs float64 {r.shape}")
            return 1
        err, nf = errors(o, r, DTYPE, ULP_FLOOR, FTZ, scale)
        nonfinite += nf
        if err.size:
            i = int(np.argmax(err))
            if err.flat[i] >= worst:
                worst = float(err.flat[i])
                where = (k, np.unravel_index(i, err.shape), float(o.flat[i]), float(r.flat[i]))
    print(f"{DTYPE} max error {worst:.4g} ulp on the finite outputs (threshold {THRESHOLD_ULP:.4g}: {THRESHOLD_WHY}); "
          f"NaN/Inf outputs where the float64 run is finite and in range: {nonfinite}")
    if where is not None:
        k, idx, o, r = where
        print(f"  worst element output[{k}][{', '.join(map(str, idx))}]: {DTYPE} {o!r}, float64 {r!r}")
    if KIND == "crash":
        return 0
    # new NaN/Inf as the gate defines it: this checkout's output is NaN/Inf where base's output
    # (stored beside the input) is finite, even where the float64 run is NaN too; except an
    # infinity that is the float64 run correctly rounded where base's finite value is no answer
    # either (off from base's float64 run by 2^(p/2) ulps or more)
    new, stored = 0, False
    for k, o in enumerate(low):
        b = DATA.get(f"base_out_{k}")
        o = np.asarray(o)
        if b is not None and b.shape == o.shape and o.dtype.kind == "f":
            stored = True
            r = np.asarray(ref[k], np.float64) if k < len(ref) and np.shape(ref[k]) == o.shape else None
            mask = new_nonfinite_mask(o, b, r, DATA.get(f"base_ref_{k}"), DTYPE)
            new += int(np.count_nonzero(mask))
        elif b is None and o.dtype.kind == "f":
            new += int(np.count_nonzero(~np.isfinite(o)))
    if new:
        print(f"NaN/Inf where base's output is finite: {new}")
    if KIND == "nonfinite":  # against base's stored output: NaN/Inf base shares is not the finding
        return 1 if new or (nonfinite and not stored) else 0
    return 1 if worst > THRESHOLD_ULP or new else 0


if __name__ == "__main__":
    sys.exit(main())
'''

def _py(v) -> str:
    """A Python literal for ``v`` (parameters are plain JSON-ish values and tuples)."""
    if isinstance(v, float) and not np.isfinite(v):
        return f"float({repr(str(v))})"
    if isinstance(v, (np.integer,)):
        return repr(int(v))
    if isinstance(v, (np.floating,)):
        return _py(float(v))
    if isinstance(v, tuple):
        return "(" + "".join(_py(x) + ", " for x in v) + ")"
    if isinstance(v, list):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(x)}" for k, x in v.items()) + "}"
    return repr(v)


def write_repro(folder: Path, stem: str, spec: OpSpec, variant: Variant, cand: Candidate, *, kind: str,
                threshold: float, threshold_why: str, repo: Path, python_path, reason: str,
                base_reference=None, base_outputs=None, ftz: bool = False, summary: Optional[str] = None,
                hang_after: Optional[float] = None, env: Optional[dict] = None) -> dict:
    """Write ``<stem>.py`` and ``<stem>.npz`` into ``folder``; returns their paths and the command.
    ``env``: variables the script sets where its environment does not (default: the values of the
    config's ``env:``, which the gate's workers had: keras's torch backend needs
    ``KERAS_BACKEND=torch`` or its import loads TensorFlow beside torch and aborts)."""
    if env is None:
        from ..backends.sandbox import config_values

        env = config_values()
    folder.mkdir(parents=True, exist_ok=True)
    script, data = folder / f"{stem}.py", folder / f"{stem}.npz"
    arrays = {f"in_{k}": np.asarray(v) for k, v in cand.arrays.items()}
    for k, a in enumerate(base_reference or []):
        arrays[f"base_ref_{k}"] = np.asarray(a, dtype=np.float64)
    for k, a in enumerate(base_outputs or []):  # the judge's "new NaN/Inf" is against base's output
        arrays[f"base_out_{k}"] = np.asarray(a, dtype=np.float64)
    np.savez_compressed(data, **arrays)
    lay = spec.layout(variant.layout)
    present, call_kwargs = [t for t in spec.inputs if t.name in cand.arrays], {}
    header = {
        "OP": spec.name, "VARIANT": variant.key, "CALLABLE": spec.callable, "CONSTRUCT": dict(spec.construct), "REFERENCE": spec.reference,
        "INPUTS": [t.name for t in spec.inputs if t.name in cand.arrays],
        # where each input goes in the call, as the gate's callers place it (input packs as lists)
        "CALL_ARGS": arrange(((t, t.name) for t in present), call_kwargs),
        "CALL_KWARGS": call_kwargs,
        "FLOAT_INPUTS": float_input_names(spec),
        "INPUT_DTYPES": {t.name: t.dtype for t in spec.inputs if t.dtype and t.kind == "float"},
        "SUBCLASSES": {t.name: t.subclass for t in spec.inputs if t.subclass},
        "PARAMS": {k: ({"__import__": str(v)} if isinstance(v, ImportRef) else v) for k, v in cand.params.items()},
        "DTYPE": variant.dtype,
        "INPUT_DTYPE": "float32" if variant.mode == "operator" else variant.dtype,
        "MODE": variant.mode, "DEVICE": variant.device, "ORACLE": variant.oracle,
        "THREADS": intra_op_threads(),  # the gate's CPU threads per call: the same sums, the same rounding
        "MEMORY_FORMAT": lay.memory_format if lay else None,
        "PERMUTE": {k: tuple(v) for k, v in (lay.permute.items() if lay else [])},
        "OUT_PERMUTE": tuple(lay.out_permute) if lay and lay.out_permute else None,
        "LAYOUT_PARAMS": dict(lay.params) if lay else {},
        "KIND": kind, "THRESHOLD_ULP": float(threshold), "THRESHOLD_WHY": threshold_why,
        "HANG_AFTER": float(hang_after) if hang_after else None,
        "ULP_FLOOR": spec.ulp_floor, "NORMALISED": normalised_scale(spec), "FTZ": bool(ftz), "SUMMARY": summary or cand.summary(),
        "PYTHON_PATH": list(python_path), "DEFAULT_REPO": str(Path(repo).resolve()),
        "ENV": dict(env or {}),
    }
    doc = (f'"""Reproduce {spec.name}[{variant.key}]: {reason}\n\n'
           f"Generated by dl-gate (localise). Needs only numpy and {spec.framework}, and the operator library:\n"
           f"imported from {header['DEFAULT_REPO']} by default; --repo DIR (or DL_GATE_REPO) picks another\n"
           f"checkout, e.g. the base branch, to compare. Data: {data.name} beside this file.\n"
           f'Exit status: 1 when the finding reproduces, 0 when it does not, 2 when the library cannot be\n'
           f'imported (a broken environment)."""\n')
    lines = [
        "#!/usr/bin/env python3",
        doc,
        "import argparse", "import contextlib", "import importlib", "import inspect", "import os", "import sys", "import types", "", "import numpy as np", "",
    ]
    for k, v in header.items():
        lines.append(f"{k} = {_py(v)}")
    lines += ["for _name, _value in ENV.items():  # the config's env: values, as the gate's workers had them",
              "    os.environ.setdefault(_name, _value)"]
    lines.append('DATA = dict(np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), '
                 f'{data.name!r})))')
    body = repro_prelude(spec.framework) + _COMMON.replace(
        "{FORMATS}", json.dumps({k: list(v) for k, v in FLOAT_FORMATS.items()}))
    script.write_text("\n".join(lines) + "\n" + body)
    os.chmod(script, 0o755)
    return {"script": str(script), "data": str(data), "command": f"python {script}"}
