"""One definition of each outcome (issue 12), checked on the judge alone with the numbers of
real cases: head and base replays of one input, as the pipeline hands them to
:func:`gate.judge.decide.decide`.

* new NaN/Inf is about *outputs*: head non-finite where base's output is finite. A stability fix
  whose float64 run became finite while both float32 outputs are still inf (``sigmoid(x).log()``
  -> ``logsigmoid(x)`` inside a larger loss) is not new;
* head finite where base's output was NaN/Inf is a fix, whatever head's error there;
* the float64 run moving by less than the variant's threshold (an approximation replaced by the
  exact function) is "reference moved", not a behaviour change; beyond it, it is one;
* a stability fix that rounds a little worse elsewhere (within m x the threshold) is reported,
  not failed; a larger loss still fails.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from gate.judge import verdict as V
from gate.judge.decide import GateSettings, decide, ref_divergence
from gate.judge.replay import ReplayResult
from gate.ops.catalog import load_catalog
from gate.oracles.precision import Metrics
from gate.plan import Variant

F32 = Variant("float32")


@pytest.fixture(scope="module")
def spec():
    return load_catalog([], builtin=("torch",)).get("torch.exp")


def rr(out, ref, ulp=0.5, nonfinite=0) -> ReplayResult:
    return ReplayResult(status="ok", metrics=Metrics(ulp=ulp, nonfinite=nonfinite),
                        outputs=[np.asarray(out, np.float32)], reference=[np.asarray(ref, np.float64)])


def judge(spec, head, base, controls=None):
    return decide(spec, F32, head, base, None, "ok", None, GateSettings(), inputs=[f"in{i}" for i in range(len(head))],
                  controls=controls if controls is not None else [True] * len(head))


def test_inf_on_both_sides_is_not_new_even_when_only_heads_float64_became_finite(spec):
    # a focal-loss style fix: both float32 outputs overflow to inf on this input; base's float64
    # run was inf too, head's is finite now (logsigmoid). Head's own count says 1 non-finite
    # where its reference is finite; base's says 0 -- the old rule called that "new NaN/Inf".
    head = [rr([np.inf, 1.0], [3.4e39, 1.0], ulp=0.5, nonfinite=1), rr([2.0], [2.0])]
    base = [rr([np.inf, 1.0], [np.inf, 1.0], ulp=0.5, nonfinite=0), rr([2.0], [2.0])]
    v = judge(spec, head, base)
    assert v.outcome in (V.PASS, V.IMPROVEMENT), (v.outcome, v.reason)


def test_nan_where_bases_output_was_finite_is_new_even_if_heads_float64_is_nan(spec):
    head = [rr([np.nan, 1.0], [np.nan, 1.0], ulp=0.5, nonfinite=0)]  # a dropped eps: 0/0 in any dtype
    base = [rr([0.0, 1.0], [0.0, 1.0])]
    v = judge(spec, head, base)
    assert v.outcome == V.REGRESSION and v.reason.startswith("new NaN/Inf"), v.reason


def test_numbers_where_base_returned_nan_are_a_fix_whatever_the_error(spec):
    head = [rr([0.25], [0.5], ulp=3.7e5)]  # finite, far from its reference
    base = [rr([np.nan], [np.nan], ulp=0.0)]  # NaN, "equal" to its own NaN reference
    v = judge(spec, head, base)
    assert v.outcome == V.IMPROVEMENT, (v.outcome, v.reason)


def test_a_reference_that_moved_within_the_threshold_is_not_a_behaviour_change(spec):
    # an erf-style rational approximation replaced by the exact function: the float64 runs of
    # the two differ by 1.7 float32 ulp (floor 4): reported, not failed
    x = np.float64(0.75)
    moved = x + 1.7 * float(np.spacing(np.float32(x)))
    head = [rr([x], [moved], ulp=0.6)]
    base = [rr([x + 1e-7], [x], ulp=0.7)]
    v = judge(spec, head, base)
    assert v.outcome == V.PASS and "reference moved" in v.reason, (v.outcome, v.reason)
    assert 1.0 < v.details["reference_moved_ulp"] <= 4.0
    # a real change of the function (50 ulp of float32 at 0.75) is one
    head = [rr([x], [x + 50 * float(np.spacing(np.float32(x)))], ulp=0.6)]
    v = judge(spec, head, base)
    assert v.outcome == V.BEHAVIOUR_CHANGE, (v.outcome, v.reason)


def test_a_stability_fix_that_rounds_a_little_worse_elsewhere_is_reported_not_failed(spec):
    fixed = (rr([1.0], [1.0], ulp=0.5), rr([np.nan], [np.nan], ulp=0.0))  # head fixes this input
    v = judge(spec, [rr([2.0000002], [2.0], ulp=54.0), fixed[0]], [rr([2.0], [2.0], ulp=24.0), fixed[1]])
    assert v.outcome == V.IMPROVEMENT and "less precise elsewhere" in v.details["warning"], (v.outcome, v.reason)
    # ... but a fix that also loses 20x the threshold still fails
    v = judge(spec, [rr([2.0000002], [2.0], ulp=1000.0), fixed[0]], [rr([2.0], [2.0], ulp=24.0), fixed[1]])
    assert v.outcome == V.REGRESSION and math.isfinite(v.head_error), (v.outcome, v.reason)


def test_a_failing_new_nan_row_reads_nan_in_the_report_even_when_base_had_nan_elsewhere(spec):
    """Report rows agree with the verdict: base's NaN at another element of the same input does
    not turn head's new NaN into a "x0" ratio and a zero bar."""
    from gate.report.common import head_for_chart, verdict_ratio

    head = [rr([np.nan, np.nan, 1.0], [1.0, 1.0, 1.0], ulp=0.0, nonfinite=2)]
    base = [rr([1.0, np.nan, 1.0], [1.0, 1.0, 1.0], ulp=0.5, nonfinite=1)]
    v = judge(spec, head, base)
    assert v.outcome == V.REGRESSION and v.details["kind"] == "nonfinite"
    assert verdict_ratio(v) == "NaN/Inf" and math.isinf(head_for_chart(v))
    assert v.head_nonfinite == 1 and "on 1 elements" in v.reason  # one count, in the table and the reason


