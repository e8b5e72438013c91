"""ELU with a hand-vectorised body. The head processes each row in blocks of 8 with expm1 and
the scalar tail (the last D % 8 elements) with exp(x) - 1: cancellation for tiny negative x,
visible only when the row length is not a multiple of 8 and the values are tiny."""
import torch

WIDTH = 8


def base(input, alpha=1.0):
    return torch.where(input > 0, input, alpha * torch.expm1(input))


def head(input, alpha=1.0):
    d = input.shape[-1]
    cut = d - d % WIDTH
    body = input[..., :cut]
    tail = input[..., cut:]
    body_out = torch.where(body > 0, body, alpha * torch.expm1(body))
    tail_out = torch.where(tail > 0, tail, alpha * (torch.exp(tail) - 1))
    return torch.cat([body_out, tail_out], dim=-1)
