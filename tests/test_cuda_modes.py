"""CUDA math modes as variants (issue 15): ``tf32`` (float32 matmuls/convolutions in TF32) and
``reduced`` (float16/bfloat16 matmuls reducing in reduced precision), planned on CUDA only; the
numbers come from tests/test_gpu.py on a GPU runner."""
import pytest
import torch

from gate.backends.torch_backend import cuda_math
from gate.errors import GateError
from gate.ops.catalog import load_builtin
from gate.plan import validate_variant_filters, variants_for


def _spec(name):
    return {s.name: s for s in load_builtin(("torch",))}[name]


def test_tf32_and_reduced_are_planned_on_cuda_for_their_dtypes_only():
    spec = _spec("torch.matmul")
    keys = {v.key for v in variants_for(spec, modes=["input", "tf32", "reduced"], available_devices=["cpu", "cuda"])}
    assert {"float32/cuda/tf32", "float16/cuda/reduced", "bfloat16/cuda/reduced", "float32/cuda/input"} <= keys
    assert not {k for k in keys if k.endswith(("/cpu/tf32", "/cpu/reduced"))}
    assert "float16/cuda/tf32" not in keys and "float32/cuda/reduced" not in keys
    # without a GPU (or without asking) nothing of the kind is planned
    assert not {v.mode for v in variants_for(spec, modes=["tf32", "reduced"], available_devices=["cpu"])} & \
        {"tf32", "reduced"}
    assert not {v.mode for v in variants_for(spec, available_devices=["cpu", "cuda"])} & {"tf32", "reduced"}
    validate_variant_filters(None, ["tf32", "reduced"], None)
    with pytest.raises(GateError, match="unknown mode"):
        validate_variant_filters(None, ["tf16"], None)


def test_each_mode_runs_with_its_own_flags_and_restores_the_previous_ones():
    m, c = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (m.allow_tf32, c.allow_tf32, m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    with cuda_math("tf32"):
        assert (m.allow_tf32, c.allow_tf32, m.allow_fp16_reduced_precision_reduction) == (True, True, False)
    with cuda_math("reduced"):
        assert (m.allow_tf32, m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction) == \
            (False, True, True)
    with cuda_math("input"):  # strict: each flag is judged as its own variant
        assert (m.allow_tf32, c.allow_tf32, m.allow_fp16_reduced_precision_reduction) == (False, False, False)
    with cuda_math(None):  # not on CUDA: untouched
        assert (m.allow_tf32, c.allow_tf32) == before[:2]
    assert (m.allow_tf32, c.allow_tf32, m.allow_fp16_reduced_precision_reduction,
            m.allow_bf16_reduced_precision_reduction) == before


def test_the_gpu_workflow_asks_for_the_cuda_math_modes():
    from pathlib import Path

    import yaml

    wf = yaml.safe_load((Path(__file__).resolve().parent.parent / ".github/workflows/dl-gate-gpu.yml").read_text())
    run = next(s["run"] for s in wf["jobs"]["gpu"]["steps"] if "dl-gate run" in str(s.get("run", "")))
    assert "--mode tf32" in run and "--mode reduced" in run and "--mode input" in run


def test_the_modes_work_after_torch_testing_froze_the_cudnn_flags():
    # importing torch.testing._internal (OpInfo's op_db, read for the seeds of built-in rows)
    # calls torch.backends.disable_global_flags(): setting cudnn.allow_tf32 then raises, and the
    # fresh-clone CI failed this file's test above whenever a seed test ran first. In a child
    # process, so the freeze does not leak into this one.
    import subprocess
    import sys

    code = (
        "import torch\n"
        "torch.backends.disable_global_flags()\n"
        "from gate.backends.torch_backend import cuda_math\n"
        "m, c = torch.backends.cuda.matmul, torch.backends.cudnn\n"
        "before = (m.allow_tf32, c.allow_tf32, c.enabled, c.deterministic, c.benchmark)\n"
        "with cuda_math('tf32'):\n"
        "    assert (m.allow_tf32, c.allow_tf32) == (True, True), (m.allow_tf32, c.allow_tf32)\n"
        "    assert (c.enabled, c.deterministic, c.benchmark) == before[2:]\n"
        "with cuda_math('input'):\n"
        "    assert (m.allow_tf32, c.allow_tf32) == (False, False)\n"
        "assert (m.allow_tf32, c.allow_tf32, c.enabled, c.deterministic, c.benchmark) == before, before\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
