"""EAGLE-style equivalence oracles on real torch and TensorFlow: each planted defect (a layout
bug, a compiled path that differs from eager, a batch-dependent result, a stride assumption, a
vector-tail bug, an aliasing in-place form) is found within a 10 s budget, and the same oracle
on a correct operator reports (almost) nothing."""
from __future__ import annotations

import pytest

from gate.fuzz import fuzz_task
from gate.ops.catalog import load_builtin
from gate.plan import variants_for

from tests.oracle_support import task, user_ops

OPS = """
- name: planted.channel_scale
  callable: planted_ops:channel_scale
  kind: elementwise
  dims: {N: [1, 2], C: [1, 7], H: [1, 4], W: [1, 4]}
  inputs: [{name: x, shape: [N, C, H, W]}]
  dtypes: [float32]
  modes: [input]
  layouts: {nhwc: {params: {data_format: NHWC}, permute: {x: [0, 2, 3, 1]}, out_permute: [0, 2, 3, 1]}}
- name: planted.channel_scale_ok
  callable: planted_ops:channel_scale_ok
  kind: elementwise
  dims: {N: [1, 2], C: [1, 7], H: [1, 4], W: [1, 4]}
  inputs: [{name: x, shape: [N, C, H, W]}]
  dtypes: [float32]
  modes: [input]
  layouts: {nhwc: {params: {data_format: NHWC}, permute: {x: [0, 2, 3, 1]}, out_permute: [0, 2, 3, 1]}}
- name: planted.gelu_compiled
  callable: planted_ops:gelu_compiled_differs
  kind: activation
  dims: {N: [1, 8], D: [1, 16]}
  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 3}}]
  dtypes: [float32]
  modes: [input]
  oracle_args: {compiled: {compiler: aot_eager}}   # the defect is decided at trace time
- name: planted.gelu_tf_function
  framework: tensorflow
  callable: planted_ops:gelu_tf_function_differs
  kind: activation
  dims: {N: [1, 8], D: [1, 16]}
  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 3}}]
  dtypes: [float32]
- name: planted.center_rows
  callable: planted_ops:center_rows
  kind: normalization
  batch_dim: 0
  dims: {N: [2, 6], D: [1, 16]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float32]
  modes: [input]
- name: planted.double_dense
  callable: planted_ops:double_dense
  dims: {N: [2, 6], D: [2, 6]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float32]
  modes: [input]
- name: planted.double_via_view
  callable: planted_ops:double_via_view
  dims: {N: [2, 6], D: [2, 6]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float32]
  modes: [input]
- name: planted.exp_tail_half
  callable: planted_ops:exp_tail_half
  dims: {N: [1, 4], D: [1, 40]}
  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 3}}]
  dtypes: [float32]
  modes: [input]
- name: planted.triple
  callable: planted_ops:triple
  dims: {N: [1, 8], D: [1, 8]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float32]
  modes: [input]
  oracle_args: {inplace_eq: {inplace: "planted_ops:triple_"}}
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return user_ops(tmp_path_factory.mktemp("equivalence"), OPS)


@pytest.fixture(scope="module")
def builtin():
    return {s.name: s for s in load_builtin(("torch", "tensorflow"))}


def test_layout_bug_found_by_layout_eq(ops):
    spec = ops["planted.channel_scale"]
    (variant,) = [v for v in variants_for(spec, oracles=["layout_eq"])]
    assert (variant.layout, variant.oracle) == ("nhwc", "layout_eq")
    f = fuzz_task(task(spec, "layout_eq", layout="nhwc", evals=60))
    assert f.status == "ok" and f.metrics.ulp > 1e4, f.metrics
    assert f.extra["a"] == "default-layout" and f.extra["b"] == "nhwc"
    assert f.extra["closer"] == "default-layout"  # the NCHW path is the right one
    assert f.best.dims["C"] % 4 != 0  # only a channel tail exposes it
    ok = fuzz_task(task(ops["planted.channel_scale_ok"], "layout_eq", layout="nhwc", evals=60))
    assert ok.status == "ok" and ok.metrics.ulp == 0.0


def test_compiled_path_that_differs_from_eager_torch(ops, builtin):
    f = fuzz_task(task(ops["planted.gelu_compiled"], "compiled", evals=15))
    assert f.status == "ok" and f.metrics.ulp > 1e3, f.metrics
    assert f.extra["b"] == "compiled[aot_eager]" and f.extra["closer"] == "eager"
    relu = builtin["torch.relu"].replace(oracle_args={"compiled": {"compiler": "aot_eager"}})
    ok = fuzz_task(task(relu, "compiled", evals=15))
    assert ok.status == "ok" and ok.metrics.ulp == 0.0


def test_tf_function_and_xla_paths(ops, builtin):
    spec = ops["planted.gelu_tf_function"]
    assert {v.oracle for v in variants_for(spec, oracles=["compiled", "compiled_xla"])} == {"compiled", "compiled_xla"}
    for oracle in ("compiled", "compiled_xla"):
        f = fuzz_task(task(spec, oracle, evals=10))
        assert f.status == "ok" and f.metrics.ulp > 1e3, (oracle, f.metrics)
        assert f.extra["closer"] == "eager"
    ok = fuzz_task(task(builtin["tf.relu"], "compiled_xla", evals=10))
    assert ok.status == "ok" and ok.metrics.ulp == 0.0


def test_batch_dependence_found_by_batch_eq(ops, builtin):
    f = fuzz_task(task(ops["planted.center_rows"], "batch_eq", evals=30))
    # the batch-wide mean shows as a large ULP difference, or as an overflow on one side only
    assert f.status == "ok" and f.metrics.severity > 1e3, f.metrics
    ok = fuzz_task(task(builtin["torch.softmax"], "batch_eq", evals=40))
    assert ok.status == "ok" and ok.metrics.ulp <= 2
    assert ok.invalid > 0  # softmax over dim 0 is not batch-separable: skipped, not compared


def test_stride_assumption_found_by_contig_eq(ops, builtin):
    f = fuzz_task(task(ops["planted.double_dense"], "contig_eq", evals=30))
    assert f.status == "ok" and f.metrics.ulp > 1e3, f.metrics
    assert f.extra["b"] in ("transposed", "strided")
    ok = fuzz_task(task(builtin["torch.exp"], "contig_eq", evals=30))
    assert ok.status == "ok" and ok.metrics.ulp == 0.0


def test_one_side_raising_is_a_crash_finding(ops):
    f = fuzz_task(task(ops["planted.double_via_view"], "contig_eq", evals=10))
    assert f.crashes, f
    sig = f.crashes[0].signature
    assert sig.startswith(("transposed raised RuntimeError", "strided raised RuntimeError")), sig
    assert sig.endswith("; contiguous returned")


def test_vector_tail_bug_found_by_length_eq(ops, builtin):
    f = fuzz_task(task(ops["planted.exp_tail_half"], "length_eq", evals=30))
    # the half-precision tail shows as a large ULP difference, or as its overflow past 65504
    assert f.status == "ok" and f.metrics.severity > 100, f.metrics
    ok = fuzz_task(task(builtin["torch.exp"], "length_eq", evals=30))
    assert ok.status == "ok" and ok.metrics.ulp <= 2


def test_aliasing_inplace_form_found_by_inplace_eq(ops, builtin):
    f = fuzz_task(task(ops["planted.triple"], "inplace_eq", evals=20))
    assert f.status == "ok" and f.metrics.ulp > 1e3, f.metrics
    assert f.extra["b"] == "inplace"
    ok = fuzz_task(task(builtin["torch.exp"], "inplace_eq", evals=20))  # exp_ and exp(out=)
    assert ok.status == "ok" and ok.metrics.ulp == 0.0


def test_dtype_pair_float16_against_float32(builtin):
    f = fuzz_task(task(builtin["torch.tanh"], "dtype_eq", dtype="float16", evals=40))
    assert f.status == "ok" and f.metrics.ulp <= 1.0, f.metrics
    assert f.extra["b"] == "float32->float16"
