"""A set value domain: labels such as 1 and -1 that a loss compares with ``==`` (deel-lip's KR
losses select a class with ``y_true == 1``). Drawn from real values no element is ever a label,
the loss is NaN on every draw, and init left it out (the fix direction of deel-lip 28a867d was
"right" only because nothing was judged). The domain holds every value the search gives such an
input to the set; init writes one for a label-like argument the tests passed only -1, 0 and 1 to.
The gate-level bed is tests/test_init_constructions.py (both directions of the KR fix)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from gate.errors import ConfigError
from gate.fuzz import fuzz_task
from gate.init.infer import _label_values
from gate.ops.catalog import builtin_defaults
from gate.ops.spec import Domain, OpSpec
from gate.plan import Budget, Task, Variant
from gate.search.coverage import feasible_values
from gate.search.inputs import draw_values, inside_after_rounding, nearest_values, project

LABELS = {"name": "labels", "values": [1, -1]}


def test_a_set_domain_reads_writes_and_validates():
    d = Domain.parse(LABELS)
    assert d.values == (-1.0, 1.0) and d.lo is None and d.hi is None
    assert Domain.parse(d.to_dict()) == d
    assert Domain().to_dict() == {"lo": None, "hi": None, "scale": 1.0, "name": "real"}  # intervals as before
    for bad in ({"values": []}, {"values": [1, "a"]}, {"values": [float("nan")]}, {"values": 1}, {"values": [True]}):
        with pytest.raises(ConfigError, match="'values' must be a non-empty list of finite numbers"):
            Domain.parse(bad)
    with pytest.raises(ConfigError, match="a set of 'values' takes no lo, hi or scale"):
        Domain.parse({"values": [-1, 1], "lo": -2})
    schema = json.loads((Path(__file__).resolve().parents[1] / "gate" / "config_schema.json").read_text())
    tensor = {"$ref": "#/$defs/tensor", "$defs": schema["$defs"]}
    jsonschema.validate({"name": "y_true", "shape": ["N"], "domain": LABELS}, tensor)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "y_true", "shape": ["N"], "domain": {"values": []}}, tensor)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_every_value_the_search_gives_is_one_of_the_set(dtype):
    d = Domain.parse({"values": [-1, 0, 1]})
    rng = np.random.default_rng(0)
    for shape in ((), (7,), (300, 200)):  # a large one takes the compiled draws
        a = draw_values(d, shape, rng)
        assert a.shape == shape and set(np.unique(a)) <= {-1.0, 0.0, 1.0}
    assert len(np.unique(draw_values(d, (1000,), rng))) == 3
    moved = np.array([-7.0, -0.6, -0.5, 0.2, 0.5, 0.51, 3.0, np.inf, -np.inf, np.nan])
    assert nearest_values(moved, d.values).tolist() == [-1, -1, -1, 0, 0, 1, 1, 1, -1, 1]
    assert project(moved, d).tolist() == nearest_values(moved, d.values).tolist()
    q = inside_after_rounding(moved, d, dtype)
    assert set(q.tolist()) <= {-1.0, 0.0, 1.0}
    ok = np.array([1.0, -1.0, 0.0])
    assert inside_after_rounding(ok, d, dtype) is ok  # nothing to do: the same array
    # a value the dtype cannot hold is held as the dtype rounds it (what the operator is given)
    tenth = inside_after_rounding(np.array([0.3, 0.09]), Domain.parse({"values": [0.1]}), dtype)
    assert tenth.tolist() == [float(np.float32(0.1)) if dtype == "float32" else
                              float(np.float16(0.1)) if dtype == "float16" else
                              0.10009765625 if dtype == "bfloat16" else 0.1] * 2


def test_coverage_aims_only_at_classes_a_set_can_have():
    got = feasible_values(Domain.parse(LABELS), "float32", (1, 64))
    assert set(got) == {"bulk", "near_one", "constant", "negative"}, got
    got = feasible_values(Domain.parse({"values": [0, 1]}), "float16", (0, 64))
    assert set(got) == {"empty", "zero", "bulk", "near_one", "constant", "all_tiny"}, got


KR = '''import torch


def kr(y_true, y_pred):
    """deel-lip's binary KR loss before its epsilon (28a867d's parent), the labels it was given noted."""
    SEEN.update(float(v) for v in torch.unique(y_true))
    S0 = (y_true == 1).to(y_pred.dtype)
    S1 = (y_true != 1).to(y_pred.dtype)
    return (y_pred * (S0 / S0.mean() - S1 / S1.mean())).mean(dim=-1)


SEEN = set()
'''


def test_a_loss_of_labels_is_searched_on_labels(tmp_path, monkeypatch):
    (tmp_path / "krops.py").write_text(KR)
    monkeypatch.syspath_prepend(str(tmp_path))
    import krops

    def run(domain):
        row = {"name": "lib.kr", "callable": "krops:kr", "dims": {"N": [1, 64]},
               "inputs": [{"name": "y_true", "shape": ["N", 1], **({"domain": domain} if domain else {})},
                          {"name": "y_pred", "shape": ["N", 1]}]}
        spec = OpSpec.from_dict(row, builtin_defaults("torch"), origin="user")
        krops.SEEN.clear()
        f = fuzz_task(Task(op=spec, variant=Variant("float32"), budget=Budget(evals=40), seed=0))
        return f, set(krops.SEEN)

    # real values: no element is the label 1, the float64 reference is NaN on every evaluation
    # too, and nothing is measured
    f, seen = run(None)
    assert 1.0 not in seen and f.evals >= 40 and f.metrics.ulp == 0.0, (sorted(seen)[:3], f.metrics)
    f, seen = run(LABELS)
    assert seen == {-1.0, 1.0}, seen
    # evaluations that hold both classes compute a number: the search measures the loss
    assert f.evals >= 40 and 0.0 < f.metrics.ulp < np.inf, f.metrics


def test_init_infers_a_set_for_signed_labels_only():
    pm1 = [np.array([1.0, -1.0, 1.0, 1.0]), np.array([[1.0], [0.0]])]
    assert _label_values("y_true", pm1) == {"name": "labels", "values": [-1.0, 0.0, 1.0]}
    assert _label_values("target", [np.array([-1.0, 1.0, 1.0, -1.0]), None]) == {"name": "labels", "values": [-1.0, 1.0]}
    # deel-lip's tests: 0/1, -1/1, labels scaled for several GPUs (about -2 and 2), a batch of one
    deel = [np.array([1.0, 1, 1, 0, 0, 0]), np.where(np.arange(8) % 2, 1.0, -1.0), np.array([-2.0, 2, 2, -2]),
            np.array([2.0, 2, 2]), np.array([-1.996, 2.004, 2.004, -1.996]), np.array([-2.0])]
    assert _label_values("y_true", deel)["values"] == [-2.0, -1.996, -1.0, 0.0, 1.0, 2.0, 2.004]
    # not a label's name (an activation's input the tests built from randint), 0/1 alone (soft
    # labels keep [0, 1]), one value, a call of real values, no repetition (a few real numbers),
    # nothing recorded: no set
    assert _label_values("x", pm1) is None
    assert _label_values("y_true", [np.array([0.0, 1.0, 1.0])]) is None
    assert _label_values("y_true", [np.array([-1.0, -1.0])]) is None
    assert _label_values("y_true", pm1 + [np.array([-1.0, 1.0, 0.5, 0.25])]) is None
    assert _label_values("target", [np.array([0.5, -0.3])]) is None
    assert _label_values("y_true", [None]) is None
