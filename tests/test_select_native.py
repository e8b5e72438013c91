"""Selection on C++/CUDA trees shaped like PyTorch's (native_functions.yaml kernels, structured
kernels, dispatch stubs, headers, TORCH_LIBRARY custom ops, Python decompositions) and
TensorFlow's (REGISTER_OP, REGISTER_KERNEL_BUILDER in macros, functors, REGISTERn, tf_export
wrappers). Selected sets and uncovered native ops are asserted exactly."""
import re
from pathlib import Path

import pytest

from gate.config import parse_config
from gate.ops.catalog import load_catalog
from gate.select import select_ops
from gate.select.aten import NativeFunctions, wheel_yaml
from gate.select.tfnames import tf_snake
from tests.fixtures.select_trees import TF_CONFIG, TF_TREE, TORCH_CONFIG, TORCH_TREE
from tests.helpers.gitrepo import GitRepo

A = "aten/src/ATen/native"
K = "tensorflow/core/kernels"

DECOMP = '''\
import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten


def _cube(x):
    return x * x * x


@register_decomposition(aten.gelu)
def gelu(x, approximate="none"):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * _cube(x))))


@register_decomposition([aten.hardsigmoid.default])
def hardsigmoid(x):
    return torch.clamp(x + 3, 0, 6) / 6
'''


def _repo(tmp_path_factory, name, tree, config):
    r = GitRepo.init(tmp_path_factory.mktemp(name) / "r")
    r.write({**tree, ".dl-gate.yml": config})
    r.commit("base")
    cfg = parse_config(r.read(".dl-gate.yml"), r.path / ".dl-gate.yml", r.path)
    return r, cfg, load_catalog(cfg.ops, builtin=cfg.builtin)


@pytest.fixture(scope="module")
def torch_tree(tmp_path_factory):
    return _repo(tmp_path_factory, "torch", {**TORCH_TREE, "torch/_decomp/decompositions.py": DECOMP}, TORCH_CONFIG)


@pytest.fixture(scope="module")
def tf_tree(tmp_path_factory):
    return _repo(tmp_path_factory, "tf", TF_TREE, TF_CONFIG)


def edit(r, path, old, new):
    src = r.read(path)
    assert old in src, (path, old)
    r.write({path: src.replace(old, new)}, dedent=False)


def pr(tree, name, change):
    r, cfg, cat = tree
    r.checkout("main")
    r.branch(name)
    change(r)
    r.commit(name)
    r.checkout("main")
    return select_ops(r.path, "main", name, cat, cfg)


def uncovered(sel):
    return {(u.framework, u.op) for u in sel.uncovered_native}


TORCH_CASES = [
    # a template in an anonymous namespace -> kernel -> REGISTER_DISPATCH stub -> TORCH_IMPL_FUNC -> gelu
    ("cpu-kernel-helper", lambda r: edit(r, f"{A}/cpu/Activation.cpp", "T(0.5) * x", "T(0.5f) * x"), {"torch.gelu"}, set()),
    ("header-inline", lambda r: edit(r, f"{A}/Activation.h", "return 0.044715;", "return 0.0447;"), {"torch.gelu"}, set()),
    ("cuda-kernel", lambda r: edit(r, f"{A}/cuda/ActivationGeluKernel.cu", "0.70710678f", "0.7071067811865476f"),
     {"torch.gelu"}, set()),
    # an #include added to a header: what every includer registers
    ("header-include", lambda r: edit(r, f"{A}/Activation.h", "#include <ATen/native/DispatchStub.h>",
                                      "#include <ATen/native/DispatchStub.h>\n#include <cmath>"),
     {"torch.gelu", "torch.relu"}, {("torch", "hardsigmoid")}),
    ("cuda-comment-only", lambda r: edit(r, f"{A}/cuda/ActivationGeluKernel.cu", "erf form", "erf formulation"), set(), set()),
    ("cuda-unregistered", lambda r: edit(r, f"{A}/cuda/ActivationGeluKernel.cu", "= 0.0f;", "= 1.0f;"), set(), set()),
    ("dispatch-kernel-name", lambda r: edit(r, f"{A}/Activation.cpp", "at::clamp_min(self, 0)", "at::clamp_min(self, 0.0)"),
     {"torch.relu"}, set()),
    ("meta-function", lambda r: edit(r, f"{A}/Activation.cpp", "build_unary_op(", "build_borrowing_unary_op("),
     {"torch.gelu"}, set()),
    ("static-helper-structured", lambda r: edit(r, f"{A}/SoftMax.cpp", "in.max()", "in.amax()"), {"torch.softmax"}, set()),
    ("uncovered-aten-op", lambda r: edit(r, f"{A}/cpu/Activation.cpp", "/ 6.0f;", "* (1.0f / 6.0f);"),
     set(), {("torch", "hardsigmoid")}),
    ("custom-op-helper", lambda r: edit(r, "csrc/myops.cpp", "x + 0.044715", "x + 0.0447"), {"myops.gelu2"}, set()),
    ("custom-op-schema", lambda r: edit(r, "csrc/myops.cpp", "float s)", "float s=1.0)"), set(), {("torch", "myops::scale")}),
    ("python-decomposition", lambda r: edit(r, "torch/_decomp/decompositions.py", "x * x * x", "x ** 3"),
     {"torch.gelu"}, set()),
    ("python-decomposition-uncovered", lambda r: edit(r, "torch/_decomp/decompositions.py", "/ 6\n", "* (1 / 6)\n"),
     set(), {("torch", "hardsigmoid")}),
]


