"""A plain class whose instances are called (tensorflow/model-remediation 6a7ea561: its
``MinDiffKernel`` is neither a Keras Layer nor an nn.Module; ``LaplacianKernel(kernel_length)(x, y)``
computes ``exp(-norm(x - y) / kernel_length)``, and the fix added an epsilon under the norm,
whose gradient is NaN where x and y meet). init left every kernel out ("a class that is not an
nn.Module, a Keras Layer or Loss, or an autograd.Function"), so neither direction of the fix
was judged. Now such a class is gated through its ``__call__``, on an instance built as the tests
build it, and its row is named after the class."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.test_init import _cli, _refresh_then_run_pr, git

KERNELS = '''"""Kernels as callable objects (after tensorflow/model-remediation's min_diff kernels)."""
import torch

_EPSILON = {EPS}


class Kernel:
    """Not a module: an object whose call computes the kernel of two batches."""

    def __init__(self, kernel_length=0.1):
        self.kernel_length = kernel_length

    def __call__(self, x, y):
        return self.call(x[:, None, :], y[None, :, :])

    def call(self, x, y):
        raise NotImplementedError


def norm(d, dim):
    """tf.norm's Euclidean norm: the square root of the sum of squares (its gradient at 0 is NaN;
    torch's own vector_norm defines it as 0)."""
    return torch.sqrt((d * d).sum(dim=dim))


class LaplacianKernel(Kernel):
    def call(self, x, y):
        return torch.exp(-norm(x - y + _EPSILON, dim=2) / self.kernel_length)
'''
TESTS = '''import torch

from kernlib import LaplacianKernel


def test_laplacian():
    torch.manual_seed(0)
    k = LaplacianKernel(2.0)
    x = torch.randn(6, 3)
    assert k(x, x).shape == (6, 6)
    assert k(x, torch.randn(4, 3)).shape == (6, 4)
'''


def _make(tmp_path, eps: str):
    repo = tmp_path / "kernrepo"
    (repo / "kernlib").mkdir(parents=True)
    (repo / "kernlib" / "__init__.py").write_text(KERNELS.replace("{EPS}", eps))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_kernels.py").write_text(TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    return repo


def test_a_called_object_is_gated_through_its_call_built_as_the_tests_build_it(tmp_path):
    repo = _make(tmp_path, "1.0e-8")
    res = _cli(repo, "init", "--no-workflows")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = {r["name"]: r for r in yaml.safe_load((repo / ".dl-gate.yml").read_text())["ops"]}
    row = rows["kernlib.LaplacianKernel"]
    assert row["callable"] == "kernlib:LaplacianKernel.__call__" and row["construct"] == {"kernel_length": 2.0}, row
    assert [t["name"] for t in row["inputs"]] == ["x", "y"], row
    # the base class, which the tests never call, is not a row
    assert "kernlib.Kernel" not in rows and "kernlib.norm" in rows


TF_KERNELS = '''"""tensorflow/model-remediation's kernels (min_diff/losses/kernels), trimmed."""
import tensorflow as tf

_EPSILON = {EPS}


class MinDiffKernel:
    def __init__(self, kernel_length=0.1, tile_input=True):
        self.kernel_length = kernel_length
        self.tile_input = tile_input

    def __call__(self, x, y=None):
        if y is None:
            y = x
        if self.tile_input:
            x = x[:, tf.newaxis, :]
            y = y[tf.newaxis, :, :]
        return self.call(x, y)

    def call(self, x, y):
        raise NotImplementedError


class LaplacianKernel(MinDiffKernel):
    def call(self, x, y):
        return tf.exp(-tf.norm(x - y + _EPSILON, axis=2) / self.kernel_length)
'''
TF_TESTS = '''import tensorflow as tf

from tfkern import LaplacianKernel


def test_laplacian_of_a_batch_with_itself():
    x = tf.constant([[0.1, 0.2], [0.3, 0.4], [0.5, 0.9]])
    assert LaplacianKernel(0.05)(x).shape == (3, 3)
'''


@pytest.mark.slow
@pytest.mark.tf
@pytest.mark.parametrize("base_fixed", [True, False])
def test_a_tensorflow_kernels_gradient_is_checked_by_default(tmp_path, base_fixed):
    """The real fix's shape: TensorFlow, the kernel of a batch with itself (y defaults to x), tf.norm
    whose gradient at 0 is NaN. A user TensorFlow row gets a gradient variant by default, as a torch
    one does: the revert fails on it, the fix is an improvement there (before, TensorFlow rows had
    no gradient variant and both directions passed on forward values the epsilon does not move)."""
    repo = tmp_path / "tfrepo"
    (repo / "tfkern").mkdir(parents=True)
    src = repo / "tfkern" / "__init__.py"
    src.write_text(TF_KERNELS.replace("{EPS}", "1.0e-8" if base_fixed else "0.0"))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_kern.py").write_text(TF_TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    res = _cli(repo, "init", "--no-workflows")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    cfg = yaml.safe_load((repo / ".dl-gate.yml").read_text())
    row = {r["name"]: r for r in cfg["ops"]}["tfkern.LaplacianKernel"]
    assert row.get("framework", cfg.get("framework")) == "tensorflow" and [t["name"] for t in row["inputs"]] == ["x"], row
    res = _refresh_then_run_pr(repo, tmp_path / "out", 20, src, TF_KERNELS.replace("{EPS}", "0.0" if base_fixed else "1.0e-8"),
                               "drop the epsilon" if base_fixed else "an epsilon under the norm")
    assert res.returncode == (1 if base_fixed else 0), res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    grad = [v for v in report["verdicts"] if v["variant"].get("oracle") == "grad"]
    assert len(grad) == 1, report["verdicts"]
    if base_fixed:
        assert grad[0]["outcome"] == "regression" and "NaN" in grad[0]["reason"], grad
        # the forward values move by a few float32 ulps (the epsilon): a refinement, reported, not failed
        assert [v for v in report["verdicts"] if v["outcome"] == "regression"] == grad, report["verdicts"]
    else:
        assert grad[0]["outcome"] == "improvement", grad
