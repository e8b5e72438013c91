"""Exact answers where they are cheap: every 16-bit input of an elementwise operator
(gate.fuzz.exhaustive) and correctly rounded references (gate.oracles.references)."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from tests.helpers.repro import run_script

torch = pytest.importorskip("torch")

from gate.fuzz import exhaustive as EX  # noqa: E402
from gate.fuzz import fuzz_task  # noqa: E402
from gate.oracles.runner import OK, VariantRunner  # noqa: E402
from gate.judge import verdict as V  # noqa: E402
from gate.judge.decide import GateSettings, decide  # noqa: E402
from gate.judge.replay import replay  # noqa: E402
from gate.ops.catalog import load_catalog  # noqa: E402
from gate.ops.spec import OpSpec  # noqa: E402
from gate.oracles import references as R  # noqa: E402
from gate.plan import Budget, Task, Variant, variants_for  # noqa: E402


def user_spec(callable_: str, **kw) -> OpSpec:
    raw = {"name": kw.pop("name", "lib.op"), "framework": "torch", "callable": callable_,
           "inputs": [{"name": "x", "shape": ["N", "D"]}], "dims": {"N": [1, 8], "D": [1, 8]},
           "dtypes": ["float16", "bfloat16", "float32"], "elementwise": True, "layouts": {}, "grad": False, **kw}
    return OpSpec.from_dict(raw, origin="user")


# -- operators of the tests (importable as tests.test_exhaustive:NAME) -------------------------------
def erf_as_7_1_26(x):
    """erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, absolute): the approximation
    inductor's vectorised CPU erf uses (pytorch/pytorch#198183), which loses every digit near 0."""
    xf = x.float()
    t = 1.0 / (1.0 + 0.3275911 * xf.abs())
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (torch.sign(xf) * (1.0 - p * torch.exp(-xf * xf))).to(x.dtype)


def erf_in_float32(x):
    """The fix of a 16-bit erf: compute in float32, round once."""
    return torch.erf(x.float()).to(x.dtype)


# -- value sets ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,nans", [("float16", 2046), ("bfloat16", 254)])
def test_every_bit_pattern_once(dtype, nans):
    v = R.dtype_values(dtype)
    assert v.size == 65536
    assert int(np.isnan(v).sum()) == nans
    assert {math.inf, -math.inf} <= set(v[np.isinf(v)].tolist())
    zeros = v[v == 0]
    assert sorted(math.copysign(1, z) for z in zeros) == [-1.0, 1.0]
    tiny = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126}[dtype]
    sub = v[(np.abs(v) < tiny) & (v != 0)]
    assert sub.size == 2 * ({"float16": 1023, "bfloat16": 127}[dtype])  # every subnormal, both signs
    finite = v[~np.isnan(v)]
    assert np.unique(finite.view(np.int64)).size == finite.size  # distinct patterns (-0 != +0)
    idx = R.bit_index(v, dtype)
    assert np.array_equal(idx[~np.isnan(v)], np.arange(65536)[~np.isnan(v)])


# -- the exact maximum equals a brute-force loop -------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_exhaustive_max_equals_brute_force_loop(dtype):
    spec = user_spec("torch.sigmoid", ulp_floor="dtype")
    res = EX.run(VariantRunner(spec, Variant(dtype=dtype)), spec, Variant(dtype=dtype))
    contiguous, strided = res.sets
    assert (contiguous.path, strided.path) == ("contiguous", "strided")
    assert all(s.status == OK and s.values == 65536 for s in res.sets)
    tdt = getattr(torch, dtype)
    p, emin = {"float16": (11, -14), "bfloat16": (8, -126)}[dtype]
    values = R.dtype_values(dtype)
    whole = torch.sigmoid(torch.tensor(values).to(tdt)).double().numpy()  # one contiguous call

    def brute(outputs):
        best, best_x = -1.0, None
        for x, out in zip(values, outputs):  # one value at a time, math reference, own ulp rule
            if math.isnan(x) or math.isnan(out):
                continue
            ref = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
            m, e = math.frexp(abs(ref))
            ulp = max(2.0 ** (e - 1 - (p - 1)) if ref != 0 else 0.0, 2.0 ** (emin - (p - 1)))
            err = abs(out - ref) / ulp
            if err > best:
                best, best_x = err, x
        return best, best_x

    best, best_x = brute(whole)
    assert contiguous.metrics.ulp == pytest.approx(best, rel=1e-12) and contiguous.worst_input == best_x
    one_by_one = [float(torch.sigmoid(torch.tensor([x], dtype=torch.float64).to(tdt)).double()) for x in values]
    best, best_x = brute(one_by_one)  # a one-element call runs the element-by-element loop
    assert strided.metrics.ulp == pytest.approx(best, rel=1e-12) and strided.worst_input == best_x