@pytest.mark.parametrize("name,change,expected,unc", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_torch_tree_selection_is_exact(torch_tree, name, change, expected, unc):
    sel = pr(torch_tree, name, change)
    assert set(sel.op_names()) == expected, [(s.op, [r.path for r in s.reasons]) for s in sel.selected]
    assert uncovered(sel) == unc


def test_torch_reason_path_goes_through_stub_and_structured_kernel(torch_tree):
    sel = pr(torch_tree, "path", lambda r: edit(r, f"{A}/cpu/Activation.cpp", "T(0.5) * x", "T(0.5) * x * T(1)"))
    (reason,) = sel.get("torch.gelu").reasons
    assert (reason.file, reason.kind, reason.symbol) == (f"{A}/cpu/Activation.cpp", "aten", "at::native::gelu_tanh")
    text = " -> ".join(reason.path)
    for step in ("GeluKernelImpl", "REGISTER_DISPATCH(GeluKernel, GeluKernelImpl)", "gelu_out_cpu", "aten::gelu", "torch.gelu"):
        assert step in text, text
    assert text.index("GeluKernelImpl") < text.index("gelu_out_cpu") < text.index("aten::gelu")


def test_custom_op_reaches_the_user_row_through_python_too(torch_tree):
    sel = pr(torch_tree, "custom-kind", lambda r: edit(r, "csrc/myops.cpp", "return 0.5 * x", "return 0.5f * x"))
    kinds = {r.kind for r in sel.get("myops.gelu2").reasons}
    assert kinds == {"torch-library"}


def test_repository_native_functions_yaml_wins_over_the_wheel(tmp_path_factory):
    fork = dict(TORCH_TREE)
    fork[f"{A}/native_functions.yaml"] = (
        "- func: my_act(Tensor self) -> Tensor\n  dispatch:\n    CPU: my_act_cpu\n\n"
        "- func: gelu(Tensor self, *, str approximate='none') -> Tensor\n  structured_delegate: gelu.out\n\n"
        "- func: gelu.out(Tensor self, *, str approximate='none', Tensor(a!) out) -> Tensor(a!)\n"
        "  structured: True\n  dispatch:\n    CPU: gelu_out_cpu\n")
    fork[f"{A}/MyAct.cpp"] = "#include <ATen/ATen.h>\nnamespace at::native {\nTensor my_act_cpu(const Tensor& x) {\n  return x * 2;\n}\n}\n"
    cfg = TORCH_CONFIG + "  - {name: fork.my_act, callable: \"myops_py:gelu2\", native: [my_act], inputs: [{name: x, shape: [4]}]}\n"
    tree = _repo(tmp_path_factory, "fork", fork, cfg)
    sel = pr(tree, "my-act", lambda r: edit(r, f"{A}/MyAct.cpp", "x * 2", "x + x"))
    assert sel.op_names() == ["fork.my_act"]
    assert wheel_yaml() is not None and not NativeFunctions.load().is_op("my_act")


TF_CASES = [
    # functor -> kernel class using it -> REGISTER_KERNEL_BUILDER inside a #define -> Relu only
    ("functor", lambda r: edit(r, f"{K}/relu_op_functor.h", "cwiseMax(static_cast<T>(0))", "cwiseMax(T(0))"), {"tf.relu"}, set()),
    # one kernel class serves Softmax and LogSoftmax (and tf.attention declares Softmax)
    ("kernel-class-several-ops", lambda r: edit(r, f"{K}/softmax_op.cc", "log_);", "log_, /*stable=*/true);"),
     {"tf.softmax", "tf.log_softmax", "tf.attention"}, set()),
    ("register-op-shape-fn", lambda r: edit(r, "tensorflow/core/ops/nn_ops.cc",
                                            'T: {half, bfloat16, float, double}")\n    .SetShapeFn(shape_inference::UnchangedShape);',
                                            'T: {half, float, double}")\n    .SetShapeFn(shape_inference::UnchangedShape);'),
     {"tf.elu"}, set()),
    ("registerN-functor", lambda r: edit(r, f"{K}/cwise_ops.h", "return a + b;", "return b + a;"),
     {"tf.batch_normalization"}, {("tensorflow", "Add")}),
    ("new-dtype-registration", lambda r: edit(r, f"{K}/relu_op.cc", "TF_CALL_double(REGISTER_RELU_KERNELS);",
                                              "TF_CALL_double(REGISTER_RELU_KERNELS);\nTF_CALL_half(REGISTER_RELU_KERNELS);"),
     {"tf.relu", "tf.elu"}, set()),
    ("one-line-of-a-macro", lambda r: edit(r, f"{K}/relu_op.cc", 'Name("Elu").Device(DEVICE_CPU)', 'Name("Elu").Device(DEVICE_CPU).Priority(1)'),
     {"tf.elu"}, set()),
    ("macro-comment-only", lambda r: edit(r, f"{K}/relu_op.cc", "EluOp<CPUDevice, type>);", "EluOp<CPUDevice, type>);  // elu"),
     set(), set()),
    ("tf-export-wrapper", lambda r: edit(r, "tensorflow/python/ops/nn_ops.py", "gen_nn_ops.relu(features, name=name)",
                                         "gen_nn_ops.relu(features + 0, name=name)"),
     {"tf.relu"}, set()),
]


@pytest.mark.parametrize("name,change,expected,unc", TF_CASES, ids=[c[0] for c in TF_CASES])
def test_tf_tree_selection_is_exact(tf_tree, name, change, expected, unc):
    sel = pr(tf_tree, name, change)
    assert set(sel.op_names()) == expected, [(s.op, [r.path for r in s.reasons]) for s in sel.selected]
    assert uncovered(sel) == unc


def test_tf_snake_case_matches_every_generated_wrapper_in_the_tf_wheel():
    tf_ops = Path(__import__("importlib").util.find_spec("tensorflow").submodule_search_locations[0]) / "python" / "ops"
    pairs = []
    for f in tf_ops.glob("gen_*_ops.py"):
        pairs += re.findall(r'^(\w+) = tf_export\("raw_ops\.\w+"\)\(_ops\.to_raw_op\((\w+)\)\)', f.read_text(), re.M)
    assert len(pairs) > 1000
    # hidden ops get a leading underscore in Python; the rule itself is exact
    assert [(op, fn) for op, fn in pairs if tf_snake(op) != fn.lstrip("_")] == []
    assert [tf_snake(x) for x in ("Conv2D", "MatMul", "TopKV2", "RGBToHSV", "_FusedConv2D", "LRN", "FFT2D")] == [
        "conv2d", "mat_mul", "top_kv2", "rgb_to_hsv", "_fused_conv2d", "lrn", "fft2d"]


ATEN_YAML = """# small copy of ATen's table
- func: exp(Tensor self) -> Tensor
  variants: function, method
  structured_delegate: exp.out

- func: exp.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
  structured: True
  dispatch:
    CPU, CUDA: exp_out

- func: gelu(Tensor self, *, str approximate='none') -> Tensor
  structured_delegate: gelu.out

- func: gelu.out(Tensor self, *, str approximate='none', Tensor(a!) out) -> Tensor(a!)
  structured: True
  dispatch:
    CPU: gelu_out_cpu
"""


@pytest.mark.parametrize("name,old,new,expected", [
    ("yaml-dispatch", "CPU, CUDA: exp_out", "CPU, CUDA: exp_out_fast", {"torch.exp"}),
    ("yaml-default", "str approximate='none') -> Tensor\n", "str approximate='tanh') -> Tensor\n", {"torch.gelu"}),
    ("yaml-comment", "# small copy", "# a small copy", set()),
    ("yaml-layout", "  variants: function, method\n", "  variants:   function, method\n", set()),
])
def test_native_functions_yaml_entries_select_their_ops(tmp_path_factory, name, old, new, expected):
    aten_yaml = f"{A}/native_functions.yaml"
    r, cfg, cat = _repo(tmp_path_factory, name, {aten_yaml: ATEN_YAML, "README.md": "x\n"}, "version: 1\nops: []\n")
    sel = pr((r, cfg, cat), name, lambda r: edit(r, aten_yaml, old, new))
    assert set(sel.op_names()) == expected, [(s.op, [x.path for x in s.reasons]) for s in sel.selected]
    if expected:
        (reason,) = sel.get(next(iter(expected))).reasons
        assert reason.file == aten_yaml and "native_functions.yaml" in reason.path[0]
    else:
        assert not sel.unmapped and sel.cleared  # read and cleared, not "no analyser reads this file"
