"""The backend interface: everything the gate asks of a framework, and nothing about which op
is run or why. Arrays cross this boundary as float64 NumPy arrays whose values are already
exactly representable in the dtype under test."""
from __future__ import annotations

import collections
import importlib
import inspect
import math
import os
import re
import traceback
import weakref
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError

#: the environment variable that sets how many CPU threads a framework computes one operator call
#: on (its intra-op parallelism); set from the config's ``threads`` by the commands, inherited
#: by the isolated workers
THREADS_ENV = "DL_GATE_THREADS"


def intra_op_threads() -> int:
    """CPU threads per operator call: ``$DL_GATE_THREADS``, else 1; 0 leaves the framework's own
    default (every core). One thread by default, as ``torch.utils.benchmark`` times: a kernel's
    parallel reductions split their sums by thread, so the rounding of an output depends on the
    thread count (a baseline refreshed on a 4-core runner and a PR run on 2 cores would differ in
    the last bits), and a 2-thread parallel region on a 2-core runner with anything else busy
    waits for its descheduled thread: beside one busy process the search ran 1.7-4.8x fewer
    evaluations a second at the catalogue's shapes (``bench/threads.py``)."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return 1
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{THREADS_ENV}={text!r}: not a whole number of threads (1 by default; 0 leaves the "
                          "framework's own default)")
    return n


def before_tensorflow() -> None:
    """Load Triton, when it is installed, before TensorFlow. Both bundle LLVM, and Triton
    imported after TensorFlow aborts the process ("LLVM ERROR: inconsistency in registered
    CommandLine options"); torch.compile, torch.export's dynamo path and Triton kernels all
    import Triton, so a run with a TensorFlow operator and any of those would die. Imported in
    this order the two load side by side (0.3 s, only where both are installed)."""
    import importlib.util
    import sys

    if "tensorflow" in sys.modules or "triton" in sys.modules:
        return
    try:
        if importlib.util.find_spec("triton") is None:
            return
        import triton  # noqa: F401
    except Exception:  # a broken Triton: TensorFlow still loads, Triton's own users report it
        pass


class NotDifferentiable(NotImplementedError):
    """The operator's outputs are not connected to its inputs by autograd (computed outside it,
    e.g. a kernel launched without a ``torch.autograd.Function``): a gradient variant does not
    apply (judged unsupported, not a gradient of zero)."""


class Output:
    """One output array of an operator, as float64 (floats; float32 where a run asked for narrow
    outputs, Backend.to_outputs) or int64/bool (exact types)."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: str):
        self.array = array
        self.dtype = dtype

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("float", "bfloat", "complex"))


