"""A run is what it claims or it is not a measurement (issue 31 item 4, issue 26 item 5).

Modelled on AMPLIFY PR #22 (RMSNorm statistics upcast to float32) and a Keras layer built with
its default float32 dtype policy: an operator whose float16 run returns float32 was measured
against float64 in float16 ulps, read ~0 ulp on every row, and a float16 overflow regression
passed. Now its figures carry why they do not measure float16, and the judge says
``not-measured`` (never a 0-ulp pass) when both sides are so, and "the output dtype changed"
when a PR changes it."""
from __future__ import annotations

import numpy as np
import pytest

from gate.backends.base import Output
from gate.errors import Outcome
from gate.judge import verdict as V
from gate.judge.decide import GateSettings, decide, overall
from gate.judge.replay import ReplayResult
from gate.oracles.precision import compare, not_measured
from gate.oracles.registry import build_runner
from gate.plan import Variant
from gate.search.inputs import Candidate

from tests.oracle_support import user_ops

F16 = Variant("float16")


def test_a_wider_low_run_or_a_narrower_reference_is_named():
    x = np.array([1.0, 2.0])
    assert not_measured([Output(x, "float16")], [Output(x, "float64")], "float16") is None
    assert "returns float32" in not_measured([Output(x, "float32")], [Output(x, "float64")], "float16")
    assert "reference returns float32" in not_measured([Output(x, "float16")], [Output(x, "float32")], "float16")
    assert not_measured([Output(x, "float64")], [Output(x, "float64")], "float16") is None  # a Python float
    assert compare([Output(x, "float32")], [Output(x, "float64")], "bfloat16").unmeasured


OPS = """
- name: planted.rms_upcast
  callable: measured_ops:rms_upcast
  dims: {N: [1, 4], D: [2, 16]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float16]
- name: planted.rms
  callable: measured_ops:rms
  dims: {N: [1, 4], D: [2, 16]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float16]
"""

SRC = '''
import torch


def rms_upcast(x, eps=1e-6):
    xf = x.float()
    return xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)  # returned in float32


def rms(x, eps=1e-6):
    return rms_upcast(x, eps).to(x.dtype)
'''


