"""A C++/CUDA extension library (``lncuda``, a ``torch.utils.cpp_extension.CUDAExtension`` built
with nvcc) for the CUDA test bed, and the pull requests made on it.

The layer norm kernel computes each row's mean and variance in two passes (the mean, then the
squared deviations), as PyTorch's LayerNorm has since pytorch/pytorch#55044 (fixing #51102) and
as apex's and PyTorch's CUDA kernels do with Welford's update: the one-pass form
``E[x^2] - E[x]^2`` cancels catastrophically when a row's mean is large next to its spread, and
the variance comes out negative (NaN after the square root) or far off. The pull requests:

* ``one_pass_variance``: the planted regression, the revert of that fix in the device helper
  ``row_moments`` (one pass, squared sum);
* ``benign``: the same arithmetic in the same order behind a load helper with renamed locals:
  must pass.

``rms_norm_kernel`` shares no code with the layer norm: a change to ``row_moments`` must not
select it. The selection half of the bed (tree-sitter reading the ``.cu`` file, launches
``<<<...>>>`` included) runs on any machine; the build and the gate run need nvcc and a GPU.
"""
from __future__ import annotations

from pathlib import Path

from . import cpp_ext as C

KERNEL_CU = r'''#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <type_traits>

namespace {

// Mean and (biased) variance of one row, in two passes: the mean first, then the squared
// deviations from it (pytorch/pytorch#55044: E[x^2] - E[x]^2 cancels for a large mean).
template <typename scalar_t, typename acc_t>
__device__ void row_moments(const scalar_t* x, int64_t n, acc_t& mean, acc_t& var) {
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

// One thread per row: the rows of the bed are short (<= 256 values).
template <typename scalar_t, typename acc_t>
__global__ void layer_norm_kernel(const scalar_t* X, const scalar_t* W, const scalar_t* B, scalar_t* Y,
                                  int64_t rows, int64_t n, acc_t eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) {
    return;
  }
  acc_t mean = 0;
  acc_t var = 0;
  row_moments<scalar_t, acc_t>(X + r * n, n, mean, var);
  const acc_t rstd = acc_t(1) / sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) {
    const acc_t v = (static_cast<acc_t>(X[r * n + i]) - mean) * rstd;
    Y[r * n + i] = static_cast<scalar_t>(v * static_cast<acc_t>(W[i]) + static_cast<acc_t>(B[i]));
  }
}

template <typename scalar_t, typename acc_t>
__global__ void rms_norm_kernel(const scalar_t* X, const scalar_t* W, scalar_t* Y, int64_t rows, int64_t n,
                                acc_t eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) {
    return;
  }
  acc_t ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const acc_t v = static_cast<acc_t>(X[r * n + i]);
    ss += v * v;
  }
  const acc_t rstd = acc_t(1) / sqrt(ss / static_cast<acc_t>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    Y[r * n + i] = static_cast<scalar_t>(static_cast<acc_t>(X[r * n + i]) * rstd * static_cast<acc_t>(W[i]));
  }
}

constexpr int kThreads = 128;

}  // namespace

torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "layer_norm_forward: CUDA tensors only");
  TORCH_CHECK(x.dim() >= 1, "layer_norm_forward: x needs a last dimension");
  const at::cuda::OptionalCUDAGuard guard(x.device());
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto bc = bias.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t n = xc.size(-1);
  const int64_t rows = n == 0 ? 0 : xc.numel() / n;
  if (rows == 0) {
    return y;
  }
  const int blocks = static_cast<int>((rows + kThreads - 1) / kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "layer_norm_forward", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    layer_norm_kernel<scalar_t, acc_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(), bc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows, n,
        static_cast<acc_t>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

torch::Tensor rms_norm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "rms_norm_forward: CUDA tensors only");
  const at::cuda::OptionalCUDAGuard guard(x.device());
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t n = xc.size(-1);
  const int64_t rows = n == 0 ? 0 : xc.numel() / n;
  if (rows == 0) {
    return y;
  }
  const int blocks = static_cast<int>((rows + kThreads - 1) / kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "rms_norm_forward", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    rms_norm_kernel<scalar_t, acc_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows, n, static_cast<acc_t>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("layer_norm_forward", &layer_norm_forward, "LayerNorm over the last dimension (CUDA)");
  m.def("rms_norm_forward", &rms_norm_forward, "RMSNorm over the last dimension (CUDA)");
}
'''

SETUP = '''\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

# without TORCH_CUDA_ARCH_LIST, torch builds for the visible GPU's architecture only
setup(
    name="lncuda",
    packages=["lncuda"],
    ext_modules=[CUDAExtension("lncuda._C", ["csrc/layer_norm.cu"], extra_compile_args={"cxx": ["-O1"], "nvcc": ["-O2"]})],
    cmdclass={"build_ext": BuildExtension},
)
'''

# the Python side and the reference are the CPU bed's (tests/beds/cpp_ext.py), word for word
INIT, OPS, REFERENCE = C.INIT, C.OPS, C.REFERENCE

CONFIG = '''\
version: 1
framework: torch
python_path: ["."]
builtin: false
seed: 0
build: "pip install -e ."  # run by the gate with a throw-away --prefix: the environment is untouched
gate:
  dtypes: [float32]
  devices: [cuda]
ops:
  - name: lncuda.layer_norm
    callable: lncuda.ops:layer_norm
    reference: lncuda.reference:layer_norm
    kind: normalization
    params: {eps: {choices: [1.0e-5]}}
    dims: {N: [1, 8], D: [2, 256]}
    inputs:
      - {name: x, shape: [N, D]}
      - {name: weight, shape: [D]}
      - {name: bias, shape: [D]}
  - name: lncuda.rms_norm
    callable: lncuda.ops:rms_norm
    reference: lncuda.reference:rms_norm
    kind: normalization
    params: {eps: {choices: [1.0e-6]}}
    dims: {N: [1, 8], D: [1, 256]}
    inputs:
      - {name: x, shape: [N, D]}
      - {name: weight, shape: [D]}
'''

FILES = {
    "csrc/layer_norm.cu": KERNEL_CU,
    "setup.py": SETUP,
    "lncuda/__init__.py": INIT,
    "lncuda/ops.py": OPS,
    "lncuda/reference.py": REFERENCE,
    ".gitignore": "build/\n*.so\n*.egg-info/\n__pycache__/\n",
    ".dl-gate.yml": CONFIG,
}

#: pull request -> (old text, new text) in csrc/layer_norm.cu: the CPU bed's row statistics edits
PRS = {name: C.PRS[name] for name in ("one_pass_variance", "benign")}

_LOAD_HELPER = '''template <typename acc_t, typename scalar_t>
__device__ __forceinline__ acc_t load(const scalar_t* x, int64_t i) {
  return static_cast<acc_t>(x[i]);
}

'''


def apply_pr(root, name: str) -> str:
    p = Path(root) / "csrc/layer_norm.cu"
    src = p.read_text()
    old, new = PRS[name]
    assert src.count(old) == 1, name
    src = src.replace(old, new)
    if name == "benign":
        src = src.replace("// Mean and (biased) variance", _LOAD_HELPER + "// Mean and (biased) variance", 1)
    p.write_text(src)
    return "csrc/layer_norm.cu"
