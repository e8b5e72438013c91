"""0 false alarms over 20 seeds (tests/test_gate_run.py's bed): a refactor of ``smooth`` passes on
every seed. One benign change per file, so that the test runner's workers share the 20 x 3 gate
runs (tests/test_false_alarms_docs.py, tests/test_false_alarms_improve.py)."""
import pytest

from tests.test_gate_run import base_repo, clone, gate, open_pr  # noqa: F401  (base_repo: the bed, once per file)

SEEDS = range(20)


@pytest.mark.slow
def test_a_refactor_passes_on_20_seeds(base_repo, tmp_path):
    repo = clone(base_repo, tmp_path / "ref")
    open_pr(repo, "refactor")
    runs = [gate(repo, tmp_path / "refactor", seed=seed, evals=25) for seed in SEEDS]
    assert all(code == 0 for code, _ in runs), [(c, r.outcome, r.reason) for c, r in runs if c]