class Backend(ABC):
    name: str = ""
    #: exception messages that mean "this dtype/device/op combination is not implemented"
    unsupported_patterns: Sequence[str] = ()
    #: the framework flushes subnormal results to zero (FTZ): a zero where the reference is
    #: subnormal in the dtype is the framework's documented behaviour, not an operator error
    flush_subnormals: bool = False

    # -- environment --------------------------------------------------------------------
    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def devices(self) -> List[str]: ...

    def environment(self, device: str) -> dict:
        """Facts a baseline is keyed by (framework version and device description) and the CPU
        threads an operator call ran on (reported, not part of the key)."""
        env = {"framework": self.name, "version": self.version(), "device": device}
        threads = self.threads()
        if threads:
            env["threads"] = threads
        return env

    def set_threads(self, n: int) -> None:
        """Compute each operator call on ``n`` CPU threads (0: leave the framework's default)."""

    def threads(self) -> int:
        """The CPU threads an operator call runs on (0: not known)."""
        return 0

    # -- values -------------------------------------------------------------------------
    @abstractmethod
    def quantize(self, arr: np.ndarray, dtype: str) -> np.ndarray:
        """Round float64 ``arr`` to ``dtype`` and back: the exact values the op will see."""

    @abstractmethod
    def to_native(self, arr: np.ndarray, dtype: str, device: str, memory_format: Optional[str] = None) -> Any: ...

    @abstractmethod
    def to_outputs(self, result: Any, narrow: bool = False) -> List[Output]:
        """The result's tensors and numbers as arrays: float ones as float64, or with ``narrow``
        in the narrowest NumPy dtype that holds them exactly (float32 for float32 and the 16-bit
        formats, float64 for float64; no conversion pass where the tensor is one already):
        what the scoring reads, which widens each element as it goes."""

    # -- running ------------------------------------------------------------------------
    @abstractmethod
    def call(self, fn: Callable, args: Sequence, kwargs: dict, *, mode: str, dtype: str, device: str) -> Any:
        """Call ``fn`` under the variant's computation mode (``input`` or ``operator``: float32
        inputs computed at ``dtype``, under autocast, a Keras layer class under its mixed policy)."""

    def compile(self, fn: Callable, how: str = "default", **options) -> Callable:  # pragma: no cover - per backend
        raise NotImplementedError(f"{self.name} has no compiled mode {how!r}")

    def vjp(self, fn: Callable, args: Sequence, kwargs: dict,
            upstream: Callable[[List["Output"]], List[Optional[np.ndarray]]], *, dtype: str,
            device: str, narrow: bool = False) -> Tuple[List["Output"], List[Optional["Output"]]]:  # pragma: no cover
        """Forward and backward: ``fn``'s outputs, and the gradients of
        ``sum(upstream(outputs) * outputs)`` with respect to every floating tensor among
        ``args`` then ``kwargs`` (in that order; ``None`` where an input is unused).
        ``upstream`` sees the outputs and returns one float64 array per output (``None`` for
        outputs that are not differentiated); the arrays are fed at each output's dtype.
        ``narrow``: outputs and gradients as :meth:`to_outputs` gives them with ``narrow``."""
        raise NotImplementedError(f"{self.name} has no automatic differentiation")

    def as_subclass(self, native: Any, path: str) -> Any:
        """``native`` made an instance of the tensor subclass ``path`` names (``module:Class``):
        an input row's ``subclass``. Only torch has tensor subclasses a library defines."""
        raise ConfigError(f"input subclass {path}: a tensor subclass is a torch input, and this operator is "
                          f"{self.name}'s")

    def full(self, shape: Sequence[int], value: float, dtype: str, device: str) -> Any:  # pragma: no cover
        """A new tensor filled with ``value`` (buffers for ``out=`` arguments)."""
        raise NotImplementedError(f"{self.name} cannot allocate tensors")

    def seed(self, seed: int) -> None:
        """Seed the framework's own RNG (for ops with internal randomness)."""

    # -- helpers ------------------------------------------------------------------------
    def resolve(self, path: str, construct: Sequence[Tuple[str, Any]] = ()) -> Callable:
        """The operator ``path`` names (``construct``: a class's constructor arguments)."""
        return resolve_callable(path, construct)

    def is_unsupported(self, exc: BaseException) -> bool:
        if isinstance(exc, NotDifferentiable):
            return True
        msg = f"{type(exc).__name__}: {exc}"
        return any(re.search(p, msg) for p in self.unsupported_patterns)