def test_a_regression_that_also_fixes_other_inputs_says_so(spec):
    # torchmetrics #1030's KL divergence: head no longer returns NaN where p has a zero (base did),
    # and returns inf where q is subnormal (p / q overflows; base clamped q): still a regression,
    # but the reason shows the trade instead of a plain "new NaN/Inf"
    head = [rr([np.inf], [11.29], ulp=0.0, nonfinite=1), rr([0.69], [0.69])]
    base = [rr([1.35], [1.35]), rr([np.nan], [0.69], ulp=0.0, nonfinite=1)]
    v = judge(spec, head, base)
    assert v.outcome == V.REGRESSION and v.reason.startswith("new NaN/Inf"), (v.outcome, v.reason)
    assert "head also fixes NaN/Inf or a crash on 1 other input(s) where base failed" in v.reason
    assert v.details["fixed_inputs_total"] == 1
    plain = judge(spec, head[:1], base[:1])
    assert plain.outcome == V.REGRESSION and "also fixes" not in plain.reason


def test_an_improvements_elsewhere_leaves_out_the_inputs_it_fixed(spec):
    # vector-quantize-pytorch's cdist clamp: on the input it fixes, head returns 0 where base
    # returned NaN (the true value is tiny, so head's error there is large in ulps); "elsewhere"
    # read "15.3 -> 1.02e+04 ulp", head's error on the fixed element itself
    head = [rr([0.0, 1.0], [1e-3, 1.0], ulp=1.02e4), rr([2.0], [2.0], ulp=1.0)]
    base = [rr([np.nan, 1.0], [np.nan, 1.0], ulp=0.5), rr([2.0000002], [2.0], ulp=1.2)]
    v = judge(spec, head, base)
    assert v.outcome == V.IMPROVEMENT and "(elsewhere 1.2 -> 1 ulp)" in v.reason, v.reason
    assert v.head_error == 1.0 and v.base_error == 1.2


def test_nan_in_both_outputs_reads_in_both_columns_when_bases_reference_is_not_float64(spec):
    # AMPLIFY's RMSNorm: base computes `x.float()`, so its "float64" run is float32 and NaN
    # where head's is finite; the outputs are NaN on both sides at the same elements. The row
    # showed head "nan/inf x1", base 0 and a reason without a word about NaN
    head = [rr([np.nan, 1.0], [3.0, 1.0], ulp=0.0, nonfinite=1)]
    base = [rr([np.nan, 1.0], [np.nan, 1.0], ulp=0.0, nonfinite=0)]
    v = judge(spec, head, base)
    assert v.outcome == V.PASS, (v.outcome, v.reason)
    assert (v.head_nonfinite, v.base_nonfinite) == (1, 1) and "NaN/Inf in both (head 1, base 1 elements)" in v.reason


