"""The core engine on real torch and TensorFlow."""
import numpy as np
import pytest

from gate.config import load_config
from gate.fuzz import fuzz_task
from gate.ops.catalog import load_catalog
from gate.plan import Budget, Task, Variant, plan

CATALOG = load_catalog()


@pytest.mark.parametrize("op", ["torch.relu", "torch.max_pool2d", "torch.hardtanh", "tf.relu", "tf.max_pool2d"])
def test_exact_ops_report_zero_error_at_every_dtype(op):
    spec = CATALOG.get(op)
    tasks = plan([spec], Budget(evals=40), per_op=Budget(evals=40 * 8), seed=1)
    assert {t.variant.dtype for t in tasks} == {"float16", "bfloat16", "float32"}
    for task in tasks:
        f = fuzz_task(task)
        assert f.status == "ok", (task.id, f.message)
        assert f.evals >= 30
        assert f.metrics.ulp == 0 and f.metrics.abs == 0 and f.metrics.nonfinite == 0, task.id


PLANTED = '''
import torch

def log1p_naive(x):
    """planted defect: log(1 + x) loses everything for tiny x"""
    return torch.log(1 + x)

def log1p_good(x):
    return torch.log1p(x)
'''

PLANTED_CFG = '''
version: 1
framework: torch
python_path: ["."]
ops:
  - name: planted.bad
    callable: MODULE:log1p_naive
    dtypes: [float32]
    dims: {N: [1, 64]}
    inputs: [{name: x, shape: [N], domain: gt_minus1}]
  - name: planted.good
    callable: MODULE:log1p_good
    dtypes: [float32]
    dims: {N: [1, 64]}
    inputs: [{name: x, shape: [N], domain: gt_minus1}]
'''


def test_planted_precision_defect_found_within_200_evaluations(user_lib):
    """A deterministic budget (before: 5 s of wall clock an operator, what the machine allowed)."""
    cfg = load_config(user_lib(PLANTED, PLANTED_CFG))
    cfg.activate()
    cat = load_catalog(cfg.ops, builtin=())
    errs = {}
    for name in ("planted.bad", "planted.good"):
        task = Task(op=cat.get(name), variant=Variant("float32"), budget=Budget(evals=200), seed=0)
        f = fuzz_task(task)
        assert f.status == "ok" and f.evals == 200
        errs[name] = f.metrics.ulp
    assert errs["planted.good"] <= 2.0
    assert errs["planted.bad"] > 100 * max(errs["planted.good"], 0.5), errs


def test_same_seed_and_eval_budget_give_identical_results():
    spec = CATALOG.get("torch.softmax")
    v = Variant("float16")
    runs = [fuzz_task(Task(op=spec, variant=v, budget=Budget(evals=120), seed=7)) for _ in range(2)]
    a, b = runs
    assert a.evals == b.evals == 120
    assert a.metrics == b.metrics
    assert a.trajectory == b.trajectory
    assert a.best.params == b.best.params
    for k in a.best.arrays:
        np.testing.assert_array_equal(a.best.arrays[k], b.best.arrays[k])
    c = fuzz_task(Task(op=spec, variant=v, budget=Budget(evals=120), seed=8))
    assert c.trajectory != a.trajectory


def test_inputs_are_exactly_representable_and_in_domain():
    spec = CATALOG.get("torch.erfinv")
    f = fuzz_task(Task(op=spec, variant=Variant("bfloat16"), budget=Budget(evals=80), seed=3))
    x = f.best.arrays["input"]
    bits = x.astype(np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)
    assert np.all((x > -1) & (x < 1))


def test_unsupported_variant_is_reported_not_crashed(user_lib):
    src = '''
import torch
def only_fp32(x):
    if x.dtype == torch.float16:
        raise NotImplementedError("not implemented for 'Half'")
    return x * 2
'''
    cfg_text = '''
version: 1
ops:
  - name: planted.only32
    callable: MODULE:only_fp32
    dtypes: [float16]
    dims: {N: [1, 8]}
    inputs: [{name: x, shape: [N]}]
'''
    cfg = load_config(user_lib(src, cfg_text))
    cfg.activate()
    spec = load_catalog(cfg.ops, builtin=()).get("planted.only32")
    f = fuzz_task(Task(op=spec, variant=Variant("float16"), budget=Budget(evals=20), seed=0))
    assert f.status == "unsupported" and "Half" in f.message
    assert not f.crashes


def test_crash_is_recorded_with_input(user_lib):
    src = '''
import torch
def fragile(x):
    if x.numel() > 4:
        raise RuntimeError("index out of range in self")
    return x + 1
'''
    cfg_text = '''
version: 1
ops:
  - name: planted.fragile
    callable: MODULE:fragile
    dtypes: [float32]
    dims: {N: [1, 16]}
    inputs: [{name: x, shape: [N]}]
'''
    cfg = load_config(user_lib(src, cfg_text))
    cfg.activate()
    spec = load_catalog(cfg.ops, builtin=()).get("planted.fragile")
    f = fuzz_task(Task(op=spec, variant=Variant("float32"), budget=Budget(evals=60), seed=0))
    # the float64 reference crashes too, so these inputs are invalid, not crashes
    assert f.invalid > 0 and not f.crashes
