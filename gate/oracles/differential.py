"""Cross-framework differential oracle (Audee): a torch operator and its TensorFlow twin on
identical values, through the translation table ``gate/ops/catalog/xfw.yaml``.

Candidates are always drawn from the torch row of the pair (restricted by the table's
allow-list), whichever side the variant belongs to, so ``torch.conv2d[…/xfw]`` and
``tf.conv2d[…/xfw]`` search the same space. Both sides run at the variant dtype on the same
quantised numbers; the error figure is the divergence of the TF output from the torch output in
ULPs of that dtype. ``extra`` says which side is closer to the float64 reference (the torch
row's reference), each side's own error against it, and the share of elements whose two float64
results differ beyond 1e-6 relative (a semantic difference shows there, not a precision one).

TensorFlow is imported only when this runner is built, i.e. only for ``xfw`` variants.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..backends.base import Output
from ..errors import ConfigError
from ..ops.xfw import TwinCall, Untranslatable, XfwPair, load_table, pair_specs
from .pair_metrics import closer, compare_pair
from .precision import compare
from ..plan import Variant
from ..search.inputs import Candidate
from .base import OracleRunner
from .runner import CRASH, INVALID, OK, UNSUPPORTED, Evaluation, VariantRunner, exception_signature


def _add_after(fn, tensor):
    def call(*args, **kwargs):
        return fn(*args, **kwargs) + tensor

    return call


class _PairBackend:
    """The variant's own backend, whose environment also names the twin framework's version:
    a baseline of a differential finding is only comparable when both versions match."""

    def __init__(self, own, twin):
        self._own, self._twin = own, twin

    def __getattr__(self, name):
        return getattr(self._own, name)

    def environment(self, device: str) -> dict:
        env = self._own.environment(device)
        env["twin_framework"] = self._twin.name
        env["twin_version"] = self._twin.version()
        return env


def _pair(spec) -> XfwPair:
    pair = load_table().pair_for(spec.name)
    if pair is None:
        raise ConfigError(f"operator {spec.name} has no torch/TensorFlow pair in xfw.yaml")
    return pair


class XfwRunner(OracleRunner):
    oracle = "xfw"

    @classmethod
    def candidate_spec(cls, spec, variant, options):
        pair = _pair(spec)
        torch_spec, _ = pair_specs(pair)
        return pair.restrict(torch_spec)

    def __init__(self, spec, variant, backend=None, **options):
        self.pair = _pair(spec)
        self.torch_spec, self.tf_spec = pair_specs(self.pair)
        # the variant's own framework (seed, environment); the torch side runs the candidate
        super().__init__(spec, variant, backend=backend, **options)
        side_variant = Variant(dtype=variant.dtype, device=variant.device, mode="input")
        self.torch = VariantRunner(self.torch_spec, side_variant)
        self.tf = VariantRunner(self.tf_spec, side_variant)
        twin = self.tf.backend if spec.framework == "torch" else self.torch.backend
        self.backend = _PairBackend(self.backend, twin)

    def quantize(self, cand: Candidate) -> Candidate:
        return self.torch.quantize(cand)

    def _run_tf(self, call: TwinCall, dtype: str) -> List[Output]:
        be = self.tf.backend
        dev = self.variant.device
        args: list = []
        kwargs: Dict[str, Any] = dict(call.kwargs)
        keyword = {t.name for t in self.tf_spec.inputs if t.keyword}
        for name, arr in call.arrays:
            native = be.to_native(arr, dtype, dev)
            if name in keyword:
                kwargs[name] = native
            else:
                args.append(native)
        fn = self.tf.fn
        if call.post_add is not None:  # e.g. the conv bias TF's op lacks, added in TF at the dtype
            fn = _add_after(self.tf.fn, be.to_native(call.post_add[0], dtype, dev))

        outs = be.to_outputs(be.call(fn, args, kwargs, mode="input", dtype=dtype, device=dev))
        if call.out_permute is not None:
            outs = [Output(np.transpose(o.array, call.out_permute), o.dtype) if o.array.ndim == len(call.out_permute) else o
                    for o in outs]
        return outs

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        t0 = time.perf_counter()
        q = cand if quantized else self.quantize(cand)
        dtype = self.variant.dtype

        def done(status: str, **kw) -> Tuple[Candidate, Evaluation]:
            return q, Evaluation(status, seconds=time.perf_counter() - t0, **kw)

        reason = self.pair.allowed(q.params)
        if reason:
            return done(INVALID, error=f"allow-listed difference: {reason}")
        declared = {p.name for p in self.torch_spec.params}
        extra = sorted(k for k in q.params if k not in declared)
        if extra:  # a seed passing a parameter the pair knows nothing about (ceil_mode, return_indices)
            return done(INVALID, error=f"not translatable: {extra[0]}={q.params[extra[0]]!r} is not a parameter of "
                                       f"the {self.pair.torch} row")
        try:
            call = self.pair.translate(self.torch_spec, self.tf_spec, q.dims, q.params, q.arrays)
        except Untranslatable as exc:
            return done(INVALID, error=f"not translatable: {exc}")
        try:
            ref = self.torch.run_reference(q)
        except Exception as exc:
            return done(INVALID, error=exception_signature(exc)[1])
        sides: Dict[str, Tuple[Optional[List[Output]], Optional[BaseException]]] = {}
        for name, thunk in (("torch", lambda: self.torch.run_low(q)), ("tensorflow", lambda: self._run_tf(call, dtype))):
            try:
                sides[name] = (thunk(), None)
            except Exception as exc:
                sides[name] = (None, exc)
        for name, (_, exc) in sides.items():
            be = self.torch.backend if name == "torch" else self.tf.backend
            if exc is not None and be.is_unsupported(exc):
                sig, short = exception_signature(exc)
                return done(UNSUPPORTED, error=f"{name}: {short}", signature=f"{name}: {sig}")
        (t_out, t_err), (f_out, f_err) = sides["torch"], sides["tensorflow"]
        base_extra = {"oracle": self.oracle, "pair": [self.pair.torch, self.pair.tf], "twin": self._twin_name()}
        if (t_err is None) != (f_err is None):
            failed, other, exc = ("torch", "tensorflow", t_err) if t_err is not None else ("tensorflow", "torch", f_err)
            sig, short = exception_signature(exc)
            return done(CRASH, error=f"{failed} raised {short}; {other} returned",
                        signature=f"{failed} raised {sig}; {other} returned",
                        extra={**base_extra, "raised": failed, "returned": other})
        if t_err is not None:
            return done(INVALID, error=f"both frameworks raised: {exception_signature(t_err)[1]}")
        floor = self.torch_spec.ulp_floor
        metrics = compare_pair(t_out, f_out, dtype, floor)
        err_t = compare(t_out, ref, dtype, floor)
        err_f = compare(f_out, ref, dtype, floor)
        extra = {
            **base_extra,
            "closer": closer(err_t, err_f, "torch", "tensorflow"),
            "torch_ulp_vs_float64": err_t.ulp,
            "tensorflow_ulp_vs_float64": err_f.ulp,
            "torch_nonfinite": err_t.nonfinite,
            "tensorflow_nonfinite": err_f.nonfinite,
        }
        try:
            f64 = self._run_tf(call, "float64")
            extra["float64_mismatch"] = float64_mismatch(ref, f64)
        except Exception as exc:  # the twin has no float64 kernel: nothing to say about semantics
            extra["float64_mismatch"] = None
            extra["float64_note"] = exception_signature(exc)[1]
        ev = Evaluation(OK, metrics=metrics, seconds=time.perf_counter() - t0, extra=extra)
        if keep_outputs:  # as the precision runner: the judged output and the float64 reference
            ev.outputs, ev.reference = f_out, ref
        return q, ev

    def _twin_name(self) -> str:
        return self.pair.tf if self.spec.name == self.pair.torch else self.pair.torch


def float64_mismatch(a: List[Output], b: List[Output], rtol: float = 1e-6) -> float:
    """Share of elements whose float64 results differ by more than ``rtol`` relative (NaN/Inf
    positions compared exactly; 1.0 when shapes differ). Two translations of the same function
    agree to rounding almost everywhere; a semantic difference shows on a large share."""
    if len(a) != len(b):
        return 1.0
    bad = total = 0
    for x, y in zip(a, b):
        u, v = np.asarray(x.array, dtype=np.float64), np.asarray(y.array, dtype=np.float64)
        if u.shape != v.shape:
            return 1.0
        total += u.size
        same = (np.isnan(u) & np.isnan(v)) | (u == v)
        with np.errstate(invalid="ignore", over="ignore"):
            close = np.abs(u - v) <= rtol * np.maximum(np.abs(u), np.abs(v))
        bad += int(np.count_nonzero(~(same | close)))
    return bad / total if total else 0.0
