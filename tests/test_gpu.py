"""CUDA variants: run on a GPU runner (dl-gate-gpu.yml), skipped visibly elsewhere."""
import pytest

from gate.fuzz import fuzz_task
from gate.ops.catalog import load_builtin
from gate.plan import Budget, Task, Variant, variants_for

pytestmark = pytest.mark.gpu


def _spec(name):
    return {s.name: s for s in load_builtin(("torch",))}[name]


def test_cuda_variants_are_planned_where_a_gpu_is_present():
    import torch

    keys = {v.key for v in variants_for(_spec("torch.softmax"), available_devices=["cpu", "cuda"])}
    assert "float16/cuda/input" in keys and torch.cuda.is_available()


@pytest.mark.parametrize("name,dtype", [("torch.softmax", "float16"), ("torch.relu", "bfloat16"),
                                        ("torch.matmul", "float32")])
def test_fuzzing_on_cuda_scores_against_a_float64_reference_on_the_same_device(name, dtype):
    # exhaustive=False: the search itself (relu at bfloat16 would otherwise take all 65,536 values first)
    task = Task(op=_spec(name), variant=Variant(dtype, "cuda"), budget=Budget(evals=60), seed=0)
    f = fuzz_task(task, exhaustive=False)
    assert f.status == "ok" and f.evals == 60, f.message
    assert f.env["device_name"] and f.env["capability"].startswith("sm_")
    if name == "torch.relu":
        assert f.metrics.ulp == 0.0  # exact on every device
    again = fuzz_task(task, exhaustive=False)
    assert again.metrics.ulp == f.metrics.ulp  # deterministic for a seed and an evaluation budget


def test_an_elementwise_16_bit_row_on_cuda_is_exhaustive():
    f = fuzz_task(Task(op=_spec("torch.relu"), variant=Variant("bfloat16", "cuda"), budget=Budget(evals=60), seed=0))
    assert f.status == "ok" and f.evals >= 65536, f.message  # every bfloat16 value, then the search
    assert f.extra.get("search") == "exhaustive"
    assert f.metrics.ulp == 0.0


def test_tf32_is_a_variant_of_its_own_and_less_precise_than_strict_float32():
    spec = _spec("torch.matmul")
    strict = fuzz_task(Task(op=spec, variant=Variant("float32", "cuda", "input"), budget=Budget(evals=40), seed=0))
    tf32 = fuzz_task(Task(op=spec, variant=Variant("float32", "cuda", "tf32"), budget=Budget(evals=40), seed=0))
    assert strict.status == tf32.status == "ok"
    assert tf32.metrics.ulp > 10 * max(strict.metrics.ulp, 1.0)  # a 10-bit mantissa in the products


def test_reduced_precision_reductions_are_a_float16_variant():
    spec = _spec("torch.matmul")
    f = fuzz_task(Task(op=spec, variant=Variant("float16", "cuda", "reduced"), budget=Budget(evals=40), seed=0))
    assert f.status == "ok" and f.evals == 40, f.message
