"""The PR comment a reviewer acts on (issue 29): failures grouped by the changed line that causes
them, the smallest input, head and base counted the same way, an operator x dtype grid,
improvements by name and one next step. No framework: reports shaped like the judge's."""
from __future__ import annotations

from gate.judge.verdict import IMPROVEMENT, PASS, REGRESSION, GateReport, VariantVerdict
from gate.report import digest
from gate.report.markdown import COMMENT_BUDGET, render_comment, render_markdown
from tests.report_samples import variant


def failing(op, dtype="float32", *, line=7, file="lib/_helpers.py", elements=4, nonfinite=0, base_nonfinite=0,
            head=50.0, base=1.0, oracle="precision", located=True, mode="input"):
    d = {"kind": "nonfinite" if nonfinite else "precision",
         "minimal_input": f"x[{elements}] = [...]", "minimal_input_elements": elements,
         "repro_script": f"/runner/work/lib/dl-gate-out/repro/{op}_{dtype}_{oracle}.py",
         "changed_code": [{"file": file, "line": line, "symbol": "shift"}] if located else []}
    var = dict(variant(dtype, mode=mode), oracle=oracle)
    return VariantVerdict(op=op, framework="torch", variant=var, outcome=REGRESSION, reason="r",
                          base_error=base, head_error=head, threshold=2 * base, head_nonfinite=nonfinite,
                          base_nonfinite=base_nonfinite, diagnosis=d, source_file="lib/ops.py", source_line=30,
                          details={"kind": d["kind"]})


def report_of(*verdicts, outcome="regression"):
    return GateReport(outcome=outcome, reason="x", verdicts=list(verdicts), head_sha="b" * 40,
                      base_ref="origin/main", base_sha="a" * 40)


def test_failures_are_grouped_by_the_changed_line_most_variants_first():
    r = report_of(failing("lib.softmax", "float16", elements=9), failing("lib.log_softmax", "float32", elements=1),
                  failing("lib.norm", line=40, file="lib/norm.py"), failing("lib.odd", located=False))
    cs = digest.causes(r)
    assert [(c.where, len(c.verdicts), c.located) for c in cs] == [
        ("lib/_helpers.py:7", 2, True), ("lib/norm.py:40", 1, True), ("lib/ops.py:30", 1, False)]
    assert cs[0].ops == ["lib.log_softmax", "lib.softmax"]
    assert cs[0].smallest.op == "lib.log_softmax"  # 1 element beats 9
    text = render_comment(r)
    assert "**4 failing variant(s) of 4 operator(s)**, traced to 2 changed lines:" in text
    assert text.count("**1. `lib/_helpers.py:7` `shift`**") == 1 and "**2. `lib/norm.py:40` `shift`**" in text
    assert "no changed line located: `lib.odd` (operator at `lib/ops.py:30`)" in text
    # one block per line, not one bullet per variant repeating the same line
    assert text.count("lib/_helpers.py:7") == 1


def test_head_and_base_are_counted_the_same_way():
    # the issue's own figures: head 0 ulp + 142 NaN/Inf must not read better than base's 28.3 ulp
    v = failing("lib.log_softmax", "float16", nonfinite=142, base_nonfinite=0, head=0.0, base=28.3)
    assert digest.head_vs_base(v) == "head 142 NaN/Inf, 0 ulp vs base 0 NaN/Inf, 28.3 ulp (threshold 56.6 ulp)"
    text = render_comment(report_of(v))
    assert "head 142 NaN/Inf, 0 ulp vs base 0 NaN/Inf, 28.3 ulp" in text
    md = render_markdown(report_of(v))  # the job summary's table: the same words on both sides
    assert "| 0 NaN/Inf, 28.3 ulp | 142 NaN/Inf, 0 ulp |" in md
    plain = failing("lib.gelu")
    assert digest.head_vs_base(plain) == "head 50 ulp vs base 1 ulp (threshold 2 ulp)"


