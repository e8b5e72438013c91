"""A small Triton kernel library (``tk``) for the kernel test bed, and the pull requests made on it.

The kernels follow real ones: ``_softmax_kernel`` is Liger-Kernel's single-block softmax forward,
``_rms_norm_fwd_kernel`` Liger-Kernel's RMSNorm forward in its Llama casting mode (the mean square
in float32, the product cast back), ``_layer_norm_fwd_kernel`` the Triton tutorial's layer norm
(``05-layer-norm.py``: a loop over column blocks whose tail block is masked).

The pull requests plant the bugs these kernels have really had:

* ``fp16_accumulate``: the float32 upcast of the mean square is dropped (Liger-Kernel #92 added it,
  #950 fixed the same slip in the block backward kernel; ROCm/triton #633's review: squares of
  three-digit numbers overflow a float16 accumulator);
* ``tail_mask``: the ``tl.where(cols < N, x - mean, 0.)`` of the variance loop becomes
  ``x - mean``, so the padded lanes of the tail block add ``mean**2`` each (FlagGems #3716:
  masked-out lanes fed to a reduction);
* ``no_max_shift``: the softmax exponentiates ``x`` instead of ``x - max(x)`` (overflow to inf/inf);
* ``refactor``: the launch settings move to a helper and the kernel's locals are renamed: same
  numerics, must pass.
"""
from __future__ import annotations

INIT = '''\
from .layer_norm import layer_norm
from .rms_norm import rms_norm
from .softmax import softmax
'''

SOFTMAX = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(Y_ptr, Y_row_stride, X_ptr, X_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row_id = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    x = tl.load(X_ptr + row_id * X_row_stride + offsets, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    y = e / d
    tl.store(Y_ptr + row_id * Y_row_stride + offsets, y.to(Y_ptr.dtype.element_ty), mask=mask)


def softmax(x):
    """Softmax over the last dimension."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    n_rows, n_cols = x2.shape
    y = torch.empty_like(x2)
    BLOCK_SIZE = triton.next_power_of_2(n_cols)
    _softmax_kernel[(n_rows,)](y, y.stride(0), x2, x2.stride(0), n_cols, BLOCK_SIZE=BLOCK_SIZE)
    return y.reshape(shape)
'''

RMS_NORM = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_fwd_kernel(Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    X_row = tl.load(X_ptr + row_idx * X_row_stride + col_offsets, mask=mask, other=0)
    X_row_dtype = X_row.dtype
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0)
    # Llama casting mode: the mean square in float32, the normalised row cast back
    X_row = X_row.to(tl.float32)
    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    X_row = X_row * rstd
    X_row = X_row.to(X_row_dtype)
    Y_row = X_row * W_row
    tl.store(Y_ptr + row_idx * Y_row_stride + col_offsets, Y_row, mask=mask)


def rms_norm(x, weight, eps=1e-6):
    """RMSNorm over the last dimension."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    n_rows, n_cols = x2.shape
    y = torch.empty_like(x2)
    BLOCK_SIZE = triton.next_power_of_2(n_cols)
    _rms_norm_fwd_kernel[(n_rows,)](y, y.stride(0), x2, x2.stride(0), weight.contiguous(), n_cols, eps,
                                    BLOCK_SIZE=BLOCK_SIZE)
    return y.reshape(shape)
'''

LAYER_NORM = '''\
import torch
import triton
import triton.language as tl

MAX_BLOCK = 32  # columns per block: a row longer than this is reduced in a loop, the last block masked


@triton.jit
def _layer_norm_fwd_kernel(X, Y, W, B, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    _mean = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        a = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        _mean += a
    mean = tl.sum(_mean, axis=0) / N
    _var = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.)
        _var += x * x
    var = tl.sum(_var, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(Y + cols, y, mask=mask)


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dimension."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    M, N = x2.shape
    y = torch.empty_like(x2)
    BLOCK_SIZE = min(MAX_BLOCK, triton.next_power_of_2(N))
    _layer_norm_fwd_kernel[(M,)](x2, y, weight.contiguous(), bias.contiguous(), x2.stride(0), N, eps,
                                 BLOCK_SIZE=BLOCK_SIZE)
    return y.reshape(shape)
'''

REFERENCE = '''\
"""float64 references (plain torch) for the kernels."""
import torch


def softmax(x):
    return torch.softmax(x, dim=-1)


def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def layer_norm(x, weight, bias, eps=1e-5):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)
'''

CONFIG = '''\
version: 1
framework: torch
python_path: ["."]
builtin: false
seed: 0
gate:
  dtypes: [float16, float32]
ops:
  - name: tk.softmax
    callable: tk.softmax:softmax
    reference: tk.reference:softmax
    kind: normalization
    dims: {N: [1, 3], D: [1, 48]}
    inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 4}}]
  - name: tk.rms_norm
    callable: tk.rms_norm:rms_norm
    reference: tk.reference:rms_norm
    kind: normalization
    params: {eps: {choices: [1.0e-6]}}
    dims: {N: [1, 3], D: [1, 48]}
    inputs:
      - {name: x, shape: [N, D]}
      - {name: weight, shape: [D]}
  - name: tk.layer_norm
    callable: tk.layer_norm:layer_norm
    reference: tk.reference:layer_norm
    kind: normalization
    params: {eps: {choices: [1.0e-5]}}
    dims: {N: [1, 3], D: [2, 80]}
    inputs:
      - {name: x, shape: [N, D]}
      - {name: weight, shape: [D]}
      - {name: bias, shape: [D]}
