"""The framework part of a repro script (:mod:`gate.localise.repro` writes the rest): how the
script builds tensors, calls the operator and reads outputs back, as text for each framework.
The script runs on its own, so the text imports its framework; this module does not."""
from __future__ import annotations

TORCH = r'''
if DEVICE == "cpu":  # a Triton kernel runs on CPU tensors only in the interpreter (read at @triton.jit)
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch

if THREADS:
    torch.set_num_threads(THREADS)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def to_native(arr, dtype, memory_format):
    if arr.dtype.kind in "iub":
        t = torch.from_numpy(np.ascontiguousarray(arr)).to(DEVICE)
    else:
        t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64)).to(device=DEVICE, dtype=DTYPES[dtype])
    if memory_format == "channels_last" and t.dim() == 4:
        t = t.contiguous(memory_format=torch.channels_last)
    elif memory_format == "channels_last_3d" and t.dim() == 5:
        t = t.contiguous(memory_format=torch.channels_last_3d)
    elif memory_format in ("transposed", "noncontiguous") and t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, non-contiguous strides
    elif memory_format in ("strided", "noncontiguous") and t.dim() >= 1 and t.shape[-1] > 1:
        buf = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
        view = buf[..., ::2]  # same values, every other element of a longer buffer
        view.copy_(t)
        t = view
    return t


def quantize(arr, dtype):
    return torch.from_numpy(np.asarray(arr, np.float64)).to(DTYPES[dtype]).to(torch.float64).numpy()


_BUILT = {}


def _apply_of(fn):
    """An autograd.Function's apply, as the gate calls it: apply takes positional arguments only,
    so arguments given by name are bound to forward's signature (after ctx) first."""
    sig = inspect.Signature(list(inspect.signature(fn.forward).parameters.values())[1:])

    def call(*args, **kwargs):
        if not kwargs:
            return fn.apply(*args)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return fn.apply(*bound.args)

    return call


def at_dtype(fn, dtype, mode="input"):
    """As the gate runs a class named as the operator: an autograd.Function's apply; a module
    built once with the row's constructor arguments (its initial weights from seed 0) and a copy
    of it moved to each dtype (float32 under autocast); a method operator (``Method``), that
    method of the module built so (of the one instance of a class that is not a module)."""
    if isinstance(fn, Method):
        if issubclass(fn.cls, torch.nn.Module):
            return getattr(at_dtype(fn.cls, dtype, mode), fn.name)
        return getattr(_BUILT.setdefault(fn.cls, fn.cls(**CONSTRUCT)), fn.name)
    if not isinstance(fn, type):
        return fn
    if issubclass(fn, torch.autograd.Function):
        return _apply_of(fn)
    if fn not in _BUILT:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            _BUILT[fn] = {"default": fn(**CONSTRUCT)}
    built = _BUILT[fn]
    dtype = "float32" if mode == "operator" and dtype in ("float16", "bfloat16") else dtype
    if dtype not in built:
        import copy

        built[dtype] = copy.deepcopy(built["default"]).to(device=DEVICE, dtype=DTYPES[dtype])
    return built[dtype]


_NARROW = (torch.float16, torch.bfloat16, torch.float32)


def _wide(x):
    if isinstance(x, torch.dtype):
        return torch.float64 if x in _NARROW else x
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.dtype) for v in x):
        return type(x)(_wide(v) for v in x)
    return x


class Float64Everywhere(torch.overrides.TorchFunctionMode):
    """As the gate runs its float64 reference: a cast of a float64 tensor to a narrower float
    dtype keeps float64, a dtype= of float16/bfloat16/float32 is float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16) and args \
                and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[0], torch.Tensor) \
                and isinstance(args[1], torch.Tensor) and args[1].dtype in _NARROW:
            args = (args[0], args[1].device, *args[2:])
        args = tuple(_wide(a) for a in args)
        if "dtype" in kwargs:
            kwargs = {**kwargs, "dtype": _wide(kwargs["dtype"])}
        return func(*args, **kwargs)


def wide(dtype):
    return Float64Everywhere() if dtype == "float64" else contextlib.nullcontext()


def as_the_gate_runs(run, dtype):
    """``run()`` in float64 throughout for the reference; as written where it cannot run so."""
    try:
        with wide(dtype):
            return run()
    except Exception:  # noqa: BLE001 - an extension that takes float32 only: as written
        if dtype != "float64":
            raise
        return run()


def call_grad(fn, args, kwargs, dtype):
    """Gradients of every float input for the stored upstream gradients (the gate's vjp)."""
    leaves = []

    def leaf(x):
        if isinstance(x, list):  # a list argument: each of its tensors, in order
            return [leaf(y) for y in x]
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.detach().requires_grad_(True)
            leaves.append(x)
        return x

    args = [leaf(a) for a in args]
    kwargs = {k: leaf(v) for k, v in kwargs.items()}
    fn = at_dtype(fn, dtype)

    def forward():
        with torch.enable_grad():
            return fn(*args, **kwargs)

    result = as_the_gate_runs(forward, dtype)
    flat = []

    def walk(r):
        if isinstance(r, (list, tuple)):
            for x in r:
                walk(x)
        elif isinstance(r, torch.Tensor):
            flat.append(r)

    walk(result)
    roots, ups = [], []
    for k, t in enumerate(flat):
        if not t.requires_grad or not t.is_floating_point():
            continue
        u = upstream(k, tuple(t.shape) or (1,))
        roots.append(t)
        ups.append(torch.from_numpy(np.ascontiguousarray(u, dtype=np.float64)).reshape(t.shape)
                   .to(device=t.device, dtype=t.dtype))
    with wide(dtype):
        grads = torch.autograd.grad(roots, leaves, ups, allow_unused=True) if roots and leaves else [None] * len(leaves)
    if leaves and all(g is None for g in grads):  # as the gate's gradient oracle: no gradient at all
        raise RuntimeError("not differentiable: no float output has a gradient with respect to the float inputs")
    return [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, leaves)]


def call(fn, args, kwargs, mode, dtype):
    ctx = torch.autocast(device_type=DEVICE, dtype=DTYPES[dtype]) if mode == "operator" and dtype in ("float16", "bfloat16") else contextlib.nullcontext()
    fn = at_dtype(fn, dtype, mode)

    def run():
        with torch.no_grad(), ctx:
            return fn(*args, **kwargs)

    return as_the_gate_runs(run, dtype)


def outputs(result, low):
    flat = []

    def walk(r):
        if isinstance(r, (list, tuple)):
            for x in r:
                walk(x)
        elif isinstance(r, torch.Tensor):
            flat.append(r.detach().to("cpu", torch.float64).numpy() if r.is_floating_point() else r.cpu().numpy())
        elif isinstance(r, (int, float, bool)):
            flat.append(np.asarray(r, dtype=np.float64))

    walk(result)
    if low and OUT_PERMUTE is not None and flat:
        flat[0] = np.transpose(flat[0], np.argsort(OUT_PERMUTE))
    return flat
'''