def test_nan_in_both_outputs_reads_in_both_columns_when_heads_reference_is_nan_too(spec):
    # the mirror (a 20-operator library's l2_normalize, the fix reverted, float16): base's clamp
    # underflows to 0 in float16, so base's output is NaN where its float64 run is finite; head
    # (no clamp) is NaN there too, and so is its float64 run (0/0). The row read "base 128
    # NaN/Inf, head 0" on the same inputs
    head = [rr([np.nan, 1.0], [np.nan, 1.0], ulp=0.0, nonfinite=0)]
    base = [rr([np.nan, 1.0], [0.0, 1.0], ulp=0.0, nonfinite=1)]
    v = judge(spec, head, base)
    assert v.outcome == V.PASS, (v.outcome, v.reason)
    assert (v.head_nonfinite, v.base_nonfinite) == (1, 1) and "NaN/Inf in both (head 1, base 1 elements)" in v.reason


def test_a_passing_rows_nan_columns_count_the_same_outputs_alike(spec):
    # pytorch-metric-learning's PNPLoss fix in the zero-config acceptance: 15 of 15 outputs
    # identical, NaN at the same elements, but each side counted NaN/Inf where its *own* float64
    # run was finite, and the two float64 runs differ: the row read "1883 vs 1967 NaN/Inf"
    head = [rr([np.nan, np.inf, 1.0], [1.0, 2.0, 1.0], ulp=0.0, nonfinite=2)]
    base = [rr([np.nan, np.inf, 1.0], [np.nan, 2.0, 1.0], ulp=0.0, nonfinite=1)]
    v = judge(spec, head, base)
    assert v.outcome == V.PASS, (v.outcome, v.reason)
    assert (v.head_nonfinite, v.base_nonfinite) == (2, 2) and "NaN/Inf in both (head 2, base 2 elements)" in v.reason


def test_a_function_that_was_zero_and_is_not_changed_on_heads_scale():
    # kornia's sobel eps fix (3950f42b0) on a flat image, judged per output (kind: composite, as
    # init writes rows): base's float64 output is 0, head's sqrt(1e-6) = 1e-3. Measured in ulps of
    # 1 (an all-zero output's default scale) that read 1 float16 ulp, "the function did not
    # change", and the fix's float16 rounding of its subnormal eps failed as a precision loss
    head = ReplayResult("ok", Metrics(ulp=7.42), outputs=[np.full(4, 1.007e-3, np.float16)], reference=[np.full(4, 1e-3)])
    base = ReplayResult("ok", Metrics(ulp=0.0), outputs=[np.zeros(4, np.float16)], reference=[np.zeros(4)])
    assert ref_divergence(head, base, "float16", "output") > 500
    # per element it always read so; and a residue on the computation's scale still is none
    assert ref_divergence(head, base, "float16", "dtype") > 500
    res = ReplayResult("ok", Metrics(ulp=0.0, scale=1.0), outputs=[np.zeros(2, np.float32)], reference=[np.array([3e-17, 0.0])])
    zero = ReplayResult("ok", Metrics(ulp=0.0, scale=1.0), outputs=[np.zeros(2, np.float32)], reference=[np.zeros(2)])
    assert ref_divergence(res, zero, "float32", "output") < 1 and ref_divergence(zero, res, "float32", "output") < 1


def grr(out, ref, forward_nonfinite=0, ulp=0.5) -> ReplayResult:
    return ReplayResult(status="ok", metrics=Metrics(ulp=ulp, forward_nonfinite=forward_nonfinite),
                        outputs=[np.asarray(out, np.float32)], reference=[np.asarray(ref, np.float64)])