def test_the_next_step_is_the_artifact_then_explain_then_the_repro_of_the_smallest_input():
    r = report_of(failing("lib.softmax", "float16", elements=9), failing("lib.log_softmax", elements=1))
    step = digest.next_step(r, run_id="42", repository="acme/ops")
    assert step.download == "gh run download 42 -R acme/ops -n dl-gate-report -D dl-gate-out"
    assert step.explain == "dl-gate explain 'dl-gate-out/report.json#lib.log_softmax[float32/cpu/input]'"
    # the runner's absolute path means nothing on a reviewer's machine: the artifact's path
    assert step.repro == "python dl-gate-out/repro/lib.log_softmax_float32_precision.py"
    text = render_comment(r, run_id="42", repository="acme/ops", full_report="https://github.com/acme/ops/actions/runs/42")
    block = text[text.index("**Next step**"):]
    assert step.download in block and step.explain in block and step.repro in block
    assert "[run page](https://github.com/acme/ops/actions/runs/42)" in block
    assert digest.next_step(report_of(failing("x", located=True)), out="/tmp/o").explain.startswith("dl-gate explain '/tmp/o/report.json#")
    assert digest.next_step(report_of(outcome="pass")) is None


def test_the_grid_merges_modes_and_orders_dtypes():
    vs = [failing("lib.softmax", "float32", nonfinite=3), failing("lib.softmax", "float16", mode="operator"),
          failing("lib.softmax", "float32", oracle="grad")]
    ok = VariantVerdict(op="lib.softmax", framework="torch", variant=variant("float16"), outcome=PASS, reason="ok")
    better = VariantVerdict(op="lib.gelu", framework="torch", variant=variant("bfloat16"), outcome=IMPROVEMENT,
                            reason="better", base_error=4.0, head_error=1.0)
    r = report_of(*vs, ok, better)
    cols, rows = digest.grid(r)
    assert cols == ["float16", "bfloat16", "float32", "float32 grad"]
    assert [op for op, _ in rows] == ["lib.softmax", "lib.gelu"]  # failing operators first
    softmax = dict(rows)["lib.softmax"]
    assert digest.cell(r, softmax["float16"]) == (REGRESSION, "precision")  # the operator-mode row wins over the pass
    assert digest.cell(r, softmax["float32"]) == (REGRESSION, "NaN/Inf")
    text = render_comment(r)
    assert "| operator | float16 | bfloat16 | float32 | float32 grad |" in text
    assert "| `lib.softmax` | ❌ precision | · | ❌ NaN/Inf | ❌ precision |" in text
    assert "| `lib.gelu` | · | 📉 improved | · | · |" in text


def test_a_passing_pr_names_its_improvements():
    fixed = VariantVerdict(op="lib.log_softmax", framework="torch", variant=variant("float16"), outcome=IMPROVEMENT,
                           reason="head fixes NaN/Inf", base_error=45.6, head_error=1.34, details={"fixed_inputs": 5})
    precise = VariantVerdict(op="lib.gelu", framework="torch", variant=variant("float32"), outcome=IMPROVEMENT,
                             reason="better", base_error=4.0, head_error=1.0, metric="ulp")
    text = render_comment(report_of(fixed, precise, outcome="pass"))
    assert "**Improved (2 variant(s)):**" in text
    assert "`lib.log_softmax` (NaN/Inf or a crash fixed: float16/cpu/input (5 inputs))" in text
    assert "`lib.gelu` (more precise: float32/cpu/input 4 → 1 ulp)" in text
    assert "Next step" not in text  # nothing to do


def test_a_comment_of_many_causes_stays_under_its_budget_and_counts_what_it_left_out():
    vs = [failing(f"lib.op{i}", line=i + 1, file=f"lib/m{i}.py") for i in range(60)]
    text = render_comment(report_of(*vs), run_id="1", repository="a/b")
    assert len(text.encode()) <= COMMENT_BUDGET
    assert "**1. `lib/m" in text and "more cause(s)" in text and "**Next step**" in text
