"""Deployment paths: how users ship an operator or a model out of eager mode.

An :class:`ExportPath` turns a framework-native callable (a single-operator model, or a graph)
into the artifact users deploy, saves it, loads it back and returns something callable on the
same native tensors: TorchScript (trace / script), ONNX run in onnxruntime (torch's TorchScript-
based and dynamo-based exporters, tf2onnx), TensorFlow SavedModel. The framework code lives in
``export_torch`` / ``export_tf``, imported only when that framework's path is used; this module
is the registry and never imports a framework.

Each step runs inside :func:`stage` so that a failure says which step broke (``convert``,
``save``, ``load``, ``run``); converters that *announce* an unsupported operator raise
:class:`ExportUnsupported`.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ConfigError


class ExportUnsupported(Exception):
    """The converter says the operator (or construct) is not supported."""


class StageError(Exception):
    """A failure inside one export step; ``exc`` is the converter's own exception."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}")
        self.stage = stage
        self.exc = exc


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    try:
        yield
    except StageError:
        raise
    except Exception as exc:  # the converter's failure, tagged with the step
        raise StageError(name, exc) from exc


@contextlib.contextmanager
def quiet_output() -> Iterator[None]:
    """Silence a converter's own printing, Python and native (some print graphs from C++ to
    file descriptor 1/2 when they fail): both descriptors point at /dev/null meanwhile."""
    import io
    import os
    import sys

    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # a closed or odd stream: nothing to flush
            pass
    saved = []
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
                os.dup2(devnull, fd)
            except OSError:
                pass
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


@dataclass
class ExportCall:
    """What to export: ``model(*tensors)`` (pure Python over native ops, parameters baked in)
    and example tensors; ``function`` / ``bind`` let a path that compiles the operator's own
    Python function (``torch.jit.script``) call it as ``bind(compiled, tensors)``."""

    model: Callable[..., Any]
    example: List[Any]
    function: Optional[Callable] = None
    bind: Optional[Callable[[Callable, Sequence[Any]], Any]] = None
    label: str = "model"


@dataclass(frozen=True)
class ExportPath:
    name: str
    framework: str
    module: str  # gate.backends module holding the implementation
    function: str  # its export function: (ExportCall, workdir) -> callable on native tensors
    converter_packages: Tuple[str, ...]  # module prefixes of the converter / runtime (failure grouping)
    requires: Tuple[str, ...] = ()  # importable packages the path needs
    description: str = ""

    def missing(self) -> Optional[str]:
        """Why the path cannot run here (a package is not installed), else ``None``."""
        for pkg in self.requires:
            if importlib.util.find_spec(pkg) is None:
                return f"{pkg} is not installed (pip install 'dl-gate[export]')"
        return None

    def export(self, call: ExportCall, workdir: str) -> Callable[..., Any]:
        impl = getattr(importlib.import_module(self.module), self.function)
        return impl(call, workdir)


PATHS: Dict[str, ExportPath] = {
    p.name: p
    for p in (
        ExportPath("torchscript", "torch", "gate.backends.export_torch", "torchscript_trace",
                   ("torch.jit", "torch._C", "torch.nn.modules.module"),
                   description="torch.jit.trace, saved and loaded back"),
        ExportPath("torchscript-script", "torch", "gate.backends.export_torch", "torchscript_script",
                   ("torch.jit", "torch._jit_internal", "torch._sources", "torch._C", "torch.nn.modules.module"),
                   description="torch.jit.script of the operator's Python function, saved and loaded back"),
        ExportPath("onnx", "torch", "gate.backends.export_torch", "onnx_torchscript",
                   ("torch.onnx", "torch.jit", "onnx", "onnxruntime"), requires=("onnx", "onnxruntime"),
                   description="torch.onnx.export(dynamo=False), run in onnxruntime"),
        ExportPath("onnx-dynamo", "torch", "gate.backends.export_torch", "onnx_dynamo",
                   ("torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch.fx", "onnxscript", "onnx_ir",
                    "onnx", "onnxruntime"), requires=("onnx", "onnxruntime", "onnxscript"),
                   description="torch.onnx.export(dynamo=True) via torch.export, run in onnxruntime"),
        ExportPath("savedmodel", "tensorflow", "gate.backends.export_tf", "saved_model",
                   ("tensorflow.python.saved_model", "tensorflow.python.eager", "tensorflow.python.framework",
                    "tensorflow.python.trackable", "tensorflow"),
                   description="tf.saved_model.save of a tf.function, tf.saved_model.load and call"),
        ExportPath("tf2onnx", "tensorflow", "gate.backends.export_tf", "tf2onnx_path",
                   ("tf2onnx", "onnx", "onnxruntime"), requires=("tf2onnx", "onnx", "onnxruntime"),
                   description="tf2onnx.convert.from_function, run in onnxruntime"),
    )
}


def paths_for(framework: str) -> List[ExportPath]:
    return [p for p in PATHS.values() if p.framework == framework]


def get_path(name: str) -> ExportPath:
    if name not in PATHS:
        raise ConfigError(f"unknown export path {name!r} (known: {', '.join(PATHS)})")
    return PATHS[name]


__all__ = ["ExportPath", "ExportCall", "ExportUnsupported", "StageError", "stage", "PATHS", "paths_for", "get_path"]