def resolve_callable(path: str, construct: Sequence[Tuple[str, Any]] = ()) -> Callable:
    """Import ``pkg.mod:obj.attr`` or ``pkg.mod.func``; one-line error if that fails. A class is
    built (with ``construct``'s arguments: an ``nn.Module`` / Keras ``Layer`` the library's
    tests construct with them)."""
    if ":" in path:
        mod_name, attr = path.split(":", 1)
        candidates: List[Tuple[str, str]] = [(mod_name, attr)]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]
    last_err: Optional[BaseException] = None
    for mod_name, attr in candidates:
        try:
            obj: Any = importlib.import_module(mod_name)
        except ImportError as exc:
            last_err = exc
            continue
        except Exception as exc:  # the module exists but fails to import: that is the code's error, say where
            where = ""
            if isinstance(exc, SyntaxError) and exc.filename:
                where = f" at {exc.filename}:{exc.lineno}"
            else:
                tb = traceback.extract_tb(exc.__traceback__)
                if tb:
                    where = f" at {tb[-1].filename}:{tb[-1].lineno}"
            msg = (exc.msg if isinstance(exc, SyntaxError) else str(exc)).strip().splitlines()
            raise ConfigError(f"cannot import callable {path!r}: module {mod_name} fails to import{where}: "
                              f"{type(exc).__name__}: {msg[0] if msg else ''}") from None
        owner: Any = None
        try:
            for part in attr.split("."):
                owner, obj = obj, getattr(obj, part)
        except AttributeError as exc:
            where = getattr(importlib.import_module(mod_name), "__file__", None)
            last_err = AttributeError(f"{exc} (imported from {where})" if where else str(exc))
            continue
        if inspect.isclass(obj):
            return _operator_of_class(path, obj, dict(construct))
        if inspect.isclass(owner) and _is_instance_method(owner, attr.split(".")[-1]):
            return MethodOperator(path, owner, attr.split(".")[-1], dict(construct))
        if construct:
            raise ConfigError(f"{path}: construct is for a class (an nn.Module or Keras Layer), and this is "
                              f"{type(obj).__name__}")
        if not callable(obj):
            raise ConfigError(f"{path} is not callable")
        return obj
    raise ConfigError(f"cannot import callable {path!r}: {last_err}")


def _operator_of_class(path: str, cls: type, construct: Optional[Dict[str, Any]] = None) -> Callable:
    """What calling the class ``path`` names means as an operator: an ``autograd.Function``'s
    ``apply``; an instance of a ``nn.Module`` / Keras ``Layer`` built with ``construct``'s
    arguments (none by default); anything else (or a constructor that fails) is a one-line error
    saying what to declare."""
    bases = {f"{c.__module__}.{c.__name__}" for c in cls.__mro__[1:]}
    if any(b.startswith("torch.autograd.function.") and b.endswith(".Function") for b in bases):
        if construct:
            raise ConfigError(f"{path} is an autograd.Function: construct is for an nn.Module or Keras Layer")
        return positional_apply(cls)
    keras = _keras_or_torch(cls)
    if keras is not None:
        try:
            return ClassOperator(cls, keras=keras, kwargs=construct)
        except Exception as exc:
            if construct:
                raise ConfigError(f"{path}({', '.join(f'{k}={v!r}' for k, v in construct.items())}) fails: "
                                  f"{type(exc).__name__}: {exc}") from None
            raise ConfigError(f"{path} is a class whose constructor needs arguments ({type(exc).__name__}: {exc}): "
                              "give them as the row's construct: {name: value}, or declare an instance "
                              "(module:INSTANCE) or a factory function") from None
    raise ConfigError(f"{path} is a class, not an operator: declare a function, an instance or, for an "
                      "autograd.Function, its .apply")


def positional_apply(cls: type) -> Callable:
    """An ``autograd.Function``'s ``apply`` that takes a row's arguments by name too. ``apply``
    hands its positional arguments to ``forward`` after ``ctx`` and rejects keywords ("forward()
    missing required argument: 'target'": deep-spin/entmax's loss Functions, whose ``target``
    the gate passes by name, were left out by init); keywords are bound to ``forward``'s
    signature (without ``ctx``), its defaults filled in, and passed in order."""
    apply = cls.apply  # type: ignore[attr-defined]
    try:
        params = list(inspect.signature(cls.forward).parameters.values())[1:]  # type: ignore[attr-defined]
        sig = inspect.Signature(params)
    except (TypeError, ValueError):
        return apply

    def call(*args, **kwargs):
        if not kwargs:
            return apply(*args)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return apply(*bound.args)

    call.__signature__ = sig  # type: ignore[attr-defined]
    call.__name__ = "apply"
    call.__qualname__ = f"{getattr(cls, '__name__', 'Function')}.apply"
    return call


