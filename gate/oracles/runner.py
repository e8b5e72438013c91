"""Evaluate one candidate for one variant: quantise the input to the variant's dtype, run the
operator there, run the reference in float64 on the same values, and score the difference.

This is where spec, backend and oracle meet; the search engine above sees only numbers."""
from __future__ import annotations

import collections
import math
import time
import traceback
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..backends import get_backend
from ..backends.base import Backend, Output
from ..errors import UnsupportedVariant
from ..ops.spec import OpSpec, arrange, check_imports, resolve_params
from .precision import compare
from ..plan import Variant
from ..search.evaluation import CRASH, INVALID, OK, UNSUPPORTED, Evaluation, exception_signature, exit_signature  # noqa: F401
from ..search.inputs import Candidate, inside_after_rounding


def quantize_inputs(spec: OpSpec, backend: Backend, cand: Candidate, dtype: str) -> Candidate:
    """``cand`` with every float input rounded to ``dtype`` (the values the kernel will see) and
    kept strictly inside its open value domain."""
    out = cand.derive()
    exhaustive = cand.origin.startswith(("exhaustive", "sweep"))  # every value of the dtype, outside the domain too
    for t in spec.inputs:
        a = out.arrays.get(t.name)
        if a is None or t.kind != "float":
            continue
        d = t.dtype_at(dtype)  # an input that keeps its own dtype (mixed precision)
        a64 = np.asarray(a, dtype=np.float64)
        if exhaustive:
            out.arrays[t.name] = backend.quantize(a64, d)
            continue
        key = (d, t.domain.lo, t.domain.hi, t.domain.values)
        if _was_quantized(a64, key):  # an input the mutation left as it was: rounded already
            continue
        q, extremes = _rounded_within(backend, a64, d)
        q, extremes = within_spread(backend, q, d, t.domain, extremes)
        kept = inside_after_rounding(q, t.domain, d)
        if extremes is not None and kept is q:  # the values run: coverage needs not read their extremes again
            from ..search import coverage

            coverage.remember(q, d, *extremes)
            remember_largest(q, max(extremes[1], -extremes[0]))
        _QUANTIZED.append((weakref.ref(kept), key))
        out.arrays[t.name] = kept
    return out


#: (weak reference to an array quantize_inputs returned, (dtype, domain bounds)) of the last few:
#: each step of rounding, halving and stepping inside the domain leaves such an array as it is,
#: so a candidate that shares it with its parent (a mutation changes one input; ``param`` none)
#: is not rounded again. Candidate arrays are never written in place (gate.search.inputs).
_QUANTIZED: "collections.deque" = collections.deque(maxlen=16)


def _was_quantized(a: np.ndarray, key: tuple) -> bool:
    return any(ref() is a and k == key for ref, k in _QUANTIZED)


def _rounded_within(backend: Backend, a64: np.ndarray, d: str):
    """``(backend.quantize(within_dtype(a64, d), d), extremes)``, rounding first: rounding is
    monotone, so a finite value beyond ``d``'s range rounds either to the largest finite value
    (as its clipped value does) or to an infinity. When the rounded values' least and greatest
    (two reductions, NaN propagates) are finite, no value was clipped and nothing else needs
    checking: ``extremes`` are those two, and :func:`within_dtype`'s own two reductions of the
    input are saved. Otherwise (``extremes`` None) the range is checked as always, and the
    input rounded again only where a value was clipped."""
    q = backend.quantize(a64, d)
    if q.size and d != "float64" and q.dtype.kind == "f":
        from ..backends.base import known_extremes

        # the rounding loop took them as it went (a large array); else two reductions
        lo, hi = known_extremes(q) or (float(q.min()), float(q.max()))
        if math.isfinite(lo) and math.isfinite(hi):
            return q, (lo, hi)
    w = within_dtype(a64, d)
    return (q if w is a64 else backend.quantize(w, d)), None


