"""0 false alarms over 20 seeds (tests/test_gate_run.py's bed): a docs-only change selects
nothing and passes on every seed (see tests/test_false_alarms_refactor.py)."""
import pytest

from tests.test_gate_run import base_repo, clone, gate, open_pr  # noqa: F401  (base_repo: the bed, once per file)

SEEDS = range(20)


@pytest.fixture(scope="module")
def docs_pr(base_repo, tmp_path_factory):
    repo = clone(base_repo, tmp_path_factory.mktemp("docs"))
    open_pr(repo, "docs")
    return repo


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_docs_only_change_selects_nothing_on_every_seed(docs_pr, tmp_path, seed):
    code, report = gate(docs_pr, tmp_path, seed=seed, evals=25)
    assert code == 0, (report.outcome, report.reason)
    assert report.verdicts == []  # nothing selected