def _keras_or_torch(cls: type) -> Optional[bool]:
    """What :class:`ClassOperator` builds per dtype: True for a Keras ``Layer`` or ``Loss``, False
    for a torch ``nn.Module``, None for any other class."""
    bases = {f"{c.__module__}.{c.__name__}" for c in cls.__mro__[1:]}
    if any(b.endswith(".Module") and b.startswith("torch.nn.") for b in bases):
        return False
    if any(b.endswith(".Layer") for b in bases) or any(b.endswith(".Loss") and "keras" in b for b in bases):
        return True
    return None


def _is_instance_method(cls: type, name: str) -> bool:
    """``cls.name`` is a plain method (called on an instance), not a static or class method."""
    try:
        raw = inspect.getattr_static(cls, name)
    except AttributeError:
        return False
    return inspect.isfunction(raw) and name != "__init__"


class MethodOperator:
    """A method of a class named as an operator (``geoopt.manifolds.SymmetricPositiveDefinite.norm``:
    a manifold is an ``nn.Module`` whose operators are its methods): the method of an instance built
    with the row's ``construct`` arguments, as a :class:`ClassOperator` builds it, at the variant's
    dtype where the class is an ``nn.Module`` / Keras ``Layer`` (its buffers and weights in that
    dtype), else the one instance."""

    def __init__(self, path: str, cls: type, name: str, construct: Optional[Dict[str, Any]] = None):
        self.name = name
        keras = _keras_or_torch(cls)
        try:
            if keras is not None:
                self.owner: Any = ClassOperator(cls, keras=keras, kwargs=construct)
                self.instance = self.owner.default
            else:
                with _seeded_globals():
                    self.owner, self.instance = None, cls(**(construct or {}))
        except Exception as exc:
            how = (f"({', '.join(f'{k}={v!r}' for k, v in construct.items())}) fails" if construct else
                   " cannot be built without arguments: give them as the row's construct: {name: value}")
            raise ConfigError(f"{path}: {cls.__name__}{how}: {type(exc).__name__}: {exc}") from None
        self._built: dict = {}
        try:
            self.__signature__ = inspect.signature(getattr(self.instance, name))
        except (TypeError, ValueError):
            pass

    def __call__(self, *args, **kwargs):
        return getattr(self.instance, self.name)(*args, **kwargs)

    def at(self, dtype: str, device: str = "cpu"):
        """The method of the instance that runs at ``dtype`` on ``device``."""
        if self.owner is None:
            return getattr(self.instance, self.name)
        key = (dtype, device)
        if key not in self._built:
            if self.owner.keras:
                self._built[key] = getattr(self.owner._keras_at(dtype), self.name)
            else:
                self._built[key] = getattr(self.owner.at(dtype, device), self.name)
        return self._built[key]


