"""Shared machinery of the non-precision oracles' runners.

Every runner has the interface the framework-blind engine calls, ``evaluate(candidate) ->
(quantised candidate, Evaluation)``, plus optional hooks :func:`gate.fuzz.fuzz_task` reads:

* ``search_spec``: the operator spec candidates are drawn and mutated from (default: the task's),
* ``guidance``: a guidance the oracle imposes (the NaN search maximises ``spread``),
* ``extra_mutators``: mutators added to the engine's table for this oracle.

The hooks are computed by classmethods from data alone (spec, variant, rule arguments), so an
isolated runner (:mod:`gate.backends.isolate`) can answer them in the parent without importing a
framework.

:class:`PairRunner` is the EAGLE/Audee shape: side A and one or more B sides computed from the
same quantised values at the variant dtype; the error figure is B's divergence from A in ULPs of
that dtype; one side raising while the other returns is a CRASH with a signature naming both.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backends.base import Backend, Output
from ..ops.spec import OpSpec, arrange, resolve_params
from .pair_metrics import closer, compare_pair
from .precision import Metrics, compare
from ..plan import Variant
from ..search.inputs import Candidate
from .runner import CRASH, INVALID, OK, UNSUPPORTED, Evaluation, VariantRunner, exception_signature


class NotComparable(Exception):
    """The candidate is outside what this oracle can compare (e.g. outputs without a batch dim)."""


class OracleRunner(VariantRunner):
    oracle = ""
    guidance: Optional[str] = None

    def __init__(self, spec: OpSpec, variant: Variant, backend: Optional[Backend] = None, **options: Any):
        super().__init__(spec, variant, backend=backend)
        self.options = dict(options)
        self.search_spec = type(self).candidate_spec(spec, variant, self.options)
        self.extra_mutators = type(self).mutators_for(spec, variant, self.options)

    @classmethod
    def build(cls, spec: OpSpec, variant: Variant, options: Dict[str, Any]) -> "OracleRunner":
        return cls(spec, variant, **options)

    # -- hooks (data only, no framework) -----------------------------------------------------
    @classmethod
    def candidate_spec(cls, spec: OpSpec, variant: Variant, options: Dict[str, Any]) -> OpSpec:
        return spec

    @classmethod
    def mutators_for(cls, spec: OpSpec, variant: Variant, options: Dict[str, Any]) -> Dict[str, Callable]:
        return {}

    # -- calling -----------------------------------------------------------------------------
    def native_call(self, cand: Candidate, dtype: str, *, memory_format: Optional[str] = None,
                    use_layout: bool = False) -> Tuple[list, dict]:
        """Arguments of one call at ``dtype``: the variant's layout when ``use_layout``, else the
        default layout with every tensor in ``memory_format`` (None: dense)."""
        if use_layout or memory_format is None:
            return self.build_call(cand, dtype, low=use_layout)
        placed: list = []
        kwargs: Dict[str, Any] = resolve_params(cand.params, self.spec.name)
        for t in self.spec.inputs:
            d = t.dtype if (t.dtype and t.kind == "float" and dtype != "float64") else dtype
            native = self.backend.to_native(cand.arrays[t.name], d, self.variant.device, memory_format=memory_format)
            if t.subclass:
                native = self.backend.as_subclass(native, t.subclass)
            placed.append((t, native))
        return arrange(placed, kwargs), kwargs

    def run_call(self, fn: Callable, args: Sequence, kwargs: dict, dtype: str) -> List[Output]:
        return self.backend.to_outputs(
            self.backend.call(fn, args, kwargs, mode="input", dtype=dtype, device=self.variant.device))

    def run_at(self, cand: Candidate, dtype: str, *, fn: Optional[Callable] = None,
               memory_format: Optional[str] = None, use_layout: bool = False) -> List[Output]:
        args, kwargs = self.native_call(cand, dtype, memory_format=memory_format, use_layout=use_layout)
        return self._outputs(self.backend.call(fn or self.fn, args, kwargs, mode="input", dtype=dtype,
                                               device=self.variant.device), low=use_layout)

    def classify(self, exc: BaseException) -> str:
        return UNSUPPORTED if self.backend.is_unsupported(exc) else CRASH


Side = Tuple[str, Callable[[], List[Output]]]


class PairRunner(OracleRunner):
    """Side A vs each B side, on identical values at the variant dtype."""

    a_name = "a"

    @property
    def compare_floor(self) -> str:
        """ULP floor of the divergence: the operator's own (elementwise ops: per element)."""
        return str(self.options.get("ulp_floor") or self.spec.ulp_floor)

    def skip(self, q: Candidate) -> Optional[str]:
        """Why this candidate cannot be compared by this oracle (``None``: it can)."""
        return None

    def side_a(self, q: Candidate) -> List[Output]:
        return self.run_low(q)

    def sides_b(self, q: Candidate, a: Optional[List[Output]]) -> List[Side]:
        """The computation(s) that must agree with side a; each differential runner defines them."""
        raise NotImplementedError(f"{type(self).__name__} defines no side b")

    def facts(self) -> Dict[str, Any]:
        return {}

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        t0 = time.perf_counter()
        q = cand if quantized else self.quantize(cand)

        def done(status: str, **kw) -> Tuple[Candidate, Evaluation]:
            return q, Evaluation(status, seconds=time.perf_counter() - t0, **kw)

        why = self.skip(q)
        if why:
            return done(INVALID, error=why)
        try:
            ref = self.run_reference(q)
        except Exception as exc:  # outside the operator's domain
            return done(INVALID, error=exception_signature(exc)[1])
        a, err_a = _attempt(lambda: self.side_a(q))
        if err_a is not None and isinstance(err_a, NotComparable):
            return done(INVALID, error=str(err_a))
        results: List[Tuple[str, Optional[List[Output]], Optional[BaseException]]] = []
        for name, thunk in self.sides_b(q, a):
            out, err = _attempt(thunk)
            results.append((name, out, err))
        # one side raising while the other returns is the finding; both raising is not ours
        for name, out, err in results:
            if isinstance(err, NotComparable):
                return done(INVALID, error=str(err))
            for failed, other, exc in ((self.a_name, name, err_a), (name, self.a_name, err)):
                if exc is None:
                    continue
                if self.backend.is_unsupported(exc):
                    sig, short = exception_signature(exc)
                    return done(UNSUPPORTED, error=f"{failed}: {short}", signature=f"{failed}: {sig}")
            if (err_a is None) != (err is None):
                failed, other, exc = (name, self.a_name, err) if err is not None else (self.a_name, name, err_a)
                sig, short = exception_signature(exc)
                return done(CRASH, error=f"{failed} raised {short}; {other} returned",
                            signature=f"{failed} raised {sig}; {other} returned",
                            extra={"oracle": self.oracle, "raised": failed, "returned": other, **self.facts()})
        ok = [(n, o) for n, o, e in results if e is None]
        if err_a is not None or not ok:
            exc = err_a or next(e for _, _, e in results if e is not None)
            return done(INVALID, error=f"every side raised: {exception_signature(exc)[1]}")
        dtype = self.variant.dtype
        worst: Optional[Tuple[str, Metrics, List[Output]]] = None
        for name, out in ok:
            m = compare_pair(a, out, dtype, self.compare_floor)
            if worst is None or (m.severity, m.ulp, m.abs) > (worst[1].severity, worst[1].ulp, worst[1].abs):
                worst = (name, m, out)
        name_b, metrics, out_b = worst
        err_a64 = compare(a, ref, dtype, self.spec.ulp_floor)
        err_b64 = compare(out_b, ref, dtype, self.spec.ulp_floor)
        extra = {
            "oracle": self.oracle,
            "a": self.a_name,
            "b": name_b,
            "closer": closer(err_a64, err_b64, self.a_name, name_b),
            "a_ulp_vs_float64": err_a64.ulp,
            "b_ulp_vs_float64": err_b64.ulp,
            **self.facts(),
        }
        ev = Evaluation(OK, metrics=metrics, seconds=time.perf_counter() - t0, extra=extra)
        if keep_outputs:  # as the precision runner: the judged output and the float64 reference
            ev.outputs, ev.reference = out_b, ref
        return q, ev


def _attempt(thunk: Callable[[], List[Output]]) -> Tuple[Optional[List[Output]], Optional[BaseException]]:
    try:
        return thunk(), None
    except Exception as exc:  # the side's own failure, judged by the caller
        return None, exc


def float_input_names(spec: OpSpec) -> List[str]:
    """Float tensor inputs in the order a backend sees them (positional, then keyword)."""
    pos = [t.name for t in spec.inputs if t.kind == "float" and not t.keyword]
    kw = [t.name for t in spec.inputs if t.kind == "float" and t.keyword]
    return pos + kw


def content_seed(cand: Candidate, names: Sequence[str], salt: int = 0) -> int:
    """A seed derived from the candidate's input values (stable across runs and processes)."""
    import zlib

    h = salt & 0xFFFFFFFF
    for n in names:
        a = cand.arrays.get(n)
        if a is not None:
            h = zlib.crc32(np.ascontiguousarray(a).tobytes(), h)
            h = zlib.crc32(repr(a.shape).encode(), h)
    return h
