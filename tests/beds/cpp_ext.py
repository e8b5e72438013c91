"""A C++ CPU extension library (``lnext``, built with ``torch.utils.cpp_extension``) for the
extension test bed, and the pull requests made on it.

``layer_norm_forward`` computes the row mean and variance in two passes (mean, then squared
deviations), as PyTorch's CPU LayerNorm has since pytorch/pytorch#55044 (fixing #51102): the
squared-sum form ``E[x^2] - E[x]^2`` cancels catastrophically when a row's mean is large next to
its spread. The pull requests:

* ``one_pass_variance``: the planted regression, the revert of that fix (one pass, squared sum);
* ``benign``: the row statistics move to a helper with renamed locals, same arithmetic in the
  same order: must pass;
* ``broken``: a typo that does not compile (a misspelt header): the gate's outcome is ``error`` naming the compiler's
  first error line.

``rms_norm_forward`` shares no code with the layer norm: a change to the layer norm must not
select it.
"""
from __future__ import annotations

LAYER_NORM_CPP = r'''// only the headers it uses (as PyTorch's per-operator headers): a third of <torch/extension.h>'s compile time
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <type_traits>

namespace {

// Mean and (biased) variance of one row, in two passes: the mean first, then the squared
// deviations from it (pytorch/pytorch#55044: E[x^2] - E[x]^2 cancels for a large mean).
template <typename scalar_t, typename acc_t>
void row_moments(const scalar_t* x, int64_t n, acc_t& mean, acc_t& var) {
  acc_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += static_cast<acc_t>(x[i]);
  }
  mean = sum / static_cast<acc_t>(n);
  acc_t sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const acc_t d = static_cast<acc_t>(x[i]) - mean;
    sq += d * d;
  }
  var = sq / static_cast<acc_t>(n);
}

}  // namespace

at::Tensor layer_norm_forward(at::Tensor x, at::Tensor weight, at::Tensor bias, double eps) {
  TORCH_CHECK(x.dim() >= 1, "layer_norm_forward: x needs a last dimension");
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto bc = bias.contiguous();
  auto y = at::empty_like(xc);
  const int64_t n = xc.size(-1);
  const int64_t rows = n == 0 ? 0 : xc.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "layer_norm_forward", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* X = xc.data_ptr<scalar_t>();
    const scalar_t* W = wc.data_ptr<scalar_t>();
    const scalar_t* B = bc.data_ptr<scalar_t>();
    scalar_t* Y = y.data_ptr<scalar_t>();
    for (int64_t r = 0; r < rows; ++r) {
      acc_t mean = 0;
      acc_t var = 0;
      row_moments<scalar_t, acc_t>(X + r * n, n, mean, var);
      const acc_t rstd = acc_t(1) / std::sqrt(var + static_cast<acc_t>(eps));
      for (int64_t i = 0; i < n; ++i) {
        const acc_t v = (static_cast<acc_t>(X[r * n + i]) - mean) * rstd;
        Y[r * n + i] = static_cast<scalar_t>(v * static_cast<acc_t>(W[i]) + static_cast<acc_t>(B[i]));
      }
    }
  });
  return y;
}

at::Tensor rms_norm_forward(at::Tensor x, at::Tensor weight, double eps) {
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto y = at::empty_like(xc);
  const int64_t n = xc.size(-1);
  const int64_t rows = n == 0 ? 0 : xc.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "rms_norm_forward", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* X = xc.data_ptr<scalar_t>();
    const scalar_t* W = wc.data_ptr<scalar_t>();
    scalar_t* Y = y.data_ptr<scalar_t>();
    for (int64_t r = 0; r < rows; ++r) {
      acc_t ss = 0;
      for (int64_t i = 0; i < n; ++i) {
        const acc_t v = static_cast<acc_t>(X[r * n + i]);
        ss += v * v;
      }
      const acc_t rstd = acc_t(1) / std::sqrt(ss / static_cast<acc_t>(n) + static_cast<acc_t>(eps));
      for (int64_t i = 0; i < n; ++i) {
        Y[r * n + i] = static_cast<scalar_t>(static_cast<acc_t>(X[r * n + i]) * rstd * static_cast<acc_t>(W[i]));
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("layer_norm_forward", &layer_norm_forward, "LayerNorm over the last dimension (CPU)");
  m.def("rms_norm_forward", &rms_norm_forward, "RMSNorm over the last dimension (CPU)");
}
'''