class ClassOperator:
    """A ``nn.Module`` / Keras ``Layer`` class named as an operator, built by the gate with the
    row's ``construct`` arguments (none by default): once as it is (a call without a dtype), and
    once per dtype it is run at (:meth:`at`), so that it computes in the variant's dtype rather
    than in its float32 default. A Keras layer is built with ``dtype=`` (its dtype policy: a
    layer built without it keeps float32 and casts float16 inputs up, measuring float32 at every
    dtype; in mode operator a mixed policy's name, :func:`keras_mixed_policy`) and given the first
    instance's weights; a torch module is a copy of the one instance moved ``.to(dtype, device)``.
    Every dtype, the float64 reference included, runs the same weights, and a torch module's
    initial weights come from a fixed seed, so that head and base (separate processes) run the
    same weights too; so does what a constructor draws from Python's ``random`` or NumPy's global
    generator (:func:`_seeded_globals`). An instance the user declares is used as it is."""

    def __init__(self, cls: type, keras: bool, kwargs: Optional[Dict[str, Any]] = None):
        self.cls, self.keras = cls, keras
        self.kwargs = dict(kwargs or {})
        with _seeded_globals():
            if keras:
                self.default = cls(**self.kwargs)
            else:
                import torch

                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    self.default = cls(**self.kwargs)
        self._built: dict = {}
        self._default_ok = False  # a Keras instance's first call has succeeded (see call_default)
        try:  # what inspect.signature reports: the instance's call (forward / call), not (*args, **kwargs)
            self.__signature__ = inspect.signature(getattr(self.default, keras_call_method(cls) if keras else "forward"))
        except (TypeError, ValueError):
            pass

    def __call__(self, *args, **kwargs):
        if not self.keras:
            return self.default(*args, **kwargs)
        return self.call_default(*args, **kwargs)

    def call_default(self, *args, **kwargs):
        """The instance built without a dtype, called; a Keras layer whose first call failed (its
        ``build`` rejected the input's shape: deel-lip's GroupSort on an odd channel count) is
        built afresh, so that the next input builds it again: Keras marks a layer built before its
        ``build`` finishes, and a variant whose first input was invalid found every later one
        invalid too ("self.n has to be a divisor of the number of channels" on channels of 4)."""
        if not self.keras or self._default_ok:
            return self.default(*args, **kwargs)
        try:
            out = self.default(*args, **kwargs)
        except Exception:
            with _seeded_globals():
                self.default = self.cls(**self.kwargs)
            raise
        self._default_ok = True
        return out

    def at(self, dtype: str, device: str = "cpu"):
        """The instance that runs at ``dtype`` on ``device``; for a Keras layer ``dtype`` may be a
        dtype policy's name (``mixed_float16``: :func:`keras_mixed_policy`)."""
        key = (dtype, device)
        if key not in self._built:
            if self.keras:
                self._built[key] = _KerasAt(lambda: self._keras_at(dtype), self)
            else:
                import copy

                import torch

                self._built[key] = copy.deepcopy(self.default).to(device=device, dtype=getattr(torch, dtype))
        return self._built[key]


    def _keras_at(self, dtype: str):
        """The Keras layer built with ``dtype=``; a constructor that takes no ``dtype`` (no
        ``**kwargs`` passed to Layer: TFRS's HardNegativeMining) is built as it is and given the
        dtype policy before its first call."""
        try:
            return self.cls(dtype=dtype, **self.kwargs)
        except TypeError as exc:
            if "dtype" not in str(exc):
                raise
        layer = self.cls(**self.kwargs)
        try:
            layer.dtype_policy = dtype  # Keras 3: a property with a setter
        except (AttributeError, TypeError, ValueError) as exc:
            # tf.keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1): the property is read-only and the layer
            # sets its policy with _set_dtype_policy (TFRS's layers, on tf.keras, took no dtype=)
            setter = getattr(layer, "_set_dtype_policy", None)
            try:
                if setter is None:
                    raise exc
                setter(dtype)
            except (AttributeError, TypeError, ValueError) as exc2:
                raise TypeError(f"{self.cls.__name__}() takes no dtype= and its dtype policy cannot be set: "
                                f"{exc2}") from None
        return layer


class _seeded_globals:
    """Python's ``random`` and NumPy's global generator seeded (0) for the block, and given back
    their states after it. A constructor that draws from them builds the same instance in every
    process: lucidrains' hyper-connections pick a residual stream with ``random.randrange`` when
    no layer index is given, so head's worker and base's built different layers, and a PR that
    only added ``.float()`` upcasts read as "the function changed" by 3e6 ulp (and, in the
    mixed-precision variants, as non-deterministic)."""

    def __enter__(self):
        import random

        self._py, self._np = random.getstate(), np.random.get_state()
        random.seed(0)
        np.random.seed(0)
        return self

    def __exit__(self, *exc):
        import random

        random.setstate(self._py)
        np.random.set_state(self._np)
        return False


