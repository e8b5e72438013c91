"""0 false alarms over 20 seeds (tests/test_gate_run.py's bed): a precision improvement
(``log(1 + x)`` -> ``log1p(x)``) passes, reported as an improvement, on every seed (see
tests/test_false_alarms_refactor.py)."""
import pytest

from tests.test_gate_run import BASE_OPS, gate, git, make_repo

SEEDS = range(20)


@pytest.mark.slow
def test_a_precision_improvement_passes_on_20_seeds(tmp_path):
    improve_base = BASE_OPS.replace("def log1p_op(x):\n    return torch.log1p(x)", "def log1p_op(x):\n    return torch.log(1 + x)")
    repo = make_repo(tmp_path / "imp", ops_src=improve_base)
    git(repo, "checkout", "-q", "-b", "pr-improve")
    (repo / "mylib" / "ops.py").write_text(BASE_OPS)
    git(repo, "commit", "-q", "-am", "use log1p")
    runs = [gate(repo, tmp_path / "improve", seed=seed, evals=25) for seed in SEEDS]
    assert all(code == 0 for code, _ in runs), [(c, r.outcome, r.reason) for c, r in runs if c]
    assert all("improvement" in [v.outcome for v in r.verdicts] for _, r in runs), \
        [[v.outcome for v in r.verdicts] for _, r in runs]
