"""The export oracle: a planted export defect (data-dependent control flow frozen by tracing)
is found, failures are grouped by converter function, "not supported" is classified apart."""
from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from gate.backends.exporters import ExportPath, ExportUnsupported, StageError  # noqa: E402
from gate.oracles.export import export_op, group_failures  # noqa: E402
from gate.ops.catalog import load_builtin  # noqa: E402
from gate.ops.spec import OpSpec  # noqa: E402
from gate.oracles.export_metrics import classify, converter_function  # noqa: E402
from gate.plan import Variant  # noqa: E402

USER_OPS = textwrap.dedent('''
    import torch

    def branchy(x):
        """Eager takes the branch each input asks for; a trace freezes the example's."""
        if x.sum() > 0:
            return x * 2.0
        return x * -0.5

    def clean(x):
        return torch.tanh(x) * 2.0

    def with_default(x, factor: float = 2.0):
        return x * factor
''')

FAKE_CONVERTER = textwrap.dedent('''
    def convert(model):
        return _lower(model)

    def _lower(model):
        raise RuntimeError("lowering failed: shape mismatch in node 3")

    def convert_unsupported(model):
        raise ValueError("Exporting the operator 'aten::fancy' to opset 17 is not supported")
''')


@pytest.fixture()
def userops(tmp_path, monkeypatch):
    (tmp_path / "dlgate_export_userops.py").write_text(USER_OPS)
    (tmp_path / "dlgate_fake_converter.py").write_text(FAKE_CONVERTER)
    monkeypatch.syspath_prepend(str(tmp_path))


def user_spec(name, fn) -> OpSpec:
    return OpSpec.from_dict({"name": name, "framework": "torch", "callable": f"dlgate_export_userops.{fn}",
                             "inputs": [{"name": "x", "shape": ["N", "D"]}], "dims": {"N": [1, 8], "D": [1, 8]}},
                            {"thresholds_by_kind": {"elementwise": {"float32": {"ulp": 4}}}}, origin="user")


@pytest.mark.parametrize("path", ["torchscript", "onnx"])
def test_traced_control_flow_is_found(userops, path):
    f = export_op(user_spec("user.branchy", "branchy"), path, seed=0, evals=12)
    assert f.variant == Variant(dtype="float32", device="cpu", mode=path, oracle="export")
    assert f.id == f"user.branchy[float32/cpu/{path}/export]"
    assert f.status == "ok" and not f.crashes
    assert f.metrics.ulp > 1e6  # the frozen branch: 2x instead of -0.5x
    assert f.extra["differs"] and f.extra["diverges"]
    assert f.extra["eager_vs_f64_ulp"] == 0.0
    assert any("trace might not generalize" in n for n in f.extra["notes"])


def test_scripting_keeps_the_control_flow(userops):
    f = export_op(user_spec("user.branchy", "branchy"), "torchscript-script", seed=0, evals=12)
    assert f.status == "ok" and f.metrics.ulp == 0.0 and not f.extra["diverges"]


@pytest.mark.parametrize("path", ["torchscript", "onnx"])
def test_a_correct_op_matches_eager(userops, path):
    f = export_op(user_spec("user.clean", "clean"), path, seed=0, evals=6)
    assert f.status == "ok" and not f.crashes
    assert not f.extra["diverges"]
    assert f.metrics.ulp <= 4.0


def test_not_supported_is_classified_apart():
    spec = next(s for s in load_builtin(("torch",)) if s.name == "torch.erfinv")
    f = export_op(spec, "onnx", seed=0, evals=4)
    assert f.status == "unsupported" and not f.crashes
    fail = f.extra["failure"]
    assert fail["kind"] == "unsupported" and fail["stage"] == "convert"
    assert fail["converter_function"].startswith("torch.onnx.")
    assert "erfinv" in fail["error"]
    assert group_failures([f]) == {}  # unsupported is not a failure finding


def test_a_load_or_run_failure_where_eager_works_is_grouped_by_converter_function(userops):
    """A scripted function saved and loaded back loses its default argument values."""
    f = export_op(user_spec("user.with_default", "with_default"), "torchscript-script", seed=0, evals=4)
    assert f.crashes, f.extra
    fail = f.extra["failure"]
    assert fail["kind"] == "failure" and fail["stage"] == "run"
    assert "factor" in fail["error"]
    assert group_failures([f]) == {f"torchscript-script: {fail['converter_function']}": [f.id]}


def test_classify_names_the_innermost_converter_frame(userops):
    import dlgate_fake_converter as conv

    path = ExportPath("fake", "torch", "x", "y", converter_packages=("dlgate_fake_converter",))
    try:
        conv.convert(None)
    except RuntimeError as exc:
        fail = classify(StageError("convert", exc), path)
    assert (fail.kind, fail.stage, fail.function) == ("failure", "convert", "dlgate_fake_converter._lower")
    assert fail.error == "RuntimeError: lowering failed: shape mismatch in node 3"
    try:
        conv.convert_unsupported(None)
    except ValueError as exc:
        fail = classify(exc, path)
    assert fail.kind == "unsupported" and fail.function == "dlgate_fake_converter.convert_unsupported"
    assert classify(ExportUnsupported("no"), path).kind == "unsupported"
    try:
        raise KeyError("elsewhere")
    except KeyError as exc:
        assert converter_function(exc, ("dlgate_fake_converter",)) == "<native>"


def test_dynamo_exporter_refuses_data_dependent_control_flow_as_unsupported(userops):
    pytest.importorskip("onnxscript")
    f = export_op(user_spec("user.branchy", "branchy"), "onnx-dynamo", seed=0, evals=4)
    assert f.status == "unsupported" and not f.crashes
    fail = f.extra["failure"]
    assert fail["kind"] == "unsupported" and "data-dependent" in fail["error"]
    assert fail["converter_function"].startswith("torch.")