def keras_call_method(cls: type) -> str:
    """The method a Keras layer class is called through: ``__call__`` where a class of its own
    (not Keras') overrides it (TFRS's SamplingProbablityCorrection), else ``call``."""
    for k in cls.__mro__:  # the top-level package: tensorflow_recommenders is a library of its own
        if (getattr(k, "__module__", "") or "").split(".")[0] in ("keras", "tensorflow", "tf_keras"):
            return "call"
        if "__call__" in vars(k):
            return "__call__"
    return "call"


class _KerasAt:
    """A Keras layer built at a dtype by ``make``, given the weights of ``owner``'s instance built
    without a dtype when it builds them (Keras creates weights at the first call, each instance its
    own random draw). A first call that fails (the layer's ``build`` rejected the input's shape)
    leaves a fresh layer for the next input, as :meth:`ClassOperator.call_default` does."""

    def __init__(self, make: Callable[[], Any], owner: "ClassOperator"):
        self.make, self.owner, self.ready = make, owner, False
        self.layer = make()

    def __call__(self, *args, **kwargs):
        if not self.ready:
            try:
                out = self.layer(*args, **kwargs)  # builds the layer's weights
                if getattr(self.layer, "weights", None):  # a Keras Loss has none
                    if not self.owner._default_ok:
                        self.owner.call_default(*args, **kwargs)
                    self.layer.set_weights(self.owner.default.get_weights())
                    out = self.layer(*args, **kwargs)
            except Exception:
                self.layer = self.make()
                raise
            self.ready = True
            return out
        return self.layer(*args, **kwargs)


def at_dtype(fn: Callable, dtype: str, device: str = "cpu") -> Callable:
    """``fn`` as it runs at ``dtype`` on ``device``: a :class:`ClassOperator` built for it,
    anything else unchanged."""
    return fn.at(dtype, device) if isinstance(fn, (ClassOperator, MethodOperator)) else fn


def keras_mixed_policy(fn: Callable, mode: str, dtype: str) -> Optional[str]:
    """The Keras mixed-precision policy a variant builds ``fn`` with, or None: a Keras layer class
    in mode ``operator`` at float16 / bfloat16 is built with ``dtype="mixed_float16"`` /
    ``"mixed_bfloat16"`` (float32 variables, 16-bit compute) and called with float32 inputs that
    the layer autocasts itself, as a model under ``keras.mixed_precision.set_global_policy`` runs
    it: Keras's own autocast, as torch's operator mode is ``torch.autocast``. A layer that turns
    autocast off to compute its statistics in float32 (keras' GroupNormalization) shows the
    difference only there: in mode ``input`` its inputs already arrive in float16."""
    if mode == "operator" and dtype in ("float16", "bfloat16") and isinstance(fn, ClassOperator) and fn.keras:
        return f"mixed_{dtype}"
    return None


def flatten(result: Any) -> List[Any]:
    """Flatten nested tuples/lists/namedtuples/dicts (in their order) of outputs, dropping ``None``."""
    if result is None:
        return []
    if isinstance(result, (list, tuple)):
        out: List[Any] = []
        for r in result:
            out.extend(flatten(r))
        return out
    if isinstance(result, dict):
        out = []
        for r in result.values():
            out.extend(flatten(r))
        return out
    return [result]


# Float formats: (mantissa bits incl. implicit, minimum normal exponent, maximum exponent)
FLOAT_FORMATS = {
    "float16": (11, -14, 15),
    "bfloat16": (8, -126, 127),
    "float32": (24, -126, 127),
    "float64": (53, -1022, 1023),
}


def overflow_bound(dtype: str) -> float:
    """Smallest magnitude that rounds to infinity in ``dtype``."""
    p, _, emax = FLOAT_FORMATS[dtype]
    try:
        return math.ldexp(2.0 - math.ldexp(1.0, -p), emax)
    except OverflowError:  # float64: the bound is past the largest float64, every finite value is below it
        return math.inf