# -- a known framework precision bug at 16 bits, with its exact input --------------------------------
def test_torch_erf_bfloat16_found_with_its_exact_input():
    spec = load_catalog(builtin=["torch"]).get("torch.erf")
    assert spec.elementwise and spec.truth == "erf"
    f = fuzz_task(Task(op=spec, variant=Variant(dtype="bfloat16"), budget=Budget(evals=20), seed=0))
    ex = f.extra["exhaustive"]
    assert f.extra["search"] == "exhaustive" and ex["values"] == 65536 and ex["reference"] == "erf"
    # torch.erf in bfloat16 returns 0 at x = 2.0754822e-38 where erf(x) = 2.34e-38 (~255 ulp)
    assert ex["worst_input"] == float(np.float32(2.0754822e-38))
    assert 250 < ex["max_ulp"] < 260 and f.metrics.worst_out == 0.0
    assert f.metrics.worst_ref == pytest.approx(2.341805e-38, rel=1e-6)
    assert f.best.arrays["input"].size == 1 and f.best.arrays["input"].item() == ex["worst_input"]
    assert any(c.arrays["input"].size == 65536 for c in f.inputs)  # replayed on head and base alike


def test_torch_erf_float16_at_1e_minus_7_is_measured_exactly():
    # float16(1e-7) = 1.1920929e-07: torch.erf returns 0, the true value 1.345e-7 (2.26 subnormal
    # ulps); the exhaustive set holds that input and measures it, the row's maximum is elsewhere
    spec = load_catalog(builtin=["torch"]).get("torch.erf")
    runner = VariantRunner(spec, Variant(dtype="float16"))
    values = R.dtype_values("float16")
    q, ev = runner.evaluate(EX.candidate(spec, values, {}), keep_outputs=True, quantized=True)
    i = int(np.flatnonzero(values == float(np.float16(1e-7)))[0])
    out, ref = ev.outputs[0].array.reshape(-1)[i], ev.reference[0].array.reshape(-1)[i]
    assert out == 0.0 and ref == pytest.approx(1.3451e-7, rel=1e-4)
    assert ev.metrics.ulp >= ref / 2.0 ** -24  # at least this element's error, in ulps of the subnormal spacing


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_erf_fix_computed_in_float32_is_within_one_ulp(dtype):
    spec = user_spec("tests.test_exhaustive:erf_in_float32", reference="mpmath.erf", ulp_floor="dtype")
    f = fuzz_task(Task(op=spec, variant=Variant(dtype=dtype), budget=Budget(evals=10), seed=0))
    assert f.extra["exhaustive"]["values"] == 65536
    assert f.metrics.ulp <= 0.51  # rounded once from float32: correctly rounded but for double rounding


# -- correctly rounded references ----------------------------------------------------------------------
@pytest.mark.parametrize("name,gen,params", [
    ("expm1", lambda r: r.normal(size=60) * 5, {}),
    ("lgamma", lambda r: r.normal(size=60) * 6, {}),
    ("digamma", lambda r: r.uniform(-4, 6, size=60), {}),
    ("gelu", lambda r: r.normal(size=60) * 4, {"approximate": "tanh"}),
    ("erfinv", lambda r: r.uniform(-1, 1, size=60), {}),
    ("pow", lambda r: r.uniform(0, 9, size=60), {"exponent": 2.5}),
])
def test_references_are_correctly_rounded(name, gen, params):
    xs = gen(np.random.default_rng(1))
    got = R.resolve(name).values([xs], params)
    fn, _ = R.FUNCTIONS[name]
    with mpmath.workprec(600):  # far more bits than the reference used
        want = np.array([R.to_float(mpmath.mpf(fn(mpmath.mp, mpmath.mpf(float(x)), **params)), mpmath.mp) for x in xs])
    assert np.array_equal(got, want)


