"""TensorFlow deployment paths (imported only when a TensorFlow export path runs): SavedModel
saved and loaded back, and tf2onnx run in onnxruntime."""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Callable, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from .base import before_tensorflow  # noqa: E402

before_tensorflow()
import tensorflow as tf  # noqa: E402

from .exporters import ExportCall, ExportUnsupported, quiet_output, stage  # noqa: E402


def _signature(call: ExportCall) -> List[tf.TensorSpec]:
    return [tf.TensorSpec(shape=tuple(x.shape), dtype=x.dtype, name=f"i{k}") for k, x in enumerate(call.example)]


@contextlib.contextmanager
def _quiet():
    with quiet_output(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def saved_model(call: ExportCall, workdir: str) -> Callable:
    path = os.path.join(workdir, "saved_model")
    model = call.model
    with _quiet():
        with stage("convert"):
            module = tf.Module()
            module.f = tf.function(lambda *xs: model(*xs), input_signature=_signature(call))
            module.f.get_concrete_function()
        with stage("save"):
            tf.saved_model.save(module, path)
        with stage("load"):
            loaded = tf.saved_model.load(path)
    return lambda *xs: loaded.f(*xs)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def tf2onnx_path(call: ExportCall, workdir: str) -> Callable:
    with _quiet():
        with stage("convert"):
            import tf2onnx  # noqa: F401  (optional extra)
            from tf2onnx import convert
    log = logging.getLogger("tf2onnx")
    handler = _Collect()
    log.addHandler(handler)
    old = log.propagate
    log.propagate = False
    model = call.model
    path = os.path.join(workdir, "model.onnx")
    try:
        with _quiet():
            with stage("convert"):
                fn = tf.function(lambda *xs: model(*xs), input_signature=_signature(call))
                proto, _ = convert.from_function(fn, input_signature=_signature(call), opset=17)
                unsupported = [m for m in handler.messages if "nsupported ops" in m or "is not supported" in m]
                if unsupported:
                    raise ExportUnsupported(f"tf2onnx: {unsupported[-1]}")
            with stage("save"):
                with open(path, "wb") as fh:
                    fh.write(proto.SerializeToString())
    finally:
        log.removeHandler(handler)
        log.propagate = old
    with stage("load"):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(*xs):
        feed = {}
        for k, x in enumerate(xs):
            for cand in (f"i{k}", f"i{k}:0"):
                if cand in names:
                    feed[cand] = np.asarray(x.numpy())
        outs = sess.run(None, feed)
        res = tuple(tf.constant(o) for o in outs)
        return res[0] if len(res) == 1 else res

    return run