def min_normal(dtype: str) -> float:
    """``dtype``'s smallest normal number."""
    _, emin, _ = FLOAT_FORMATS[dtype]
    return math.ldexp(1.0, emin)


def numpy_quantize(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Round-to-nearest-even into ``dtype`` (bf16 done bitwise on float32), back as float64.
    Arrays of :data:`ROUND_KERNEL_MIN` elements or more are rounded by one compiled loop
    (:mod:`gate.backends._round_kernel`, the same arithmetic) where Numba is there."""
    arr = np.asarray(arr, dtype=np.float64)
    if arr.size >= ROUND_KERNEL_MIN and dtype in FLOAT_FORMATS and dtype != "float64":
        k = _round_kernel()
        if k is not None:
            return kernel_quantize(k, arr, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return _quantize(arr, dtype)


#: arrays below this many elements are rounded by NumPy (importing Numba costs more there)
ROUND_KERNEL_MIN = 1 << 15

_ROUND = []


def _round_kernel():
    """The compiled rounding loops, or None (no Numba, or ``DL_GATE_FUSED=0``)."""
    if not _ROUND:
        k = None
        if os.environ.get("DL_GATE_FUSED", "1") != "0":
            try:
                from . import _round_kernel as k
            except ImportError:  # no Numba (or no wheel for this platform): NumPy rounds everything
                k = None
        _ROUND.append(k)
    return _ROUND[0]


def warm_round_kernel() -> bool:
    """Load every rounding loop from Numba's cache (compiling it the first time); True when the
    compiled loops are used (see :func:`gate.oracles.registry.warm_kernels`)."""
    k = _round_kernel()
    if k is None:
        return False
    a = np.linspace(-1.0, 1.0, ROUND_KERNEL_MIN)
    for dtype in ("float16", "bfloat16", "float32"):
        kernel_quantize(k, a, dtype)
    float32_twin(a)
    k.round_float32_twin_counts(a, np.empty_like(a), np.empty(a.shape, np.float32), np.empty(2),
                                np.ones(8, np.int32), np.empty(8, np.int64))
    return True


def kernel_quantize(k, arr: np.ndarray, dtype: str) -> np.ndarray:
    """:func:`numpy_quantize` by the compiled loop ``k`` (``gate.backends._round_kernel``)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    out = np.empty_like(flat)
    if dtype == "float32":
        k.round_float32(flat, out)
        return out.reshape(arr.shape)
    p, emin, emax = FLOAT_FORMATS[dtype]
    big = math.ldexp(2.0 - math.ldexp(1.0, 1 - p), emax)
    ext = np.empty(2)
    k.round_to(flat, out, p, emin, big, dtype == "bfloat16", ext)
    return _remember_extremes(out.reshape(arr.shape), ext)


#: (weak reference to an array a rounding loop made, its least value, its greatest, the count
#: thresholds or None, the counts or None) of the last few (a candidate rounds one array an input)
_EXTREMES: "collections.deque" = collections.deque(maxlen=8)


def _remember_extremes(arr: np.ndarray, ext: np.ndarray, edges=None, counts=None) -> np.ndarray:
    _EXTREMES.append((weakref.ref(arr), float(ext[0]), float(ext[1]), edges,
                      None if counts is None else tuple(int(c) for c in counts)))
    return arr


def _known(arr: np.ndarray):
    for entry in reversed(_EXTREMES):
        if entry[0]() is arr:
            return entry
    return None


def known_extremes(arr: np.ndarray) -> Optional[Tuple[float, float]]:
    """``(arr.min(), arr.max())`` without reading ``arr`` again when it is an array a rounding
    loop made lately (which took both in the same pass; NaN both where it holds a NaN), else
    None. Rounded arrays are never written in place afterwards (as every candidate array)."""
    entry = _known(arr)
    return None if entry is None else (entry[1], entry[2])


#: dtype -> the float64 magnitudes (eight, positive) at which the float32 rounding loop counts
#: its rounded magnitudes as it goes (see :func:`count_magnitudes_at`), and their float32 patterns
_COUNT_EDGES: Dict[str, Tuple[tuple, np.ndarray]] = {}


def count_magnitudes_at(dtype: str, edges) -> None:
    """Ask the compiled float32 rounding (:func:`float32_twin`; ``dtype`` "float32") to count, in
    its own pass, how many rounded magnitudes are at or above each of the eight positive float64
    ``edges`` (:func:`known_counts`); :mod:`gate.search.coverage` registers its value bands'
    edges (a separate counting pass over the candidate was ~1 ms of a million-element
    evaluation). ``None`` stops it."""
    if dtype != "float32":
        return
    if edges is None:
        _COUNT_EDGES.pop(dtype, None)
        return
    edges = tuple(float(e) for e in edges)
    if len(edges) != 8 or not all(e > 0 for e in edges):
        raise ValueError("eight positive thresholds")
    _COUNT_EDGES[dtype] = (edges, np.array([_float32_at_or_above(e) for e in edges], dtype=np.int32))


def _float32_at_or_above(e: float) -> int:
    """The bit pattern of the least float32 at or above ``e`` > 0 (+inf's beyond the largest)."""
    with np.errstate(over="ignore"):
        c = np.float32(e)  # nearest (inf when far beyond the largest finite value)
        if float(c) < e:
            c = np.nextafter(c, np.float32(np.inf))
    return int(np.array(c, dtype=np.float32).view(np.int32))


def known_counts(arr: np.ndarray, edges) -> Optional[Tuple[int, ...]]:
    """How many magnitudes of ``arr`` are at or above each of ``edges`` (the registered ones),
    counted by the rounding pass that made ``arr``; None where that pass did not count them
    (another array, other edges). Meaningful where every value is finite."""
    entry = _known(arr)
    if entry is None or entry[4] is None or entry[3] != tuple(float(e) for e in edges):
        return None
    return entry[4]


def float32_twin(arr: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """``(numpy_quantize(arr, "float32"), the same values as float32)`` from one compiled pass,
    or None where :func:`numpy_quantize` would not take the compiled loop (a small array, no
    Numba, ``DL_GATE_FUSED=0``). The pass takes the extremes (:func:`known_extremes`) and, where
    thresholds are registered (:func:`count_magnitudes_at`), the counts (:func:`known_counts`)."""
    arr = np.asarray(arr, dtype=np.float64)
    if arr.size < ROUND_KERNEL_MIN:
        return None
    k = _round_kernel()
    if k is None:
        return None
    flat = np.ascontiguousarray(arr).reshape(-1)
    out = np.empty_like(flat)
    out32 = np.empty(flat.shape, dtype=np.float32)
    ext = np.empty(2)
    count = _COUNT_EDGES.get("float32")
    if count is None:
        k.round_float32_twin(flat, out, out32, ext)
        return _remember_extremes(out.reshape(arr.shape), ext), out32.reshape(arr.shape)
    g = np.empty(8, dtype=np.int64)
    k.round_float32_twin_counts(flat, out, out32, ext, count[1], g)
    return _remember_extremes(out.reshape(arr.shape), ext, count[0], g), out32.reshape(arr.shape)


def _quantize(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float64":
        return arr.copy()
    if dtype == "float32":
        return arr.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return arr.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        f32 = arr.astype(np.float32)
        bits = f32.view(np.uint32).astype(np.uint64)
        rounding = ((bits >> 16) & 1) + 0x7FFF
        out_bits = ((bits + rounding) >> 16 << 16).astype(np.uint32)
        out = out_bits.view(np.float32).astype(np.float64)
        nan = np.isnan(f32)
        out[nan] = np.nan
        return out
    raise ConfigError(f"unsupported dtype {dtype!r}")
