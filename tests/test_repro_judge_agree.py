"""The repro script's "new NaN/Inf" (gate/localise/repro.py, a standalone script that imports
nothing of the gate) and the judge's (gate.judge.decide.new_nonfinite_masks) are one definition
written twice: held equal element by element on outputs built around each of its rules."""
import json

import numpy as np
import pytest

from gate.backends.base import FLOAT_FORMATS
from gate.judge.decide import new_nonfinite_masks
from gate.judge.replay import ReplayResult
from gate.localise import repro
from gate.oracles.precision import overflow_bound


def _script_rules():
    """The script's shared part, as the script runs it (its FORMATS filled in)."""
    ns = {"np": np, "sys": __import__("sys")}
    exec(repro._COMMON.replace("{FORMATS}", json.dumps({k: list(v) for k, v in FLOAT_FORMATS.items()})), ns)
    return ns["new_nonfinite_mask"]


def _case(rng, dtype, n=64):
    """Head's output x, base's y and both float64 runs, around the rules' edges: values at and
    beyond the range's end, the top binade, infinities of either sign, NaN, base half its digits
    off or right, overflows that moved."""
    ovf = overflow_bound(dtype)
    pool = np.array([0.0, 1.0, -2.5, ovf * 0.4, ovf * 0.6, -ovf * 0.75, ovf * 0.99, ovf, ovf * 1.01,
                     -ovf * 1.5, ovf * 4, np.inf, -np.inf, np.nan])
    rx = rng.choice(pool[:-3], n) * rng.choice([1.0, 1.0 + 2.0 ** -20], n)
    ry = np.where(rng.random(n) < 0.7, rx, rng.choice(pool[:-3], n))
    x = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rx)
    # base: right (its float64 run rounded), half its digits off, or non-finite
    p = FLOAT_FORMATS[dtype][0]
    y = np.where(rng.random(n) < 0.5, ry, ry * (1 + rng.choice([0.0, 2.0 ** (-p / 2 + 1), 0.5], n)))
    y = np.where(rng.random(n) < 0.15, rng.choice([np.inf, -np.inf, np.nan], n), y)
    y = np.where(np.isfinite(y), np.clip(y, -ovf, ovf), y)
    if rng.random() < 0.3:
        ry = None
    return x, y, rx, ry


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_repro_script_and_the_judge_count_the_same_new_nonfinite_elements(dtype):
    script_mask = _script_rules()
    rng = np.random.default_rng(0)
    kinds = {"new": 0, "excused": 0}
    for _ in range(400):
        x, y, rx, ry = _case(rng, dtype)
        h = ReplayResult("ok", outputs=[x], reference=[rx])
        b = ReplayResult("ok", outputs=[y], reference=None if ry is None else [ry])
        ((_, judge),) = list(new_nonfinite_masks(h, b, dtype))
        mine = script_mask(x, y, rx, ry, dtype)
        assert np.array_equal(judge, mine), (x[judge != mine], y[judge != mine], rx[judge != mine])
        raw = ~np.isfinite(x) & np.isfinite(y)
        kinds["new"] += int(judge.sum())
        kinds["excused"] += int((raw & ~judge).sum())
    # both the rule and its exceptions were exercised
    assert kinds["new"] > 100 and kinds["excused"] > 20, kinds


def test_an_infinity_for_a_value_beyond_the_range_is_not_new_where_base_was_inside_it():
    script_mask = _script_rules()
    ovf = overflow_bound("float16")
    x, y, rx = np.array([np.inf, np.inf]), np.array([ovf, 1.0]), np.array([ovf * 1.3, 1.0])
    h = ReplayResult("ok", outputs=[x], reference=[rx])
    b = ReplayResult("ok", outputs=[y], reference=[rx])
    ((_, judge),) = list(new_nonfinite_masks(h, b, "float16"))
    assert judge.tolist() == [False, True] == script_mask(x, y, rx, rx, "float16").tolist()
