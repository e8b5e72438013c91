"""Verdict rules found by acceptance tests on an unseen library (real git repos, real torch):

* a NaN/Inf the base shares must not end the search and hide a new precision loss (as an
  overflow shared by a pairwise distance hid its switch to the expanded |a|²+|b|²-2ab form);
* head's output bit-identical to base's is never a regression, even when base's "float64"
  reference secretly ran in float32 (``x.float()``);
* NaN where base's output was finite is a new NaN even when head's float64 run is NaN too
  (a dropped ``eps``: 0/0), found on the all-zeros input replayed on both sides."""
import pytest

from tests.test_gate_run import by_op, gate, git, make_repo, commit_pr


def main_variants(report, op):
    """The operator's precision verdicts at its default layout (not the default non-contiguous
    layout or gradient variants every user operator also gets)."""
    return [v for v in by_op(report, op)
            if v.variant.get("layout", "default") == "default" and v.variant.get("oracle", "precision") == "precision"]

OPS = '''
import torch


def rms_norm(x, eps=1e-6):
    xf = x.float()
    ms = (xf * xf).mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(ms + eps)).to(x.dtype)


def noisy(x):
    return x + torch.randn_like(x) * 1e-7


def entropy_noisy(x):
    import numpy as np  # an unseeded generator: OS entropy, different on every call

    rng = np.random.default_rng()
    # a relative noise of 1e-9..1e-4 (0.01..840 float32 ulps): two calls' errors on one input differ
    # by up to 1e5x, and base's stays below the 4096 ulps where an input is no longer judged (an
    # absolute 1e-7 on small inputs made every error 1e8 ulps: nothing was judged, so nothing failed
    # and the second run of head that tells non-determinism was never asked for)
    scale = 10.0 ** rng.uniform(-4.0, 1.0)
    return x * (1 + torch.from_numpy(rng.standard_normal(x.shape)).to(x.dtype) * 1e-5 * scale)


def ref_noisy(x):
    import numpy as np  # OS entropy: the float64 run moves by 1e-12 relative (far below float32's
    # resolution, so that the float32 outputs are the same on every call)

    noise = torch.from_numpy(np.random.default_rng().standard_normal(x.shape))
    return x * (1 + noise * 1e-12) if x.dtype == torch.float64 else x


def log1p_masked(x):
    # 0 * exp(x) is NaN once exp overflows the dtype (x > 88.7 in float32): a NaN base and
    # head share, which the search finds within a few evaluations
    return torch.log1p(x) + 0 * torch.exp(x)
'''

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
ops:
  - name: lib.rms_norm
    callable: lib.ops:rms_norm
    kind: normalization
    sources: [lib/ops.py]
    dims: {N: [1, 8], D: [1, 64]}
    inputs: [{name: x, shape: [N, D]}]
  - name: lib.noisy
    callable: lib.ops:noisy
    sources: [lib/ops.py]
    dims: {N: [1, 16]}
    inputs: [{name: x, shape: [N]}]
  - name: lib.entropy_noisy  # one variant: each other one (a layout, a gradient) is its own coin toss
    callable: lib.ops:entropy_noisy
    sources: [lib/ops.py]
    layouts: {}
    grad: false
    dims: {N: [1, 16]}
    inputs: [{name: x, shape: [N]}]
  - name: lib.ref_noisy
    callable: lib.ops:ref_noisy
    sources: [lib/ops.py]
    layouts: {}
    grad: false
    dims: {N: [1, 16]}
    inputs: [{name: x, shape: [N]}]
  - name: lib.log1p_masked
    callable: lib.ops:log1p_masked
    sources: [lib/ops.py]
    dims: {N: [1, 32]}
    inputs: [{name: x, shape: [N], domain: gt_minus1}]
