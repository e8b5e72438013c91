"""Gradient oracles for differentiable operators (rows with ``grad: true``).

``grad``: backward at the variant dtype vs backward in float64, on identical input values and an
identical upstream gradient ``u``; the error is measured per input gradient in ULPs of the
variant dtype, with the operator's ULP floor (elementwise operators: per element; others: the
ulp of that gradient's magnitude, as their backward results are sums of products whose small
elements carry no relative accuracy).

``gradcheck``: float64 analytic vs numerical gradient, ``torch.autograd.gradcheck``'s fast mode
(``u^T J v`` for random ``u`` and direction ``v``, against central differences of
``phi(t) = <u, f(x + t v)>``), on small inputs. It is written here rather than calling
``torch.autograd.gradcheck`` because the gate needs a magnitude to baseline, not a pass/fail
with fixed tolerances, and because it must skip non-differentiable points: one-sided
differences whose gap does not shrink with the step are a kink (relu at 0, max ties), not a
wrong gradient (detected where the analytic gradient jumps within a step). The error reported is what remains above the numerical noise (the spread of the
central differences at steps h, h/2, h/4 plus float64 rounding), so a correct gradient scores ~0; ``extra`` carries
``gradcheck_ratio``, the error over torch's own tolerance (atol 1e-5 + rtol 1e-3), > 1 meaning
``torch.autograd.gradcheck`` would fail.

``u`` and ``v`` are derived from the candidate's values and stored in the candidate
(``__upstream<k>__``, ``__direction_<input>__``) so that a saved input replays exactly.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..backends.base import NotDifferentiable, Output
from .precision import Metrics, compare, not_measured, ulp
from ..search.inputs import Candidate
from .base import OracleRunner, content_seed, float_input_names
from ..search import randoms
from .runner import INVALID, OK, UNSUPPORTED, Evaluation, exception_signature, largest, remember_largest, widened

UPSTREAM = "__upstream{}__"
DIRECTION = "__direction_{}__"


class _GradBase(OracleRunner):
    def _upstream(self, q: Candidate, dtype: str):
        names = float_input_names(self.spec)

        def make(outs: List[Output]) -> List[Optional[np.ndarray]]:
            ups: List[Optional[np.ndarray]] = []
            for k, o in enumerate(outs):
                if not o.is_float:
                    ups.append(None)
                    continue
                key = UPSTREAM.format(k)
                u = q.arrays.get(key)
                if u is None or u.shape != o.array.shape:
                    rng = np.random.default_rng(content_seed(q, names, salt=k + 1))
                    # NumPy's normals below randoms.MIN_ELEMENTS; above, the search's counter-based
                    # ones (a million of NumPy's: ~12 ms, more than layer_norm's forward and backward)
                    u = self.backend.quantize(randoms.standard_normal(rng, o.array.shape), dtype)
                    if u.size and u.dtype.kind == "f":
                        lo, hi = float(u.min()), float(u.max())  # normals: finite
                        remember_largest(u, max(hi, -lo))
                    q.arrays[key] = u
                ups.append(u)
            return ups

        return make

    def _vjp(self, q: Candidate, dtype: str, fn, upstream_dtype: str) -> Tuple[List[Output], List[Output]]:
        args, kwargs = self.build_call(q, dtype, low=False)
        # a low-precision run's outputs and gradients as they are (float32 for the 32- and 16-bit
        # formats; the scoring widens each element as it reads it): no float64 copy of each
        outs, grads = self.backend.vjp(fn, args, kwargs, self._upstream(q, upstream_dtype), dtype=dtype,
                                       device=self.variant.device, narrow=dtype != "float64")
        names = float_input_names(self.spec)
        if names and all(g is None for g in grads):
            raise NotDifferentiable("not differentiable: no float output of the operator has a gradient with respect "
                                    "to its float inputs (integer outputs, torch.no_grad, .detach(), a NumPy round trip)")
        full = []
        for name, g in zip(names, grads):
            if g is None:  # unused input: its gradient is zero
                g = Output(np.zeros(q.arrays[name].shape), dtype)
            full.append(g)
        return outs, full


def normalised_scale(spec) -> float:
    """1 for an operator whose output is normalised (``kind: normalization``: softmax and its
    log, layer and RMS norms), else 0. Such an operator's local derivatives are O(1) whatever
    its inputs' magnitude (log_softmax's backward sums ``u`` and ``exp(y) * sum(u)``): on a row
    of one value -1e-6 its output is a residue ~0 and the inputs tiny, so upstream x max(inputs,
    outputs) would put the terms that cancelled at 1e-6 of their size (a float32 residue of
    them then reads 5e5 ulp); they are of the upstream's size."""
    return 1.0 if getattr(spec, "kind", None) == "normalization" else 0.0


