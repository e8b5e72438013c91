"""`dl-gate baseline refresh` / `dl-gate merge`: rows keyed by op x variant x environment,
never deleting rows a refresh did not re-measure, shards merged into the full set."""
import json

from gate.cli import main
from gate.judge.baselines import BaselineStore, DirBaselineSource

OPS = '''
import torch

def double(x):
    return x * 2

def square(x):
    return x * x

def halve(x):
    return x / 2
'''

CONFIG = '''
version: 1
python_path: ["."]
gate: {dtypes: [float32]}
ops:
''' + "".join(f'''  - name: lib.{n}
    callable: MODULE:{n}
    dims: {{N: [1, 8]}}
    inputs: [{{name: x, shape: [N]}}]
''' for n in ("double", "square", "halve"))


def rows(d):
    store = BaselineStore(DirBaselineSource(d)).load()
    return {(op, r.variant): r for op, rs in store.rows.items() for r in rs}


def test_shards_merge_into_the_full_refresh_and_refresh_keeps_other_rows(user_lib, tmp_path, capsys, monkeypatch):
    cfg = user_lib(OPS, CONFIG)
    monkeypatch.chdir(cfg.parent)
    common = ["--evals", "10", "--seed", "0", "-c", str(cfg)]
    assert main(["baseline", "refresh", *common, "--shard", "1/2", "--out", str(tmp_path / "s1")]) == 0
    assert main(["baseline", "refresh", *common, "--shard", "2/2", "--out", str(tmp_path / "s2")]) == 0
    s1, s2 = rows(tmp_path / "s1"), rows(tmp_path / "s2")
    # sorted names, every second one: double, square | halve
    assert {k[0] for k in s1} == {"lib.double", "lib.square"} and {k[0] for k in s2} == {"lib.halve"}
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "-c", str(cfg)]) == 0
    assert "+ lib.halve[float32/cpu/input]" in capsys.readouterr().out
    merged = rows(cfg.parent / "baselines")
    assert set(merged) == set(s1) | set(s2)
    for key, row in merged.items():
        assert row.corpus and all((cfg.parent / "baselines" / f).exists() for f in row.corpus), key
        assert row.env["framework"] == "torch" and row.env["harness"] and row.evals == 10
    # a partial refresh re-measures one op and leaves the others exactly as they were
    before = {p.name: p.read_text() for p in (cfg.parent / "baselines").glob("*.json")}
    assert main(["baseline", "refresh", "--ops", "lib.square", "--evals", "10", "--seed", "1", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "lib.square[float32/cpu/input]" in out and "lib.double" not in out
    after = {p.name: p.read_text() for p in (cfg.parent / "baselines").glob("*.json")}
    assert after["lib.double.json"] == before["lib.double.json"]
    assert after["lib.halve.json"] == before["lib.halve.json"]
    assert json.loads(after["lib.square.json"])["rows"][0]["seed"] == 1
    # baseline files are committed: readable by everyone, not mkstemp's 0600
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in (cfg.parent / "baselines").glob("*.json"))


def test_refresh_lines_name_nonfinite_rows_and_zero_ratios():
    from gate.judge.baselines import RowChange

    assert RowChange("m.op", "float32/cpu/input", None, 0.0, "added", 8).line() == \
        "+ m.op[float32/cpu/input]: 0 ulp, NaN/Inf on 8 element(s) (new row)"
    assert RowChange("m.op", "v", 0.0, 0.0, "changed", 3, 0).line() == "~ m.op[v]: 0 ulp, NaN/Inf on 0 -> 3 element(s)"
    assert RowChange("m.op", "v", 0.0, 2.0, "changed").line() == "~ m.op[v]: 0 -> 2 ulp (from 0)"
    assert RowChange("m.op", "v", 2.0, 4.0, "changed").line() == "~ m.op[v]: 2 -> 4 ulp (x2)"


def test_bad_shard_is_one_line(user_lib, capsys):
    cfg = user_lib(OPS, CONFIG)
    assert main(["baseline", "refresh", "--shard", "3/2", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shard must look like I/N" in err[0]


def test_a_run_that_checked_nothing_is_not_a_pass():
    from gate.errors import Outcome
    from gate.judge import verdict as V
    from gate.judge.decide import GateSettings, overall

    def vv(outcome):
        return V.VariantVerdict(op="m.op", framework="torch", variant={"dtype": "float32"}, outcome=outcome, reason="")

    outcome, reason = overall([vv(V.NOT_COVERED), vv(V.NOT_COVERED)], [], GateSettings())
    assert outcome == Outcome.ERROR.value and "covered none of the 2 selected variant(s)" in reason
    outcome, reason = overall([vv(V.PASS), vv(V.NOT_COVERED)], [], GateSettings())
    assert outcome == Outcome.PASS.value and "1 not covered by the budget" in reason


def test_refresh_refuses_a_corrupt_baseline_file_before_measuring(user_lib, capsys, monkeypatch):
    cfg = user_lib(OPS, CONFIG)
    monkeypatch.chdir(cfg.parent)
    (cfg.parent / "baselines").mkdir()
    (cfg.parent / "baselines" / "lib.halve.json").write_text('{"op": "lib.halve", "rows": [\n  {"variant": ')
    assert main(["baseline", "refresh", "--evals", "5", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "corrupt baseline file" in err and "lib.halve.json" in err
    assert "measuring" not in err  # refused up front, nothing was spent


def test_a_baseline_row_keeps_the_largest_finite_error_its_search_saw():
    """A search whose worst input makes the output NaN (a scalar loss on logits near the range's
    end: nothing finite left to measure, 0 ulp) also keeps its worst input with finite outputs;
    the stored row is the larger of the two, the error a head is held to where base cannot be
    replayed. MONAI's focal loss before ec63e068fe stored 0 ulp and its fix failed at 4.99 ulp
    as 'max(floor 4, 2 x baseline 0)' although base's own search had seen more."""
    from gate.judge.baselines import BaselineRow
    from gate.plan import Variant
    from gate.search.finding import Finding
    from gate.search.inputs import Candidate
    from gate.search.score import Metrics

    nan_input = Metrics(ulp=0.0, abs=0.0, rel=float("nan"), l1=0.0, nonfinite=1)
    finite = Metrics(ulp=7.5, abs=3e-7, rel=float("nan"), l1=1e-7, nonfinite=0)
    cand = Candidate(dims={}, params={}, arrays={})
    f = Finding(op="lib.loss", framework="torch", variant=Variant("float32"), strategy="linf", seed=0, evals=40,
                seconds=1.0, metrics=nan_input, best=cand)
    assert BaselineRow.from_finding(f, []).ulp == 0.0  # the worst input alone
    f.best_finite, f.finite_metrics = cand, finite
    row = BaselineRow.from_finding(f, [])
    assert (row.ulp, row.abs, row.l1, row.nonfinite) == (7.5, 3e-7, 1e-7, 1)
    assert row.rel != row.rel  # not measured by the search on either input: NaN, as before
