"""PyTorch backend. Imported only when a torch operator runs."""
from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import ConfigError
from .base import Backend, NotDifferentiable, Output, at_dtype, flatten, float32_twin, numpy_quantize

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
NAMES = {v: k for k, v in DTYPES.items()}


@contextlib.contextmanager
def cuda_math(mode: Optional[str]):
    """CUDA math flags for one call: ``tf32`` lets float32 matmuls and convolutions run in TF32,
    ``reduced`` lets float16/bfloat16 matmuls reduce in reduced precision; every other mode runs
    with both off (full-precision accumulation), so that each flag is judged as its own variant.
    ``None`` (not on CUDA): nothing is touched. The previous settings come back afterwards."""
    if mode is None:
        yield
        return
    m, c = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (m.allow_tf32, m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    tf32, reduced = mode == "tf32", mode == "reduced"
    try:
        m.allow_tf32 = tf32
        m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = reduced
        with _cudnn_tf32(c, tf32):
            yield
    finally:
        m.allow_tf32, m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved


@contextlib.contextmanager
def _cudnn_tf32(c, value: bool):
    """cuDNN's TF32 flag for the block. Importing ``torch.testing._internal`` (OpInfo's op_db,
    which the seeds of built-in rows read) freezes cuDNN's flags process-wide
    (``torch.backends.disable_global_flags``): then only ``cudnn.flags()`` may change them, and it
    sets every flag, so each is passed at its current value."""
    if not torch.backends.flags_frozen():
        saved = c.allow_tf32
        c.allow_tf32 = value
        try:
            yield
        finally:
            c.allow_tf32 = saved
        return
    import inspect

    current = {"enabled": c.enabled, "benchmark": c.benchmark, "benchmark_limit": getattr(c, "benchmark_limit", None),
               "deterministic": c.deterministic, "fp32_precision": getattr(c, "fp32_precision", None),
               "depthwise_kernel": getattr(c, "depthwise_kernel", None)}
    params = inspect.signature(c.flags).parameters
    kw = {k: v for k, v in current.items() if k in params and v is not None}
    with c.flags(allow_tf32=value, **kw):
        yield


_NARROW = (torch.float16, torch.bfloat16, torch.float32)
#: complex dtypes narrower than complex128 (complex64 is two float32s: piqa's MDSI casts its
#: similarity maps to ``torch.cfloat``, which in the float64 run computed in float32)
_NARROW_COMPLEX = (torch.complex64, torch.complex32)
_NARROWING_METHODS = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}


def _wide(x: Any) -> Any:
    """``x`` with a narrower float dtype (or a list/tuple of them) replaced by float64, a
    narrower complex dtype by complex128."""
    if isinstance(x, torch.dtype):
        if x in _NARROW_COMPLEX:
            return torch.complex128
        return torch.float64 if x in _NARROW else x
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.dtype) for v in x):
        return type(x)(_wide(v) for v in x)
    return x


class Float64Everywhere(torch.overrides.TorchFunctionMode):
    """The float64 reference computes in float64 throughout: inside it, every cast of a float64
    tensor to a narrower float dtype (``.float()``, ``.half()``, ``.to(torch.float32)``,
    ``.type(torch.float32)``) keeps float64, and a ``dtype=`` of float16/bfloat16/float32 given
    to any torch function (``F.softmax(x, dtype=torch.float32)``, ``torch.zeros(n,
    dtype=torch.float32)``) is float64. Code written for low precision upcasts internally
    (LlamaRMSNorm's ``hidden_states.to(torch.float32)``, T5's layer norm, attention's
    ``softmax(..., dtype=torch.float32)``); run on float64 inputs, the same code casts the
    reference *down* to float32 and returns it as float64: the "reference" then equals the
    float32 run (a float32 regression reads 0 ulp) and two ways of writing one function differ
    by float32 rounding (a behaviour change where nothing changed). A constant of the operator's
    own in a narrower dtype (a float32 kernel made at import) meets the float64 values as float64
    (:func:`_constants_widened`). A reference that cannot run so (an extension that takes float32
    only) is run as written (:meth:`TorchBackend.call`)."""

    def __enter__(self):
        # a tensor made without a dtype (``torch.zeros(n)``, ``torch.tensor([0.5, 2.0])``) is
        # float64 here: made in the default float32, it narrowed every value written into it,
        # and a float64 run returned float32 (torchfields' vote weights, summed into
        # ``torch.zeros(...)``: "not measured", and init left the function out)
        self._default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.set_default_dtype(self._default_dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _NARROWING_METHODS and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            return args[0]
        if func is torch.Tensor.cfloat and args and isinstance(args[0], torch.Tensor) \
                and args[0].dtype in (torch.float64, torch.complex128):
            return args[0].to(torch.complex128)
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[0], torch.Tensor) \
                and isinstance(args[1], torch.Tensor) and args[1].dtype in _NARROW:
            args = (args[0], args[1].device, *args[2:])  # x.to(other): other's device, float64 kept
        args = tuple(_wide(a) for a in args)
        if "dtype" in kwargs:
            kwargs = {**kwargs, "dtype": _wide(kwargs["dtype"])}
        if _meets_float64(args, kwargs):
            args, kwargs = _constants_widened(func, args, kwargs)
        return func(*args, **kwargs)