def forward_nonfinite(low: List[Output], ref: List[Output]) -> int:
    """Elements of the low-precision forward outputs that are NaN/Inf where the float64 forward is
    finite."""
    n = 0
    for o, r in zip(low, ref):
        if o.is_float and r.is_float and np.shape(o.array) == np.shape(r.array):
            n += int(np.count_nonzero(~np.isfinite(o.array) & np.isfinite(r.array)))
    return n


class GradRunner(_GradBase):
    oracle = "grad"

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        t0 = time.perf_counter()
        q = cand if quantized else self.quantize(cand)
        dtype = self.variant.dtype
        try:
            ref_outs, ref = self._vjp(q, "float64", self.ref_fn, dtype)
        except NotDifferentiable as exc:  # found not to be differentiable: the variant does not apply
            return q, Evaluation(UNSUPPORTED, error=str(exc), signature=str(exc), seconds=time.perf_counter() - t0)
        except Exception as exc:  # outside the domain (forward or backward)
            return q, Evaluation(INVALID, error=exception_signature(exc)[1], seconds=time.perf_counter() - t0)
        try:
            fwd, low = self._vjp(q, dtype, self.fn, dtype)
        except NotDifferentiable as exc:  # the reference has a gradient, the operator does not (a kernel launched
            # outside autograd): nothing to judge here; base having one on the same input is judged "gradient lost"
            return q, Evaluation(UNSUPPORTED, error=str(exc), signature=str(exc), seconds=time.perf_counter() - t0)
        except Exception as exc:
            sig, short = exception_signature(exc)
            return q, Evaluation(self.classify(exc), error=f"backward: {short}", signature=f"backward: {sig}",
                                 seconds=time.perf_counter() - t0)
        names = float_input_names(self.spec)
        # the terms a gradient sums are the upstream gradient times the operator's inputs or
        # outputs: a gradient that is zero in exact arithmetic (shift invariance, ties) is judged
        # on that scale, not in ulps of its float64 residue (operators judged per output; an
        # elementwise operator's gradient elements are each their own product, no cancellation)
        scale = 0.0
        if self.spec.ulp_floor == "output":
            ups = largest(q.arrays[k] for k in q.arrays if k.startswith("__upstream"))
            scale = ups * max(largest(q.arrays[n] for n in names if n in q.arrays),
                              largest(o.array for o in ref_outs if o.is_float), normalised_scale(self.spec))
        metrics = compare(low, ref, dtype, self.spec.ulp_floor, scale=scale, check_dtypes=False, figures=self.figures)
        if scale > 0:
            metrics = dataclasses.replace(metrics, scale=scale)
        if self.figures == "all":  # the judge's: did the forward itself fail here (gate.judge.decide)
            broken = forward_nonfinite(fwd, ref_outs)
            if broken:
                metrics = dataclasses.replace(metrics, forward_nonfinite=broken)
        if self.variant.mode == "input":
            # each gradient in its own input's dtype (a mixed-precision input keeps its declared one)
            by_name = {t.name: t.dtype_at(dtype) for t in self.spec.inputs}
            why = next((w for n, g, r in zip(names, low, ref)
                        for w in [not_measured([g], [r], by_name.get(n, dtype))] if w), None)
            if why:
                metrics = dataclasses.replace(metrics, unmeasured=why)
        extra = {"oracle": self.oracle, "inputs": names,
                 "worst_input": names[metrics.worst_output] if names else None}
        ev = Evaluation(OK, metrics=metrics, seconds=time.perf_counter() - t0, extra=extra)
        if keep_outputs:
            ev.outputs, ev.reference = widened(low), ref
        return q, ev


