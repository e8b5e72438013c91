"""EAGLE's equivalent computations inside one framework, as runners (see ``oracles.yaml`` for
which operators each applies to, and ``docs/oracles.md``).

=============  ==============================================  ================================
oracle         side A                                          side(s) B
=============  ==============================================  ================================
compiled       eager at the variant dtype                      ``torch.compile`` / ``tf.function``
compiled_xla   eager                                           ``tf.function(jit_compile=True)``
dtype_eq       float16/bfloat16 result                         float32 result rounded to the dtype
layout_eq      default layout                                  the variant's layout (NHWC, channels_last)
contig_eq      dense inputs                                    transposed-stride / every-other-element views
length_eq      the whole flattened input                       pieces of length 1, 7, 8, 9, 16 …
batch_eq       the whole batch                                 each item alone, concatenated
inplace_eq     functional                                      in-place (``op_``, inplace=True), ``out=``
=============  ==============================================  ================================
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from ..backends.base import Output
from ..errors import ConfigError
from ..search.inputs import Candidate
from .base import NotComparable, PairRunner, Side


class CompiledRunner(PairRunner):
    """Eager vs compiled: ``torch.compile`` (rule args: ``compiler`` — the dynamo backend,
    inductor by default —, ``dynamic``, ``fullgraph``, ``mode``) or ``tf.function``
    (``jit_compile``)."""

    oracle = "compiled"
    a_name = "eager"

    def __init__(self, spec, variant, backend=None, **options):
        super().__init__(spec, variant, backend=backend, **options)
        fn = self.fn

        def call(*args, **kwargs):  # a Python function, so that dynamo / autograph trace into it
            return fn(*args, **kwargs)

        opts = {k: v for k, v in self.options.items() if k != "compiler"}
        if self.options.get("compiler"):
            opts["backend"] = self.options["compiler"]
        self.compiled = self.backend.compile(call, "default", **opts)
        label = self.options.get("compiler") or ("xla" if self.options.get("jit_compile") else "function")
        self.b_name = f"compiled[{label}]"

    def sides_b(self, q: Candidate, a) -> List[Side]:
        return [(self.b_name, lambda: self.run_at(q, self.variant.dtype, fn=self.compiled))]


class CompiledXlaRunner(CompiledRunner):
    oracle = "compiled_xla"


class DtypeEqRunner(PairRunner):
    """The same values in two dtypes: the variant dtype's result vs the ``against`` dtype's
    (float32) result rounded to the variant dtype."""

    oracle = "dtype_eq"
    a_name = "native"

    def sides_b(self, q: Candidate, a) -> List[Side]:
        against = str(self.options.get("against", "float32"))
        dtype = self.variant.dtype

        def run() -> List[Output]:
            outs = self.run_at(q, against)
            return [Output(self.backend.quantize(o.array, dtype), o.dtype) if o.is_float else o for o in outs]

        return [(f"{against}->{dtype}", run)]


class LayoutEqRunner(PairRunner):
    """Default layout vs the variant's declared layout, both at the variant dtype."""

    oracle = "layout_eq"
    a_name = "default-layout"

    def side_a(self, q: Candidate) -> List[Output]:
        return self.run_at(q, self.variant.dtype)

    def sides_b(self, q: Candidate, a) -> List[Side]:
        return [(self.variant.layout, lambda: self.run_low(q))]


class ContigEqRunner(PairRunner):
    """Dense inputs vs the same values behind other strides (rule arg ``forms``)."""

    oracle = "contig_eq"
    a_name = "contiguous"

    def sides_b(self, q: Candidate, a) -> List[Side]:
        forms = list(self.options.get("forms") or ("transposed", "strided"))
        return [(form, (lambda f: lambda: self.run_at(q, self.variant.dtype, memory_format=f))(form)) for form in forms]


class LengthEqRunner(PairRunner):
    """Elementwise ops: the whole flattened input vs pieces of the lengths in rule arg
    ``pieces`` (the rest in one piece), which exercise scalar tails and vector bodies."""

    oracle = "length_eq"
    a_name = "whole"

    def skip(self, q: Candidate) -> Optional[str]:
        shapes = {q.arrays[t.name].shape for t in self.spec.inputs}
        if len(shapes) != 1:
            return "length_eq needs every input of one shape (elementwise)"
        return None

    def _flat(self, q: Candidate, lo: int, hi: int) -> Candidate:
        c = q.copy()
        for t in self.spec.inputs:
            c.arrays[t.name] = np.ascontiguousarray(q.arrays[t.name].reshape(-1)[lo:hi])
        return c

    def side_a(self, q: Candidate) -> List[Output]:
        n = next(iter(q.arrays[t.name] for t in self.spec.inputs)).size
        outs = self.run_at(self._flat(q, 0, n), self.variant.dtype)
        for o in outs:
            if o.array.size != n:
                raise NotComparable("length_eq: the output is not elementwise (size differs from the input's)")
        return outs

    def sides_b(self, q: Candidate, a) -> List[Side]:
        n = next(iter(q.arrays[t.name] for t in self.spec.inputs)).size
        bounds, pos = [], 0
        for p in [int(x) for x in self.options.get("pieces") or (1, 7, 8, 9, 16)]:
            if pos >= n:
                break
            bounds.append((pos, min(n, pos + p)))
            pos += p
        if pos < n:
            bounds.append((pos, n))

        def run() -> List[Output]:
            parts = [self.run_at(self._flat(q, lo, hi), self.variant.dtype) for lo, hi in bounds]
            return [Output(np.concatenate([np.reshape(p[k].array, -1) for p in parts]), parts[0][k].dtype)
                    for k in range(len(parts[0]))]

        return [("pieces", run)]

    def facts(self) -> Dict[str, Any]:
        return {"pieces": [int(x) for x in self.options.get("pieces") or ()]}