def test_a_gradients_new_inf_where_head_fixed_the_forward_is_reported_not_failed(spec):
    # piqa-style gradient magnitude, sqrt(gx*gx + gy*gy) -> hypot(gx, gy) (the overflow fix): in
    # float32 at x = 1.7e38 torch's hypot backward (grad * x / result) overflows to -inf, where
    # base's forward overflowed (gx * gx) and its gradient through it read 0 for a true 2.0 (the
    # bed's run). Head fixed the function on that input; base's gradient of a value it could not
    # compute was no answer. Reported, with no fix needed elsewhere in the run (the forward's
    # search need not reach base's overflow at 1.8e19)
    from gate.judge.decide import stability_fixes

    head = [grr([np.inf, -np.inf, 1.0], [1.998, -2.152, 1.0]), grr([1.0, 2.0], [1.0, 2.0])]
    base = [grr([0.0, -0.5565, 1.0], [1.998, -2.152, 1.0], forward_nonfinite=1, ulp=9.25e6), grr([1.0, 2.0], [1.0, 2.0])]
    grad = judge(spec, head, base)
    assert grad.outcome == V.BEHAVIOUR_CHANGE and grad.reported_only, grad.reason
    assert grad.details["gradient_of_a_fix"] == 1 and "head fixed the function there" in grad.reason
    # float16: a true value beyond the range overflows on both sides; head fixed the rest there
    some = judge(spec, [grr([np.inf, -np.inf, 1.0], [1.998, -2.152, 1.0], forward_nonfinite=1), head[1]],
                 [grr([0.0, -0.5565, 1.0], [1.998, -2.152, 1.0], forward_nonfinite=3, ulp=9.25e6), base[1]])
    assert some.outcome == V.BEHAVIOUR_CHANGE and some.reported_only, some.reason
    assert stability_fixes([grad]) == [] and grad.outcome == V.BEHAVIOUR_CHANGE
    # base's forward was finite there (cdist's clamp kept, head's sqrt(0) has a NaN gradient): new
    kept = judge(spec, head, [grr([0.0, -0.5565, 1.0], [1.998, -2.152, 1.0], ulp=9.25e6), base[1]])
    assert kept.outcome == V.REGRESSION and "new NaN/Inf" in kept.reason, kept.reason
    # head's forward fails there as much (the revert: the square overflows on head): new
    both = judge(spec, [grr([np.inf, -np.inf, 1.0], [1.998, -2.152, 1.0], forward_nonfinite=1), head[1]], base)
    assert both.outcome == V.REGRESSION and "new NaN/Inf" in both.reason, both.reason
    # a fix elsewhere in the run does not excuse a gradient's NaN where base's forward was right
    fwd = V.VariantVerdict(op=kept.op, framework="torch", variant={"dtype": "float32"}, outcome=V.IMPROVEMENT,
                           reason="head fixes NaN/Inf", details={"fixed_inputs": 7})
    stability_fixes([fwd, kept])
    assert kept.outcome == V.REGRESSION
    # and a precision regression on another input still fails beside the fixed one
    worse = judge(spec, [head[0], grr([1.0, 2.001], [1.0, 2.0], ulp=4000.0)], base)
    assert worse.outcome == V.REGRESSION and "error" in worse.reason, worse.reason


def test_where_base_kept_fewer_than_half_its_digits_head_cannot_regress_in_precision(spec):
    # the benign layer_norm refactor's gradient on a near-constant row (bench/false_alarms.py: 11
    # of 20 seeds failed before): the float64 gradient is ~1e-30 of the inputs' scale, base's
    # float32 one is off by 9e15 ulps of it, head's by 4e31: both are rounding garbage
    g = judge(spec, [rr([1e-7], [1e-30], ulp=4.06e31)], [rr([2e-7], [1e-30], ulp=9.01e15)])
    assert g.outcome == V.PASS and g.details.get("base_unreliable") == 1, (g.outcome, g.reason)
    # the passing row's huge figure is explained where users read it
    assert "1 of them not judged for precision: base's own error there is 4.1e+03 ulp or more" in g.reason, g.reason
    # base at 2^12 float32 ulps (12 of 24 bits): amplified rounding, not judged either
    g = judge(spec, [rr([1e-7], [1e-30], ulp=1e6)], [rr([2e-7], [1e-30], ulp=2.0 ** 12)])
    assert g.outcome == V.PASS and g.details.get("base_unreliable") == 1, (g.outcome, g.reason)
    # just below 2^12 ulps base still held half its bits: the ordinary rule holds
    g = judge(spec, [rr([1e-7], [1e-30], ulp=1e6)], [rr([2e-7], [1e-30], ulp=2.0 ** 12 - 1)])
    assert g.outcome == V.REGRESSION and "ulp >" in g.reason, (g.outcome, g.reason)
    # and a new NaN still counts wherever base was
    g = judge(spec, [rr([float("nan")], [1e-30], ulp=0.0, nonfinite=1)], [rr([2e-7], [1e-30], ulp=9.01e15)])
    assert g.outcome == V.REGRESSION and "new NaN/Inf" in g.reason, (g.outcome, g.reason)