def test_reference_edge_conventions():
    r = {n: R.resolve(n) for n in ("log", "rsqrt", "lgamma", "digamma", "erf", "erfinv")}
    x = np.array([-1.0, -0.0, 0.0, np.inf, -np.inf, np.nan])
    assert np.array_equal(r["log"].values([x], {}), [np.nan, -np.inf, -np.inf, np.inf, np.nan, np.nan], equal_nan=True)
    assert np.array_equal(r["rsqrt"].values([x], {}), [np.nan, -np.inf, np.inf, 0.0, np.nan, np.nan], equal_nan=True)
    lg = r["lgamma"].values([np.array([-2.0, 0.5])], {})
    with mpmath.workprec(200):  # lgamma(1/2) = log(sqrt(pi)); glibc's math.lgamma is 3 ulp off here
        assert lg[0] == np.inf and lg[1] == R.to_float(mpmath.log(mpmath.sqrt(mpmath.pi)), mpmath.mp)
    assert np.isnan(r["digamma"].values([np.array([-3.0])], {})).all()  # a pole: never judged
    assert np.array_equal(r["erf"].values([x[3:5]], {}), [1.0, -1.0])
    assert np.array_equal(r["erfinv"].values([np.array([1.0, -1.0, 1.5])], {}), [np.inf, -np.inf, np.nan],
                          equal_nan=True)
    assert R.resolve("mpmath.erf").values([np.array([0.5])], {})[0] == math.erf(0.5)
    assert R.resolve("torch.erf") is None and not R.is_true_reference("mylib.ref")


def test_exhaustive_tables_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("DL_GATE_CACHE", str(tmp_path))  # (isolated workers share the default cache)
    monkeypatch.setattr(R, "cache_dirs", lambda: [R.cache_dir()])
    ref = R.TrueReference("sqrt", *R.FUNCTIONS["sqrt"])
    t1 = ref.table("bfloat16", {})
    files = list(R.cache_dir().glob("sqrt-bfloat16-*.npy"))
    assert len(files) == 1 and R.cache_dir() == tmp_path / "references"
    fresh = R.TrueReference("sqrt", *R.FUNCTIONS["sqrt"])
    fresh.scalar = None  # a second process reads the table: nothing is computed again
    t2 = fresh.table("bfloat16", {})
    assert np.array_equal(t1, t2, equal_nan=True)
    v = R.dtype_values("bfloat16")
    fin = np.isfinite(v) & (v >= 0)
    assert np.array_equal(t1[fin], np.sqrt(v[fin]))  # sqrt of a bfloat16 is exact in float64


# -- a user's true reference: the judge says which side is closer to the true value -----------------
def test_user_reference_mpmath_decides_and_judge_says_closer_to_the_true_value():
    approx = user_spec("tests.test_exhaustive:erf_as_7_1_26", reference="mpmath.erf", ulp_floor="dtype")
    exact = user_spec("tests.test_exhaustive:erf_in_float32", reference="mpmath.erf", ulp_floor="dtype")
    variant = Variant(dtype="bfloat16")
    f = fuzz_task(Task(op=approx, variant=variant, budget=Budget(evals=10), seed=0))
    worst = f.extra["exhaustive"]["worst_input"]
    assert abs(worst) < 1e-3 and f.metrics.ulp > 100  # all relative accuracy lost near 0
    # measured against itself (no declared reference) the float64 run is the same approximation,
    # computed in float64 throughout (its own x.float() kept at float64): what it sees is the
    # float32 cancellation of 1 - p*exp(-x^2) near 0 (it read < 2 ulp while x.float() cast the
    # reference down to float32 too)
    own = fuzz_task(Task(op=approx.replace(reference=None), variant=variant, budget=Budget(evals=10), seed=0))
    assert own.metrics.ulp > 100
    cands = [c for c in f.inputs if c.origin == "exhaustive"]
    h, b = replay(exact, variant, cands), replay(approx, variant, cands)
    settings = GateSettings()
    fix = decide(exact, variant, h, b, None, "ok", f, settings)
    assert fix.outcome == V.IMPROVEMENT and "closer to the true value (mpmath.erf)" in fix.reason
    revert = decide(approx, variant, b, h, None, "ok", f, settings)
    assert revert.outcome == V.REGRESSION and "further from the true value (mpmath.erf)" in revert.reason


