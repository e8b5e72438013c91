"""Sub-operations of a composite operator, and the first one where the error jumps.

Recording, PyTorch: a :class:`torch.overrides.TorchFunctionMode` sees every torch function and
tensor method the operator's Python code calls, with the caller's file:line (the innermost
frame outside the frameworks, the standard library and dl-gate) and the call stack of library
frames. TensorFlow (eager TF has no function mode): while tracing, the public functions of
``tf``, ``tf.math``, ``tf.nn``, ``tf.linalg``, ... and the tensor operators are swapped for
recording wrappers and ``tf.function`` bodies run eagerly; a call from TensorFlow's own code is
not recorded, so a library call counts once. Both feed one framework-neutral recorder.

Error per call (shadow execution): while the operator runs at the variant's dtype, every call
is run a second time on float64 *shadows* of its tensor inputs (the shadow of a call's output
feeds later calls; the operator's own inputs are their exact float64 values; casts pass the
shadow through). The shadow follows the very code path the low-precision run takes, so a branch
taken only for one dtype is measured like any other code. ``δ`` of a call is the error of its
output against its shadow in ULPs of the variant's dtype, with the precision oracle's floor
(:func:`gate.oracles.precision.compare`).

Analysis (NumPy only), after Audee's change rate:

* ``δ_inputs`` is the largest δ among the calls that produced a call's tensor inputs (0 for the
  operator's own inputs, which are exact);
* ``R = (δ − δ_inputs) / (δ_inputs + ε)``; a call *jumps* when ``δ`` exceeds the gate's floor
  and ``R > m − 1`` (its error is more than ``m`` times what it was given: the judge's rule);
* head vs base: both are traced, their calls aligned by name (``difflib``), and the culprit is
  the first head call that jumps where base's counterpart does not (or that base does not make:
  new code). Without base, the first jump on head;
* a behaviour change compares head's float64 intermediates with base's (a float64 run of each);
* a crash names the call that raised (or the library line the exception left).
"""
from __future__ import annotations

import difflib
import json
import math
import os
import sys
import sysconfig
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backends.base import Output
from ..oracles.precision import compare

EPS = 1e-7
MAX_RECORDED_ELEMENTS = 4_000_000  # per run; beyond it outputs are not kept (δ unknown)