class GradcheckRunner(_GradBase):
    oracle = "gradcheck"
    KINK_SHRINK = 0.75  # gradient jump over [x-h/2v, x+h/2v] vs over [x-hv, x+hv]: 0.5 smooth, 1 kink
    JUMP_FLOOR = 1e-6  # jumps below this share of the largest gradient element are noise

    @classmethod
    def candidate_spec(cls, spec, variant, options):
        cap = int(options.get("cap", 8))
        dims = tuple((name, (lo, f"max({lo}, min({hi}, {cap}))")) for name, (lo, hi) in spec.dims)
        return spec.replace(dims=dims)

    def _shifted(self, q: Candidate, names: List[str], t: float) -> Candidate:
        c = q.copy()
        for n in names:
            c.arrays[n] = q.arrays[n] + t * q.arrays[DIRECTION.format(n)]
        return c

    def _phi(self, q: Candidate, names: List[str], t: float, ups: List[Optional[np.ndarray]]) -> float:
        outs = self.run_call(self.fn, *self.build_call(self._shifted(q, names, t), "float64", low=False), "float64")
        return float(sum(np.sum(u * o.array) for o, u in zip(outs, ups) if u is not None and o.is_float))

    def _analytic(self, q: Candidate, names: List[str], t: float) -> Tuple[float, np.ndarray]:
        """<g(x + t v), v> and the flattened gradient g(x + t v) (same upstream u)."""
        c = self._shifted(q, names, t) if t else q  # a copy of q: the same upstream u
        _, grads = self._vjp(c, "float64", self.fn, "float64")
        flat = np.concatenate([np.reshape(g.array, -1) for g in grads]) if grads else np.zeros(0)
        a = float(sum(np.sum(g.array * q.arrays[DIRECTION.format(n)]) for n, g in zip(names, grads)))
        return a, flat

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 near overflow: judged below
            return self._evaluate(cand, quantized)

    def _evaluate(self, cand: Candidate, quantized: bool) -> Tuple[Candidate, Evaluation]:
        t0 = time.perf_counter()
        q = cand if quantized else self.quantize(cand)
        h = float(self.options.get("step", 1e-6))
        names = float_input_names(self.spec)

        def invalid(msg: str) -> Tuple[Candidate, Evaluation]:
            return q, Evaluation(INVALID, error=msg, seconds=time.perf_counter() - t0)

        rng = np.random.default_rng(content_seed(q, names, salt=0x5EED))
        for n in names:
            key = DIRECTION.format(n)
            x = q.arrays[n]
            if key not in q.arrays or q.arrays[key].shape != x.shape:
                q.arrays[key] = rng.standard_normal(x.shape) * np.maximum(np.abs(x), 1.0)
            dom = next(t.domain for t in self.spec.inputs if t.name == n)
            reach = h * np.abs(q.arrays[key])
            if (dom.lo is not None and np.any(x - reach <= dom.lo)) or (dom.hi is not None and np.any(x + reach >= dom.hi)):
                return invalid(f"{n} is within a finite-difference step of its domain boundary")
        steps = (h, h / 2, h / 4)
        try:
            a0, g0 = self._analytic(q, names, 0.0)
            shifted = {t: self._analytic(q, names, t) for t in (h, -h, h / 2, -h / 2)}
        except Exception as exc:
            return invalid(exception_signature(exc)[1])
        if not (math.isfinite(a0) and all(math.isfinite(v[0]) for v in shifted.values())):
            return invalid("non-finite gradient near this input")
        # a kink (relu at 0, a max with ties, |x| at 0) between x - hv and x + hv: the analytic
        # gradient jumps there by an amount that does not shrink with the step
        jump_h = np.abs(shifted[h][1] - shifted[-h][1])
        jump_h2 = np.abs(shifted[h / 2][1] - shifted[-h / 2][1])
        floor = self.JUMP_FLOOR * max(float(np.max(np.abs(g0))) if g0.size else 0.0, np.finfo(np.float64).tiny)
        if np.any((jump_h > floor) & (jump_h2 > self.KINK_SHRINK * jump_h)):
            return invalid("non-differentiable point (the gradient jumps within a step)")
        outs = self.run_call(self.fn, *self.build_call(q, "float64", low=False), "float64")
        ups = [q.arrays.get(UPSTREAM.format(k)) if o.is_float else None for k, o in enumerate(outs)]
        try:
            phi = {t: self._phi(q, names, t, ups) for t in (0.0, *steps, *(-x for x in steps))}
        except Exception as exc:
            return invalid(f"perturbed input: {exception_signature(exc)[1]}")
        if not all(math.isfinite(v) for v in phi.values()):
            return invalid("non-finite output near this input")
        central = [(phi[x] - phi[-x]) / (2 * x) for x in steps]
        mag = sum(float(np.sum(np.abs(u * o.array))) for o, u in zip(outs, ups) if u is not None and o.is_float)
        rounding = 4 * np.finfo(np.float64).eps * max(mag, abs(phi[0.0])) / steps[-1]
        numerical = central[-1]
        # numerical noise: spread of the central differences and float64 rounding of phi;
        # analytic noise: curvature of <g(x + t v), v> beyond second order (rounding in backward)
        noise = max(abs(central[0] - central[1]), abs(central[1] - central[2])) + rounding
        a_noise = abs(shifted[h][0] - 2 * a0 + shifted[-h][0]) + abs(shifted[h / 2][0] - 2 * a0 + shifted[-h / 2][0])
        err = abs(a0 - numerical)
        scale = max(abs(a0), abs(numerical), np.finfo(np.float64).tiny)
        # below rtol (default 1e-6) float64 central differences are not trustworthy anyway
        excess = max(0.0, err - max(4 * (noise + a_noise), float(self.options.get("rtol", 1e-6)) * scale))
        in_ulp = float(excess / ulp(np.asarray(scale), "float64"))
        metrics = Metrics(ulp=in_ulp, abs=excess, rel=excess / scale, l1=excess, mean_ulp=in_ulp,
                          numel=int(sum(q.arrays[n].size for n in names)), worst_out=a0, worst_ref=numerical)
        extra: Dict[str, Any] = {
            "oracle": self.oracle,
            "analytic": a0,
            "numerical": numerical,
            "noise": float(noise + a_noise),
            "gradcheck_ratio": err / (1e-5 + 1e-3 * abs(numerical)),
            "step": h,
        }
        return q, Evaluation(OK, metrics=metrics, seconds=time.perf_counter() - t0, extra=extra)