def within_spread(backend: Backend, q: np.ndarray, dtype: str, domain, extremes):
    """``(q, extremes)`` with the values of one input halved while they span more than
    ``dtype``'s finite range (largest - least > the largest finite value), where the row left
    its domain unbounded on a side (``real``: the gate chose the extent). Beyond that span the
    difference of two of the input's values is not representable in the dtype: the shift every
    stable algorithm makes (``x - max(x)`` in softmax, log-softmax and log-sum-exp, ``x - mean``
    in a normalisation) overflows there whatever the code, so no implementation at the dtype has
    an answer to compare (kornia's focal loss fix, b8f341163, replaced ``log(softmax(x) + eps)``
    by ``log_softmax(x)``: on logits ``[0, 2e38, -2e38]`` the shift gives ``-4e38 = -inf`` in
    float32, ``0 x -inf`` a NaN where the eps version returned a number). A sum of two values
    stays reachable (``(a + b) / 2`` at ``a = b = 60000`` in float16: their span is 0). Halving
    is exact (the extremes are normal numbers; subnormal values are rounded again), keeps every
    sign and ratio the search found, and stays inside a domain unbounded on a side (such a span
    needs values of both signs). ``extremes``: the finite least and greatest of ``q`` when known
    (``None``: read here)."""
    from ..backends.base import FLOAT_FORMATS

    if (domain.lo is not None and domain.hi is not None) or dtype not in FLOAT_FORMATS or dtype == "float64" \
            or not q.size or q.dtype.kind != "f":
        return q, extremes
    if extremes is not None:
        lo, hi = extremes
    else:
        fin = q[np.isfinite(q)]
        if not fin.size:
            return q, extremes
        lo, hi = float(fin.min()), float(fin.max())
    big = _largest_finite(dtype)
    if hi - lo <= big:
        return q, extremes
    return backend.quantize(q * 0.5, dtype), (None if extremes is None else (lo * 0.5, hi * 0.5))


