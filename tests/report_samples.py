"""GateReports shaped like the judge's output, for the report-stage tests (no framework)."""
from __future__ import annotations

import math

from gate.judge.verdict import (BEHAVIOUR_CHANGE, ERROR, IMPROVEMENT, NEEDS_BASELINE, NOT_COVERED, PASS,
                                REGRESSION, GateReport, VariantVerdict)


def variant(dtype="float32", device="cpu", mode="input", **kw):
    return {"dtype": dtype, "device": device, "mode": mode, "layout": kw.get("layout", "default"),
            "oracle": kw.get("oracle", "precision")}


def regression(op="mylib.softplus", dtype="float16", head=48.0, base=1.5, diagnosis=True, **kw):
    d = None
    if diagnosis:
        d = {
            "parameter": "beta=20",
            "minimal_input": "x: float16[1] = [-0.0001]",
            "worst_element": "index 0: head 3.1e-4 vs float64 2.9e-4",
            "base_vs_head": [{"input": "x=-1e-4", "base ulp": 1.5, "head ulp": 48.0},
                             {"input": "x=3.0", "base ulp": 0.5, "head ulp": 0.5}],
            "suboperation": {"call": "torch.log1p", "file": "mylib/ops.py", "line": 14, "rate": 31.0},
            "changed_code": [{"file": "mylib/ops.py", "line": 14, "symbol": "softplus"},
                             {"file": "mylib/util.py", "line": 7, "symbol": "_stable_exp"}],
            "repro_script": "dl-gate-out/repro/mylib.softplus_float16.py",
            "repro_command": "python dl-gate-out/repro/mylib.softplus_float16.py",
        }
    return VariantVerdict(
        op=op, framework="torch", variant=variant(dtype), outcome=REGRESSION,
        reason=f"max error {head:g} ulp > threshold {base * 3:g} ulp (3 x base {base:g})",
        base_error=base, head_error=head, threshold=base * 3, seed=1234, evals=400, seconds=2.5,
        source_file="mylib/ops.py", source_line=10, input_summary="x: float16[3, 4] in [-1e-4, 1e-4]",
        repro_command=f"dl-gate fuzz {op} --dtype {dtype} --seed 1234", diagnosis=d, **kw)


def rich_report(**kw) -> GateReport:
    verdicts = [
        VariantVerdict(op="mylib.softplus", framework="torch", variant=variant("float32"), outcome=PASS,
                       reason="max error 0.9 ulp <= threshold 2 ulp", base_error=0.8, head_error=0.9,
                       threshold=2.0, seed=1234, evals=400, seconds=1.25, source_file="mylib/ops.py",
                       source_line=10),
        regression(),
        VariantVerdict(op="mylib.gelu", framework="torch", variant=variant("bfloat16"), outcome=IMPROVEMENT,
                       reason="max error 1 ulp, was 4 ulp", base_error=4.0, head_error=1.0, threshold=12.0,
                       seconds=0.5, source_file="mylib/act.py", source_line=3),
        VariantVerdict(op="mylib.gelu", framework="torch", variant=variant("float64"), outcome=NEEDS_BASELINE,
                       reason="no baseline for torch 2.13.0 / cpu / float64", head_error=0.5, seconds=0.4),
        VariantVerdict(op="mylib.gelu", framework="torch", variant=variant("float16", device="cuda"),
                       outcome=NOT_COVERED, reason="budget ran out before this variant"),
        VariantVerdict(op="tf.math.tanh", framework="tensorflow", variant=variant("float32", mode="operator"),
                       outcome=ERROR, reason="worker crashed: Segmentation fault", head_crash="SIGSEGV",
                       seconds=0.1),
        VariantVerdict(op="tf.math.tanh", framework="tensorflow", variant=variant("float16"),
                       outcome=BEHAVIOUR_CHANGE, reason="head output differs from base on identical inputs",
                       base_error=1.0, head_error=1.0, threshold=3.0, seconds=0.3),
        VariantVerdict(op="mylib.exp_sum", framework="torch", variant=variant("float32"), outcome=REGRESSION,
                       reason="new NaN in head output", base_error=1.0, head_error=math.inf, threshold=2.0,
                       head_nonfinite=3, seconds=0.7, source_file="mylib/ops.py", source_line=30),
    ]
    fields = dict(outcome="regression", reason="2 regressions in 2 operators", verdicts=verdicts,
                  selected=[{"op": "mylib.softplus", "reasons": ["mylib/ops.py:14 softplus changed"]},
                            {"op": "mylib.gelu", "reasons": ["mylib/act.py:3 gelu changed"]}],
                  warnings=["tf.math.tanh: behaviour changed (gate.behaviour_change: warn)"],
                  base_ref="origin/main", base_sha="a" * 40, head_sha="b" * 40, seed=1234, seconds=12.5,
                  env={"torch": "2.13.0", "python": "3.11.7", "device": "cpu"})
    fields.update(kw)
    return GateReport(**fields)


def pass_report(**kw) -> GateReport:
    fields = dict(outcome="pass", reason="1 operator variant within thresholds",
                  verdicts=[VariantVerdict(op="mylib.softplus", framework="torch", variant=variant("float32"),
                                           outcome=PASS, reason="max error 0.9 ulp <= threshold 2 ulp",
                                           base_error=0.8, head_error=0.9, threshold=2.0, seconds=1.0)],
                  head_sha="c" * 40, base_ref="origin/main")
    fields.update(kw)
    return GateReport(**fields)


def error_report(**kw) -> GateReport:
    fields = dict(outcome="error", reason="git diff failed: unknown revision origin/nope",
                  errors=["git diff failed: unknown revision origin/nope"], head_sha="d" * 40)
    fields.update(kw)
    return GateReport(**fields)
