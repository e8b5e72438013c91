"""TensorFlow backend. Imported only when a TensorFlow operator runs."""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from .base import before_tensorflow  # noqa: E402

before_tensorflow()
import tensorflow as tf  # noqa: E402

from .base import Backend, Output, at_dtype, flatten, keras_mixed_policy, numpy_quantize  # noqa: E402

DTYPES = {
    "float16": tf.float16,
    "bfloat16": tf.bfloat16,
    "float32": tf.float32,
    "float64": tf.float64,
}


def _device(device: str) -> str:
    return "/GPU:0" if device == "cuda" else "/CPU:0"


class TFBackend(Backend):
    name = "tensorflow"
    unsupported_patterns = (
        r"No registered '.*' OpKernel",
        r"Could not find device for node",
        r"is not in the list of allowed values",
        r"NotFoundError",
        r"UnimplementedError",
        r"only supports? (the )?NHWC",  # channels-first kernels that exist on GPU only
        r"(Half|BFloat16|half|bfloat16) .*not supported",
        r"cannot compute \w+ as input #\d+\(zero-based\) was expected to be a",
    )

    def version(self) -> str:
        return tf.__version__

    def devices(self) -> List[str]:
        out = ["cpu"]
        if tf.config.list_physical_devices("GPU"):
            out.append("cuda")
        return out

    def seed(self, seed: int) -> None:
        tf.random.set_seed(seed)

    def set_threads(self, n: int) -> None:
        if n <= 0 or tf.config.threading.get_intra_op_parallelism_threads() == n:
            return
        try:
            tf.config.threading.set_intra_op_parallelism_threads(n)
        except RuntimeError:  # the runtime already started (it reads the setting once): keep its pool
            pass

    def threads(self) -> int:
        return tf.config.threading.get_intra_op_parallelism_threads()  # 0: TensorFlow's default

    # TensorFlow runs its CPU kernels with flush-to-zero / denormals-are-zero: a subnormal float32
    # (and bfloat16, computed in float32) input is read as 0, and subnormal results become 0.
    flush_subnormals = True

    def quantize(self, arr: np.ndarray, dtype: str) -> np.ndarray:
        q = numpy_quantize(arr, dtype)
        if dtype in ("float32", "bfloat16"):
            q[np.abs(q) < np.finfo(np.float32).tiny] = 0.0  # the value the kernel will see
        return q

    def to_native(self, arr: np.ndarray, dtype: str, device: str, memory_format: Optional[str] = None) -> Any:
        arr = np.ascontiguousarray(arr)
        with tf.device(_device(device)):
            if arr.dtype.kind in "iub":
                return tf.constant(arr)
            return tf.cast(tf.constant(arr.astype(np.float64, copy=False)), DTYPES[dtype])

    def to_outputs(self, result: Any, narrow: bool = False) -> List[Output]:  # narrow: float64 all the same
        outs: List[Output] = []
        for r in flatten(result):
            if isinstance(r, (tf.Tensor, tf.Variable)) or hasattr(r, "numpy"):
                name = r.dtype.name
                if r.dtype.is_floating:
                    outs.append(Output(tf.cast(r, tf.float64).numpy(), name))
                elif r.dtype.is_complex:
                    arr = r.numpy()
                    outs.append(Output(np.stack([arr.real, arr.imag], -1).astype(np.float64), "complex"))
                else:
                    outs.append(Output(np.asarray(r.numpy()).astype(np.int64), name))
            elif isinstance(r, (int, float, bool, np.ndarray, np.generic)):
                arr = np.asarray(r)
                outs.append(Output(arr.astype(np.float64), "float64"))
        return outs

    def call(self, fn: Callable, args: Sequence, kwargs: dict, *, mode: str, dtype: str, device: str) -> Any:
        policy = keras_mixed_policy(fn, mode, dtype)
        if policy is not None:
            # a Keras layer class under its mixed policy: the float32 inputs go in as they are (the
            # layer autocasts them, or not), the outputs come back in the dtype the layer returns
            with tf.device(_device(device)):
                return at_dtype(fn, policy, device)(*args, **kwargs)
        fn = at_dtype(fn, dtype, device)
        with tf.device(_device(device)):
            if mode == "operator" and dtype != "float64":
                # computed at ``dtype`` from float32 inputs, result handed back as float32
                args = [tf.cast(a, DTYPES[dtype]) if _is_float(a) else a for a in args]
                kwargs = {k: tf.cast(v, DTYPES[dtype]) if _is_float(v) else v for k, v in kwargs.items()}
                out = fn(*args, **kwargs)
                return [tf.cast(o, tf.float32) if _is_float(o) else o for o in flatten(out)]
            return fn(*args, **kwargs)

    def compile(self, fn: Callable, how: str = "default", **options) -> Callable:
        """``default``: ``tf.function`` (option ``jit_compile``: XLA); ``xla``: the same with
        ``jit_compile=True``. Shapes are generalised (``reduce_retracing``) as a fuzzer feeds many."""
        if how == "default":
            return tf.function(fn, jit_compile=bool(options.get("jit_compile", False)), reduce_retracing=True)
        if how == "xla":
            return tf.function(fn, jit_compile=True, reduce_retracing=True)
        raise NotImplementedError(f"tensorflow has no compiled mode {how!r}")

    def vjp(self, fn: Callable, args: Sequence, kwargs: dict, upstream, *, dtype: str,
            device: str, narrow: bool = False) -> Tuple[List[Output], List[Optional[Output]]]:  # narrow: float64 all the same
        # a list argument's tensors (an input pack) are leaves too, in order
        leaves = [x for a in list(args) + list(kwargs.values()) for x in (a if isinstance(a, list) else [a])
                  if _is_float(x)]
        fn = at_dtype(fn, dtype, device)
        with tf.device(_device(device)):
            with tf.GradientTape(persistent=False) as tape:
                for x in leaves:
                    tape.watch(x)
                result = fn(*args, **kwargs)
            tensors = [r for r in flatten(result) if isinstance(r, (tf.Tensor, tf.Variable))]
            outs = self.to_outputs(tensors)
            ups = upstream(outs)
            roots, grads_out = [], []
            for t, u in zip(tensors, ups):
                if u is None or not t.dtype.is_floating:
                    continue
                roots.append(t)
                grads_out.append(tf.cast(tf.constant(np.asarray(u, dtype=np.float64)), t.dtype))
            grads = tape.gradient(roots, leaves, output_gradients=grads_out) if roots and leaves else [None] * len(leaves)
        return outs, [None if g is None else self.to_outputs(tf.convert_to_tensor(g))[0] for g in grads]

    def full(self, shape: Sequence[int], value: float, dtype: str, device: str) -> Any:
        with tf.device(_device(device)):
            return tf.fill(list(shape), tf.constant(value, DTYPES[dtype]))


def _is_float(x: Any) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype.is_floating