def test_identical_outputs_neither_fail_nor_improve_whichever_reference_moved(spec):
    # T5's layer norm with its variance upcast (transformers #4436): in float32 the upcast is a
    # no-op and the outputs are bit-identical, but the upcasting side's float64 run casts to
    # float32 too, so its error reads small and the other side's huge. Neither direction may
    # show a 1e8-ulp head in a passing row, nor call the PR an improvement.
    same = [[0.0, 1.0]]
    small, large = rr(same, [0.0, 1.0], ulp=1.5), rr(same, [3e-30, 1.0], ulp=1.1e8)
    revert = judge(spec, [large], [small])
    fix = judge(spec, [small], [large])
    for v in (revert, fix):
        assert v.outcome == V.PASS and v.head_error <= 1.5 and v.base_error <= 1.5, (v.outcome, v.reason)
    # the side whose float64 run equals its own output to the last bit is named (AMPLIFY's
    # RMSNorm `x.float()`: "one side's reference" left the user to guess which)
    exact = rr(same, [0.0, 1.0], ulp=0.0)
    for head, base, side in (([exact], [large], "head"), ([large], [exact], "base")):
        v = judge(spec, head, base)
        assert v.details.get("low_reference") == side, v.details
        assert f"{side}'s reference does not run in float64 (on 1 of them" in v.details["warning"], v.details["warning"]
    # neither exact to the last bit: the side whose float64 run holds float32 values only is the
    # one that cast down (the upcasting side's [0.0, 1.0]; the other's 3e-30 is no float32 value)
    assert revert.details.get("low_reference") == "base" and fix.details.get("low_reference") == "head", \
        (revert.details, fix.details)
    # both float32 values: which one cast down cannot be told
    v = judge(spec, [rr(same, [0.5, 1.0], ulp=1.5)], [rr(same, [0.25, 1.0], ulp=1.1e8)])
    assert "low_reference" not in v.details and "one side's reference" in v.details["warning"], v.details


def test_a_change_the_dtype_rounds_away_is_said_to_be_one(spec):
    # vector-quantize-pytorch 569b8b0 (an eps 1e-20 -> 1e-5): the float32 outputs are bit for bit
    # base's, both float64 runs are really float64 and differ; no side's reference is suspect
    same = [[0.1, 1.0]]
    v = judge(spec, [rr(same, [0.1 + 3e-8, 1.0 + 5e-7], ulp=4.4)], [rr(same, [0.1, 1.0], ulp=0.3)])
    assert v.outcome == V.PASS and "low_reference" not in v.details, (v.outcome, v.details)
    assert "the change does not reach float32's results there (an eps" in v.details["warning"], v.details["warning"]
    assert "not trustworthy" not in v.details["warning"]


def test_a_loss_on_one_input_within_bases_reach_elsewhere_is_not_a_regression(spec):
    # bench/false_alarms.py --bed refactor, seed 6: a softmax's shift written amax -> max; on an
    # all-zero row (ties everywhere) the gradient's zero residue lands on one element instead of
    # seven: head 22.6 ulp vs base 1.29 on that input (16 x 1.29 = 20.6), while base's same code
    # errs by up to 348 ulp on the run's other inputs (where head's output is base's bit for bit)
    grad = Variant("float32", oracle="grad")

    def judge_grad(head, base):
        return decide(spec, grad, head, base, None, "ok", None, GateSettings(),
                      inputs=[f"in{i}" for i in range(len(head))], controls=[True] * len(head))

    same = rr([0.5], [0.5], ulp=348.0)
    v = judge_grad([rr([1.0], [1.0], ulp=22.6), same], [rr([2.0], [1.0], ulp=1.29), same])
    assert v.outcome == V.PASS, (v.outcome, v.reason)
    # beyond what base does anywhere, the loss is one
    v = judge_grad([rr([1.0], [1.0], ulp=400.0), same], [rr([2.0], [1.0], ulp=1.29), same])
    assert v.outcome == V.REGRESSION and "base's largest elsewhere 348" in v.reason and v.threshold == 348.0, v.reason
    # base's reach counts only inputs where base kept half its digits (4096 float32 ulps)
    garbage = rr([0.5], [0.5], ulp=9e15)
    v = judge_grad([rr([1.0], [1.0], ulp=400.0), garbage], [rr([2.0], [1.0], ulp=1.29), garbage])
    assert v.outcome == V.REGRESSION and "elsewhere" not in v.reason, v.reason


