"""The framework side of sub-operation tracing (:mod:`gate.localise.trace`): what the recorder
needs to know of torch and TensorFlow tensors, a torch function mode and the TensorFlow patches
that hand every call to the recorder's ``intercept(name, func, args, kwargs, caller frame)``."""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Tuple

import numpy as np


def func_name(func) -> str:
    try:
        from torch.overrides import resolve_name

        n = resolve_name(func)
        if n:
            return n
    except Exception:
        pass
    mod = getattr(func, "__module__", None) or ""
    return f"{mod}.{getattr(func, '__qualname__', getattr(func, '__name__', repr(func)))}".lstrip(".")


class _Framework:
    """What the recorder needs to know of a framework's tensors."""

    casts: frozenset = frozenset()

    def is_tensor(self, t) -> bool: ...
    def is_float(self, t) -> bool: ...
    def as_f64(self, t): ...
    def to_numpy(self, t) -> np.ndarray: ...
    def shape(self, t) -> List[int]: ...

    def numel(self, t) -> int:
        return int(np.prod(self.shape(t))) if self.shape(t) else 1

    def copy(self, t):
        """A shadow that later in-place calls cannot alter."""
        return t

    def plain(self, outs):
        """Context for the float64 shadow call (no autocast)."""
        import contextlib

        return contextlib.nullcontext()


class TorchTensors(_Framework):
    casts = frozenset({"torch.Tensor.to", "torch.Tensor.float", "torch.Tensor.half", "torch.Tensor.bfloat16",
                       "torch.Tensor.double", "torch.Tensor.type", "torch.Tensor.type_as"})

    def __init__(self):
        import torch

        self.torch = torch

    def is_tensor(self, t):
        return isinstance(t, self.torch.Tensor)

    def is_float(self, t):
        return isinstance(t, self.torch.Tensor) and (t.is_floating_point() or t.is_complex())

    def as_f64(self, t):
        return t.detach().to(self.torch.complex128 if t.is_complex() else self.torch.float64)

    def to_numpy(self, t):
        t = t.detach()
        if t.is_complex():
            t = self.torch.view_as_real(t)
        return t.to("cpu", self.torch.float64).numpy().copy()

    def shape(self, t):
        return list(t.shape)

    def numel(self, t):
        return t.numel()

    def copy(self, t):
        return t.clone()

    def plain(self, outs):
        return self.torch.autocast(device_type=outs[0].device.type, enabled=False)


class TensorFlowTensors(_Framework):
    casts = frozenset({"tf.cast", "tf.dtypes.cast", "tf.saturate_cast", "tf.dtypes.saturate_cast"})

    def __init__(self):
        import tensorflow as tf

        self.tf = tf

    def is_tensor(self, t):
        return isinstance(t, (self.tf.Tensor, self.tf.Variable))

    def is_float(self, t):
        # eager values only: symbolic tensors (inside a graph) have no values to shadow
        return self.is_tensor(t) and (t.dtype.is_floating or t.dtype.is_complex) and hasattr(t, "numpy")

    def as_f64(self, t):
        return self.tf.cast(t, self.tf.complex128 if t.dtype.is_complex else self.tf.float64)

    def to_numpy(self, t):
        a = t.numpy()
        if np.iscomplexobj(a):
            a = np.stack([a.real, a.imag], -1)
        return np.array(a, dtype=np.float64)

    def shape(self, t):
        return [int(d) if d is not None else -1 for d in t.shape]


def torch_mode(intercept: Callable):
    """A :class:`torch.overrides.TorchFunctionMode` that hands every torch function and tensor
    method call to ``intercept``."""
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return intercept(func_name(func), func, args, kwargs or {}, sys._getframe(1))

    return Mode()


#: TensorFlow namespaces whose functions are wrapped while tracing, and the tensor operators
TF_NAMESPACES = ("", "math", "nn", "linalg", "signal", "dtypes", "experimental.numpy")
TF_OPERATORS = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
                "__floordiv__", "__rfloordiv__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__neg__",
                "__abs__", "__mod__", "__rmod__", "__getitem__")


class TfPatches:
    """Eager TensorFlow has no function mode: while active, the public functions of the
    :data:`TF_NAMESPACES` (``tf.exp``, ``tf.math.log1p``, ``tf.nn.softmax``, ...) and the
    tensor operators (``x - m``, ``x[..., 0]``) are replaced by wrappers that hand every call
    to ``intercept``, and ``tf.function`` bodies run eagerly."""

    def __init__(self, intercept: Callable):
        import tensorflow as tf

        self.tf = tf
        self.intercept = intercept  # (name, func, args, kwargs, caller frame) -> result
        self._saved: List[Tuple[Any, str, Any]] = []
        self._eager = None

    def _wrap(self, name: str, func):
        intercept = self.intercept

        def wrapper(*args, **kwargs):
            return intercept(name, func, args, kwargs, sys._getframe(1))

        wrapper.__wrapped__ = func
        wrapper.__name__ = getattr(func, "__name__", name)
        wrapper.__doc__ = getattr(func, "__doc__", None)
        return wrapper

    def __enter__(self):
        import inspect

        tf = self.tf
        wrappers: Dict[int, Any] = {}
        for ns in TF_NAMESPACES:
            mod = tf
            for part in filter(None, ns.split(".")):
                mod = getattr(mod, part, None)
            if mod is None:
                continue
            prefix = "tf." + (ns + "." if ns else "")
            for attr in dir(mod):
                if attr.startswith("_"):
                    continue
                try:
                    obj = getattr(mod, attr)
                except Exception:
                    continue
                if not inspect.isfunction(obj):
                    continue  # classes, modules, dtypes
                w = wrappers.get(id(obj))
                if w is None:
                    w = wrappers[id(obj)] = self._wrap(prefix + attr, obj)
                self._saved.append((mod, attr, obj))
                setattr(mod, attr, w)
        for op in TF_OPERATORS:
            orig = tf.Tensor.__dict__.get(op)
            if orig is None:
                continue
            self._saved.append((tf.Tensor, op, orig))
            setattr(tf.Tensor, op, self._wrap(f"tf.Tensor.{op}", orig))
        self._eager = tf.config.functions_run_eagerly()
        tf.config.run_functions_eagerly(True)
        return self

    def __exit__(self, *exc):
        for owner, attr, obj in reversed(self._saved):
            setattr(owner, attr, obj)
        self._saved.clear()
        self.tf.config.run_functions_eagerly(bool(self._eager))
        return False