SETUP = '''\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="lnext",
    packages=["lnext"],
    ext_modules=[CppExtension("lnext._C", ["csrc/layer_norm.cpp"], extra_compile_args=["-O1", "-g0"])],
    cmdclass={"build_ext": BuildExtension},
)
'''

INIT = '''\
from .ops import layer_norm, rms_norm
'''

OPS = '''\
from . import _C


def layer_norm(x, weight, bias, eps=1e-5):
    return _C.layer_norm_forward(x, weight, bias, eps)


def rms_norm(x, weight, eps=1e-6):
    return _C.rms_norm_forward(x, weight, eps)
'''

REFERENCE = '''\
import torch


def layer_norm(x, weight, bias, eps=1e-5):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
'''

CONFIG = '''\
version: 1
framework: torch
python_path: ["."]
builtin: false
seed: 0
build: "pip install -e ."  # run by the gate with a throw-away --prefix: the environment is untouched
gate:
  dtypes: [float32]
ops:
  - name: lnext.layer_norm
    callable: lnext.ops:layer_norm
    reference: lnext.reference:layer_norm
    kind: normalization
    params: {eps: {choices: [1.0e-5]}}
    dims: {N: [1, 8], D: [2, 256]}
    inputs:
      - {name: x, shape: [N, D]}
      - {name: weight, shape: [D]}
      - {name: bias, shape: [D]}
  - name: lnext.rms_norm
    callable: lnext.ops:rms_norm
    reference: lnext.reference:rms_norm
    kind: normalization
    params: {eps: {choices: [1.0e-6]}}
    dims: {N: [1, 8], D: [1, 256]}
    inputs:
      - {name: x, shape: [N, D]}
      - {name: weight, shape: [D]}
'''

FILES = {
    "csrc/layer_norm.cpp": LAYER_NORM_CPP,
    "setup.py": SETUP,
    "lnext/__init__.py": INIT,
    "lnext/ops.py": OPS,
    "lnext/reference.py": REFERENCE,
    ".gitignore": "build/\n*.so\n*.egg-info/\n__pycache__/\n",
    ".dl-gate.yml": CONFIG,
}

_TWO_PASS = '''  acc_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += static_cast<acc_t>(x[i]);
  }
  mean = sum / static_cast<acc_t>(n);
  acc_t sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const acc_t d = static_cast<acc_t>(x[i]) - mean;
    sq += d * d;
  }
  var = sq / static_cast<acc_t>(n);
'''

#: pull request -> (old text, new text) in csrc/layer_norm.cpp; each old text occurs exactly once
PRS = {
    "one_pass_variance": (_TWO_PASS, '''  acc_t sum = 0;
  acc_t sumsq = 0;
  for (int64_t i = 0; i < n; ++i) {  // one pass over the row: the squared sum
    const acc_t v = static_cast<acc_t>(x[i]);
    sum += v;
    sumsq += v * v;
  }
  mean = sum / static_cast<acc_t>(n);
  var = sumsq / static_cast<acc_t>(n) - mean * mean;
'''),
    "benign": (_TWO_PASS, '''  acc_t total = 0;
  for (int64_t j = 0; j < n; ++j) {
    total += load<acc_t>(x, j);
  }
  mean = total / static_cast<acc_t>(n);
  acc_t squares = 0;
  for (int64_t j = 0; j < n; ++j) {
    const acc_t dev = load<acc_t>(x, j) - mean;
    squares += dev * dev;
  }
  var = squares / static_cast<acc_t>(n);
'''),
    # a misspelt header: g++ stops at its first fatal error, where a typo in a function body costs a
    # whole parse of torch's headers (~11 s here) before the build fails
    "broken": ("#include <ATen/Dispatch.h>\n", "#include <ATen/Dispach.h>\n"),
}

_LOAD_HELPER = '''template <typename acc_t, typename scalar_t>
inline acc_t load(const scalar_t* x, int64_t i) {
  return static_cast<acc_t>(x[i]);
}

'''


def apply_pr(root, name: str) -> str:
    from pathlib import Path

    p = Path(root) / "csrc/layer_norm.cpp"
    src = p.read_text()
    old, new = PRS[name]
    assert src.count(old) == 1, name
    src = src.replace(old, new)
    if name == "benign":
        src = src.replace("// Mean and (biased) variance", _LOAD_HELPER + "// Mean and (biased) variance", 1)
    p.write_text(src)
    return "csrc/layer_norm.cpp"