def within_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` with its finite values brought inside ``dtype``'s finite range (a value domain is
    intersected with what the variant can represent): -8e5 drawn from ``real`` for a float16
    variant is -65504, not the -inf its cast would give, so that an input the search made never
    holds an infinity the row did not ask for (NaN from inf - inf is no finding). Values that are
    already NaN or infinite are left as they are."""
    from ..backends.base import FLOAT_FORMATS

    if dtype not in FLOAT_FORMATS or dtype == "float64" or a.size == 0:
        return a
    big = _largest_finite(dtype)
    if -big <= float(a.min()) and float(a.max()) <= big:  # two reductions, no temporary (NaN: False)
        return a
    if not (np.abs(a[np.isfinite(a)]) > big).any():
        return a
    out = a.copy()
    fin = np.isfinite(out)
    out[fin] = np.clip(out[fin], -big, big)
    return out


def _largest_finite(dtype: str) -> float:
    """The largest finite value of ``dtype`` (float16 65504, bfloat16 3.39e38, float32 3.40e38)."""
    from ..backends.base import FLOAT_FORMATS

    p, emax = FLOAT_FORMATS[dtype][0], FLOAT_FORMATS[dtype][2]
    return float((2.0 - 2.0 ** (1 - p)) * 2.0 ** emax)


#: id -> (weak reference, largest finite magnitude) of the live arrays whose extremes were read
#: as they were made (a rounded input, an upstream gradient): a gradient variant's scale reads
#: them every evaluation, and a mutant keeps its parent's upstream gradient for many; an entry
#: goes with its array. Arrays of a candidate are never written in place
_LARGEST: Dict[int, Tuple[Any, float]] = {}


def remember_largest(arr: np.ndarray, value: float) -> None:
    """``arr``'s largest finite magnitude is ``value``: :func:`largest` does not read it again."""
    key = id(arr)
    _LARGEST[key] = (weakref.ref(arr, lambda _r, key=key: _LARGEST.pop(key, None)), float(value))


def largest(arrays) -> float:
    """The largest finite magnitude among ``arrays`` (0 when there is none)."""
    m = 0.0
    for a in arrays:
        known = _LARGEST.get(id(a))
        if known is not None and known[0]() is a:
            m = max(m, known[1])
            continue
        a = np.asarray(a)
        if a.size and a.dtype.kind == "f":
            hi, lo = float(a.max()), float(a.min())  # two reductions, no temporary: NaN/Inf make one non-finite
            if math.isfinite(hi) and math.isfinite(lo):
                m = max(m, hi, -lo)
                continue
            fin = np.abs(a[np.isfinite(a)])
            if fin.size:
                m = max(m, float(fin.max()))
    return m


def is_exhaustive(cand: Candidate) -> bool:
    """A set of every value of the dtype (gate.fuzz.exhaustive), or one value taken from it."""
    return cand.origin.startswith("exhaustive")


#: an exhaustive set passed as a strided view (every other element of a buffer): the element-by-
#: element loop a kernel runs for non-contiguous tensors and for its scalar tail, not its vector body
#: (any origin ending in "-strided"; a float32 sweep's chunks are "sweep" / "sweep-strided"); every
#: element of such sets is measured in ulps of its own reference
STRIDED_ORIGIN = "exhaustive-strided"


class VariantRunner:
    """Runs candidates of ``spec`` under ``variant`` against the float64 reference.

    ``figures``: which error figures :meth:`evaluate` measures (:func:`gate.oracles.precision.
    compare`); a search sets ``"search"`` while it runs and measures its findings again with all."""

    figures = "all"

    @classmethod
    def build(cls, spec: OpSpec, variant: Variant, options: Dict[str, Any]) -> "VariantRunner":
        """The runner of ``variant`` (the precision oracle takes no rule arguments)."""
        return cls(spec, variant)

    def batch_evaluator(self):
        """Candidates concatenated into one call (:mod:`gate.oracles.batch`): the precision
        runner's own, not its subclasses'; ``None`` where batching does not apply."""
        if type(self) is not VariantRunner:
            return None
        from .batch import BatchEvaluator

        return BatchEvaluator(self)

    def __init__(self, spec: OpSpec, variant: Variant, backend: Optional[Backend] = None,
                 fn: Optional[Callable] = None, reference: Optional[Callable] = None):
        self.spec = spec
        self.variant = variant
        self.backend = backend or get_backend(spec.framework)
        if variant.device not in self.backend.devices():
            raise UnsupportedVariant(f"device {variant.device} is not available to {self.backend.name}")
        self.fn = fn or self.backend.resolve(spec.callable, spec.construct)
        check_imports(spec)
        from .references import resolve as resolve_truth

        # a correctly rounded reference (``reference: mpmath.erf``) is the reference everywhere;
        # the row's ``truth`` only on the exhaustive 16-bit sets (cached), where it is cheap
        self.true_ref = None if reference is not None else resolve_truth(spec.reference)
        self.truth = self.true_ref or resolve_truth(spec.truth)
        self.ref_fn = reference or (self.backend.resolve(spec.reference) if spec.reference and self.true_ref is None
                                    else self.fn)
        self.layout = spec.layout(variant.layout)
        self.input_dtype = "float32" if variant.mode == "operator" else variant.dtype

    # -- preparing --------------------------------------------------------------------------
    def quantize(self, cand: Candidate) -> Candidate:
        """The candidate with every float input exactly representable in the dtype the operator
        is given: the variant's, or float32 in mode ``operator`` (what an autocast region or a
        layer under a mixed policy receives: float32 values beyond float16's range and between
        its numbers, which the operator's own cast rounds or overflows; keras d863dc8a5b's
        GroupNormalization cast float32 inputs above 65504 to inf under ``mixed_float16``)."""
        return quantize_inputs(self.spec, self.backend, cand, self.input_dtype)

    def build_call(self, cand: Candidate, dtype: str, low: bool) -> Tuple[list, dict]:
        placed: list = []
        kwargs: Dict[str, Any] = resolve_params(cand.params, self.spec.name)
        lay = self.layout if low else None
        if lay is not None:
            kwargs.update(lay.params)
        memory_format = lay.memory_format if lay is not None else None
        if low and memory_format is None and cand.origin.endswith("-strided"):
            memory_format = "strided"
        for t in self.spec.inputs:
            arr = cand.arrays[t.name]
            if lay is not None and t.name in lay.permute:
                arr = np.ascontiguousarray(np.transpose(arr, lay.permute[t.name]))
            in_dtype = t.dtype if (t.dtype and t.kind == "float" and dtype != "float64") else dtype
            native = self.backend.to_native(arr, in_dtype, self.variant.device, memory_format=memory_format)
            if t.subclass:
                native = self.backend.as_subclass(native, t.subclass)
            placed.append((t, native))
        return arrange(placed, kwargs), kwargs

    def _outputs(self, result: Any, low: bool, narrow: bool = False) -> List[Output]:
        outs = self.backend.to_outputs(result, narrow=narrow)
        if low and self.layout is not None and self.layout.out_permute is not None and outs:
            inv = np.argsort(self.layout.out_permute)
            outs[0] = Output(np.transpose(outs[0].array, inv), outs[0].dtype)
        return outs

    # -- running ----------------------------------------------------------------------------
    def run_reference(self, cand: Candidate) -> List[Output]:
        truth = self.true_ref or (self.truth if is_exhaustive(cand) else None)
        if truth is not None:
            arrays = [cand.arrays[t.name] for t in self.spec.inputs if t.kind == "float"]
            return [Output(truth.values(arrays, resolve_params(cand.params, self.spec.name), self.variant.dtype),
                           "float64")]
        args, kwargs = self.build_call(cand, "float64", low=False)
        return self.backend.to_outputs(
            self.backend.call(self.ref_fn, args, kwargs, mode="input", dtype="float64", device=self.variant.device)
        )

    def run_low(self, cand: Candidate, narrow: bool = False) -> List[Output]:
        """The low-precision run's outputs (``narrow``: as :meth:`Backend.to_outputs` says)."""
        args, kwargs = self.build_call(cand, self.input_dtype, low=True)
        result = self.backend.call(self.fn, args, kwargs, mode=self.variant.mode,
                                   dtype=self.variant.dtype, device=self.variant.device)
        return self._outputs(result, low=True, narrow=narrow)

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        """Score ``cand``; returns the quantised candidate that was actually run. ``keep_outputs``:
        the outputs and the reference come back with the evaluation; ``"nonfinite"``: only where
        an output holds a NaN/Inf (what :class:`gate.judge.contrast.ContrastRunner` looks at:
        an isolated worker then ships two large arrays only when they matter)."""
        t0 = time.perf_counter()
        q = cand if quantized else self.quantize(cand)
        try:
            ref = self.run_reference(q)
        except SystemExit as exc:  # the operator ended the process: a crash, not an invalid input
            sig, short = exit_signature(exc)
            return q, Evaluation(CRASH, error=short, signature=sig, seconds=time.perf_counter() - t0)
        except Exception as exc:  # the input is outside the operator's domain
            return q, Evaluation(INVALID, error=exception_signature(exc)[1], seconds=time.perf_counter() - t0)
        if not ref:
            return q, Evaluation(INVALID, error="the operator returned no tensor or number to compare",
                                 seconds=time.perf_counter() - t0)
        try:
            out = self.run_low(q, narrow=True)  # scored as they are; widened only if kept
        except SystemExit as exc:
            sig, short = exit_signature(exc)
            return q, Evaluation(CRASH, error=short, signature=sig, seconds=time.perf_counter() - t0)
        except Exception as exc:
            sig, short = exception_signature(exc)
            status = UNSUPPORTED if self.backend.is_unsupported(exc) else CRASH
            return q, Evaluation(status, error=short, signature=sig, seconds=time.perf_counter() - t0)
        # an exhaustive set holds every value of the dtype: each element is its own input, measured
        # in ulps of its own reference (a floor from the set's largest output would hide them all)
        # (and there, results below the smallest normal are judged too, unless the framework flushes
        # them by design: the sweep measures the function's accuracy, not a PR's change)
        every_value = q.origin.startswith(("exhaustive", "sweep"))
        floor = "dtype" if every_value else self.spec.ulp_floor
        metrics = compare(out, ref, self.variant.dtype, floor, ftz=self.backend.flush_subnormals or not every_value,
                          figures="all" if every_value else self.figures,
                          check_dtypes=self.variant.mode == "input")
        ev = Evaluation(OK, metrics=metrics, seconds=time.perf_counter() - t0)
        if keep_outputs == "nonfinite":
            keep_outputs = any(o.is_float and not np.isfinite(o.array).all() for o in out)
        if keep_outputs:
            ev.outputs, ev.reference = widened(out), ref
        return q, ev


def widened(outputs: List[Output]) -> List[Output]:
    """``outputs`` with each float array as float64: what a run scored as it came (narrow,
    :meth:`Backend.to_outputs`), kept for a finding."""
    return [Output(o.array.astype(np.float64), o.dtype) if o.is_float and o.array.dtype != np.float64 else o
            for o in outputs]


def format_exception(exc: BaseException) -> str:  # pragma: no cover - debugging aid
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
