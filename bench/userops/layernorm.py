"""Layer norm over the last dim. The head fuses the two reductions into one pass with
var = E[x²] - E[x]²: catastrophic cancellation when the mean is large against the spread
(large mean, small variance) - harmless in float64, garbage or NaN in float32."""
import torch


def base(input, weight, bias, eps=1e-5):
    mean = input.mean(dim=-1, keepdim=True)
    var = ((input - mean) ** 2).mean(dim=-1, keepdim=True)
    return (input - mean) / torch.sqrt(var + eps) * weight + bias


def head(input, weight, bias, eps=1e-5):
    mean = input.mean(dim=-1, keepdim=True)
    var = (input * input).mean(dim=-1, keepdim=True) - mean * mean
    return (input - mean) / torch.sqrt(var + eps) * weight + bias