# -- when exhaustive mode applies ------------------------------------------------------------------------
def test_exhaustive_is_chosen_from_the_row_and_the_dtype():
    cat = load_catalog(builtin=["torch"])
    erf, atan2, softmax = cat.get("torch.erf"), cat.get("torch.atan2"), cat.get("torch.softmax")
    assert EX.applies(erf, Variant(dtype="float16")) and EX.applies(erf, Variant(dtype="bfloat16", mode="operator"))
    assert not EX.applies(erf, Variant(dtype="float32"))  # 2^32 values: the sharded sweep
    assert not EX.applies(atan2, Variant(dtype="float16"))  # two inputs: 2^32 pairs
    assert not EX.applies(softmax, Variant(dtype="float16"))  # not elementwise
    assert not EX.applies(erf, Variant(dtype="float16", oracle="grad"))
    gelu = cat.get("torch.gelu")
    assert [p["approximate"] for p in EX.param_sets(gelu)] == ["none", "tanh"]
    spec = user_spec("torch.erf")  # a user row: `elementwise: true` in .dl-gate.yml
    assert EX.applies(spec, Variant(dtype="float16")) and not EX.applies(spec.replace(elementwise=False),
                                                                         Variant(dtype="float16"))
    assert any(v.dtype == "float16" for v in variants_for(spec))


def test_operator_refusing_values_outside_its_domain_is_run_on_its_domain():
    spec = user_spec("tests.test_exhaustive:strict_log", domain=None)
    spec = spec.replace(inputs=(spec.inputs[0].__class__.from_dict(
        {"name": "x", "shape": ["N", "D"], "domain": "positive"}),))
    res = EX.run(VariantRunner(spec, Variant(dtype="float16")), spec, Variant(dtype="float16"))
    for s in res.sets:
        assert s.status == OK and s.domain_only
        assert s.values == 31743  # every finite positive float16 (0x0001 .. 0x7bff)


def strict_log(x):
    if not bool(torch.isfinite(x).all()) or bool((x <= 0).any()):
        raise ValueError("strict_log: positive finite inputs only")
    return torch.log(x)


# -- float32: a shard of the 2^32 sweep -----------------------------------------------------------------
def test_float32_sweep_shard_and_merge():
    spec = load_catalog(builtin=["torch"]).get("torch.erf")
    variant = Variant(dtype="float32")
    runner = VariantRunner(spec, variant)
    n = 1 << 20  # shards of 4096 values
    a = EX.sweep(runner, spec, variant, shard=(1, n), chunk=1024)
    b = EX.sweep(runner, spec, variant, shard=(n // 2 + 1, n), chunk=4096)  # from -0.0 on: the negatives
    assert a["values"] == b["values"] == 4096 and a["range"] == ["0x00000000", "0x00001000"]
    assert a["failed"] == 0 and a["max_ulp"] >= 0
    merged = EX.merge_sweeps([a, b])
    assert merged["values"] == 8192 and not merged["complete"] and merged["missing_shards"] == n - 2
    assert merged["max_ulp"] == max(a["max_ulp"], b["max_ulp"])
    c = EX.sweep(runner, spec, variant, shard=(1, n), chunk=4096, strided=True)  # the element-by-element loop
    assert c["path"] == "strided" and c["values"] == 4096 and a["path"] == "contiguous"
    assert EX.parse_shard("3/64") == (3, 64)
    for bad in ("0/4", "5/4", "x"):
        with pytest.raises(Exception, match="--shard"):
            EX.parse_shard(bad)


# -- the gate on a pull request: exhaustive sets replayed on head and base -----------------------------
# Modelled on pytorch/pytorch#198183: a vectorised erf by Abramowitz & Stegun 7.1.26, whose error
# bound is absolute, returns 0 or wrong digits for small |x|; the fix computes erf in float32 and
# rounds once. The library's erf helper is judged against `reference: mpmath.erf`.
APPROX = '''
import torch


def erf(x):
    xf = x.float()
    t = 1.0 / (1.0 + 0.3275911 * xf.abs())
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (torch.sign(xf) * (1.0 - p * torch.exp(-xf * xf))).to(x.dtype)
'''
FIXED = '''
import torch


def erf(x):
    return torch.erf(x.float()).to(x.dtype)
'''
REFACTORED = '''
import torch


def erf(x):
    """erf computed in float32, rounded once to the input's dtype."""
    wide = x.to(torch.float32)
    return torch.erf(wide).to(dtype=x.dtype)
'''
ERF_CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
budget: {localise: 5}
gate: {dtypes: [bfloat16], modes: [input]}
ops:
  - name: mylib.erf
    callable: mylib.ops:erf
    elementwise: true
    reference: mpmath.erf
    sources: [mylib/ops.py]
    layouts: {}
    grad: false
    dims: {N: [1, 8], D: [1, 16]}
    inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 2}}]