@pytest.fixture
def specs(tmp_path, monkeypatch):
    (tmp_path / "measured_ops.py").write_text(SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield user_ops(tmp_path, OPS)
    import sys

    sys.modules.pop("measured_ops", None)


def run(spec, dtype="float16"):
    runner = build_runner(spec, Variant(dtype))
    cand = Candidate(dims={}, params={}, arrays={"x": np.linspace(-3, 3, 16).reshape(2, 8)})
    return runner.evaluate(cand, keep_outputs=True)[1]


def test_a_real_upcast_returned_as_is_is_not_measured(specs):
    ev = run(specs["planted.rms_upcast"])
    assert ev.metrics.unmeasured and "returns float32" in ev.metrics.unmeasured
    assert run(specs["planted.rms"]).metrics.unmeasured is None  # cast back: a float16 measurement


def rr(ev) -> ReplayResult:
    return ReplayResult(status=ev.status, metrics=ev.metrics, outputs=[o.array for o in ev.outputs],
                        reference=[o.array for o in ev.reference])


def test_the_judge_never_passes_an_unmeasured_row_and_reports_a_changed_output_dtype(specs):
    up, down = rr(run(specs["planted.rms_upcast"])), rr(run(specs["planted.rms"]))
    spec = specs["planted.rms"]

    def judge(head, base):
        return decide(spec, F16, [head], [base], None, "ok", None, GateSettings(), inputs=["x"], controls=[True])

    v = judge(up, up)
    assert v.outcome == V.NOT_MEASURED and "returns float32" in v.reason and "dtype='float16'" in v.reason
    assert overall([v], [], GateSettings())[0] == Outcome.ERROR.value
    # a PR dropped the .to(x.dtype): the output dtype changed, the values did not get worse (the
    # float32 result measured as it is, in float16 ulps): reported, with what to do once merged
    v = judge(up, down)
    assert v.outcome in (V.PASS, V.IMPROVEMENT), (v.outcome, v.reason)
    assert "output dtype changed" in v.details["warning"] and "drop float16" in v.details["warning"]
    assert v.details["output_dtype_changed"]
    v = judge(down, up)  # and the change back
    assert v.outcome in (V.PASS, V.IMPROVEMENT) and "on base its float16 run returns float32" in v.details["warning"]
    v = judge(down, down)
    assert v.outcome in (V.PASS, V.IMPROVEMENT), (v.outcome, v.reason)


@pytest.mark.tf
def test_a_keras_layer_left_at_its_float32_policy_is_not_measured_at_float16(tmp_path, monkeypatch):
    (tmp_path / "keras_ops.py").write_text(
        "import keras\n\nnorm = keras.layers.LayerNormalization()\nnorm16 = keras.layers.LayerNormalization(dtype='float16')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ops = """
- name: k.norm
  framework: tensorflow
  callable: keras_ops:norm
  dims: {N: [2, 2], D: [8, 8]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float16]
- name: k.norm16
  framework: tensorflow
  callable: keras_ops:norm16
  dims: {N: [2, 2], D: [8, 8]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float16]
"""
    specs = user_ops(tmp_path, ops)
    assert "returns float32" in (run(specs["k.norm"]).metrics.unmeasured or "")
    # pinned to float16 it runs its "float64 reference" in float16 too: neither side is a measurement
    # (the layer must be built in each run's dtype: issue 28's init)
    assert "reference returns float16" in (run(specs["k.norm16"]).metrics.unmeasured or "")


@pytest.mark.tf
def test_a_keras_loss_class_with_constructor_arguments_is_built_in_each_run_s_dtype(tmp_path, monkeypatch):
    """A Keras ``Loss`` subclass (artemmavrin/focal-loss's BinaryFocalLoss(gamma=2)) named by its
    class: built with the row's construct and ``dtype=`` the run's dtype (a Loss computes at its
    dtype, float32 by default: a float16 run would measure float32), called as losses are,
    ``loss(y_true, y_pred)``. init left Loss classes out ("not an nn.Module or a Keras Layer")."""
    (tmp_path / "keras_loss.py").write_text('''import keras
from keras import ops


class FocalLoss(keras.losses.Loss):
    def __init__(self, gamma, **kwargs):
        super().__init__(**kwargs)
        self.gamma = gamma

    def call(self, y_true, y_pred):
        p = ops.sigmoid(y_pred)
        p_t = y_true * p + (1 - y_true) * (1 - p)
        return -((1 - p_t) ** self.gamma) * ops.log(p_t + 1e-7)
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = user_ops(tmp_path, """
- name: k.FocalLoss
  framework: tensorflow
  callable: keras_loss:FocalLoss
  construct: {gamma: 2.0}
  dims: {N: [4, 4]}
  inputs: [{name: y_true, shape: [N, 8], domain: {name: prob, lo: 0.0, hi: 1.0}}, {name: y_pred, shape: [N, 8]}]
  dtypes: [float16, float32]
""")
    from gate.plan import Variant
    from gate.oracles.registry import build_runner

    cand = Candidate(dims={"N": 4}, params={}, arrays={"y_true": (np.arange(32).reshape(4, 8) % 2).astype(float),
                                                         "y_pred": np.linspace(-3, 3, 32).reshape(4, 8)})
    for dtype in ("float16", "float32"):
        ev = build_runner(specs["k.FocalLoss"], Variant(dtype)).evaluate(cand, keep_outputs=True)[1]
        assert ev.status == "ok" and ev.metrics.unmeasured is None, (dtype, ev.status, ev.error, ev.metrics)
        assert [o.dtype for o in ev.outputs] == [dtype] and ev.outputs[0].array.shape == ()
    assert ev.metrics.ulp < 8


@pytest.mark.tf
def test_a_keras_layer_class_is_built_in_each_run_s_dtype(tmp_path, monkeypatch):
    """Named by its class (what `dl-gate init` writes for a Layer), the gate builds the layer:
    with ``dtype=`` the run's dtype, so float16 is measured against a float64 reference (issue 28:
    argument-less layers kept float32 and a float16 regression passed)."""
    (tmp_path / "keras_cls.py").write_text(
        "import keras\n\n\nclass Norm(keras.layers.LayerNormalization):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = user_ops(tmp_path, """
- name: k.Norm
  framework: tensorflow
  callable: keras_cls:Norm
  dims: {N: [2, 2], D: [8, 8]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float16, bfloat16]
""")
    for dtype in ("float16", "bfloat16"):
        ev = run(specs["k.Norm"], dtype)
        assert ev.status == "ok" and ev.metrics.unmeasured is None, (dtype, ev.status, ev.metrics.unmeasured)
        assert 0 < ev.metrics.ulp < 64, ev.metrics.ulp  # a real half-precision error, not float32's 0


MIXED_SRC = """import keras
from keras import ops


class StatsNorm(keras.layers.Layer):
    def __init__(self, upcast=True, **kwargs):
        super().__init__(**kwargs)
        self.autocast = not upcast  # keras' GroupNormalization: float32 inputs stay float32 under a mixed policy
        self.seen = None

    def build(self, shape):
        self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones", name="gamma")

    def call(self, x):
        self.seen = x.dtype
        d = x - ops.mean(x, axis=-1, keepdims=True)
        var = ops.mean(ops.square(d), axis=-1, keepdims=True)  # d*d overflows float16 above 256
        y = d * ops.rsqrt(var + 1e-3) * ops.cast(self.gamma, x.dtype)
        return ops.cast(y, self.compute_dtype)


class Wide(StatsNorm):
    def call(self, x):
        return ops.cast(super().call(x), "float32")  # returned in float32 whatever the policy
"""


@pytest.mark.tf
def test_a_keras_layer_class_in_mode_operator_runs_under_its_mixed_policy(tmp_path, monkeypatch):
    """Mode ``operator`` of a Keras layer class: built with ``dtype="mixed_float16"`` (float32
    variables, float16 compute) and called with float32 inputs holding float16 values, as a model
    under a mixed policy runs it (keras-team/keras d863dc8a5b: GroupNormalization turns autocast
    off so that its statistics are float32 there). The float16 output is a float16 measurement,
    and a layer that returns float32 under its policy is what its users get, not an unmeasured
    run (the policy decides the output dtype, as autocast does for torch)."""
    (tmp_path / "keras_mixed.py").write_text(MIXED_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    row = """
- name: k.{name}
  framework: tensorflow
  callable: keras_mixed:{cls}
  construct: {{upcast: {upcast}}}
  modes: [input, operator]
  dims: {{N: [2, 2], D: [8, 8]}}
  inputs: [{{name: x, shape: [N, D]}}]
  dtypes: [float16, bfloat16]
"""
    specs = user_ops(tmp_path, "".join(row.format(name=n, cls=c, upcast=u) for n, c, u in
                                       (("up", "StatsNorm", "true"), ("down", "StatsNorm", "false"),
                                        ("wide", "Wide", "true"))))
    cand = Candidate(dims={}, params={}, arrays={"x": np.linspace(-600, 600, 16).reshape(2, 8)})

    def run_at(name, dtype, mode):
        runner = build_runner(specs[name], Variant(dtype, mode=mode))
        return runner, runner.evaluate(cand, keep_outputs=True)[1]

    runner, ev = run_at("k.up", "float16", "operator")
    layer = runner.fn.at("mixed_float16").layer
    assert layer.dtype_policy.name == "mixed_float16" and {w.dtype for w in layer.weights} == {"float32"}
    assert layer.seen == "float32"  # the float32 inputs reached the statistics
    assert ev.status == "ok" and ev.metrics.unmeasured is None, (ev.status, ev.error, ev.metrics.unmeasured)
    assert [o.dtype for o in ev.outputs] == ["float16"]
    assert ev.metrics.ulp < 2, ev.metrics.ulp  # float32 statistics, one rounding to float16
    _, down = run_at("k.down", "float16", "operator")  # autocast on: the statistics in float16 overflow
    assert down.metrics.unmeasured is None and down.metrics.ulp > 100, down.metrics.ulp
    # mode input cannot tell the two apart: float16 inputs, float16 statistics either way
    ins = [run_at(n, "float16", "input")[1].metrics.ulp for n in ("k.up", "k.down")]
    assert ins[0] == ins[1] > 100, ins
    _, bf = run_at("k.up", "bfloat16", "operator")
    assert bf.status == "ok" and [o.dtype for o in bf.outputs] == ["bfloat16"] and bf.metrics.unmeasured is None
    _, wide = run_at("k.wide", "float16", "operator")
    assert wide.metrics.unmeasured is None and [o.dtype for o in wide.outputs] == ["float32"]
    assert "returns float32" in (run_at("k.wide", "float16", "input")[1].metrics.unmeasured or "")


def test_a_torch_module_class_runs_one_set_of_weights_at_every_dtype(tmp_path, monkeypatch):
    """A module with parameters named by its class: each dtype (the float64 reference too) runs a
    copy of one instance moved to it, so the weights agree and float64 inputs are not refused by
    float32 weights."""
    (tmp_path / "torch_cls.py").write_text(
        "import torch\n\n\nclass Proj(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = torch.nn.Linear(8, 8)\n\n    def forward(self, x):\n        return self.lin(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = user_ops(tmp_path, """
- name: t.Proj
  callable: torch_cls:Proj
  dims: {N: [2, 2], D: [8, 8]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float16, float32]
""")
    import torch

    torch.manual_seed(0)  # the Linear's initial weights (its error in ulps of small outputs depends on them)
    for dtype in ("float16", "float32"):
        ev = run(specs["t.Proj"], dtype)
        assert ev.status == "ok" and ev.metrics.unmeasured is None, (dtype, ev.status, ev.error)
        # same weights: only rounding differs (a few to ~100 ulps of outputs that cancel; another
        # set of weights would differ in the leading digits: 1e5 ulps and more)
        assert ev.metrics.ulp < 1024, (dtype, ev.metrics.ulp)
    from gate.backends.base import ClassOperator, resolve_callable

    op = resolve_callable("torch_cls:Proj")
    assert isinstance(op, ClassOperator)
    w64 = op.at("float64").lin.weight
    assert w64.dtype.is_floating_point and str(w64.dtype) == "torch.float64"
    assert (w64.float() == op.default.lin.weight).all()
    import inspect

    assert list(inspect.signature(op).parameters) == ["x"]  # the forward's parameters (the instance says *args)


def test_the_float64_reference_keeps_an_operators_own_upcasts_at_float64():
    # LlamaRMSNorm / T5's layer norm: hidden_states.to(torch.float32) ... .to(input_dtype). Run on
    # float64 inputs as written, the "reference" computes in float32: its float32 row reads 0 ulp
    # (a float32 regression passes) and two ways of writing it differ by float32 rounding. The
    # backend's float64 run keeps every narrowing cast at float64 (and dtype= of a torch function)
    import torch

    from gate.backends.torch_backend import TorchBackend

    def rms(x, eps=1e-6):
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        w = torch.ones(x.shape[-1], dtype=torch.float32)
        return (w * (h * torch.rsqrt(var + eps))).to(x.dtype) + torch.softmax(x.float(), -1, dtype=torch.float32).to(x.dtype)

    be = TorchBackend()
    x = torch.tensor([[3.0, -1.0, 0.1, 7.5]], dtype=torch.float64)
    ref = be.call(rms, [x], {}, mode="input", dtype="float64", device="cpu")
    exact = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) + torch.softmax(x, -1)
    assert ref.dtype == torch.float64 and torch.equal(ref, exact)
    low = be.call(rms, [x.float()], {}, mode="input", dtype="float32", device="cpu")
    assert not torch.equal(low.double(), ref)  # the float32 run is measured against a float64 one
    # the gradient's reference too
    outs, grads = be.vjp(rms, [x], {}, lambda outs: [np.ones(o.array.shape) for o in outs], dtype="float64", device="cpu")
    xe = x.clone().requires_grad_(True)
    (ge,) = torch.autograd.grad((xe * torch.rsqrt(xe.pow(2).mean(-1, keepdim=True) + 1e-6) + torch.softmax(xe, -1)).sum(), xe)
    assert grads[0].dtype == "float64" and np.array_equal(grads[0].array, ge.numpy())
    # code that cannot run in float64 (an extension that takes float32 only) runs as written
    def float32_only(x):
        y = x.float()
        if y.dtype != torch.float32:
            raise TypeError("expected float32")
        return y * 2

    assert be.call(float32_only, [x], {}, mode="input", dtype="float64", device="cpu").dtype == torch.float32


def test_a_constant_of_the_operators_own_dtype_meets_the_float64_run_as_float64():
    # piqa's MDSI (as the zero-config acceptance found it): a float32 filter kernel made at
    # import; conv2d(x64, k32) raised "expected scalar type Double but found Float", the float64
    # run failed on every input and init left the operator out. The kernel's float32 values take
    # part in the float64 run exactly; what the operator writes into in place stays its own
    import torch
    import torch.nn.functional as F

    from gate.backends.torch_backend import TorchBackend

    kernel = torch.tensor([[0.1, 0.7, 0.2]], dtype=torch.float32)  # not exact in binary: float32's values

    def smooth(x):
        k = kernel.view(1, 1, 1, 3).expand(x.shape[1], 1, 1, 3)
        return F.conv2d(x, k, padding=(0, 1), groups=x.shape[1]) + x @ kernel.t().expand(x.shape[-1], 1)

    be = TorchBackend()
    x = torch.linspace(-2, 3, 2 * 3 * 4 * 3, dtype=torch.float64).reshape(2, 3, 4, 3)
    with pytest.raises(RuntimeError):
        smooth(x)  # as written, outside the gate's float64 run
    ref = be.call(smooth, [x], {}, mode="input", dtype="float64", device="cpu")
    k64 = kernel.double()
    exact = F.conv2d(x, k64.view(1, 1, 1, 3).expand(3, 1, 1, 3), padding=(0, 1), groups=3) + x @ k64.t().expand(3, 1)
    assert ref.dtype == torch.float64 and torch.equal(ref, exact)
    low = be.call(smooth, [x.float()], {}, mode="input", dtype="float32", device="cpu")
    assert low.dtype == torch.float32 and not torch.equal(low.double(), ref)  # measured against float64
    assert kernel.dtype == torch.float32  # the operator's constant is untouched

    acc = torch.zeros(3, dtype=torch.float32)

    def accumulate(x):
        acc.add_(x)  # an in-place write into a float32 tensor of its own: the caller's, left as it is
        return acc * 1

    out = be.call(accumulate, [torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)], {}, mode="input",
                  dtype="float64", device="cpu")
    assert acc.dtype == torch.float32 and torch.equal(out, acc)  # the write went into the operator's tensor
    assert acc[0].item() != 0.0


def test_a_cast_to_complex64_in_the_float64_run_is_complex128():
    # piqa's MDSI (f73b13c) casts its similarity maps with `.type(torch.cfloat)`: complex64, two
    # float32s. In the float64 run that computed the rest in float32 and returned float32: init
    # left MDSI out as "its float64 reference returns float32"; now it is gated at float32
    import torch

    from gate.backends.torch_backend import TorchBackend

    def similarity(x):
        g = x.type(torch.cfloat)
        h = x.to(torch.complex64) + x.cfloat()
        return (g * h).abs().mean(-1)

    be = TorchBackend()
    x = torch.linspace(0.1, 2.0, 8, dtype=torch.float64).reshape(2, 4)
    ref = be.call(similarity, [x], {}, mode="input", dtype="float64", device="cpu")
    exact = (x.to(torch.complex128) * (2 * x.to(torch.complex128))).abs().mean(-1)
    assert ref.dtype == torch.float64 and torch.equal(ref, exact)
    low = be.call(similarity, [x.float()], {}, mode="input", dtype="float32", device="cpu")
    assert low.dtype == torch.float32  # the float32 run computes in complex64, as written


def test_a_tensor_made_without_a_dtype_in_the_float64_run_is_float64():
    # seung-lab/torchfields' vote weights are written into `torch.zeros(...)` made in the default
    # dtype: the float64 run narrowed them to float32 and returned float32 ("not measured"), and
    # init left the function out. Inside the float64 run the default dtype is float64; the low
    # run keeps the user's default, and the default comes back after the call, raising or not
    import torch

    from gate.backends.torch_backend import TorchBackend

    def weights(d):
        w = torch.zeros(d.shape)
        w[...] = torch.exp(-d / 0.01) * torch.tensor([0.5, 2.0]).sum()
        return w / w.sum(dim=0, keepdim=True)

    be = TorchBackend()
    d = torch.tensor([[0.013, 0.2], [0.0131, 0.25], [0.05, 0.21]], dtype=torch.float64)
    ref = be.call(weights, [d], {}, mode="input", dtype="float64", device="cpu")
    e = torch.exp(-d / 0.01) * 2.5
    assert ref.dtype == torch.float64 and torch.equal(ref, e / e.sum(dim=0, keepdim=True))
    assert torch.get_default_dtype() == torch.float32
    low = be.call(weights, [d.half()], {}, mode="input", dtype="float16", device="cpu")
    assert low.dtype == torch.float32  # as the user's code makes it at float16: measured as such
    with pytest.raises(RuntimeError):
        be.call(lambda x: torch.zeros(2) @ torch.zeros(3), [d], {}, mode="input", dtype="float64", device="cpu")
    assert torch.get_default_dtype() == torch.float32
