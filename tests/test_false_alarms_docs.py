"""0 false alarms over 20 seeds (tests/test_gate_run.py's bed): a docs-only change selects
nothing and passes on every seed (see tests/test_false_alarms_refactor.py)."""
import pytest

from tests.test_gate_run import base_repo, clone, gate, open_pr  # noqa: F401  (base_repo: the bed, once per file)

SEEDS = range(20)


@pytest.mark.slow
def test_a_docs_only_change_selects_nothing_on_20_seeds(base_repo, tmp_path):
    repo = clone(base_repo, tmp_path / "docs")
    open_pr(repo, "docs")
    runs = [gate(repo, tmp_path / "docs", seed=seed, evals=25) for seed in SEEDS]
    assert all(code == 0 for code, _ in runs), [(c, r.outcome, r.reason) for c, r in runs if c]
    assert all(r.verdicts == [] for _, r in runs)  # nothing selected