@dataclass
class Call:
    index: int
    name: str
    file: Optional[str] = None
    line: Optional[int] = None
    function: Optional[str] = None
    stack: List[str] = field(default_factory=list)  # library frames, outermost first: "file:line function"
    inputs: List[int] = field(default_factory=list)  # producing call per tensor input (-1: not traced)
    shapes: List[List[int]] = field(default_factory=list)
    delta: Optional[float] = None  # error vs the float64 shadow, ULPs of the dtype (low run only)
    overflow: int = 0  # elements that are ±inf where the shadow is finite (beyond the dtype's range)
    error: Optional[str] = None
    outputs: Optional[List[np.ndarray]] = field(default=None, repr=False)  # float64 run only

    @property
    def site(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "?"

    def meta(self) -> dict:
        d = asdict(self)
        d.pop("outputs")
        if isinstance(d.get("delta"), float) and math.isinf(d["delta"]):
            d["delta"] = "inf"
        return d


@dataclass
class Trace:
    calls: List[Call] = field(default_factory=list)
    error: Optional[str] = None  # exception that escaped the operator
    error_site: Optional[dict] = None  # {file, line, function, stack} of the innermost library frame
    truncated: bool = False


@dataclass
class OpTrace:
    """One operator on one input: at the variant's dtype with shadows (``low``) and, for
    behaviour changes, at float64 with outputs kept (``f64``)."""

    dtype: str
    low: Optional[Trace] = None
    f64: Optional[Trace] = None
    note: Optional[str] = None

    # -- (de)serialisation across the worker boundary ---------------------------------------
    def save(self, npz: Path, name: str) -> dict:
        arrays: Dict[str, np.ndarray] = {}
        meta: Dict[str, Any] = {"dtype": self.dtype, "note": self.note, "arrays": name}
        for side in ("low", "f64"):
            tr: Optional[Trace] = getattr(self, side)
            if tr is None:
                meta[side] = None
                continue
            meta[side] = {"error": tr.error, "error_site": tr.error_site, "truncated": tr.truncated,
                          "calls": [c.meta() for c in tr.calls]}
            for c in tr.calls:
                if c.outputs is None:
                    continue
                for k, a in enumerate(c.outputs):
                    arrays[f"{side}_{c.index}_{k}"] = a
                meta[side]["calls"][c.index]["n_out"] = len(c.outputs)
        np.savez(npz, **arrays)
        return meta

    @classmethod
    def load(cls, meta: dict, folder: Path) -> "OpTrace":
        out = cls(dtype=meta["dtype"], note=meta.get("note"))
        path = Path(folder) / meta["arrays"]
        z = np.load(path) if path.exists() else None
        try:
            for side in ("low", "f64"):
                m = meta.get(side)
                if m is None:
                    continue
                calls = []
                for c in m["calls"]:
                    c = dict(c)
                    n = c.pop("n_out", None)
                    if c.get("delta") == "inf":
                        c["delta"] = math.inf
                    call = Call(**c)
                    if n is not None and z is not None:
                        call.outputs = [z[f"{side}_{call.index}_{k}"] for k in range(n)]
                    calls.append(call)
                setattr(out, side, Trace(calls=calls, error=m.get("error"), error_site=m.get("error_site"),
                                         truncated=bool(m.get("truncated"))))
        finally:
            if z is not None:
                z.close()
                path.unlink(missing_ok=True)
        return out


# ---------------------------------------------------------------------------------------
# recording (torch: a function mode; TensorFlow: wrapped API functions)
# ---------------------------------------------------------------------------------------
def _dir_of(module_name: str) -> Optional[str]:
    mod = sys.modules.get(module_name)
    f = getattr(mod, "__file__", None)
    return os.path.dirname(os.path.abspath(f)) + os.sep if f else None


class _Frames:
    """Which frames belong to the operator's own code (the *library*)."""

    def __init__(self, root: Optional[str]):
        self.root = os.path.abspath(root) + os.sep if root else None
        self.gate = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        self.skip = [d for d in (_dir_of("torch"), _dir_of("numpy"), _dir_of("tensorflow"), _dir_of("keras"),
                                 _dir_of("tf_keras")) if d]
        self.stdlib = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep

    def is_framework(self, filename: str) -> bool:
        f = os.path.abspath(filename)
        if any(f.startswith(d) for d in self.skip) or filename.startswith("<"):
            return True
        return f.startswith(self.stdlib) and "site-packages" not in f and "dist-packages" not in f

    def is_gate(self, filename: str) -> bool:
        return os.path.abspath(filename).startswith(self.gate)

    def rel(self, filename: str) -> str:
        f = os.path.abspath(filename)
        if self.root and f.startswith(self.root):
            return os.path.relpath(f, self.root).replace(os.sep, "/")
        return f

    def library_stack(self, frame) -> Optional[List[Tuple[str, int, str]]]:
        """Library frames from ``frame`` outwards (innermost first), or None when the call comes
        from dl-gate itself (the operator is a framework built-in called directly)."""
        out: List[Tuple[str, int, str]] = []
        f = frame
        while f is not None:
            fn = f.f_code.co_filename
            if self.is_gate(fn):
                break
            if not self.is_framework(fn):
                out.append((self.rel(fn), f.f_lineno, f.f_code.co_name))
            f = f.f_back
        return out or None

    def site(self, stack: List[Tuple[str, int, str]]) -> Tuple[str, int, str]:
        """The innermost frame, preferring the repository's own files."""
        if self.root:
            for fr in stack:
                if not os.path.isabs(fr[0]):
                    return fr
        return stack[0]


def _remap(obj, is_tensor, fn):
    if is_tensor(obj):
        return fn(obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_remap(o, is_tensor, fn) for o in obj)
    if isinstance(obj, list):
        return [_remap(o, is_tensor, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _remap(v, is_tensor, fn) for k, v in obj.items()}
    return obj


def _collect(obj, is_tensor, out: list) -> list:
    if is_tensor(obj):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _collect(o, is_tensor, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _collect(o, is_tensor, out)
    return out


class _Recorder:
    """Records the library's calls into the framework; with ``dtype``, shadows each call at
    float64 and keeps its δ; with ``keep``, keeps the outputs (float64 runs compared across
    base and head). The front ends (:func:`_torch_recorder`, :func:`_tf_recorder`) route the
    calls here."""

    def __init__(self, fw, frames: "_Frames", dtype: Optional[str] = None, ulp_floor: str = "output",
                 keep: bool = False):
        self.fw, self.frames = fw, frames
        self.trace = Trace()
        self.dtype, self.ulp_floor, self.keep_outputs = dtype, ulp_floor, keep
        self.producer: Dict[int, int] = {}
        self.shadow: Dict[int, Any] = {}
        self.alive: list = []  # outputs stay alive so that ids are not reused
        self.elements = 0

    def _shadow_call(self, name, func, args, kwargs, outs):
        """Float64 shadows of ``outs``: ``func`` on the shadows of its inputs."""
        fw = self.fw
        if name in fw.casts and args and fw.is_float(args[0]):
            src = self.shadow.get(id(args[0]))
            return [fw.copy(src if src is not None else fw.as_f64(args[0]))] if len(outs) == 1 else None

        def sh(t):
            s = self.shadow.get(id(t))
            if s is not None:
                return s
            return fw.as_f64(t) if fw.is_float(t) else t

        def plain(t):
            return fw.as_f64(t) if fw.is_float(t) else t

        for how in (sh, plain):
            try:
                with fw.plain(outs):
                    res = func(*_remap(args, fw.is_tensor, how), **_remap(kwargs, fw.is_tensor, how))
            except Exception:
                continue
            souts = [t for t in _collect(res, fw.is_tensor, []) if fw.is_float(t)]
            if len(souts) == len(outs) and all(fw.shape(a) == fw.shape(b) for a, b in zip(souts, outs)):
                return [fw.as_f64(t) for t in souts]
        return None

    def record(self, name: str, func, args, kwargs, stack):
        """Run ``func`` (called by the library from ``stack``) and record the call."""
        fw = self.fw
        ins = [self.producer.get(id(t), -1) for t in _collect((args, kwargs), fw.is_tensor, [])]
        site = self.frames.site(stack)
        call = Call(index=len(self.trace.calls), name=name, file=site[0], line=site[1], function=site[2],
                    stack=[f"{f}:{ln} {fn}" for f, ln, fn in reversed(stack)], inputs=ins)
        try:
            out = func(*args, **kwargs)
        except (Exception, SystemExit) as exc:
            call.error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            self.trace.calls.append(call)
            raise
        outs = [t for t in _collect(out, fw.is_tensor, []) if fw.is_float(t)]
        if not outs:
            return out
        call.shapes = [fw.shape(t) for t in outs]
        n = sum(fw.numel(t) for t in outs)
        if self.elements + n > MAX_RECORDED_ELEMENTS:
            self.trace.truncated = True
        else:
            self.elements += n
            if self.dtype is not None:
                shadows = self._shadow_call(name, func, args, kwargs, outs)
                if shadows is not None:
                    for t, sd in zip(outs, shadows):
                        self.shadow[id(t)] = sd
                    lo, hi = [fw.to_numpy(t) for t in outs], [fw.to_numpy(sd) for sd in shadows]
                    call.delta = _delta(lo, hi, self.dtype, self.ulp_floor)
                    call.overflow = int(sum(np.count_nonzero(np.isinf(a) & np.isfinite(b)) for a, b in zip(lo, hi)
                                            if a.shape == b.shape))
            if self.keep_outputs:
                call.outputs = [fw.to_numpy(t) for t in outs]
        self.trace.calls.append(call)
        for t in outs:
            self.producer[id(t)] = call.index
            self.alive.append(t)
        return out


#: factories of uninitialised memory (an output buffer a kernel fills in place, e.g. a Triton
#: launch or an ``out=`` call): their values are garbage by definition, never a sub-operation's error
UNINITIALISED = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


def _uninitialised(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in UNINITIALISED


def _torch_recorder(frames: "_Frames", **kw):
    """A torch function mode (:func:`gate.backends.trace_hooks.torch_mode`) that routes every
    torch function and tensor method the library calls to the recorder."""
    from ..backends.trace_hooks import TorchTensors, torch_mode

    core = _Recorder(TorchTensors(), frames, **kw)

    def intercept(name, func, args, kwargs, caller):
        stack = frames.library_stack(caller)
        if stack is None or name.endswith("__get__") or name.endswith("__set__") or _uninitialised(name):
            return func(*args, **kwargs)
        return core.record(name, func, args, kwargs, stack)

    mode = torch_mode(intercept)
    mode.trace = core.trace
    return mode


class _TFRecorder:
    """Eager TensorFlow has no function mode: while active, its public functions and tensor
    operators are replaced by wrappers (:class:`gate.backends.trace_hooks.TfPatches`) that route
    here. Only calls made by the library itself are recorded (TensorFlow's internal use of the
    same functions goes through its own modules)."""

    def __init__(self, frames: "_Frames", **kw):
        from ..backends.trace_hooks import TensorFlowTensors, TfPatches

        self.core = _Recorder(TensorFlowTensors(), frames, **kw)
        self.trace = self.core.trace
        self.frames = frames
        self._depth = 0
        self._patches = TfPatches(self._intercept)

    def _intercept(self, name, func, args, kwargs, caller):
        if self._depth:  # inside a recorded call
            return func(*args, **kwargs)
        if self.frames.is_framework(caller.f_code.co_filename):  # TensorFlow's own use
            return func(*args, **kwargs)
        stack = self.frames.library_stack(caller)
        if stack is None:
            return func(*args, **kwargs)
        self._depth += 1
        try:
            return self.core.record(name, func, args, kwargs, stack)
        finally:
            self._depth -= 1

    def __enter__(self):
        self._patches.__enter__()
        return self

    def __exit__(self, *exc):
        return self._patches.__exit__(*exc)


def trace_op(spec, variant, cand, root: Optional[str] = None, float64_run: bool = False) -> OpTrace:
    """Trace ``spec`` on ``cand`` at the variant's dtype (with float64 shadows) and, with
    ``float64_run``, once more at float64 keeping every intermediate output."""
    from ..backends import get_backend
    from ..oracles.runner import VariantRunner

    result = OpTrace(dtype=variant.dtype)
    if spec.framework not in ("torch", "tensorflow"):
        result.note = f"sub-operations are traced for PyTorch and TensorFlow operators only ({spec.framework})"
        return result
    get_backend(spec.framework)
    runner = VariantRunner(spec, variant)
    frames = _Frames(root)
    recorder = _torch_recorder if spec.framework == "torch" else _TFRecorder
    q = runner.quantize(cand)
    runs = [("low", runner.input_dtype, variant.mode, variant.dtype, dict(dtype=variant.dtype, ulp_floor=spec.ulp_floor))]
    if float64_run:
        runs.append(("f64", "float64", "input", "float64", dict(keep=True)))
    for side, in_dtype, mode, dtype, kw in runs:
        rec = recorder(frames, **kw)
        try:
            args, kwargs = runner.build_call(q, in_dtype, low=True)
            with np.errstate(all="ignore"), rec:
                runner.backend.call(runner.fn, args, kwargs, mode=mode, dtype=dtype, device=variant.device)
        except (Exception, SystemExit) as exc:  # sys.exit() in the operator is a crash like any other
            rec.trace.error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            rec.trace.error_site = _error_site(exc, frames)
        setattr(result, side, rec.trace)
    if not result.low.calls and not result.low.error:
        result.note = (f"no sub-operations: the operator is a framework built-in (or calls no "
                       f"{'torch' if spec.framework == 'torch' else 'TensorFlow'} function)")
    return result


def _error_site(exc: BaseException, frames: _Frames) -> Optional[dict]:
    lib = [(frames.rel(fs.filename), fs.lineno, fs.name) for fs in traceback.extract_tb(exc.__traceback__)
           if not frames.is_gate(fs.filename) and not frames.is_framework(fs.filename)]
    if not lib:
        return None
    f, ln, fn = frames.site(list(reversed(lib)))
    return {"file": f, "line": ln, "function": fn, "stack": [f"{a}:{b} {c}" for a, b, c in lib]}


# ---------------------------------------------------------------------------------------
# analysis (NumPy only)
# ---------------------------------------------------------------------------------------
#: traces longer than this (the product of both lengths) are not aligned by difflib, whose
#: matching is quadratic and worse on the repetitive traces of a loop: a running log-sum-exp over
#: 8,192 steps (50K calls a side) held localisation for minutes past its budget
ALIGN_LIMIT = 1_000_000


def align(a: Sequence[Any], b: Sequence[Any]) -> Dict[int, int]:
    """Index map a -> b of the longest matching subsequences of keys; for long traces, the
    common prefix and suffix, then the k-th call of each function in between to the k-th call of
    the same function (linear: a loop whose body changed still aligns iteration by iteration)."""
    a, b = list(a), list(b)
    out: Dict[int, int] = {}
    if len(a) * len(b) <= ALIGN_LIMIT:
        sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
        for blk in sm.get_matching_blocks():
            for k in range(blk.size):
                out[blk.a + k] = blk.b + k
        return out
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        out[p] = p
        p += 1
    s = 0
    while s < n - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        out[len(a) - 1 - s] = len(b) - 1 - s
        s += 1
    where: Dict[Any, List[int]] = {}
    for j in range(p, len(b) - s):
        where.setdefault(b[j], []).append(j)
    seen: Dict[Any, int] = {}
    for i in range(p, len(a) - s):
        k = seen.get(a[i], 0)
        js = where.get(a[i])
        if js is not None and k < len(js):
            out[i] = js[k]
        seen[a[i]] = k + 1
    return out


def _short(name: str) -> str:
    if name.startswith("tf.Tensor.__"):  # x / y -> truediv
        return name[len("tf.Tensor.__"):].rstrip("_")
    for p in ("torch.Tensor.", "torch.nn.functional.", "torch.", "tf.math.", "tf.nn.", "tf.linalg.", "tf."):
        if name.startswith(p):
            return name[len(p):]
    return name


def _delta(a: Optional[List[np.ndarray]], b: Optional[List[np.ndarray]], dtype: str, ulp_floor: str) -> Optional[float]:
    if a is None or b is None or len(a) != len(b):
        return None
    m = compare([Output(x, "float64") for x in a], [Output(y, "float64") for y in b], dtype, ulp_floor)
    if m.shape_mismatch:
        return None
    if m.nonfinite:
        return math.inf
    return m.ulp


def rates(trace: Trace, deltas: List[Optional[float]]) -> Tuple[List[float], List[Optional[float]]]:
    """(δ_inputs, R) per call."""
    d_in: List[float] = []
    r: List[Optional[float]] = []
    for c, d in zip(trace.calls, deltas):
        di = max([deltas[p] for p in c.inputs if 0 <= p < len(deltas) and deltas[p] is not None] or [0.0])
        d_in.append(di)
        if d is None:
            r.append(None)
        elif math.isinf(d):
            r.append(0.0 if math.isinf(di) else math.inf)
        else:
            r.append((d - di) / (di + EPS))
    return d_in, r


def _pick(c: Call, **extra) -> dict:
    d = {"call": _short(c.name), "file": c.file, "line": c.line, "function": c.function, "stack": c.stack}
    d.update({k: v for k, v in extra.items() if v is not None})
    return d


def culprit(head: OpTrace, base: Optional[OpTrace], kind: str, floor: float, m: float, ulp_floor: str,
            behaviour_tol: float = 1.0) -> Tuple[Optional[dict], List[dict]]:
    """The first sub-operation where head's error jumps (and base's does not), plus the table
    of every head call (for the details file)."""
    table: List[dict] = []
    thr_r = max(m - 1.0, 1.0)
    if head.low is None:
        return None, table
    if kind == "crash":
        return _crash_culprit(head, table), table
    if kind == "behaviour":
        return _behaviour_culprit(head, base, ulp_floor, behaviour_tol, thr_r, table), table
    return _precision_culprit(head, base, floor, m, thr_r, table), table


def _crash_culprit(head: OpTrace, table: List[dict]) -> Optional[dict]:
    """A crash: the call that raised, or the library line the exception left."""
    failing = [c for c in head.low.calls if c.error]
    for c in head.low.calls:
        table.append({"index": c.index, "call": _short(c.name), "site": c.site, "error": c.error})
    if failing:
        c = failing[-1]
        return _pick(c, delta=f"raises {c.error.split(':')[0]}", error=c.error, how="the call that raised on head")
    if head.low.error_site:
        es = head.low.error_site
        return {"call": "raise", "file": es["file"], "line": es["line"], "function": es["function"],
                "stack": es["stack"], "delta": f"raises {head.low.error.split(':')[0]}", "error": head.low.error,
                "how": "the library line the exception left"}
    return None


def _behaviour_culprit(head: OpTrace, base: Optional[OpTrace], ulp_floor: str, behaviour_tol: float, thr_r: float,
                       table: List[dict]) -> Optional[dict]:
    """Behaviour: head's float64 intermediates against base's; the first call whose output
    departs from base's (or the new code feeding it), else the first call base does not make."""
    if base is None or base.f64 is None or head.f64 is None:
        return None
    hm = align([c.name for c in head.f64.calls], [c.name for c in base.f64.calls])
    dl = [(_delta(c.outputs, base.f64.calls[hm[i]].outputs, head.dtype, ulp_floor) if i in hm else None)
          for i, c in enumerate(head.f64.calls)]
    d_in, rr = rates(head.f64, [0.0 if d is None else d for d in dl])
    rr = [None if d is None else r for d, r in zip(dl, rr)]
    found = None
    for i, c in enumerate(head.f64.calls):
        row = {"index": i, "call": _short(c.name), "site": c.site, "divergence": dl[i], "divergence_inputs": d_in[i],
               "rate": rr[i], "base": _short(base.f64.calls[hm[i]].name) if i in hm else None}
        table.append(row)
        if found is None and dl[i] is not None and dl[i] > behaviour_tol and (rr[i] is None or rr[i] > thr_r):
            new = [p for p in c.inputs if 0 <= p < i and p not in hm]
            src = head.f64.calls[max(new)] if new else c
            found = _pick(src, delta=dl[i], rate=rr[i],
                          how=("new code feeding the first call whose float64 output departs from base's"
                               if new else "first call whose float64 output departs from base's"))
    if found is None:
        new_calls = [c for i, c in enumerate(head.f64.calls) if i not in hm]
        if new_calls:
            found = _pick(new_calls[0], how="first call that base does not make (no intermediate diverged)")
    return found


def _precision_culprit(head: OpTrace, base: Optional[OpTrace], floor: float, m: float, thr_r: float,
                       table: List[dict]) -> Optional[dict]:
    """Precision / NaN: the change rate of head's error, base's as the control; the first call
    whose error jumps on head but not on base, else the first that jumps, else the largest."""
    dh = [c.delta for c in head.low.calls]
    din_h, r_h = rates(head.low, dh)
    db: List[Optional[float]] = []
    r_b: List[Optional[float]] = []
    hb: Dict[int, int] = {}
    if base is not None and base.low is not None:
        db = [c.delta for c in base.low.calls]
        _, r_b = rates(base.low, db)
        hb = align([c.name for c in head.low.calls], [c.name for c in base.low.calls])

    def jumps(d, r):
        return d is not None and d > floor and (r is None or r > thr_r)

    first = found = None
    for i, c in enumerate(head.low.calls):
        j = hb.get(i)
        row = {"index": i, "call": _short(c.name), "site": c.site, "delta": dh[i], "delta_inputs": din_h[i], "rate": r_h[i]}
        if j is not None:
            row.update({"base": _short(base.low.calls[j].name), "base_site": base.low.calls[j].site,
                        "base_delta": db[j] if j < len(db) else None, "base_rate": r_b[j] if j < len(r_b) else None})
        elif base is not None:
            row["base"] = None
        table.append(row)
        if not jumps(dh[i], r_h[i]):
            continue
        if first is None:
            first = (i, c)
        if found is not None:
            continue
        if base is None or base.low is None:
            continue
        bd = db[j] if j is not None and j < len(db) else None
        if j is None:
            found = _pick(c, delta=dh[i], rate=r_h[i], delta_inputs=din_h[i],
                          how="first call whose error jumps on head and that base does not make")
        elif bd is None or not jumps(bd, r_b[j]) or dh[i] > max(floor, m * bd):
            found = _pick(c, delta=dh[i], rate=r_h[i], delta_inputs=din_h[i],
                          base={"call": _short(base.low.calls[j].name), "site": base.low.calls[j].site, "delta": bd,
                                "rate": r_b[j] if j < len(r_b) else None},
                          how="first call whose error jumps on head but not on base")
    if found is None and first is not None:
        i, c = first
        found = _pick(c, delta=dh[i], rate=r_h[i], delta_inputs=din_h[i],
                      how="first call whose error jumps on head (low precision vs its float64 shadow)"
                      + ("; base jumps there too" if base is not None else ""))
    if found is None:
        cand = [(d, i) for i, d in enumerate(dh) if d is not None]
        if cand:
            d, i = max(cand)
            if d > 0:
                found = _pick(head.low.calls[i], delta=d, rate=r_h[i],
                              how="no call's error jumps above the floor; the call with the largest error")
    if found is not None and isinstance(found.get("delta"), float) and math.isinf(found["delta"]):
        found = _overflow_source(head.low, found) or found  # a NaN/Inf that an overflow upstream caused
    elif found is not None and base is not None and base.low is not None:
        found = _rounding_source(head.low, base.low, found, din_h, m) or found
    return found


ROUNDED = 0.25  # ulps: an input carrying less error than this is as exact as the dtype holds it


def _rounding_source(head: Trace, base: Trace, found: dict, din_h: List[float], m: float) -> Optional[dict]:
    """When the culprit jumps because its *input* already carries a rounding error that base's
    calls of the same function never received (a cast of angles to bfloat16 before ``cos``,
    where base took ``cos`` in float32 and rounded after), the call that introduced that error
    from exact inputs is where the PR went wrong: the culprit only amplifies it (``cos`` of a
    large argument, a subtraction that cancels). Base is the control: if its calls of the same
    function got inputs as rounded as head's, the amplifier itself is what changed."""
    idx = next((c.index for c in head.calls if c.file == found.get("file") and c.line == found.get("line")
                and _short(c.name) == found.get("call")), None)
    if idx is None or din_h[idx] < ROUNDED:
        return None
    same = [j for j, c in enumerate(base.calls) if _short(c.name) == found.get("call")]
    if not same:
        return None
    db = [c.delta for c in base.calls]
    din_b, _ = rates(base, db)
    if din_h[idx] <= m * min(din_b[j] for j in same):
        return None
    # walk back along the input that carries the most error to where it first appeared
    k, seen = idx, set()
    while True:
        c = head.calls[k]
        ins = [p for p in c.inputs if 0 <= p < len(head.calls) and head.calls[p].delta is not None]
        if k in seen or not ins:
            break
        seen.add(k)
        p = max(ins, key=lambda q: head.calls[q].delta)
        if head.calls[p].delta < ROUNDED:
            break
        k = p
    if k == idx:
        return None
    o = head.calls[k]
    return _pick(o, delta=o.delta, delta_inputs=din_h[k],
                 how=(f"rounds exact inputs by {o.delta:.3g} ulp here; {found.get('call')} "
                      f"({found.get('file')}:{found.get('line')}) amplifies it to {found.get('delta', 0):.3g} ulp, "
                      f"where base's {found.get('call')} received inputs with at most {min(din_b[j] for j in same):.3g} ulp"))


def _overflow_source(trace: Trace, found: dict) -> Optional[dict]:
    """When the culprit's inputs descend from a call whose result overflowed the dtype (the
    shadow is finite), the earliest such call is where it went wrong: the oracle counts an
    overflow of an out-of-range value as exact, so the error only shows further down."""
    idx = next((c.index for c in trace.calls if c.file == found.get("file") and c.line == found.get("line")
                and _short(c.name) == found.get("call")), None)
    if idx is None:
        return None
    seen, todo, hits = set(), list(trace.calls[idx].inputs), []
    while todo:
        p = todo.pop()
        if p < 0 or p in seen or p >= len(trace.calls):
            continue
        seen.add(p)
        if trace.calls[p].overflow:
            hits.append(p)
        todo.extend(trace.calls[p].inputs)
    if not hits:
        return None
    c = trace.calls[min(hits)]
    return _pick(c, delta=c.delta, overflow=c.overflow,
                 how=f"overflows the dtype here ({c.overflow} element(s) become ±inf, float64 is finite); "
                     f"the error shows at {found.get('call')} ({found.get('file')}:{found.get('line')})")


def summary_json(table: List[dict]) -> str:  # pragma: no cover - debugging aid
    return json.dumps(table, indent=1, default=str)