class BatchEqRunner(PairRunner):
    """The whole batch vs each item alone (the first ``max_items`` items one by one, the rest
    as one block), concatenated along ``batch_dim``."""

    oracle = "batch_eq"
    a_name = "batch"

    def __init__(self, spec, variant, backend=None, **options):
        super().__init__(spec, variant, backend=backend, **options)
        bd = spec.batch_dim
        first = spec.inputs[0]
        if bd is None or len(first.shape) <= bd:
            raise ConfigError(f"operator {spec.name}: batch_eq needs batch_dim within its first input's shape")
        self.bd = int(bd)
        sym = first.shape[self.bd]
        # inputs that carry the batch: the same dim expression at batch_dim as the first input
        self.batched = [t.name for t in spec.inputs if len(t.shape) > self.bd and t.shape[self.bd] == sym]
        self.reduce_params = list(self.options.get("reduce_params") or ())
        self.max_items = int(self.options.get("max_items", 16))

    def skip(self, q: Candidate) -> Optional[str]:
        rank = q.arrays[self.batched[0]].ndim
        for p in self.reduce_params:
            if p not in q.params:
                continue
            v = q.params[p]
            vals = v if isinstance(v, (list, tuple)) else [v]
            if v is None or any(isinstance(x, int) and x % rank == self.bd for x in vals):
                return f"not batch-separable: {p}={v!r} reduces over the batch dim"
        return None

    def _slice(self, q: Candidate, lo: int, hi: int) -> Candidate:
        c = q.copy()
        for n in self.batched:
            c.arrays[n] = np.ascontiguousarray(np.take(q.arrays[n], np.arange(lo, hi), axis=self.bd))
        return c

    def sides_b(self, q: Candidate, a) -> List[Side]:
        n = q.arrays[self.batched[0]].shape[self.bd]
        bounds = [(i, i + 1) for i in range(min(n, self.max_items))]
        if n > self.max_items:
            bounds.append((self.max_items, n))

        def run() -> List[Output]:
            parts = [self.run_low(self._slice(q, lo, hi)) for lo, hi in bounds]
            outs = []
            for k in range(len(parts[0])):
                arrs = [p[k].array for p in parts]
                if any(np.ndim(x) <= self.bd for x in arrs):
                    raise NotComparable("batch_eq: an output has no batch dim")
                outs.append(Output(np.concatenate(arrs, axis=self.bd), parts[0][k].dtype))
            return outs

        return [("per-item", run)]

    def facts(self) -> Dict[str, Any]:
        return {"batch_dim": self.bd, "batched_inputs": list(self.batched)}


class InplaceEqRunner(PairRunner):
    """Functional vs in-place and ``out=`` forms. Rule args (per operator): ``inplace``: the
    in-place callable (``torch.relu_``; called like the op, it mutates its first tensor) or
    ``kwarg:NAME`` (the op with ``NAME=True``); ``out``: true or the name of the out keyword."""

    oracle = "inplace_eq"
    a_name = "functional"

    def __init__(self, spec, variant, backend=None, **options):
        super().__init__(spec, variant, backend=backend, **options)
        ip = self.options.get("inplace")
        self.inplace_kwarg = ip[6:] if isinstance(ip, str) and ip.startswith("kwarg:") else None
        self.inplace_fn = self.backend.resolve(ip) if ip and not self.inplace_kwarg else None
        out = self.options.get("out")
        self.out_kwarg = ("out" if out is True else str(out)) if out else None

    def sides_b(self, q: Candidate, a) -> List[Side]:
        dtype = self.variant.dtype
        sides: List[Side] = []

        def inplace() -> List[Output]:
            args, kwargs = self.native_call(q, dtype)
            if not args:
                raise NotComparable("inplace_eq: the op has no positional tensor to mutate")
            if self.inplace_kwarg:
                kwargs[self.inplace_kwarg] = True
                self.backend.call(self.fn, args, kwargs, mode="input", dtype=dtype, device=self.variant.device)
            else:
                self.backend.call(self.inplace_fn, args, kwargs, mode="input", dtype=dtype, device=self.variant.device)
            return self.backend.to_outputs(args[0])

        def out_form() -> List[Output]:
            if a is None or len(a) != 1:
                raise NotComparable("inplace_eq: out= is compared for single-output calls only")
            args, kwargs = self.native_call(q, dtype)
            out_dtype = a[0].dtype if a[0].dtype in ("float16", "bfloat16", "float32", "float64") else dtype
            buf = self.backend.full(a[0].array.shape, float("nan"), out_dtype, self.variant.device)
            kwargs[self.out_kwarg] = buf
            self.backend.call(self.fn, args, kwargs, mode="input", dtype=dtype, device=self.variant.device)
            return self.backend.to_outputs(buf)

        if self.inplace_fn is not None or self.inplace_kwarg:
            sides.append(("inplace", inplace))
        if self.out_kwarg:
            sides.append(("out=", out_form))
        return sides


__all__ = ["CompiledRunner", "CompiledXlaRunner", "DtypeEqRunner", "LayoutEqRunner", "ContigEqRunner",
           "LengthEqRunner", "BatchEqRunner", "InplaceEqRunner"]