TENSORFLOW = r'''
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf

if THREADS:
    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32, "float64": tf.float64}
DEV = "/GPU:0" if DEVICE == "cuda" else "/CPU:0"


def to_native(arr, dtype, memory_format):
    with tf.device(DEV):
        if arr.dtype.kind in "iub":
            return tf.constant(np.ascontiguousarray(arr))
        return tf.cast(tf.constant(np.ascontiguousarray(arr, dtype=np.float64)), DTYPES[dtype])


_BUILT = {}


def at_dtype(fn, dtype):
    """As the gate runs a Keras layer class named as the operator: built with dtype= (a dtype, or
    a mixed policy's name) and the row's constructor arguments, per dtype, each given one
    default instance's weights; a method operator (``Method``), that method of the layer built
    at the dtype (of the one instance of a class that is not a layer)."""
    if isinstance(fn, Method):
        key = (fn.cls, dtype, "method")
        if key not in _BUILT:
            _BUILT[key] = fn.cls(dtype=dtype, **CONSTRUCT) if issubclass(fn.cls, tf.keras.layers.Layer) else fn.cls(**CONSTRUCT)
        return getattr(_BUILT[key], fn.name)
    if not isinstance(fn, type):
        return fn
    if (fn, dtype) not in _BUILT:
        default = _BUILT.setdefault((fn, None), fn(**CONSTRUCT))
        layer = fn(dtype=dtype, **CONSTRUCT)

        def first(*args, **kwargs):
            out = layer(*args, **kwargs)
            if getattr(layer, "weights", None):  # a Keras Loss has none
                if not default.built:
                    default(*args, **kwargs)
                layer.set_weights(default.get_weights())
                out = layer(*args, **kwargs)
            _BUILT[(fn, dtype)] = layer
            return out

        _BUILT[(fn, dtype)] = first
    return _BUILT[(fn, dtype)]


def call(fn, args, kwargs, mode, dtype):
    if isinstance(fn, type) and mode == "operator" and dtype in ("float16", "bfloat16"):
        # a Keras layer class under its mixed policy: float32 inputs, autocast by the layer itself
        with tf.device(DEV):
            return at_dtype(fn, "mixed_" + dtype)(*args, **kwargs)
    fn = at_dtype(fn, dtype)
    with tf.device(DEV):
        if mode == "operator" and dtype != "float64":
            cast = lambda a: tf.cast(a, DTYPES[dtype]) if isinstance(a, tf.Tensor) and a.dtype.is_floating else a
            return [tf.cast(o, tf.float32) if isinstance(o, tf.Tensor) and o.dtype.is_floating else o
                    for o in tf.nest.flatten(fn(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()}))]
        return fn(*args, **kwargs)


def quantize(arr, dtype):
    return tf.cast(tf.cast(tf.constant(np.asarray(arr, np.float64)), DTYPES[dtype]), tf.float64).numpy()


def call_grad(fn, args, kwargs, dtype):
    """Gradients of every float input for the stored upstream gradients (the gate's vjp)."""
    fn = at_dtype(fn, dtype)
    with tf.device(DEV):
        leaves = [x for a in list(args) + list(kwargs.values()) for x in (a if isinstance(a, list) else [a])
                  if isinstance(x, tf.Tensor) and x.dtype.is_floating]  # a list argument's tensors too
        with tf.GradientTape() as tape:
            for x in leaves:
                tape.watch(x)
            result = fn(*args, **kwargs)
        flat = [r for r in tf.nest.flatten(result) if isinstance(r, tf.Tensor)]
        targets, ups = [], []
        for k, t in enumerate(flat):
            if not t.dtype.is_floating:
                continue
            targets.append(t)
            ups.append(tf.cast(tf.constant(upstream(k, tuple(t.shape))), t.dtype))
        grads = tape.gradient(targets, leaves, output_gradients=ups) if targets and leaves else [None] * len(leaves)
        if leaves and all(g is None for g in grads):  # as the gate's gradient oracle: no gradient at all
            raise RuntimeError("not differentiable: no float output has a gradient with respect to the float inputs")
        return [g if g is not None else tf.zeros_like(x) for g, x in zip(grads, leaves)]


def outputs(result, low):
    flat = []
    for r in tf.nest.flatten(result):
        if hasattr(r, "dtype") and hasattr(r, "numpy"):
            flat.append(tf.cast(r, tf.float64).numpy() if r.dtype.is_floating else np.asarray(r.numpy()))
        elif isinstance(r, (int, float, bool, np.ndarray, np.generic)):
            flat.append(np.asarray(r, dtype=np.float64))
    if low and OUT_PERMUTE is not None and flat:
        flat[0] = np.transpose(flat[0], np.argsort(OUT_PERMUTE))
    return flat
'''


#: framework -> its part of a repro script (a new backend adds its own text here)
PRELUDES = {"torch": TORCH, "tensorflow": TENSORFLOW}


def repro_prelude(framework: str) -> str:
    """The script's framework part for ``framework``."""
    return PRELUDES[framework]