def test_float64_runs_of_a_zero_gradient_diverge_on_the_computations_scale(spec):
    # RMSNorm over one element: y = x / sqrt(x^2 + eps) ~ sign(x), its gradient ~ eps / |x|^3 - a
    # residue of terms of u / |x|. Two float64 runs of the same function written x * rsqrt(v) and
    # x / sqrt(v) differ by the rounding of those terms: in ulps of the residue, a behaviour
    # change; on the computation's scale (upstream x max(|x|, |y|)), none
    import torch

    x0, u0, eps = 100.0, 0.75, 1e-6

    def grad(form):
        x = torch.tensor([x0], dtype=torch.float64, requires_grad=True)
        v = x.pow(2).mean(-1, keepdim=True) + eps
        y = x * torch.rsqrt(v) if form == "rsqrt" else x / torch.sqrt(v)
        (g,) = torch.autograd.grad(y, x, torch.tensor([u0], dtype=torch.float64))
        return g.numpy()

    a, b = grad("rsqrt"), grad("sqrt")
    assert a[0] != b[0]  # the two residues differ in float64
    from gate.judge.decide import ref_divergence

    def side(ref, scale):
        return ReplayResult(status="ok", metrics=Metrics(ulp=0.5, scale=scale), outputs=[ref.astype(np.float32)],
                            reference=[ref])

    assert ref_divergence(side(a, 0.0), side(b, 0.0), "float32", "output") > 16  # the false alarm
    scale = u0 * max(x0, 1.0)
    assert ref_divergence(side(a, scale), side(b, scale), "float32", "output") < 1


def test_an_improvements_nan_columns_say_what_the_outputs_hold(spec):
    # roma's rotvec_to_rotmat fix (naver/roma 34bd744, a clamped theta): base's gradient at a zero
    # rotation vector is NaN, in its float64 run too (0/0), so base's own count was 0; head shares
    # NaN with base on an overflowing input, which head's finite float64 run counted: the table read
    # "base 0, head 1 NaN/Inf" beside "head fixes NaN/Inf"
    head = [rr([0.0, 1.0], [0.0, 1.0]), rr([np.nan, 2.0], [5.0, 2.0], nonfinite=1)]
    base = [rr([np.nan, 1.0], [np.nan, 1.0], nonfinite=0), rr([np.nan, 2.0], [np.nan, 2.0], nonfinite=0)]
    v = judge(spec, head, base)
    assert v.outcome == V.IMPROVEMENT and v.reason.startswith("head fixes NaN/Inf"), v.reason
    assert (v.head_nonfinite, v.base_nonfinite) == (1, 2), (v.head_nonfinite, v.base_nonfinite)


def test_inf_that_rounds_a_true_value_beyond_the_range_is_not_new_where_bases_value_is_inside_it():
    # a rotary embedding's positions fixed (keras-hub #1508), on inputs near float16's end: the
    # true 65600 rounds to inf in float16 and head says so; base's wrong angle gave 65504, finite
    # and close, but no float16 value is the answer. A base value beyond the range (a float32 box
    # area of 300000, torchvision #3383) holds the answer: head's inf is new there
    from gate.judge.decide import new_nonfinite

    def pair(head_out, base_out, base_dtype):
        h = ReplayResult(status="ok", metrics=Metrics(ulp=0.0, nonfinite=1), outputs=[np.asarray(head_out, np.float64)],
                         reference=[np.asarray([65600.0, 1.0])])
        b = ReplayResult(status="ok", metrics=Metrics(ulp=1.5), outputs=[np.asarray(base_out, base_dtype)],
                         reference=[np.asarray([65600.0, 1.0])])
        return h, b

    assert new_nonfinite(*pair([np.inf, 1.0], [65504.0, 1.0], np.float16), "float16") == 0
    assert new_nonfinite(*pair([np.inf, 1.0], [65600.0, 1.0], np.float32), "float16") == 1
    assert new_nonfinite(*pair([np.inf, 1.0], [30000.0, 1.0], np.float16), "float16") == 0  # far off: noise
    assert new_nonfinite(*pair([np.inf, 1.0], [65504.0, 1.0], np.float16), None) == 1  # no dtype: every inf counts


def test_the_threshold_shown_is_the_largest_bar_an_input_was_held_to(spec):
    # fvcore's acceptance run: on an input where both sides flush a subnormal result (base 1.55e7
    # "ulp", not half its digits), the float32 row read "threshold 3.1e+07" beside "pass"; the
    # inputs judged were held to max(floor, 2 x 0.6)
    flush = rr([0.0], [1e-30], ulp=1.55e7)
    v = judge(spec, [rr([1.0], [1.0], ulp=0.5), rr([0.0], [1e-30], ulp=1.55e7)],
              [rr([1.0000001], [1.0], ulp=0.6), flush])
    assert v.outcome == V.PASS, (v.outcome, v.reason)
    assert v.threshold == max(GateSettings().floor(spec, F32), 2 * 0.6), v.threshold