'''

PRS = {
    "log1p": ("torch.log1p(x) + 0", "torch.log(1 + x) + 0"),
    "noisy": ("x + torch.randn_like(x) * 1e-7", "x + 1e-7 * torch.randn_like(x)"),
    # ten times the noise: head's errors beyond base's largest, a regression if the outputs were
    # deterministic (a benign refactor of a noisy operator is within base's reach now, a pass)
    "entropy": ("standard_normal(x.shape)).to(x.dtype) * 1e-5", "standard_normal(x.shape)).to(x.dtype) * 1e-4"),
    # head's float32 outputs move by ~2 ulps (the same on every call) and its float64 run's noise
    # is 1e-6 (~8 float32 ulps): an error above base's that a second run does not reproduce
    "ref_noise": ("return x * (1 + noise * 1e-12) if x.dtype == torch.float64 else x",
                  "return x * (1 + noise * 1e-6) if x.dtype == torch.float64 else x * (1 + 2 ** -22)"),
    "no_upcast": ("    xf = x.float()\n", "    xf = x\n"),
    "no_eps": ("torch.rsqrt(ms + eps)", "torch.rsqrt(ms)"),
}


@pytest.fixture(scope="module")
def lib_repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("rules"), OPS, config=CONFIG, package="lib")


def pr(repo, name):
    commit_pr(repo, f"pr-{name}", "main", *PRS[name])


def test_a_shared_nan_does_not_hide_a_new_precision_loss(lib_repo, tmp_path):
    pr(lib_repo, "log1p")
    code, report = gate(lib_repo, tmp_path, "--dtype", "float32", evals=60)
    regs = [v for v in by_op(report, "lib.log1p_masked") if v.outcome == "regression"]
    assert code == 1 and regs, [(v.id, v.outcome, v.reason) for v in report.verdicts]
    assert "ulp >" in regs[0].reason and "on the same input" in regs[0].reason
    assert regs[0].evals == 60  # the NaN both sides share did not end the search


def test_dropping_a_no_op_upcast_is_not_a_regression_and_both_references_are_float64(lib_repo, tmp_path):
    # float32 input: x.float() is a no-op at float32, and on base it used to cast the float64
    # reference down to float32 (the references then differed: "reference moved", and base's
    # float32 row read 0 ulp). The reference runs in float64 throughout now (the backend keeps
    # x.float() at float64 there): head's and base's references agree, no warning is needed
    pr(lib_repo, "no_upcast")
    code, report = gate(lib_repo, tmp_path, "--dtype", "float32", evals=60)
    (v,) = main_variants(report, "lib.rms_norm")
    assert code == 0 and v.outcome in ("pass", "improvement"), (v.outcome, v.reason)
    assert v.details["identical_outputs"] > 0 and not v.details.get("reference_moved"), v.details
    assert v.base_error and v.base_error > 0  # measured against float64: not the 0 ulp of a float32 "reference"
    assert not any("equals base's bit for bit" in w for w in report.warnings), report.warnings


def test_nan_where_base_was_finite_is_new_even_when_float64_is_nan(lib_repo, tmp_path):
    pr(lib_repo, "no_eps")  # an all-zeros row: 0 * rsqrt(0) = NaN in float64 too
    code, report = gate(lib_repo, tmp_path, "--dtype", "float32", evals=20)
    (v,) = main_variants(report, "lib.rms_norm")
    assert code == 1 and v.outcome == "regression", (v.outcome, v.reason)
    assert "head returns NaN/Inf" in v.reason and "base's output is finite" in v.reason
    assert v.head_nonfinite > 0


def test_an_earlier_runs_outputs_are_replaced_but_foreign_files_are_kept(lib_repo, tmp_path):
    import json

    pr(lib_repo, "no_upcast")
    out = tmp_path / "out-0"
    (out / "repro").mkdir(parents=True)
    (out / "repro" / "other_branch.py").write_text("print('stale')\n")
    (out / "report.json").write_text(json.dumps({"outcome": "regression", "env": {"gate_version": "0"}}))
    gate(lib_repo, tmp_path, "--dtype", "float32", evals=10)
    assert not (out / "repro" / "other_branch.py").exists()
    # a directory that is not a dl-gate output is never cleaned
    mine = tmp_path / "mine"
    (mine / "findings").mkdir(parents=True)
    (mine / "findings" / "notes.txt").write_text("keep\n")
    from gate.pipeline import clear_previous_run

    clear_previous_run(mine)
    assert (mine / "findings" / "notes.txt").exists()


def test_a_pr_cannot_narrow_its_own_operator_row(lib_repo, tmp_path):
    pr(lib_repo, "log1p")  # the regression, and the same PR drops float32 from the op's row
    cfg = lib_repo / ".dl-gate.yml"
    text = cfg.read_text().replace("  - name: lib.log1p_masked\n", "  - name: lib.log1p_masked\n    dtypes: [bfloat16]\n")
    cfg.write_text(text.replace("domain: gt_minus1}", "domain: positive}"))
    git(lib_repo, "commit", "-q", "-am", "narrow the row")
    code, report = gate(lib_repo, tmp_path, "--dtype", "float32", evals=60)
    # float32 is still gated (the base's dtypes are kept); the domain change is reported
    assert code == 1 and any(v.outcome == "regression" and v.variant["dtype"] == "float32"
                             for v in by_op(report, "lib.log1p_masked"))
    assert any("lib.log1p_masked: this PR changes its operator row (inputs)" in w for w in report.warnings), report.warnings


def test_run_from_a_subdirectory_and_a_head_that_is_not_checked_out(lib_repo, tmp_path, monkeypatch):
    import json

    from gate.cli import main

    pr(lib_repo, "log1p")
    out = tmp_path / "sub"
    monkeypatch.chdir(lib_repo / "lib")  # a user inside the package directory
    code = main(["run", "--base", "main", "--out", str(out), "--evals", "60", "--dtype", "float32"])
    assert code == 1 and json.loads((out / "report.json").read_text())["outcome"] == "regression"
    # --head names another commit than the working tree holds: refused, not judged as the tree
    git(lib_repo, "checkout", "-q", "main")
    code = main(["run", "--base", "main", "--head", "pr-log1p", "--repo", str(lib_repo), "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert code == 2 and "is not the checked-out commit" in report["reason"] and report["env"]["setup_error"]


def test_a_seeded_random_operator_is_compared_on_the_same_random_stream(lib_repo, tmp_path):
    pr(lib_repo, "noisy")  # a benign refactor of an operator that adds torch's random noise
    # head's and base's workers are forked from one zygote and seeded alike: the same inputs
    # see the same random numbers on both sides, so the refactor is judged as what it is
    code, report = gate(lib_repo, tmp_path, "--dtype", "float32", "--ops", "lib.noisy", evals=30)
    (v,) = main_variants(report, "lib.noisy")
    assert code == 0 and v.outcome == "pass", (v.outcome, v.reason)


def test_a_non_deterministic_operator_is_not_called_a_regression(lib_repo, tmp_path):
    pr(lib_repo, "entropy")  # an operator whose noise comes from OS entropy, noisier on head
    code, report = gate(lib_repo, tmp_path, "--dtype", "float32", "--ops", "lib.entropy_noisy", evals=60)
    (v,) = main_variants(report, "lib.entropy_noisy")
    # the verdict that would have failed was checked against a second run of head
    assert code == 2 and v.outcome == "error", (v.outcome, v.reason)
    assert v.reason.startswith("non-deterministic") and v.details["nondeterministic"]


def test_an_operator_whose_float64_run_is_noisy_is_not_called_a_regression(lib_repo, tmp_path):
    # head's float32 outputs are the same on every call and its float64 run is not: the error the
    # verdict rests on is noise (a second run of head that compared the float32 outputs only
    # let it stand; the OS-entropy test above failed so whenever its float32 noise rounded away)
    pr(lib_repo, "ref_noise")
    code, report = gate(lib_repo, tmp_path, "--dtype", "float32", "--ops", "lib.ref_noisy", evals=40)
    (v,) = main_variants(report, "lib.ref_noisy")
    assert code == 2 and v.outcome == "error", (v.outcome, v.reason)
    assert v.reason.startswith("non-deterministic") and v.details["reference_rerun_ulp"] > 1, v.details
    assert v.details["would_be"] == "regression"
