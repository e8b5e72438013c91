"""Activations."""
import math

import torch

from ._helpers import shift_by_max


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax."""
    e = torch.exp(shift_by_max(x, dim))
    return e / e.sum(dim=dim, keepdim=True)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log(softmax(x)) without forming softmax (no underflow to log(0))."""
    z = shift_by_max(x, dim)
    return z - torch.log(torch.exp(z).sum(dim=dim, keepdim=True))


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Gaussian error linear unit (Hendrycks & Gimpel, 2016)."""
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