def _tensors(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (v for v in a if isinstance(v, torch.Tensor))


def _meets_float64(args, kwargs) -> bool:
    """Does a narrower float (or complex) tensor meet a float64 (or complex128) one in this call?"""
    wide = narrow = False
    for t in _tensors(args, kwargs):
        wide = wide or t.dtype in (torch.float64, torch.complex128)
        narrow = narrow or t.dtype in _NARROW or t.dtype in _NARROW_COMPLEX
    return wide and narrow


def _widen(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in _NARROW:
        return x.to(torch.float64)  # exact: every float16/bfloat16/float32 value is a float64 value
    if isinstance(x, torch.Tensor) and x.dtype in _NARROW_COMPLEX:
        return x.to(torch.complex128)
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(_widen(v) for v in x)
    return x


def _constants_widened(func, args, kwargs):
    """The float64 run's ``args`` and ``kwargs`` with each narrower float tensor widened where it
    meets a float64 one: a constant the operator made in a dtype of its own (a float32 filter
    kernel at module level, piqa's MDSI; a float32 buffer) takes part in the float64 run with its
    own values, exactly, where ``conv2d(x64, k32)`` raised "expected scalar type Double but
    found Float" and the operator had no reference at all. Where the call writes into its first
    argument (``acc.add_(x)``, ``acc += x``) or into ``out=``, that tensor is the caller's and is
    left as it is; a tensor widened here is a copy, never the operator's own."""
    name = getattr(func, "__name__", "")
    in_place = name.endswith("_") and not name.endswith("__") or name.startswith("__i")
    first = args[:1] if in_place else tuple(_widen(a) for a in args[:1])
    args = first + tuple(_widen(a) for a in args[1:])
    kwargs = {k: (v if k == "out" else _widen(v)) for k, v in kwargs.items()}
    return args, kwargs


def float64_everywhere(dtype: str):
    """:class:`Float64Everywhere` for the float64 run, nothing for the others, nor inside another
    function mode: the localiser's trace (gate.localise.trace) records each call with its
    caller's frame and runs its own float64 shadows; a mode above it would be every call's caller."""
    if dtype != "float64" or torch._C._len_torch_function_stack() > 0:
        return contextlib.nullcontext()
    return Float64Everywhere()


class TorchBackend(Backend):
    name = "torch"
    unsupported_patterns = (
        r"not implemented for '(Half|BFloat16|Float|Double)'",
        r"NotImplementedError",
        r"does not support (Half|BFloat16|half|bfloat16)",
        r"Could not run '.*' with arguments from the '.*' backend",
        r"expected scalar type .* but found",
        r"should be the same|must have the same dtype|Expected .* dtype",
    )

    def version(self) -> str:
        return torch.__version__

    def devices(self) -> List[str]:
        out = ["cpu"]
        if torch.cuda.is_available():
            out.append("cuda")
        return out

    def environment(self, device: str) -> dict:
        env = super().environment(device)
        if device == "cuda" and torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(0)
            env["capability"] = "sm_%d%d" % torch.cuda.get_device_capability(0)
        else:
            env["capability"] = torch.backends.cpu.get_cpu_capability()
        return env

    def set_threads(self, n: int) -> None:
        if n > 0 and torch.get_num_threads() != n:
            torch.set_num_threads(n)

    def threads(self) -> int:
        return torch.get_num_threads()

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    #: (weak reference to the last large array rounded to float32, its float32 values): the
    #: first float32 call of that array is given them instead of converting it again
    _twin: Tuple[Any, Any] = (None, None)

    def quantize(self, arr: np.ndarray, dtype: str) -> np.ndarray:
        if dtype == "bfloat16":
            t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))
            return t.to(torch.bfloat16).to(torch.float64).numpy()
        if dtype == "float32":
            got = float32_twin(arr)
            if got is not None:
                self._twin = (weakref.ref(got[0]), got[1])
                return got[0]
        return numpy_quantize(arr, dtype)

    def _take_twin(self, arr: np.ndarray) -> Optional[np.ndarray]:
        """The float32 values of ``arr`` if it is the array last rounded to float32, once (the
        tensor made of them is the call's own: an operator writing into its input cannot
        change a later call's)."""
        ref, twin = self._twin
        if ref is None or ref() is not arr:
            return None
        self._twin = (None, None)
        return twin

    def as_subclass(self, native: Any, path: str) -> Any:
        return native.as_subclass(_tensor_subclass(path))

    def to_native(self, arr: np.ndarray, dtype: str, device: str, memory_format: Optional[str] = None) -> Any:
        twin = self._take_twin(arr) if dtype == "float32" else None
        arr = np.ascontiguousarray(arr)
        if arr.dtype.kind in "iub":
            t = torch.from_numpy(arr).to(device=device)
        elif twin is not None:  # the same values, converted as they were rounded
            t = torch.from_numpy(twin).to(device=device)
        else:
            t = torch.from_numpy(arr.astype(np.float64, copy=False)).to(device=device, dtype=DTYPES[dtype])
        if memory_format == "channels_last" and t.dim() == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        elif memory_format == "channels_last_3d" and t.dim() == 5:
            t = t.contiguous(memory_format=torch.channels_last_3d)
        elif memory_format == "noncontiguous" and t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
            t = t.transpose(-1, -2).contiguous().transpose(-1, -2)  # as "transposed"
        elif memory_format == "noncontiguous" and t.dim() >= 1 and t.shape[-1] > 1:
            buf = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
            view = buf[..., ::2]  # as "strided", for a row or a degenerate matrix
            view.copy_(t)
            t = view
        elif memory_format == "transposed" and t.dim() >= 2:
            # same values, non-contiguous strides: a transposed copy viewed back
            t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        elif memory_format == "strided" and t.dim() >= 1:
            # same values, every other element of a buffer twice as long in the last dim
            buf = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device) \
                if t.is_floating_point() else torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
            view = buf[..., ::2]
            view.copy_(t)
            t = view
        return t

    def to_outputs(self, result: Any, narrow: bool = False) -> List[Output]:
        outs: List[Output] = []
        for r in flatten(result):
            if isinstance(r, torch.Tensor):
                r = r.detach()
                if r.is_complex():
                    outs.append(Output(torch.view_as_real(r).to("cpu", torch.float64).numpy(), "complex"))
                elif r.is_floating_point():
                    wide = r.dtype if narrow and r.dtype in (torch.float32, torch.float64) else \
                        torch.float32 if narrow else torch.float64
                    outs.append(Output(r.to("cpu", wide).numpy(), NAMES.get(r.dtype, str(r.dtype))))
                else:
                    outs.append(Output(r.to("cpu").numpy().astype(np.int64), str(r.dtype).replace("torch.", "")))
            elif isinstance(r, (bool, int)):
                outs.append(Output(np.asarray(r, dtype=np.int64), "int64"))
            elif isinstance(r, float):
                outs.append(Output(np.asarray(r, dtype=np.float64), "float64"))
        return outs

    def call(self, fn: Callable, args: Sequence, kwargs: dict, *, mode: str, dtype: str, device: str) -> Any:
        ctx = contextlib.nullcontext()
        if mode == "operator" and dtype in ("float16", "bfloat16"):
            ctx = torch.autocast(device_type=device, dtype=DTYPES[dtype])  # float32 weights, as autocast runs them
            fn = at_dtype(fn, "float32", device)
        else:
            fn = at_dtype(fn, dtype, device)
        with torch.no_grad(), ctx, cuda_math(mode if device == "cuda" else None):
            try:
                with float64_everywhere(dtype):
                    out = fn(*args, **kwargs)
            except Exception:
                if dtype != "float64":
                    raise
                out = fn(*args, **kwargs)  # as written: an error of its own raises again here
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    def compile(self, fn: Callable, how: str = "default", **options) -> Callable:
        """``default``: ``torch.compile`` (options: ``backend`` — inductor, aot_eager, eager…,
        ``dynamic``, ``fullgraph``, ``mode``); ``script``: TorchScript."""
        if how == "default":
            import torch._dynamo.config as dynamo_config

            # a fuzzer feeds many shapes and parameter values: leave room for recompiles rather
            # than silently falling back to eager after the default 8
            if getattr(dynamo_config, "recompile_limit", 64) < 64:
                dynamo_config.recompile_limit = 64
            kw = {"dynamic": options.get("dynamic", False)}
            for k in ("backend", "fullgraph", "mode"):
                if options.get(k) is not None:
                    kw[k] = options[k]
            return torch.compile(fn, **kw)
        if how == "script":
            return torch.jit.script(fn)
        raise NotImplementedError(f"torch has no compiled mode {how!r}")

    def vjp(self, fn: Callable, args: Sequence, kwargs: dict, upstream, *, dtype: str,
            device: str, narrow: bool = False) -> Tuple[List[Output], List[Optional[Output]]]:
        leaves: List[torch.Tensor] = []

        def leaf(x: Any) -> Any:
            if isinstance(x, list):  # an input pack: each of its tensors is a leaf, in order
                return [leaf(y) for y in x]
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                x = x.detach().requires_grad_(True)
                leaves.append(x)
            return x

        args = [leaf(a) for a in args]
        kwargs = {k: leaf(v) for k, v in kwargs.items()}
        fn = at_dtype(fn, dtype, device)
        wide = float64_everywhere(dtype)
        try:
            with torch.enable_grad(), wide:
                result = fn(*args, **kwargs)
        except Exception:
            if dtype != "float64":
                raise
            wide = contextlib.nullcontext()
            with torch.enable_grad():
                result = fn(*args, **kwargs)  # as written: an error of its own raises again here
        tensors = [r for r in flatten(result) if isinstance(r, torch.Tensor)]
        outs = self.to_outputs(tensors, narrow=narrow)
        ups = upstream(outs)
        roots, grads_out = [], []
        for t, u in zip(tensors, ups):
            if u is None or not t.requires_grad:
                continue
            roots.append(t)
            # (a 0-d output is a 1-element array on the gate's side: back to the tensor's shape)
            grads_out.append(torch.from_numpy(np.ascontiguousarray(u, dtype=np.float64)).reshape(t.shape)
                             .to(device=t.device, dtype=t.dtype))
        if leaves and not roots and any(u is not None for u in ups):
            # nothing autograd can differentiate (e.g. a Triton kernel launched outside a
            # torch.autograd.Function writes its output in place): no gradient to judge, not a
            # gradient of zero
            raise NotDifferentiable("not differentiable: no floating-point output requires grad (computed outside autograd, e.g. a kernel "
                                    "launched without a torch.autograd.Function)")
        if roots and leaves:
            with wide:  # a custom backward's own casts (an autograd.Function's) run in float64 too
                grads = torch.autograd.grad(roots, leaves, grads_out, allow_unused=True)
        else:
            grads = [None] * len(leaves)
        if device == "cuda":
            torch.cuda.synchronize()
        return outs, [None if g is None else self.to_outputs(g, narrow=narrow)[0] for g in grads]

    def full(self, shape: Sequence[int], value: float, dtype: str, device: str) -> Any:
        return torch.full(tuple(shape), value, dtype=DTYPES[dtype], device=device)


@functools.lru_cache(maxsize=None)
def _tensor_subclass(path: str):
    """The class ``module:Class`` names, checked to be a torch tensor subclass (one-line error)."""
    import importlib

    mod_name, _, qual = path.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise ConfigError(f"input subclass {path!r} cannot be imported: {type(exc).__name__}: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, torch.Tensor)):
        raise ConfigError(f"input subclass {path!r} is not a torch.Tensor subclass")
    return obj