'''


@pytest.mark.slow
@pytest.mark.parametrize("base_src,head_src,outcome,needle", [
    (APPROX, FIXED, "improvement", "closer to the true value (mpmath.erf)"),
    (FIXED, APPROX, "regression", "further from the true value (mpmath.erf)"),
    (FIXED, REFACTORED, "pass", "identical inputs"),
], ids=["fix", "revert", "refactor"])
def test_gate_judges_exact_maxima_on_a_pull_request(tmp_path, base_src, head_src, outcome, needle):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from gate.cli import main
    from tests.helpers.gitrepo import GitRepo

    repo = GitRepo.init(tmp_path / "lib")
    repo.write({"mylib/__init__.py": "", "mylib/ops.py": base_src, ".dl-gate.yml": ERF_CONFIG}, dedent=False)
    repo.commit("base")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    res = subprocess.run([sys.executable, "-m", "gate.cli", "baseline", "refresh", "--evals", "10", "--seed", "0"],
                         cwd=repo.path, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    from gate.search.inputs import Candidate

    stored = list((repo.path / "baselines" / "corpus").rglob("*.npz"))
    assert stored and all(Candidate.load(p).size < 65536 for p in stored)  # sets are regenerated, not stored
    repo.commit("baselines")
    repo.branch("pr")
    repo.write({"mylib/ops.py": head_src}, dedent=False)
    repo.commit("pr")
    out = tmp_path / "out"
    old = os.getcwd()
    os.chdir(repo.path)
    try:
        code = main(["run", "--base", "main", "--out", str(out), "--evals", "10", "--seed", "0"])
    finally:
        os.chdir(old)
    report = json.loads((out / "report.json").read_text())
    [vv] = report["verdicts"]
    assert vv["outcome"] == outcome and needle in vv["reason"], vv["reason"]
    assert code == (1 if outcome == "regression" else 0)
    assert vv["details"]["search"] == "exhaustive"
    ex = vv["details"]["exhaustive"]
    assert ex["values"] == 65536 and ex["reference"] == "mpmath.erf"
    assert "bfloat16/cpu/input · exhaustive" in (out / "report.md").read_text()
    if outcome == "regression":
        assert abs(ex["worst_input"]) < 1e-3 and vv["head_error"] > 100  # the approximation near 0
        # the repro script measures against mpmath.erf too: it reproduces on head (exit 1)
        [script] = list((out / "repro").glob("*.py"))
        res = run_script([str(script), "--repo", str(repo.path)])
        assert res.returncode == 1, res.stdout + res.stderr


def test_reference_first_call_in_a_fresh_process():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import numpy as np; from gate.oracles.references import resolve; "
            "print(resolve('exp').values([np.array([1.0])], {})[0])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(Path(__file__).resolve().parent.parent))
    assert res.returncode == 0, res.stderr
    assert float(res.stdout) == math.e


def test_an_unwritable_cache_falls_back_to_a_temporary_directory(tmp_path, monkeypatch):
    import tempfile

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")  # the cache root is a file: nothing can be written under it
    monkeypatch.setenv("DL_GATE_CACHE", str(blocked))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    ref = R.TrueReference("relu", *R.FUNCTIONS["relu"])
    t = ref.table("float16", {})
    [stored] = list((tmp_path / "tmp").rglob("relu-float16-*.npy"))
    assert np.array_equal(np.load(stored), t, equal_nan=True)


def test_an_operator_failing_on_every_set_is_searched_as_before():
    spec = user_spec("tests.test_exhaustive:refuses_large_tensors")
    f = fuzz_task(Task(op=spec, variant=Variant(dtype="float16"), budget=Budget(evals=15), seed=0))
    assert "search" not in f.extra and f.exhaustive == []
    assert all(s["status"] != "ok" for s in f.extra["exhaustive"]["sets"])
    assert f.status == "ok" and f.best.size <= 64  # the search's own input


def refuses_large_tensors(x):
    if x.numel() > 1000:
        raise ValueError("refuses_large_tensors: at most 1000 elements")
    return torch.tanh(x)