def test_inf_for_a_value_at_the_ranges_end_is_not_new_where_bases_value_there_was_noise():
    # bench/false_alarms.py --bed reach (keras-hub #1508's rotary fix) on an input of +-3.39e38 in
    # bfloat16: x*cos + rot*sin overflows for a true -3.395e38 (inside the range, its top binade);
    # base's wrong angle gave -8.9e37 there (94 ulp off: noise). Base right there keeps it new
    from gate.judge.decide import new_nonfinite

    true = -3.3952602154211693e38

    def pair(base_out):
        h = ReplayResult(status="ok", metrics=Metrics(ulp=0.0, nonfinite=1), outputs=[np.asarray([-np.inf, 1.0])],
                         reference=[np.asarray([true, 1.0])])
        b = ReplayResult(status="ok", metrics=Metrics(ulp=1.0), outputs=[np.asarray([base_out, 1.0])],
                         reference=[np.asarray([true, 1.0])])
        return h, b

    assert new_nonfinite(*pair(-8.905827571758936e37), "bfloat16") == 0
    assert new_nonfinite(*pair(-3.3895313892515355e38), "bfloat16") == 1  # base had it (the largest finite)
    # a value far from the range's end that overflows is new whatever base's value was
    h = ReplayResult(status="ok", metrics=Metrics(ulp=0.0, nonfinite=1), outputs=[np.asarray([np.inf])],
                     reference=[np.asarray([3.0e30])])
    b = ReplayResult(status="ok", metrics=Metrics(ulp=1.0), outputs=[np.asarray([1.0e30])],
                     reference=[np.asarray([3.0e30])])
    assert new_nonfinite(h, b, "bfloat16") == 1


def test_overflows_at_the_ranges_end_that_moved_are_not_new_when_base_has_as_many():
    # the rotary fix's bed at bfloat16 +-3.3e38 (bench/false_alarms.py --bed reach, 7 of 20
    # seeds): x*cos + rot*sin of values near the largest overflows or not by the rounding of
    # each product; head's exact angles overflow element 0 (a true -3.3934e38, base right
    # there), base's rounded ones overflow elements 1 and 2. Counted, they moved; more on head is new
    from gate.judge.decide import new_nonfinite

    ref = np.asarray([-3.3934e38, 3.39e38, 3.38e38, 1.0])

    def pair(head_out, base_out):
        return (ReplayResult(status="ok", metrics=Metrics(ulp=0.0, nonfinite=1), outputs=[np.asarray(head_out)],
                             reference=[ref]),
                ReplayResult(status="ok", metrics=Metrics(ulp=0.2), outputs=[np.asarray(base_out)], reference=[ref]))

    big = 3.3895313892515355e38
    assert new_nonfinite(*pair([-np.inf, big, big, 1.0], [-big, np.inf, np.inf, 1.0]), "bfloat16") == 0
    assert new_nonfinite(*pair([-np.inf, np.inf, big, 1.0], [-big, big, np.inf, 1.0]), "bfloat16") == 2
    assert new_nonfinite(*pair([-np.inf, big, big, np.nan], [-big, np.inf, np.inf, 1.0]), "bfloat16") == 1  # NaN: new


def _softplus_erf(x, dtype, fixed: bool):
    import torch

    t = torch.tensor(x, dtype=dtype)
    sp = torch.log1p(torch.exp(t)) if fixed else torch.log(1 + torch.exp(t))
    return (t * torch.erf(sp)).numpy()


def _run(x, fixed: bool) -> ReplayResult:
    """One side's replay of hdmquan/torch_activation's PSerf (a = b = 1) on ``x``, as measured."""
    import torch

    from gate.backends.base import Output
    from gate.oracles.precision import compare

    out, ref = _softplus_erf(x, torch.float32, fixed), _softplus_erf(x, torch.float64, fixed)
    m = compare([Output(out, "float32")], [Output(ref, "float64")], "float32", "dtype")
    return ReplayResult(status="ok", metrics=m, outputs=[out], reference=[ref])


