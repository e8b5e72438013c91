"""Framework backends behind one interface (:class:`gate.backends.base.Backend`).

Backends are imported lazily: asking for ``torch`` never imports TensorFlow and the reverse.
"""
from __future__ import annotations

import importlib
import os
from typing import Dict, Optional

from ..errors import FrameworkMissing
from .base import THREADS_ENV, Backend, intra_op_threads

_MODULES = {
    "torch": ("gate.backends.torch_backend", "TorchBackend", "torch", "torch"),
    "tensorflow": ("gate.backends.tf_backend", "TFBackend", "tensorflow", "tensorflow"),
}
_CACHE: Dict[str, Backend] = {}
#: the frameworks the gate runs, in this order everywhere (catalogues, configs, rules)
FRAMEWORKS = tuple(_MODULES)


def framework_installed(name: str) -> bool:
    import importlib.util

    if name not in _MODULES:
        return False
    return importlib.util.find_spec(_MODULES[name][2]) is not None


def get_backend(name: str) -> Backend:
    """The backend for ``name`` ('torch' or 'tensorflow'); a one-line error if it is missing."""
    if name in _CACHE:
        return _CACHE[name]
    if name not in _MODULES:
        raise FrameworkMissing(f"unknown framework {name!r} (known: {', '.join(_MODULES)})")
    module, cls, pkg, extra = _MODULES[name]
    if not framework_installed(name):
        raise FrameworkMissing(
            f"{name} is not installed: pip install 'dl-gate[{extra}]' (or 'dl-gate[all]')"
        )
    threads = intra_op_threads()  # a bad $DL_GATE_THREADS is a one-line error before the import
    backend = getattr(importlib.import_module(module), cls)()
    backend.set_threads(threads)
    _CACHE[name] = backend
    return backend


def configure_threads(n: Optional[int]) -> None:
    """Make ``n`` (the config's ``threads``) the CPU threads of every operator call of this
    process and of the workers it starts, unless ``$DL_GATE_THREADS`` already says otherwise."""
    if n is None or os.environ.get(THREADS_ENV, "").strip():
        return
    os.environ[THREADS_ENV] = str(int(n))
    for backend in _CACHE.values():
        backend.set_threads(int(n))


__all__ = ["Backend", "get_backend", "framework_installed", "configure_threads"]
