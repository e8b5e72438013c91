"""The torch <-> TensorFlow translation table (gate/ops/catalog/xfw.yaml) checked on real torch
and TensorFlow for every pair: identical values in, the same function out (float64 results agree
within 1e-6 relative on at least 95% of the elements: isolated elements may differ through one
side's own float64 inaccuracy, e.g. the tail of TF's exact GELU), and float32 results within
twice the kind's tolerance unless one side is itself beyond tolerance against float64 (then it
is a precision finding of that side, named by ``closer``). Allow-listed (documented semantic)
differences are never compared."""
from __future__ import annotations

import numpy as np
import pytest

from gate.fuzz import fuzz_task
from gate.oracles.differential import XfwRunner
from gate.search.inputs import draw
from gate.ops import xfw
from gate.ops.catalog import load_builtin
from gate.plan import Variant, variants_for

from tests.oracle_support import task

TABLE = xfw.load_table()
SPECS = {s.name: s for s in load_builtin(("torch", "tensorflow"))}


def test_table_is_complete_and_consistent():
    assert len(TABLE) >= 25
    for pair in TABLE.pairs:
        t, f = SPECS[pair.torch], SPECS[pair.tf]
        assert (t.framework, f.framework) == ("torch", "tensorflow")
        assert t.twin == pair.tf and f.twin == pair.torch, pair.torch
        assert pair.unaccounted(t) == [], f"{pair.torch}: torch parameters neither mapped nor dropped"
        for m in pair.inputs.values():
            assert m.source in {i.name for i in t.inputs}, (pair.torch, m.source)
        assert set(pair.inputs) <= {i.name for i in f.inputs}, pair.torch
        for a in pair.allow:
            assert a.reason and set(a.when) <= {p.name for p in t.params}, pair.torch
    # every torch row with a TF twin has a pair
    assert {s.name for s in SPECS.values() if s.framework == "torch" and s.twin} == {p.torch for p in TABLE.pairs}


@pytest.fixture(scope="module")
def runners():
    out = {}
    for pair in TABLE.pairs:
        out[pair.torch] = XfwRunner(SPECS[pair.torch], Variant("float32", "cpu", "input", "default", "xfw"))
    return out


@pytest.mark.parametrize("name", [p.torch for p in TABLE.pairs])
def test_pair_agrees_on_random_inputs(runners, name):
    runner = runners[name]
    threshold = SPECS[name].threshold("float32").ulp
    rng = np.random.default_rng(7)
    for _ in range(4):
        q, ev = runner.evaluate(draw(runner.search_spec, rng))
        assert ev.status == "ok", (name, ev.status, ev.error)
        x = ev.extra
        assert x["float64_mismatch"] <= 0.05, (name, q.summary(), x)  # the same function
        assert ev.metrics.nonfinite == 0, (name, q.summary(), ev.metrics)
        errs = {"torch": x["torch_ulp_vs_float64"], "tensorflow": x["tensorflow_ulp_vs_float64"]}
        if ev.metrics.ulp > 2 * threshold:  # only when a side is itself out of tolerance
            assert max(errs.values()) > threshold, (name, q.summary(), ev.metrics, x)
            assert x["closer"] == min(errs, key=errs.get), x


def test_allow_listed_values_are_not_searched_nor_compared(runners):
    runner = runners["torch.elu"]
    alpha = next(p for p in runner.search_spec.params if p.name == "alpha")
    assert alpha.choices == (1.0,)
    cand = draw(SPECS["torch.elu"], np.random.default_rng(0), fixed_params={"alpha": 0.5})
    _, ev = runner.evaluate(cand)
    assert ev.status == "invalid" and ev.error.startswith("allow-listed difference: tf.nn.elu has no alpha")


def test_both_sides_of_a_pair_are_variants_and_search_the_torch_space():
    assert [v.oracle for v in variants_for(SPECS["tf.conv2d"], dtypes=["float32"], oracles=["xfw"])] == ["xfw"]
    assert variants_for(SPECS["torch.hardswish"], oracles=["xfw"]) == []  # no TF twin
    f = fuzz_task(task(SPECS["tf.conv2d"], "xfw", evals=6))
    assert f.status == "ok" and f.op == "tf.conv2d"
    assert set(f.best.arrays) >= {"input", "weight", "bias"}  # a torch.conv2d candidate
    assert f.extra["twin"] == "torch.conv2d" and f.extra["closer"] in ("torch", "tensorflow", "tie")
    assert f.env["framework"] == "tensorflow" and f.env["twin_framework"] == "torch"  # baselines key on both
    assert f.metrics.ulp <= 2 * SPECS["torch.conv2d"].threshold("float32").ulp


def test_a_wrong_translation_is_a_divergence(monkeypatch):
    text = xfw.resources.files("gate.ops").joinpath("catalog", "xfw.yaml").read_text()
    wrong = text.replace("approximate: {from: approximate, map: {none: false, tanh: true}}",
                         "approximate: {from: approximate, map: {none: true, tanh: false}}")
    assert wrong != text
    monkeypatch.setattr(xfw, "_TABLE", xfw.parse_table(wrong))
    runner = XfwRunner(SPECS["torch.gelu"], Variant("float32", "cpu", "input", "default", "xfw"))
    rng = np.random.default_rng(0)
    evs = [runner.evaluate(draw(runner.search_spec, rng))[1] for _ in range(4)]
    assert max(ev.metrics.ulp for ev in evs) > 100  # agreeing twins stay within 2 x 8 ulp
    assert max(ev.extra["float64_mismatch"] for ev in evs) > 0.2  # a semantic difference, not precision


def test_untranslatable_value_is_skipped():
    pair = TABLE.pair_for("torch.norm")
    with pytest.raises(xfw.Untranslatable, match="ord=3"):
        pair.translate(SPECS["torch.norm"], SPECS["tf.norm"], {"N": 1, "L": 2}, {"ord": 3, "dim": -1},
                       {"x": np.ones((1, 2))})


def test_seeds_with_defaulted_or_undeclared_parameters(runners):
    """Library-test seeds (OpInfo samples) leave parameters at their defaults, or pass ones
    the row does not declare: the first are translated with the row's default, the second are
    skipped as untranslatable instead of being compared (one torch output vs two)."""
    runner = runners["torch.conv2d"]
    cand = draw(runner.search_spec, np.random.default_rng(1))
    dropped = cand.derive("seed")
    dropped.params = {k: v for k, v in cand.params.items() if k != "dilation"}
    q, ev = runner.evaluate(dropped)
    assert ev.status == "ok", ev.error
    pool = runners["torch.max_pool2d"]
    cand = draw(pool.search_spec, np.random.default_rng(2))
    extra = cand.derive("seed")
    extra.params = {**cand.params, "return_indices": True}
    _, ev = pool.evaluate(extra)
    assert ev.status == "invalid" and "return_indices=True is not a parameter of the torch.max_pool2d row" in ev.error
