"""PyTorch deployment paths (imported only when a torch export path runs): TorchScript by
tracing and by scripting, each saved to a file and loaded back, and ONNX from both of torch's
exporters, run in onnxruntime."""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from typing import Any, Callable, List

import torch

from .exporters import ExportCall, ExportUnsupported, quiet_output, stage


class _Model(torch.nn.Module):
    """A module around a pure-Python model so exporters that want an ``nn.Module`` get one."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


@contextlib.contextmanager
def _quiet() -> Any:
    """Exporters print progress, graphs and deprecation notes: keep them off the gate's
    output (tracer warnings are facts of the export, returned by :func:`tracer_warnings`)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "torch._export",
                                              "onnxscript", "torch.fx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with quiet_output(), warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            yield rec
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _warnings_of(rec) -> List[str]:
    out = []
    for w in rec or []:
        if issubclass(w.category, torch.jit.TracerWarning):
            first = (str(w.message).strip().splitlines() or [""])[0]
            if first not in out:
                out.append(first)
    return out


class _Loaded:
    """A loaded artifact plus what its export said (tracer warnings)."""

    def __init__(self, fn: Callable, notes: List[str]):
        self.fn = fn
        self.notes = notes

    def __call__(self, *xs):
        with torch.no_grad():
            return self.fn(*xs)


def torchscript_trace(call: ExportCall, workdir: str) -> _Loaded:
    path = os.path.join(workdir, "model.pt")
    with _quiet() as rec:
        with stage("convert"):
            traced = torch.jit.trace(_Model(call.model), tuple(call.example), check_trace=False)
        with stage("save"):
            traced.save(path)
        with stage("load"):
            loaded = torch.jit.load(path)
    return _Loaded(loaded, _warnings_of(rec))


def torchscript_script(call: ExportCall, workdir: str) -> _Loaded:
    fn = call.function
    if fn is None or call.bind is None:
        raise ExportUnsupported(f"torch.jit.script needs the operator's own Python function; {call.label} has none")
    if not (inspect.isfunction(fn) or isinstance(fn, torch.nn.Module)):
        raise ExportUnsupported(f"torch.jit.script is not supported on {type(fn).__name__} {getattr(fn, '__name__', fn)!r}"
                                " (a built-in, not a Python function)")
    path = os.path.join(workdir, "script.pt")
    with _quiet() as rec:
        with stage("convert"):
            scripted = torch.jit.script(fn)
        with stage("save"):
            scripted.save(path)
        with stage("load"):
            loaded = torch.jit.load(path)
    bind = call.bind
    return _Loaded(lambda *xs: bind(loaded, xs), _warnings_of(rec))


class _OrtRunner:
    def __init__(self, model_path: str, n_inputs: int, notes: List[str]):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        self.sess = ort.InferenceSession(model_path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.sess.get_inputs()]
        self.n_inputs = n_inputs
        self.notes = notes

    def __call__(self, *xs):
        feed = {}
        for k, x in enumerate(xs):
            name = f"i{k}"
            if name in self.names:
                feed[name] = x.detach().cpu().numpy()
        outs = self.sess.run(None, feed)
        res = tuple(torch.from_numpy(o) for o in outs)
        return res[0] if len(res) == 1 else res


def _onnx(call: ExportCall, workdir: str, dynamo: bool) -> _OrtRunner:
    path = os.path.join(workdir, "model-dynamo.onnx" if dynamo else "model.onnx")
    names = [f"i{k}" for k in range(len(call.example))]
    with _quiet() as rec:
        with stage("convert"):
            if dynamo:
                prog = torch.onnx.export(_Model(call.model), tuple(call.example), dynamo=True, input_names=names,
                                         verbose=False)
            else:
                torch.onnx.export(_Model(call.model), tuple(call.example), path, dynamo=False, input_names=names,
                                  opset_version=17)
        if dynamo:
            with stage("save"):
                prog.save(path)
    with stage("load"):
        return _OrtRunner(path, len(call.example), _warnings_of(rec))


def onnx_torchscript(call: ExportCall, workdir: str) -> _OrtRunner:
    return _onnx(call, workdir, dynamo=False)


def onnx_dynamo(call: ExportCall, workdir: str) -> _OrtRunner:
    return _onnx(call, workdir, dynamo=True)
