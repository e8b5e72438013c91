"""oplib: a small PyTorch operator library, bundled with dl-gate as its example."""
from .activations import gelu, softmax, log_softmax
from .norms import layer_norm, rms_norm

__all__ = ["gelu", "softmax", "log_softmax", "layer_norm", "rms_norm"]