def test_a_fix_whose_float64_run_moved_off_a_value_base_got_wrong_in_both_precisions_passes(spec):
    # torch_activation 8a95aa8: log(1 + exp(x)) -> log1p(exp(x)). At x = -90 the old formula
    # returns 0 in float32 *and* float64 (1 + 8e-40 is 1 in both), so base reads 0 ulp against its
    # own float64 run; the fix's -8.3e-38 goes through subnormal intermediates and is ~100 ulp off
    # in float32. Base's 0 is 1e7 ulp from head's float64 value: head's output is the closer one.
    # The fix failed the zero-config acceptance on that input; now it passes, and says why
    xs = [[-90.0, 0.0, 0.0], [1.0, -2.0, 0.25]]
    head, base = [_run(x, True) for x in xs], [_run(x, False) for x in xs]
    assert head[0].metrics.ulp > 4 and base[0].metrics.ulp == 0.0
    v = judge(spec, head, base, controls=[False, True])
    assert v.outcome == V.BEHAVIOUR_CHANGE and v.reported_only, (v.outcome, v.reason)
    assert "head's output is the closer one" in v.reason and "reported, not failed" in v.reason
    assert v.details["closer_than_base"]["input_index"] == 0
    assert v.details["closer_than_base"]["base_against_head_ulp"] > 1e6
    # the revert on the input where the old formula loses its digits in float32 only (x = -20:
    # 1 + 2e-9 is 1 in float32, not in float64): the float64 runs agree, a regression as before
    xs = [[-20.0, 0.0, 0.0], [1.0, -2.0, 0.25]]
    v = judge(spec, [_run(x, False) for x in xs], [_run(x, True) for x in xs], controls=[False, True])
    assert v.outcome == V.REGRESSION and "float32 error" in v.reason, (v.outcome, v.reason)
    # where the function changed on the control inputs as well, base's yardstick stands
    changed = _run([1.0, -2.0, 0.25], True)
    changed.reference = [changed.reference[0] * 1.5]
    changed.outputs = [(changed.reference[0] * (1 + 1e-7)).astype(np.float32)]
    v = judge(spec, [_run([-90.0, 0.0, 0.0], True), changed], [_run([-90.0, 0.0, 0.0], False),
                                                                  _run([1.0, -2.0, 0.25], False)],
              controls=[False, True])
    assert v.outcome == V.REGRESSION, (v.outcome, v.reason)
    # where it moved within half the digits there (a refinement: a regularisation removed, as in
    # naver/roma 34bd744), head computes the same function more exactly: the closer rule stands
    refined = _run([1.0, -2.0, 0.25], True)
    refined.reference = [refined.reference[0] * (1 + 300 * 2.0 ** -23)]
    refined.outputs = [refined.reference[0].astype(np.float32)]
    v = judge(spec, [_run([-90.0, 0.0, 0.0], True), refined], [_run([-90.0, 0.0, 0.0], False),
                                                                  _run([1.0, -2.0, 0.25], False)],
              controls=[False, True])
    assert v.outcome == V.BEHAVIOUR_CHANGE and v.reported_only and v.details.get("closer_than_base"), \
        (v.outcome, v.reason)


def test_a_stability_fix_excuses_a_guard_or_an_eps_but_not_another_function_everywhere():
    # naver/roma 1c27395 reverted: quat_composition(normalize=True) no longer normalises; base's
    # normalisation of an overflowed product was NaN on one input, which the revert "fixes"
    from gate.judge.decide import stability_fixes

    def verdict(moved, far, compared=3, outcome=V.BEHAVIOUR_CHANGE):
        return V.VariantVerdict(op="roma.quat_composition", framework="torch", variant={"dtype": "float32"},
                                outcome=outcome, reason="head's float64 output differs from base's",
                                details={"controls_changed": {"compared": compared, "moved": moved,
                                                              "beyond_half_digits": far}})

    fix = V.VariantVerdict(op="roma.quat_composition", framework="torch", variant={"dtype": "bfloat16"},
                           outcome=V.IMPROVEMENT, reason="head fixes NaN/Inf", details={"fixed_inputs": 1})
    everywhere = verdict(3, 3)           # every random control moved by half the digits or more
    one_path = verdict(2, 2)             # the third control has normalize=False: the old path, not moved
    eps = verdict(3, 2)                  # one control moved by less: an eps, not another function
    guard = verdict(0, 0)                # a guard near the singularity: the random draws did not move
    once = verdict(1, 1)                 # one control alone is too little evidence
    stability_fixes([fix, everywhere, one_path, eps, guard, once])
    for v in (everywhere, one_path):
        assert not v.reported_only and "not excused by the stability fix" in v.reason, v.reason
    for v in (eps, guard, once):
        assert v.reported_only and "alongside a stability fix" in v.reason, v.reason