'''

FILES = {
    "tk/__init__.py": INIT,
    "tk/softmax.py": SOFTMAX,
    "tk/rms_norm.py": RMS_NORM,
    "tk/layer_norm.py": LAYER_NORM,
    "tk/reference.py": REFERENCE,
    ".dl-gate.yml": CONFIG,
}

#: pull request -> (file, old text, new text); each old text occurs exactly once
PRS = {
    "fp16_accumulate": ("tk/rms_norm.py",
                        "    # Llama casting mode: the mean square in float32, the normalised row cast back\n"
                        "    X_row = X_row.to(tl.float32)\n",
                        "    # the mean square in the input's dtype: no upcast (faster, less memory)\n"),
    "tail_mask": ("tk/layer_norm.py",
                  "        x = tl.where(cols < N, x - mean, 0.)\n",
                  "        x = x - mean  # the loads are masked already\n"),
    "no_max_shift": ("tk/softmax.py",
                     "    m = tl.max(x, axis=0)\n    e = tl.exp(x - m)\n",
                     "    e = tl.exp(x)\n"),
    "refactor": ("tk/softmax.py", None, None),  # a whole-file rewrite, below
}

REFACTORED_SOFTMAX = '''\
import torch
import triton
import triton.language as tl


def _launch_settings(n_cols):
    """One program per row; the whole row in one block."""
    return triton.next_power_of_2(n_cols)


@triton.jit
def _softmax_kernel(Y_ptr, Y_row_stride, X_ptr, X_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    in_row = cols < n_cols
    logits = tl.load(X_ptr + row * X_row_stride + cols, mask=in_row, other=float("-inf")).to(tl.float32)
    row_max = tl.max(logits, axis=0)
    numerator = tl.exp(logits - row_max)
    denominator = tl.sum(numerator, axis=0)
    out = numerator / denominator
    tl.store(Y_ptr + row * Y_row_stride + cols, out.to(Y_ptr.dtype.element_ty), mask=in_row)


def softmax(x):
    """Softmax over the last dimension."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(rows)
    _softmax_kernel[(rows.shape[0],)](out, out.stride(0), rows, rows.stride(0), rows.shape[1],
                                      BLOCK_SIZE=_launch_settings(rows.shape[1]))
    return out.reshape(shape)
'''


def apply_pr(root, name: str) -> str:
    """Edit the working tree at ``root`` as pull request ``name`` does; returns the changed file."""
    from pathlib import Path

    path, old, new = PRS[name]
    p = Path(root) / path
    if name == "refactor":
        p.write_text(REFACTORED_SOFTMAX)
        return path
    src = p.read_text()
    assert src.count(old) == 1, (name, old)
    p.write_text(src.replace(old, new))
    return path
