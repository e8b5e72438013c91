"""``dl-gate init`` on small real libraries in temporary git repositories.

The library (``focallib``) is modelled on kornia's binary focal loss before and after its
numerical-stability fix (kornia PR #2125: ``probs_pos.log()`` → ``logsigmoid(input)``; the
log of a sigmoid that rounded to 0 is -inf, and the loss NaN/Inf for large logits). Its own
tests call the operators with ``torch.rand`` logits, as kornia's did. Beside it: an
``nn.Module``, an ``autograd.Function``, a module whose constructor needs arguments, a helper
that takes a path, a function no test calls (found by probing) and a private function."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from gate.config import parse_config
from gate.errors import SetupError
from gate.search.seeds import CallRecord, Opaque, TensorArg
from gate.init import run_init
from gate.init.infer import Operator, from_records, probe_specs, tensor_params, widen


@pytest.fixture(autouse=True)
def _seeded_draws():
    """The recorded values these tests make up with np.random are drawn from a fixed seed: an
    inferred domain must not depend on a draw (four unseeded weights all at most 1 read as
    probabilities about once in 40 suite runs)."""
    import numpy as np

    state = np.random.get_state()
    np.random.seed(0)
    yield
    np.random.set_state(state)

ROOT = Path(__file__).resolve().parents[1]

FIXED = '''
    log_probs_pos = torch.nn.functional.logsigmoid(input)
    log_probs_neg = torch.nn.functional.logsigmoid(-input)
'''
BROKEN = '''
    log_probs_pos = probs_pos.log()
    log_probs_neg = probs_neg.log()
'''

FOCAL = '''"""Focal losses (after kornia.losses.focal)."""
import torch


def binary_focal_loss_with_logits(input, target, alpha: float = 0.25, gamma: float = 2.0,
                                  reduction: str = "none"):
    """Binary focal loss on logits."""
    probs_pos = input.sigmoid()
    probs_neg = (-input).sigmoid()
{LOGS}
    loss = (-alpha * probs_neg.pow(gamma) * target * log_probs_pos
            - (1 - alpha) * probs_pos.pow(gamma) * (1.0 - target) * log_probs_neg)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


class BinaryFocalLossWithLogits(torch.nn.Module):
    def __init__(self, alpha: float, gamma: float = 2.0, reduction: str = "none"):  # kornia: alpha required
        super().__init__()
        self.alpha, self.gamma, self.reduction = alpha, gamma, reduction

    def forward(self, input, target):
        return binary_focal_loss_with_logits(input, target, self.alpha, self.gamma, self.reduction)


class WeightedFocal(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, input, target):
        return self.weight * binary_focal_loss_with_logits(input, target)


class ClassWeighted(torch.nn.Module):
    """Built from a tensor (kornia's FocalLoss(weight=...)): not written down as a row."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, input):
        return input * self.weight


class Projection(torch.nn.Module):
    """A layer with a size and random weights: two sizes in the tests, each called at its own."""

    def __init__(self, dim: int, bias: bool = True):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim, bias=bias)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Smoothed(torch.nn.Module):
    """Defaults only; the tests build it with their own setting (pytorch-metric-learning's
    PNPLoss(variant="Ds")): the row is built as they build it."""

    def __init__(self, eps: float = 0.1, mode: str = "hard"):
        super().__init__()
        self.eps, self.mode = eps, mode

    def forward(self, x):
        s = torch.softmax(x, dim=-1)
        return s * (1 - self.eps) + self.eps / x.shape[-1] if self.mode == "soft" else s


def _private_helper(x):
    return x
'''

EXTRA = '''"""Other operators."""
from typing import Literal

import torch


class Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)


def rgb_to_gray(image):
    """Needs a [..., 3, H, W] image: found by probing (no test calls it)."""
    if image.dim() < 3 or image.shape[-3] != 3:
        raise ValueError(f"expected (*, 3, H, W), got {tuple(image.shape)}")
    r, g, b = image.unbind(-3)
    return 0.299 * r + 0.587 * g + 0.114 * b


@torch.library.custom_op("focallib::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 2.0


@scaled_tanh.register_fake
def _(x):
    return torch.empty_like(x)


def normalize(x, mode: Literal["l2", "max", "bogus"] = "l2", center: bool = False, inplace: bool = False):
    """No test calls it: its modes come from the type hint, each tried ("bogus" raises)."""
    if center:
        x = x - x.mean(-1, keepdim=True)
    if mode == "l2":
        return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    if mode == "max":
        return x / x.abs().amax(-1, keepdim=True).clamp_min(1e-12)
    raise ValueError(f"unknown mode {mode}")


def save_tensor(x, path):
    torch.save(x, path)


def describe(name: str) -> str:
    return name.upper()
'''

TESTS = '''import torch

from focallib import binary_focal_loss_with_logits, BinaryFocalLossWithLogits, Softplus


def test_focal():
    for n in (2, 5):
        x = torch.rand(n, 3)
        t = torch.rand(n, 3)
        for red in ("none", "mean"):
            assert torch.isfinite(binary_focal_loss_with_logits(x, t, alpha=0.5, reduction=red)).all()


def test_module():
    m = BinaryFocalLossWithLogits(alpha=0.25)
    assert m(torch.rand(2, 3), torch.rand(2, 3)).shape == (2, 3)
    assert BinaryFocalLossWithLogits(0.75, reduction="mean")(torch.rand(4, 3), torch.rand(4, 3)).dim() == 0


def test_built_modules():
    from focallib.focal import ClassWeighted, Projection

    assert ClassWeighted(torch.ones(3))(torch.rand(2, 3)).shape == (2, 3)
    small, big = Projection(4), Projection(8, bias=False)
    for n in (1, 3):
        assert small(torch.randn(n, 4)).shape == (n, 4)
    assert big(torch.randn(2, 8)).shape == (2, 8)


def test_softplus():
    assert Softplus.apply(torch.randn(4, 6)).shape == (4, 6)


def test_smoothed():
    from focallib.focal import Smoothed

    assert Smoothed(eps=0.25, mode="soft")(torch.randn(3, 5)).shape == (3, 5)


def test_normalize_rejects_an_unknown_mode():
    import pytest
    from focallib import normalize

    with pytest.raises(ValueError):
        normalize(torch.rand(2, 3), mode="bogus")
'''


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c",
                           "commit.gpgsign=false", *args], check=True, capture_output=True, text=True).stdout


def drawn_shape(op, t) -> tuple:
    """An input's shape as its draws have it: a literal size, or a dim of one size (``S7: [7, 7]``,
    the tests' size, which only the search's size mutation moves past)."""
    dims = dict(op.dims)
    return tuple(dims[x][0] if isinstance(x, str) and x in dims and dims[x][0] == dims[x][1] else x for x in t.shape)


def make_lib(tmp_path: Path, fixed: bool = True, init_extra: str = "") -> Path:
    repo = tmp_path / "repo"
    pkg = repo / "focallib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init_extra + "from .focal import *  # noqa\nfrom .extra import *  # noqa\n"
                                     "from .focal import BinaryFocalLossWithLogits, binary_focal_loss_with_logits\n")
    (pkg / "focal.py").write_text(FOCAL.replace("{LOGS}", FIXED if fixed else BROKEN))
    (pkg / "extra.py").write_text(EXTRA)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_focal.py").write_text(TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "focallib")
    return repo


@pytest.fixture(scope="module")
def inited(tmp_path_factory):
    """focallib after one `dl-gate init` (shared: the run takes seconds)."""
    tmp = tmp_path_factory.mktemp("init")
    repo = make_lib(tmp)
    rep = run_init(repo, probe_timeout=20)
    return repo, rep


def test_init_discovers_infers_and_writes_a_valid_config(inited):
    repo, rep = inited
    text = (repo / ".dl-gate.yml").read_text()
    cfg = parse_config(text, repo / ".dl-gate.yml", repo)  # the real validator
    ops = {o.name: o for o in cfg.ops}
    assert set(ops) == {"focallib.binary_focal_loss_with_logits", "focallib.BinaryFocalLossWithLogits",
                        "focallib.Softplus", "focallib.rgb_to_gray", "focallib.scaled_tanh",
                        "focallib.normalize", "focallib.Projection", "focallib.Smoothed",
                        # a class the tests also build with other settings (a flag, a mode's name):
                        # a second row built that way (deel-lip's KR(multi_gpu=True) and KR())
                        "focallib.Smoothed(mode='hard')", "focallib.Projection(bias=False)",
                        "focallib.BinaryFocalLossWithLogits(reduction='mean')"}, sorted(ops)
    # a constructor with defaults only, built by the tests with their own setting: built as they build it
    assert dict(ops["focallib.Smoothed"].construct) == {"eps": 0.25, "mode": "soft"}, ops["focallib.Smoothed"].construct
    assert "built as Smoothed(eps=0.25, mode='soft') as the tests build it" in text
    focal = ops["focallib.binary_focal_loss_with_logits"]
    # from the tests' calls: the batch size varies (2, 5), the 3 never does: draws keep it, the
    # search's size mutation aims past it (a loss over 3 classes runs over 4096)
    assert [t.name for t in focal.inputs] == ["input", "target"]
    assert focal.inputs[0].shape == ("N", "S3") and focal.dims == (("N", (2, 5)), ("S3", (3, 3)))
    assert dict(focal.reach) == {"N": 4096, "S3": 4096}
    # the tests draw torch.rand logits; real values run, so the row is not narrowed to (0, 1)
    assert focal.inputs[0].domain.name == "real"
    params = {p.name: p for p in focal.params}
    # the tests' values first, then others that run (one value seen must not pin the row)
    assert params["alpha"].choices == (0.5, 0.25, 0.75, 0.125, 0.625, 0.375)
    assert params["gamma"].choices == (2.0, 1.0, 4.0) and set(params["reduction"].choices) == {"none", "mean"}
    # probed: no test calls it, the first shape it accepts has 3 channels
    gray = ops["focallib.rgb_to_gray"]
    assert gray.inputs[0].shape[-3] == 3
    # parameter values from type hints and defaults, each tried: "bogus" raises, inplace is never flipped
    norm = {p.name: p for p in ops["focallib.normalize"].params}
    assert norm["mode"].choices == ("l2", "max") and norm["center"].choices == (False, True)
    assert "inplace" not in norm
    # its only test call raised (a negative case): recorded as such and not used
    assert "# focallib.normalize: probed: the first shape that ran; mode, center: values from the type hints" in text
    # the autograd.Function's row is its class (resolved to .apply)
    assert ops["focallib.Softplus"].callable == "focallib.extra:Softplus"
    # the torch.library custom op: its callable is the op; no autograd registered: no gradient row
    assert ops["focallib.scaled_tanh"].callable == "focallib.extra:scaled_tanh"
    assert ops["focallib.scaled_tanh"].grad is False and "gradient check off" in text
    # 4 calls from the tests, 2 from the module's forward (recorded too: a library's own calls count)
    assert "# focallib.binary_focal_loss_with_logits: from 6 test call(s) in tests/test_focal.py" in text
    left = dict(rep.left_out)
    assert "constructor needs weight and no test constructs it" in left["focallib.WeightedFocal"]
    assert "construct it with a tensor (weight)" in left["focallib.ClassWeighted"]
    # a tensor cannot be written as a construct value: the hint is the builder function
    assert "write a function that builds it" in left["focallib.ClassWeighted"]
    assert "give it a row with construct" in left["focallib.WeightedFocal"]  # a value can
    # classes built as the tests build them: kornia's required alpha, the instance called most
    # (its calls' shapes, not the other instance's: a Linear(4, 4) is never given 8 features)
    assert ops["focallib.BinaryFocalLossWithLogits"].construct == (("alpha", 0.25),)
    proj = ops["focallib.Projection"]
    assert proj.construct == (("dim", 4),) and proj.inputs[0].shape == ("N", 4) and proj.dims == (("N", (1, 3)),)
    assert "built as Projection(dim=4)" in text
    # the second construction of each: built as the tests built it, fed its own instances' calls
    # (the default-built Smoothed: every call)
    assert ops["focallib.Smoothed(mode='hard')"].construct == ()
    other = ops["focallib.Projection(bias=False)"]
    assert other.construct == (("dim", 8), ("bias", False)) and other.inputs[0].shape[-1] == 8, other
    assert ops["focallib.BinaryFocalLossWithLogits(reduction='mean')"].construct == (("alpha", 0.75), ("reduction", "mean"))
    assert "the tests build Projection with other settings too (bias=False here)" in text
    assert "path" in left["focallib.save_tensor"]
    assert "name: str" in left["focallib.describe"]
    assert not any("_private_helper" in n for n in left)
    # what is left out is listed under not_gated with its callable and why (a run names a change to one)
    not_gated = {e["name"]: e for e in yaml.safe_load(text)["not_gated"]}
    assert set(not_gated) == {n for n in left if n.startswith("focallib.")} and "focallib.WeightedFocal" in not_gated
    assert not_gated["focallib.WeightedFocal"]["callable"].endswith(":WeightedFocal")
    assert not_gated["focallib.WeightedFocal"]["why"] == left["focallib.WeightedFocal"]
    # the harvested calls are seeds beside the baselines
    assert rep.seeds > 0 and any((repo / "baselines" / "seeds").rglob("*.npz"))
    # every row was run once as refresh will read it: parsed from the file written
    assert sorted(rep.checked) == sorted(rep.added) == sorted(ops)


def test_the_install_command_is_what_the_repository_declares(tmp_path):
    from gate.init.workflows import install_command

    assert install_command(tmp_path) == ""
    (tmp_path / "requirements.txt").write_text("numpy\n")
    assert install_command(tmp_path) == "pip install -r requirements.txt"
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 100\n")  # configuration only: no build
    assert install_command(tmp_path) == "pip install -r requirements.txt"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert install_command(tmp_path) == "pip install -e ."
    assert install_command(tmp_path, "tensorflow") == "pip install 'tensorflow-cpu==2.21.*' && pip install -e ."


def test_the_action_is_pinned_by_its_tags_commit_or_says_it_is_not(tmp_path):
    from gate.init.workflows import ActionRef, parse_action, resolve

    pinned = resolve(ActionRef())  # the conftest's stand-in for github.com/dl-gate/dl-gate, tag v0
    assert pinned.sha == os.environ["DL_GATE_TEST_ACTION_SHA"] and pinned.uses().endswith("  # v0")
    offline = resolve(ActionRef(), url=str(tmp_path / "nowhere"))
    assert offline.sha is None and offline.uses().startswith("dl-gate/dl-gate@v0  # zizmor: ignore[unpinned-uses] not pinned")
    assert parse_action("acme/dl-gate@v2") == ActionRef("acme/dl-gate", "v2")
    with pytest.raises(Exception, match="OWNER/REPO"):
        parse_action("dl-gate")


def test_init_writes_workflows_that_actionlint_accepts(inited):
    repo, rep = inited
    assert sorted(rep.workflows) == [".github/workflows/dl-gate-baselines.yml", ".github/workflows/dl-gate-comment.yml",
                                     ".github/workflows/dl-gate-fork.yml", ".github/workflows/dl-gate.yml"]
    bin_dir = Path(sys.executable).parent
    actionlint = bin_dir / "actionlint" if (bin_dir / "actionlint").exists() else shutil.which("actionlint")
    if not actionlint:
        pytest.fail("actionlint not found: install the test extra")
    shellcheck = bin_dir / "shellcheck" if (bin_dir / "shellcheck").exists() else shutil.which("shellcheck")
    res = subprocess.run([str(actionlint), "-color=false", "-shellcheck", str(shellcheck or "")], cwd=repo,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    zizmor = bin_dir / "zizmor" if (bin_dir / "zizmor").exists() else shutil.which("zizmor")
    res = subprocess.run([str(zizmor), "--offline", "--format", "plain", "--no-progress", ".github/workflows"],
                         cwd=repo, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    # one adoption path: the Action pinned by the commit of its major tag, the library installed by
    # the detected command, the sticky comment on (its default)
    gate = yaml.safe_load((repo / ".github/workflows/dl-gate.yml").read_text())
    (step,) = [s for s in gate["jobs"]["gate"]["steps"] if str(s.get("uses", "")).startswith("dl-gate/dl-gate@")]
    assert step["uses"] == f"dl-gate/dl-gate@{os.environ['DL_GATE_TEST_ACTION_SHA']}"
    assert step["with"] == {"config": ".dl-gate.yml"}  # focallib has no build: python_path finds it, nothing to install
    assert gate["jobs"]["gate"]["permissions"]["pull-requests"] == "write"
    text = (repo / ".github/workflows/dl-gate.yml").read_text()
    assert f"@{os.environ['DL_GATE_TEST_ACTION_SHA']}  # v0" in text and "pip install dl-gate" not in text


def test_rerun_keeps_the_users_edits_adds_new_operators_and_reports_removed_ones(inited, tmp_path):
    src, _ = inited
    repo = tmp_path / "again"
    shutil.copytree(src, repo)
    cfg = repo / ".dl-gate.yml"
    text = cfg.read_text()
    # the user narrows a row and comments it
    text = text.replace("  - name: focallib.Softplus\n",
                        "  # mine: keep it at float32\n  - name: focallib.Softplus\n    dtypes: [float32]\n")
    text = text.replace("budget: {total: 120", "budget: {total: 77")
    # ... and deletes one row, keeping it out for good
    start = text.index("  # focallib.BinaryFocalLossWithLogits:")
    end = text.index("\n  # ", start + 5) if "\n  # " in text[start + 5:] else text.index("\n\n#", start)
    text = text[:start] + "  # dl-gate init: skip focallib.BinaryFocalLossWithLogits\n" + text[end + 1:]
    cfg.write_text(text)
    # the library gains an operator and loses one
    extra = repo / "focallib" / "extra.py"
    extra.write_text(extra.read_text().replace("def rgb_to_gray(image):", "def rgb_to_grey(image):")
                     + "\n\ndef log1p_exp(x):\n    return torch.log1p(torch.exp(x))\n")
    rep = run_init(repo, probe_timeout=20, no_tests=True)
    after = cfg.read_text()
    assert "# mine: keep it at float32" in after and "budget: {total: 77" in after
    cfg_obj = parse_config(after, cfg, repo)
    ops = {o.name: o for o in cfg_obj.ops}
    assert ops["focallib.Softplus"].dtypes == ("float32",)
    assert set(rep.added) == {"focallib.log1p_exp", "focallib.rgb_to_grey"}, rep.added
    assert "focallib.binary_focal_loss_with_logits" in rep.kept
    assert rep.removed == ["focallib.rgb_to_gray"]
    assert "focallib.BinaryFocalLossWithLogits" not in ops
    assert "skip" in dict(rep.left_out)["focallib.BinaryFocalLossWithLogits"]
    assert after.index("focallib.Softplus") < after.index("focallib.log1p_exp")
    assert rep.workflows == []  # present already: never rewritten


def test_a_package_that_reads_its_own_version_gets_a_one_line_hint(tmp_path):
    repo = make_lib(tmp_path, init_extra="import importlib.metadata\n"
                                          "__version__ = importlib.metadata.version('focallib-not-installed')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "gate.cli", "init", "--no-tests"], cwd=repo, capture_output=True,
                         text=True, env=env, timeout=300)
    assert res.returncode == 2, res.stderr
    err = [line for line in res.stderr.splitlines() if line.startswith("dl-gate: error")]
    assert len(err) == 1 and "Traceback" not in res.stderr
    assert "reads its own installed version" in err[0] and "pip install --no-deps -e ." in err[0]
    assert not (repo / ".dl-gate.yml").exists()


def test_a_missing_declared_dependency_is_named_in_one_line(tmp_path):
    repo = make_lib(tmp_path, init_extra="import einops_not_installed_anywhere\n")
    (repo / "pyproject.toml").write_text('[project]\nname = "focallib"\nversion = "0.1"\n'
                                         'dependencies = ["torch", "einops_not_installed_anywhere>=0.3"]\n')
    with pytest.raises(SetupError) as exc:
        run_init(repo, no_tests=True)
    msg = str(exc.value)
    assert "\n" not in msg and "einops_not_installed_anywhere is a declared dependency" in msg


def test_a_package_whose_only_module_does_not_parse_says_which_file(tmp_path):
    repo = tmp_path / "repo"
    (repo / "vqlib").mkdir(parents=True)
    (repo / "vqlib" / "__init__.py").write_text("from .vq import *\n")
    (repo / "vqlib" / "vq.py").write_text("import torch\n\ndef cdist(x, y):\n  a = x\n    return a\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    with pytest.raises(SetupError) as exc:
        run_init(repo, no_tests=True, workflows=False)
    assert "\n" not in str(exc.value) and "vqlib/vq.py does not parse" in str(exc.value), str(exc.value)


def test_no_package_and_an_unknown_package_are_one_line_errors(tmp_path):
    with pytest.raises(SetupError, match="no Python package"):
        run_init(tmp_path)
    repo = make_lib(tmp_path)
    with pytest.raises(SetupError, match="--package nolib"):
        run_init(repo, package="nolib")


def test_a_private_operator_is_taken_when_named(tmp_path):
    # torchmetrics' LPIPS: the operator a PR changes is `_normalize_tensor` in a public module
    repo = write_files(tmp_path / "repo", {
        "imgmetrics/__init__.py": '"""Image metrics."""\n',
        "imgmetrics/lpips.py": "import torch\n\n\ndef _normalize_tensor(in_feat, eps: float = 1e-8):\n"
                               "    norm_factor = torch.sqrt(eps + torch.sum(in_feat**2, dim=1, keepdim=True))\n"
                               "    return in_feat / norm_factor\n",
        "tests/test_lpips.py":
            "import torch\nfrom imgmetrics.lpips import _normalize_tensor\n\n\ndef test_unit_norm():\n"
            "    x = torch.randn(2, 4, 3, 3)\n"
            "    assert torch.allclose(_normalize_tensor(x).pow(2).sum(1), torch.ones(2, 3, 3), atol=1e-5)\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "imgmetrics")
    with pytest.raises(SetupError) as exc:  # not asked for: nothing public, and how to ask
        run_init(repo, no_tests=True, workflows=False)
    assert "\n" not in str(exc.value) and "--ops imgmetrics.module._name" in str(exc.value)
    for name in ("imgmetrics.lpips._normalize_tensor", "_normalize_tensor"):
        (repo / ".dl-gate.yml").unlink(missing_ok=True)
        rep = run_init(repo, only=[name], workflows=False, probe_timeout=20)
        cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
        (op,) = cfg.ops
        assert op.callable == "imgmetrics.lpips:_normalize_tensor", name
        assert [list(drawn_shape(op, t)) for t in op.inputs] == [[2, 4, 3, 3]]  # from the test's call
    with pytest.raises(SetupError, match="defines none of imgmetrics.lpips._nope"):
        run_init(repo, only=["imgmetrics.lpips._nope"], workflows=False)


# -- inference from records (no process, no framework) ---------------------------------------
def _op(params, kind="function"):
    return Operator(name="lib.f", module="lib.m", qualname="f", kind=kind, file="lib/m.py", line=1,
                    params=[{"name": n, "kind": "POSITIONAL_OR_KEYWORD", "has_default": d is not None, "default": d,
                             "annotation": None} for n, d in params])


def test_a_layer_row_keeps_its_mixed_policy_mode_only_where_it_runs():
    from gate.init import MIXED_MODES, _finish, _with_modes

    op = _op([("x", None)], kind="layer")
    cand = _with_modes({"name": "lib.f", "callable": "lib.m:f", "kind": "composite", "sources": ["lib/m.py"],
                        "inputs": [{"name": "x", "shape": [4]}]}, MIXED_MODES)
    ok = ["ok", None]
    runs = {f"{d}/cpu/{m}": ok for d in ("float16", "bfloat16", "float32") for m in ("input", "operator")
            if not (m == "operator" and d == "float32")}
    spec, note = _finish(op, {"chosen": 0, "variants": runs}, [cand], "from 1 test call(s)")
    assert spec["modes"] == ["input", "operator"] and "mixed" not in note, (spec, note)
    # a mixed policy that fails at one dtype: mode operator off, and the row says why
    fails = dict(runs, **{"bfloat16/cpu/operator": ["crash", "TypeError: bfloat16 and float32"]})
    spec, note = _finish(op, {"chosen": 0, "variants": fails}, [cand], "from 1 test call(s)")
    assert "modes" not in spec and "mixed-precision policy (mode operator) off (TypeError" in note, (spec, note)
    # a dtype dropped in mode input does not count against the policy; no 16-bit dtype: no policy, no note
    drop16 = dict(fails, **{"bfloat16/cpu/input": ["crash", "no bfloat16 kernel"]})
    spec, note = _finish(op, {"chosen": 0, "variants": drop16}, [cand], "from 1 test call(s)")
    assert spec["modes"] == ["input", "operator"] and spec["dtypes"] == ["float16", "float32"], (spec, note)
    only32 = {k: (v if k.startswith("float32") else ["crash", "no kernel"]) for k, v in runs.items()}
    spec, note = _finish(op, {"chosen": 0, "variants": only32}, [cand], "from 1 test call(s)")
    assert "modes" not in spec and "mixed" not in note, (spec, note)


def test_records_give_shared_dims_tied_params_and_index_inputs():
    import numpy as np

    op = _op([("x", None), ("target", None), ("num_classes", None), ("eps", 1e-6), ("fn", None)])
    recs = []
    for n, c in ((2, 5), (4, 7), (3, 5)):
        recs.append(CallRecord(op="lib.f", args=[TensorArg((n, c), "float32", np.random.rand(n, c) * 8 - 4),
                                                 TensorArg((n,), "int64", np.arange(n) % c)],
                               kwargs={"num_classes": c, "eps": 1e-6, "fn": 3}))
    inf = from_records(op, recs, "torch", ["lib/m.py"])
    spec = inf.spec
    assert spec["inputs"][0]["shape"] == ["N", "C"] and spec["inputs"][1]["shape"] == ["N"]
    assert spec["dims"] == {"N": [2, 4], "C": [5, 7]}
    assert spec["inputs"][1]["kind"] == "index" and spec["inputs"][1]["index_hi"] == 2
    assert spec["params"]["num_classes"] == {"expr": "C"} and spec["params"]["eps"] == 1e-6
    assert spec["inputs"][0]["domain"]["name"] == "real"
    # an object argument without a default: not replayable, said so
    op2 = _op([("x", None), ("fn", None)])
    bad = [CallRecord(op="lib.f", args=[TensorArg((2,), "float32", np.ones(2)), Opaque("function")], kwargs={})]
    assert from_records(op2, bad, "torch", []).spec is None


def test_parameter_values_come_from_every_test_call_not_only_the_replayed_signature():
    # MONAI's focal-loss tests: one call on a 4-D batch with gamma=0, one on a hand-written row
    # with gamma=2 and alpha=0.25; the row's tensors are not replayed, its settings are
    import numpy as np

    op = _op([("input", None), ("target", None), ("gamma", 2.0), ("alpha", None)])
    op.params[-1]["has_default"] = True  # alpha: Optional[float] = None
    big = CallRecord(op="lib.f", args=[TensorArg((2, 3, 8, 8), "float32", np.random.randn(2, 3, 8, 8) * 4),
                                       TensorArg((2, 3, 8, 8), "float32", (np.random.rand(2, 3, 8, 8) > 0.5) * 1.0)],
                     kwargs={"gamma": 0.0})
    row = CallRecord(op="lib.f", args=[TensorArg((1, 3), "float32", np.array([[10.0, -10.0, 0.5]])),
                                       TensorArg((1, 3), "float32", np.array([[1.0, 0.0, 1.0]]))],
                     kwargs={"gamma": 2.0, "alpha": 0.25})
    spec = from_records(op, [big, row], "torch", ["lib/m.py"]).spec
    assert spec["inputs"][0]["shape"] == [2, 3, 8, 8]  # the replayed signature: the batch
    assert sorted(spec["params"]["gamma"]["choices"]) == [0.0, 2.0]
    assert set(spec["params"]["alpha"]["choices"]) == {0.25, None}  # absent in one call: its default
    # a size is a setting only of the calls it was measured with: tied to their dim, not widened
    op2 = _op([("x", None), ("n", None)])
    recs = [CallRecord(op="lib.f", args=[TensorArg((k, 4), "float32", np.ones((k, 4)))], kwargs={"n": k}) for k in (2, 5)]
    recs.append(CallRecord(op="lib.f", args=[TensorArg((9,), "float32", np.ones(9))], kwargs={"n": 9}))
    assert from_records(op2, recs, "torch", []).spec["params"]["n"] == {"expr": "N"}
    # an argument that is a replayed tensor never becomes a parameter, nor a tensor of another
    # signature a parameter value
    op3 = _op([("x", None), ("w", None)])
    op3.params[-1]["has_default"] = True
    recs = [CallRecord(op="lib.f", args=[TensorArg((2, 3), "float32", np.ones((2, 3))), TensorArg((3,), "float32", np.ones(3))],
                       kwargs={}),
            CallRecord(op="lib.f", args=[TensorArg((2, 3), "float32", np.ones((2, 3))), TensorArg((3,), "float32", np.ones(3))],
                       kwargs={}),
            CallRecord(op="lib.f", args=[TensorArg((4,), "float32", np.ones(4))], kwargs={"w": 0.5})]
    spec = from_records(op3, recs, "torch", []).spec
    assert [t["name"] for t in spec["inputs"]] == ["x", "w"] and "w" not in spec.get("params", {}), spec
    recs = [CallRecord(op="lib.f", args=[TensorArg((2, 3), "float32", np.ones((2, 3)))], kwargs={"w": 0.5}),
            CallRecord(op="lib.f", args=[TensorArg((2, 3), "float32", np.ones((2, 3)))], kwargs={"w": 0.25}),
            CallRecord(op="lib.f", args=[TensorArg((4,), "float32", np.ones(4)), TensorArg((4,), "float32", np.ones(4))],
                       kwargs={})]
    assert sorted(from_records(op3, recs, "torch", []).spec["params"]["w"]["choices"], key=str) == [0.25, 0.5]


def test_module_records_drop_self_and_tests_range_is_widened():
    import numpy as np

    op = _op([("input", None)], kind="module")
    rec = CallRecord(op="lib.f", args=[Opaque("Module"), TensorArg((2, 3), "float32", np.random.rand(2, 3))], kwargs={})
    spec = from_records(op, [rec], "torch", []).spec
    assert spec["inputs"] == [{"name": "input", "shape": [2, 3], "domain": "prob"}]
    assert widen(spec)["inputs"] == [{"name": "input", "shape": [2, 3]}]


def test_labels_the_tests_pass_as_zeros_and_ones_stay_in_zero_one():
    # fvcore's focal loss (acceptance run, fvcore bfff2ef): the tests pass targets of 0 and 1;
    # opened to real values the search drew targets of -65504 and 5e17, every loss overflowed on
    # both sides, and the upcast fix read as a 3e7-ulp regression. Logits drawn by torch.rand still open
    import numpy as np

    op = _op([("inputs", None), ("targets", None)])
    labels = np.array([[1.0, 0.0, 1.0, 1.0]])
    recs = [CallRecord(op="lib.f", args=[TensorArg((1, 4), "float32", np.random.rand(1, 4)),
                                        TensorArg((1, 4), "float32", labels)], kwargs={})]
    spec = from_records(op, recs, "torch", []).spec
    assert spec["inputs"][1]["domain"] == {"name": "prob", "lo": 0.0, "hi": 1.0}, spec["inputs"]
    wide = widen(spec)
    assert "domain" not in wide["inputs"][0] and wide["inputs"][1] == spec["inputs"][1], wide["inputs"]


def test_soft_labels_drawn_in_zero_one_stay_there_logits_drawn_so_open():
    # kornia's binary focal loss (acceptance run, kornia b8f341163): its tests draw the target
    # with torch.rand, so it never reached 0 or 1 exactly; opened to real values the search
    # asked the loss about a target of -2.0. A target (or label, mask) in [0, 1] stays there;
    # the logits drawn the same way are opened
    import numpy as np

    op = _op([("input", None), ("target", None)])
    recs = [CallRecord(op="lib.f", args=[TensorArg((2, 4), "float32", np.random.rand(2, 4) * 0.9 + 0.05),
                                        TensorArg((2, 4), "float32", np.random.rand(2, 4) * 0.9 + 0.05)], kwargs={})]
    spec = from_records(op, recs, "torch", []).spec
    assert [t.get("domain") for t in spec["inputs"]] == ["prob", "prob"], spec["inputs"]
    wide = widen(spec)
    assert "domain" not in wide["inputs"][0] and wide["inputs"][1]["domain"] == "prob", wide["inputs"]


def test_a_probability_drawn_in_zero_one_stays_there():
    # tensorflow/recommenders 406f8e1: SamplingProbablityCorrection(logits, candidate_sampling_probability)
    # clips the probability into [1e-6, 1] before its log; opened to real values, the search asked
    # about probabilities of 7 and the fix read as a behaviour change. The logits open as before
    import numpy as np

    for name in ("candidate_sampling_probability", "probs", "keep_prob", "class_probabilities"):
        op = _op([("logits", None), (name, None)])
        recs = [CallRecord(op="lib.f", args=[TensorArg((2, 4), "float32", np.random.rand(2, 4) * 0.9 + 0.05),
                                            TensorArg((4,), "float32", np.random.rand(4) * 0.9 + 0.05)], kwargs={})]
        wide = widen(from_records(op, recs, "torch", []).spec)
        assert "domain" not in wide["inputs"][0] and wide["inputs"][1]["domain"] == "prob", (name, wide["inputs"])
    op = _op([("logits", None), ("problem", None)])  # a word that only starts like one opens
    recs = [CallRecord(op="lib.f", args=[TensorArg((4,), "float32", np.random.rand(4)),
                                        TensorArg((4,), "float32", np.random.rand(4))], kwargs={})]
    assert all("domain" not in t for t in widen(from_records(op, recs, "torch", []).spec)["inputs"])


def test_sample_and_class_weights_stay_non_negative_a_layers_weight_opens():
    # tensorflow/model-remediation's MMDLoss(membership, predictions, sample_weight): opened to real
    # values every widened spec was rejected ("`sample_weight` cannot contain any negative
    # weights"); a layer's `weight` is any real matrix and opens as before
    import numpy as np

    # weights above 1 among them: four weights all at most 1 read as probabilities (`prob`)
    rng = np.random.default_rng(0)
    predictions = rng.random((4, 1)) + 0.1
    weights = np.array([[0.4], [2.5], [1.2], [3.0]])
    for name in ("sample_weight", "class_weights", "pos_weight"):
        op = _op([("predictions", None), (name, None)])
        recs = [CallRecord(op="lib.f", args=[TensorArg((4, 1), "float32", predictions),
                                            TensorArg((4, 1), "float32", weights)], kwargs={})]
        wide = widen(from_records(op, recs, "torch", []).spec)
        assert "domain" not in wide["inputs"][0] and wide["inputs"][1]["domain"] == "nonneg", (name, wide["inputs"])
    op = _op([("input", None), ("weight", None)])
    recs = [CallRecord(op="lib.f", args=[TensorArg((4, 3), "float32", rng.random((4, 3)) + 0.1),
                                        TensorArg((2, 3), "float32", rng.random((2, 3)) * 3 + 0.1)], kwargs={})]
    assert all("domain" not in t for t in widen(from_records(op, recs, "torch", []).spec)["inputs"])


def test_a_class_with_defaults_is_built_as_the_tests_built_it():
    # keras' GroupNormalization (acceptance run on keras-team/keras d863dc8a5b): its constructor
    # has defaults only (groups=32); the tests build it as GroupNormalization(groups=4,
    # gamma_constraint=UnitNorm()) and call it on 4 channels. Built with the defaults, every
    # recorded call raised ("Number of groups (32) cannot be more than the number of channels")
    # and init left it out; the constraint object is a training-time setting with a default
    import numpy as np

    from gate.init.infer import bind_init, constructed

    op = _op([("inputs", None)], kind="layer")
    op.init = [{"name": "groups", "kind": "POSITIONAL_OR_KEYWORD", "has_default": True, "default": 32},
               {"name": "gamma_constraint", "kind": "POSITIONAL_OR_KEYWORD", "has_default": True, "default": None}]
    init = CallRecord(op="lib.f", args=[], kwargs={"groups": 4, "gamma_constraint": Opaque("UnitNorm")},
                      kind="init", ctor="c1")
    call = CallRecord(op="lib.f", args=[Opaque("Layer"), TensorArg((3, 4, 4), "float32", np.ones((3, 4, 4)))],
                      kwargs={}, ctor="c1")
    assert bind_init(op, init) == ({"groups": 4}, "")
    built, mine, why = constructed(op, [init, call])
    assert built == {"groups": 4} and mine == [call], why
    # an object for a required argument still cannot be written down (SpectralNormalization(layer=...))
    needs_layer = _op([("inputs", None)], kind="layer")
    needs_layer.init = [{"name": "layer", "kind": "POSITIONAL_OR_KEYWORD", "has_default": False, "default": None}]
    wrapped = CallRecord(op="lib.f", args=[], kwargs={"layer": Opaque("Dense")}, kind="init", ctor="c2")
    kw, why = bind_init(needs_layer, wrapped)
    assert kw is None and "object (layer=" in why, why


def test_probe_specs_and_their_refusals():
    specs, _ = probe_specs(_op([("a", None), ("b", None), ("alpha", 0.5)]), "torch", [])
    assert specs and all([t["name"] for t in s["inputs"]] == ["a", "b"] for s in specs)
    assert {len(s["inputs"][0]["shape"]) for s in specs} == {1, 2, 3, 4}
    op = _op([("x", None), ("k", None)])
    op.params[1]["annotation"] = "int"
    assert tensor_params(op)[0] is None and "k: int" in tensor_params(op)[1]
    assert tensor_params(_op([("x", None), ("path", None)]))[0] is None


# -- init, then the gate, on the real fix ------------------------------------------------------
def _cli(repo, *args, timeout=900):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gate.cli", *args], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=timeout)


def _refresh_and_pr(repo: Path, evals: int, path: Path, text: str, message: str) -> None:
    """What a user does after `dl-gate init`: commit the config, record and commit the baselines
    (pushed to the repository's origin, as the PR's checkout sees them), then a PR branch that
    writes ``text`` to ``path``."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "dl-gate init")
    res = _cli(repo, "baseline", "refresh", "--evals", str(evals))
    assert res.returncode == 0, res.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "baselines")
    origin = repo.parent / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main")
    git(repo, "fetch", "-q", "origin")
    git(repo, "checkout", "-q", "-b", "pr")
    path.write_text(text)
    git(repo, "commit", "-q", "-am", message)


def _refresh_then_run_pr(repo: Path, out: Path, evals: int, path: Path, text: str, message: str):
    """:func:`_refresh_and_pr`, then the gate on the PR as the CLI runs it."""
    _refresh_and_pr(repo, evals, path, text, message)
    return _cli(repo, "run", "--base", "main", "--evals", str(evals), "--out", str(out))


def _set_evals(repo: Path, evals: int) -> None:
    """A deterministic budget in the config init wrote (a user's choice; tests never time)."""
    cfg = repo / ".dl-gate.yml"
    data = yaml.safe_load(cfg.read_text())
    data.setdefault("budget", {})["evals"] = evals
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.slow
@pytest.mark.parametrize("base_fixed", [True, False])
def test_init_then_refresh_then_run_fails_on_the_revert_and_passes_on_the_fix(tmp_path, base_fixed):
    """Issue 28's bed and issue 29's acceptance: a user's repository, `dl-gate init`, `baseline
    refresh`, then the pull request gated by the workflow init wrote, its Action step run as a
    runner runs it (inputs from the step, the install command, the event, a fake GitHub API); on
    the revert, the sticky comment, the job summary and the JUnit file that come out, then the
    fork pair's comment job posting the same report."""
    from tests.github_fake import FakeGitHub
    from tests.helpers.runner import action_step, load_workflow, run_step

    repo = make_lib(tmp_path, fixed=base_fixed)
    (repo / "requirements.txt").write_text("numpy\n")  # the library's declared dependencies
    # the function, and kornia's class whose constructor needs alpha (built as the tests build it)
    res = _cli(repo, "init", "--ops", "focallib.binary_focal_loss_with_logits", "--ops", "focallib.BinaryFocalLossWithLogits")
    assert res.returncode == 0, res.stderr
    assert "construct: {alpha: 0.25}" in (repo / ".dl-gate.yml").read_text()
    gate_wf = load_workflow(repo / ".github/workflows/dl-gate.yml")
    step = action_step(gate_wf, "gate")
    assert step["with"] == {"config": ".dl-gate.yml", "install": "pip install -r requirements.txt"}
    _set_evals(repo, 40)
    focal = repo / "focallib" / "focal.py"
    old, new = (FIXED, BROKEN) if base_fixed else (BROKEN, FIXED)
    before = focal.read_text()
    _refresh_and_pr(repo, 40, focal, before.replace(old, new), "revert the fix" if base_fixed else "the fix")
    changed = {i for i, (a, b) in enumerate(zip(before.splitlines(), focal.read_text().splitlines()), 1) if a != b}
    head = git(repo, "rev-parse", "HEAD").strip()
    event = {"number": 7, "pull_request": {"number": 7, "head": {"sha": head}, "base": {"ref": "main", "sha": "a" * 40}}}
    with FakeGitHub() as fake:
        fake.add_pull(7, head, owner="acme", branch="pr")
        res, out, summary = run_step(step, repo, tmp_path / "job", api=fake.url, event_name="pull_request", event=event)
        want = 1 if base_fixed else 0
        assert res.returncode == want, res.stdout[-3000:] + res.stderr[-3000:]
        assert "dl-gate action: install: pip install -r requirements.txt" in res.stderr
        if not base_fixed:
            assert out["outcome"] == "pass"
            return
        import json

        from junitparser import JUnitXml

        report = json.loads((repo / "dl-gate-out" / "report.json").read_text())
        failed = {v["op"] for v in report["verdicts"] if v["outcome"] == "regression"}
        # the class's second row (built as the tests also build it, reduction='mean') fails too
        assert failed == {"focallib.binary_focal_loss_with_logits", "focallib.BinaryFocalLossWithLogits",
                          "focallib.BinaryFocalLossWithLogits(reduction='mean')"}, failed
        assert out["outcome"] == "regression" and out["comment-action"] == "created"
        # the comment: one root cause at the changed line, the next step with this run's artifact
        (comment,) = fake.comments[7]
        body = comment["body"]
        import re

        causes = {int(n) for n in re.findall(r"^\*\*\d+\. \[focallib/focal\.py:(\d+)\]", body, re.M)}
        assert causes and causes <= changed and f"traced to {len(causes)} changed line" in body, (changed, body)
        assert "gh run download 4242 -R acme/ops -n dl-gate-report -D dl-gate-out" in body
        assert "dl-gate explain 'dl-gate-out/report.json#focallib." in body and "python dl-gate-out/repro/" in body
        # the job summary starts with the same cause; the JUnit file points reporters at the changed line
        assert summary.startswith("## ❌ dl-gate: **regression**") and f"focallib/focal.py:{min(causes)}" in summary
        cases = [c for s in JUnitXml.fromfile(str(repo / "dl-gate-out" / "junit.xml")) for c in s if c.result
                 and c.result[0]._tag == "failure"]
        assert cases and {c._elem.get("file") for c in cases} == {"focallib/focal.py"}
        assert {int(c._elem.get("line")) for c in cases} == causes
        # the fork pair: the comment job downloads the report into an empty workspace and publishes it
        ws = tmp_path / "comment-ws"
        (ws / "dl-gate-artifact").mkdir(parents=True)
        (ws / "dl-gate-artifact" / "report.json").write_text((repo / "dl-gate-out" / "report.json").read_text())
        fake.add_pull(8, head, owner="forker", branch="feature")
        run_event = {"workflow_run": {"id": 4243, "run_attempt": 1, "event": "pull_request", "head_sha": head,
                                      "head_branch": "feature", "pull_requests": [],
                                      "head_repository": {"full_name": "forker/ops", "owner": {"login": "forker"}}}}
        comment_step = action_step(load_workflow(repo / ".github/workflows/dl-gate-comment.yml"), "comment")
        res, out, _ = run_step(comment_step, ws, tmp_path / "comment-job", api=fake.url, event_name="workflow_run",
                               event=run_event, run_id=4250)
        assert res.returncode == 0 and out["comment-action"] == "created", res.stdout[-2000:] + res.stderr[-2000:]
        assert f"traced to {len(causes)} changed line" in fake.comments[8][0]["body"]
        assert "::error file=" not in res.stdout  # the fork run's annotations are not repeated here


@pytest.mark.tf
def test_init_on_a_keras_library(tmp_path):
    """A Keras library whose layer's constructor takes an argument, built by its own test: init
    records the construction from the test run (Keras builds a layer's config from
    ``getfullargspec(cls.__init__)``: the recorder's wrapper made every construction raise
    ``KeyError: 'args'``, so the tests recorded nothing and the layer was left out)."""
    pytest.importorskip("tensorflow")
    repo = tmp_path / "tfrepo"
    (repo / "tfops").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "tfops" / "__init__.py").write_text("from .ops import *  # noqa\n")
    (repo / "tfops" / "ops.py").write_text(textwrap.dedent('''
        import tensorflow as tf
        import keras
        from keras import ops


        def softplus_safe(x):
            return tf.nn.softplus(x)


        class Swish(tf.keras.layers.Layer):
            def call(self, inputs):
                return inputs * tf.sigmoid(inputs)


        class ScaledSwish(keras.layers.Layer):
            def __init__(self, beta, **kwargs):
                super().__init__(**kwargs)
                self.beta = beta

            def call(self, x):
                return x * ops.sigmoid(self.beta * x)


        class FocalLoss(keras.losses.Loss):
            def __init__(self, gamma, **kwargs):
                super().__init__(**kwargs)
                self.gamma = gamma

            def call(self, y_true, y_pred):
                p_t = y_true * ops.sigmoid(y_pred) + (1 - y_true) * ops.sigmoid(-y_pred)
                return -((1 - p_t) ** self.gamma) * ops.log(p_t + 1e-7)


        class Correction(tf.keras.layers.Layer):  # TFRS's SamplingProbablityCorrection: __call__ overridden
            def __call__(self, logits, sampling_probability):
                return logits - tf.math.log(tf.clip_by_value(sampling_probability, 1e-6, 1.0))


        class HardNegatives(tf.keras.layers.Layer):  # TFRS's HardNegativeMining: no **kwargs, no dtype=
            def __init__(self, scale):
                super().__init__()
                self._scale = scale

            def call(self, logits):
                return tf.nn.softplus(logits * self._scale)
        '''))
    (repo / "tests" / "test_ops.py").write_text(textwrap.dedent('''
        import numpy as np
        from tfops import Correction, FocalLoss, HardNegatives, ScaledSwish


        def test_scaled_swish():
            x = np.linspace(-3, 3, 12, dtype="float32").reshape(3, 4)
            assert ScaledSwish(beta=1.5)(x).shape == (3, 4)


        def test_focal_loss():
            y = np.array([[0.0, 1.0, 1.0, 0.0]], dtype="float32")
            assert float(FocalLoss(gamma=2.0)(y, np.linspace(-2, 2, 4, dtype="float32")[None])) > 0


        def test_correction():
            logits = np.linspace(-2, 2, 12, dtype="float32").reshape(3, 4)
            assert Correction()(logits, np.full((3, 4), 0.25, dtype="float32")).shape == (3, 4)


        def test_hard_negatives():
            assert HardNegatives(scale=2.0)(np.linspace(-2, 2, 8, dtype="float32").reshape(2, 4)).shape == (2, 4)
        '''))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, probe_timeout=30)
    cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
    assert cfg.raw["framework"] == "tensorflow"
    kinds = {name: kind for name, kind, _ in rep.found}
    # a layer that overrides __call__ is called and recorded through it; one whose constructor
    # takes no dtype= is given its dtype policy after it is built (TFRS, acceptance run 406f8e1)
    assert kinds == {"tfops.softplus_safe": "function", "tfops.Swish": "layer", "tfops.ScaledSwish": "layer",
                     "tfops.FocalLoss": "layer", "tfops.Correction": "layer", "tfops.HardNegatives": "layer"}, \
        rep.left_out
    corr = next(o for o in cfg.ops if o.name == "tfops.Correction")
    assert [t.name for t in corr.inputs] == ["logits", "sampling_probability"], corr.inputs
    hard = next(o for o in cfg.ops if o.name == "tfops.HardNegatives")
    assert dict(hard.construct) == {"scale": 2.0} and "float16" in hard.dtypes, (hard.construct, hard.dtypes)
    assert all(o.framework == "tensorflow" for o in cfg.ops)
    scaled = next(o for o in cfg.ops if o.name == "tfops.ScaledSwish")
    assert dict(scaled.construct) == {"beta": 1.5}, scaled.construct
    # a layer class is gated under Keras's mixed-precision policies too (mode operator: built with
    # dtype="mixed_float16", float32 inputs); a function keeps mode input
    modes = {o.name: o.modes for o in cfg.ops if o.name not in ("tfops.Correction", "tfops.HardNegatives")}
    assert modes == {"tfops.softplus_safe": ("input",), "tfops.Swish": ("input", "operator"),
                     "tfops.ScaledSwish": ("input", "operator"), "tfops.FocalLoss": ("input",)}, modes
    # a Keras Loss class is built as its test builds it, and its 0/1 labels stay labels
    focal = next(o for o in cfg.ops if o.name == "tfops.FocalLoss")
    assert dict(focal.construct) == {"gamma": 2.0}, focal.construct
    assert focal.inputs[0].domain.name == "prob", focal.inputs
    # the Action's image holds torch only: a TensorFlow library's install step brings TensorFlow first
    assert "install: \"pip install 'tensorflow-cpu==2.21.*'" in (repo / ".github/workflows/dl-gate.yml").read_text()


def test_an_operator_that_exits_hangs_or_kills_its_process_costs_only_itself(tmp_path):
    repo = tmp_path / "wild"
    (repo / "wildlib").mkdir(parents=True)
    (repo / "wildlib" / "__init__.py").write_text(textwrap.dedent('''
        import os
        import sys


        def doubled(x):
            return x * 2


        def exits(x):
            os._exit(3)


        def spins(x):
            while True:
                pass


        def quits(x):
            sys.exit("no")


        def halved(x):
            return x / 2
        '''))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, no_tests=True, probe_timeout=2)
    assert {n for n, _, _ in rep.found} == {"wildlib.doubled", "wildlib.halved"}
    left = dict(rep.left_out)
    assert "died (exit 3)" in left["wildlib.exits"]
    assert "no answer within 2s" in left["wildlib.spins"]
    assert "sys.exit" in left["wildlib.quits"]


def test_a_src_layout_package_is_found_from_its_project_name(tmp_path):
    repo = tmp_path / "srcrepo"
    (repo / "src" / "my_ops").mkdir(parents=True)
    (repo / "src" / "my_ops" / "__init__.py").write_text("import torch\n\n\ndef log1p_exp(x):\n"
                                                         "    return torch.log1p(torch.exp(x))\n")
    (repo / "tools").mkdir()
    (repo / "tools" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text('[project]\nname = "my-ops"\nversion = "0.1"\n')
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, no_tests=True, workflows=False, probe_timeout=20)
    cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
    assert rep.package == "my_ops" and cfg.raw["python_path"] == ["src"]
    assert [o.sources for o in cfg.ops] == [("src/my_ops/__init__.py",)]
    assert not (repo / ".github").exists()


def test_a_namespace_package_is_found_where_no_regular_package_is(tmp_path):
    # deel-lip: its package is deel/lip, `deel` a PEP 420 namespace (no __init__.py); init stopped
    # with "no Python package" on both directions of its acceptance run
    repo = tmp_path / "nsrepo"
    (repo / "deel" / "lip").mkdir(parents=True)
    (repo / "deel" / "lip" / "__init__.py").write_text("import torch\n\n\ndef log1p_exp(x):\n"
                                                       "    return torch.log1p(torch.exp(x))\n")
    (repo / "deel" / "notes").mkdir()  # a folder of no package beside it
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, no_tests=True, workflows=False, probe_timeout=20)
    cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
    assert rep.package == "deel.lip" and [o.callable for o in cfg.ops] == ["deel.lip:log1p_exp"], cfg.ops
    assert [o.sources for o in cfg.ops] == [("deel/lip/__init__.py",)]
    (repo / ".dl-gate.yml").unlink()
    rep = run_init(repo, package="deel.lip", no_tests=True, workflows=False, probe_timeout=20)
    assert rep.package == "deel.lip"


def test_floats_init_writes_are_floats_to_the_gate_s_own_yaml_reader(tmp_path):
    """Seen on a real library: init wrote ``epsilon: 1e-07`` (ruamel, YAML 1.2), which PyYAML
    (YAML 1.1, what refresh and run read) takes for a string, and every variant of the next
    refresh failed ("'<=' not supported between Tensor and str")."""
    import math

    from gate.init import yamlio

    values = [1e-07, 1e-5, 1.5e-12, 0.5, 1e20, -3e-300, 5e-324, 1.7976931348623157e308, 2.0, float("inf"),
              float("-inf")]
    row = {"name": "m.f", "callable": "m:f", "params": {"eps": {"choices": values}, "alpha": 1e-07}}
    doc = yamlio.new_document({"version": 1}, [(row, None)], "header", {})
    text = yamlio.dump(doc)
    back = yaml.safe_load(text)["ops"][0]["params"]
    assert back["alpha"] == 1e-07 and isinstance(back["alpha"], float), text
    assert all(isinstance(x, float) for x in back["eps"]["choices"]), text
    assert back["eps"]["choices"] == values
    assert math.isnan(yaml.safe_load("x: " + yamlio.float_text(float("nan")))["x"])
    assert yamlio.read_back_errors(text, [row]) == []
    # the check catches what the old writer produced (and anything else that does not read back)
    bad = text.replace("alpha: 1.0e-07", "alpha: 1e-07")
    assert bad != text
    assert yamlio.read_back_errors(bad, [row]) == ["ops.m.f.params: written {'eps': {'choices': "
                                                   f"{values!r}}}, 'alpha': 1e-07}}, read back "
                                                   f"{yaml.safe_load(bad)['ops'][0]['params']!r}"]
    # a float read from the user's file keeps its own spelling on the next init (round trip)
    user = tmp_path / ".dl-gate.yml"
    user.write_text("params: {eps: 1e-3, beta: 0.25}\n")
    assert yamlio.dump(yamlio.load(user)) == "params: {eps: 1e-3, beta: 0.25}\n"


def test_a_test_run_that_records_nothing_says_why_and_env_gives_its_environment(tmp_path):
    """Seen on a real library: its tests read TEST_DEVICE at collection, so without it the run
    recorded nothing and init said only "exited 1 ... 0 calls". Now the tests' own error is
    quoted with what to do; --env gives the variable, and its name goes to the config's env."""
    repo = tmp_path / "envrepo"
    (repo / "envlib").mkdir(parents=True)
    (repo / "envlib" / "__init__.py").write_text("import torch\n\n\ndef log1p_exp(x):\n"
                                                 "    return torch.log1p(torch.exp(x))\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "conftest.py").write_text("import os\n\nDEVICE = os.environ['TEST_DEVICE']\n")
    (repo / "tests" / "test_ops.py").write_text(
        "import os\n\nimport torch\n\nfrom envlib import log1p_exp\n\n\ndef test_it():\n"
        "    x = torch.linspace(-3, 3, 7, device=os.environ['TEST_DEVICE']).reshape(1, 7)\n"
        "    assert log1p_exp(x).shape == (1, 7)\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, workflows=False, probe_timeout=20)
    assert "0 distinct calls" in rep.harvest and "KeyError: 'TEST_DEVICE'" in rep.harvest, rep.harvest
    assert "--env NAME=VALUE" in rep.harvest
    (repo / ".dl-gate.yml").unlink()
    # the command says so at its end too, beside "done": the file is written from probes only
    res = _cli(repo, "init", "--no-workflows", "--probe-timeout", "20")
    assert res.returncode == 0 and "warning: the library's tests did not pass (`" in res.stdout, res.stdout[-2000:]
    (repo / ".dl-gate.yml").unlink()
    rep = run_init(repo, workflows=False, probe_timeout=20, env={"TEST_DEVICE": "cpu"})
    assert "1 distinct calls of 1 operators" in rep.harvest, rep.harvest
    cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
    assert cfg.raw["env"] == {"TEST_DEVICE": "cpu"}  # the value too: refresh and run need no export
    assert drawn_shape(cfg.ops[0], cfg.ops[0].inputs[0]) == (1, 7)  # from the recorded call, not probed


def test_when_nothing_runs_the_error_names_the_operators_the_tests_called_first(tmp_path):
    """Seen on a real library: the tests called the one operator that mattered, and init's error
    listed the first 3 of 23 reasons, none of them about it."""
    repo = tmp_path / "nothing"
    (repo / "nolib").mkdir(parents=True)
    helpers = "".join(f"\n\ndef save_{k}(x, path):\n    pass\n" for k in range(5))
    # it runs where the tests' fixture chose its backend, not in init's probe
    (repo / "nolib" / "__init__.py").write_text(
        "import os\n\nimport torch\n" + helpers + "\n\ndef fused_gelu(x):\n"
        "    if 'GELU_BACKEND' not in os.environ:\n        raise RuntimeError('no GELU backend chosen')\n"
        "    return torch.nn.functional.gelu(x)\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "conftest.py").write_text("import os\n\nos.environ.setdefault('GELU_BACKEND', 'reference')\n")
    (repo / "tests" / "test_gelu.py").write_text(
        "import torch\n\nfrom nolib import fused_gelu\n\n\ndef test_gelu():\n"
        "    assert fused_gelu(torch.ones(2, 3)).shape == (2, 3)\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    with pytest.raises(SetupError) as err:
        run_init(repo, workflows=False, probe_timeout=10)
    msg = str(err.value)
    assert "\n" not in msg and "the tests called 1 of them, first below" in msg, msg
    assert msg.index("nolib.fused_gelu") < msg.index("nolib.save_0"), msg
    assert "(+3 more: --json FILE lists every one)" in msg and "--ops NAME" in msg
    assert len(err.value.report.left_out) == 6 and not (repo / ".dl-gate.yml").exists()


def test_rows_that_do_not_run_as_read_back_from_the_file_are_left_out_not_written(tmp_path):
    """init checks the file it writes, not its rows in memory: a row that does not run as
    parsed from the text is left out (init's bug, said so), the others are written."""
    from types import SimpleNamespace

    from gate.init import InitReport, _write_config

    pkg = SimpleNamespace(name="m", python_path=".", root=tmp_path)
    rows = [({"name": f"m.{n}", "callable": f"m:{n}", "inputs": [{"name": "x", "shape": [3]}]}, f"m.{n}: probed")
            for n in ("good", "bad")]
    report = InitReport(package="m", found=[("m.good", "function", ""), ("m.bad", "function", "")])
    seen = []

    def check(text, path, names):
        seen.append(sorted(names))
        return {"m.bad": "crash: TypeError: x"} if "m.bad" in names else {}

    text, path = _write_config(tmp_path, pkg, "torch", {}, ".dl-gate.yml", rows, report, check=check)
    assert seen == [["m.bad", "m.good"], ["m.good"]]
    assert [o.name for o in parse_config(path.read_text(), path, tmp_path).ops] == ["m.good"]
    assert "does not run as read back from the file it was written to (crash: TypeError: x)" in dict(report.left_out)["m.bad"]
    assert [f[0] for f in report.found] == ["m.good"]
    # the rows read back as the spec the probe ran are not run again; any difference is
    from gate.init import same_as_probed

    spec = parse_config(path.read_text(), path, tmp_path).ops[0]
    assert same_as_probed(rows[0][0], spec, "torch")
    assert not same_as_probed(dict(rows[0][0], inputs=[{"name": "x", "shape": [4]}]), spec, "torch")
    assert not same_as_probed(None, spec, "torch")
    path.unlink()
    with pytest.raises(SetupError, match="no operator of m runs"):
        _write_config(tmp_path, pkg, "torch", {}, ".dl-gate.yml", rows[1:], InitReport(package="m"), check=check)


SOFTPLUS_FAST = {"fixed": "torch.where(x > threshold, x, torch.log1p(torch.exp(x)))",
                 "broken": "torch.log1p(torch.exp(x))"}
SOFTPLUS = '''"""Softplus with a fast path for the default beta (after PyTorch's softplus threshold: above
it the function is x, and log1p(exp(x)) would overflow)."""
import torch


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    if beta == 1.0:  # the common case: no scaling
        return {FAST}
    return torch.where(x * beta > threshold, x, torch.log1p(torch.exp(x * beta)) / beta)
'''


@pytest.mark.slow
@pytest.mark.parametrize("base_fixed", [True, False])
def test_one_parameter_value_in_the_tests_does_not_pin_the_row(tmp_path, base_fixed):
    """Seen on a real library: a function tested only at alpha=1.5 was gated only there, and every
    variant passed on a revert that broke other values. init widens a float parameter the tests
    set (its default, values around the tests'): a softplus tested only at beta=2 loses the
    threshold of its default's fast path (inf above ~11 in float16, ~88 in float32): the revert
    fails, the fix passes. (An ELU whose fast path goes from exp(x) - 1 to expm1 was tried first:
    the fix direction failed its gradient, rightly: autograd's expm1 backward, grad x (out + 1),
    rounds exp(x) to 0 below x = -17 in float32, where exp(x)'s own backward did not.)"""
    repo = tmp_path / "sprepo"
    (repo / "splib").mkdir(parents=True)
    src = repo / "splib" / "__init__.py"
    src.write_text(SOFTPLUS.replace("{FAST}", SOFTPLUS_FAST["fixed" if base_fixed else "broken"]))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_softplus.py").write_text(
        "import torch\n\nfrom splib import softplus\n\n\ndef test_softplus():\n"
        "    torch.manual_seed(0)  # the recorded values, and so the inferred row, the same on every machine\n"
        "    assert softplus(torch.randn(4, 8), beta=2.0).shape == (4, 8)\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    res = _cli(repo, "init", "--no-workflows")
    assert res.returncode == 0, res.stderr
    row = yaml.safe_load((repo / ".dl-gate.yml").read_text())["ops"][0]
    assert row["params"]["beta"]["choices"][:2] == [2.0, 1.0], row  # the tests' value first, then the default
    res = _refresh_then_run_pr(repo, tmp_path / "out", 60, src,
                               SOFTPLUS.replace("{FAST}", SOFTPLUS_FAST["broken" if base_fixed else "fixed"]),
                               "drop the threshold" if base_fixed else "the threshold")
    assert res.returncode == (1 if base_fixed else 0), res.stdout[-3000:] + res.stderr[-3000:]


NANOGPT = '''"""One model file (after nanoGPT's model.py): a function, and a LayerNorm whose constructor
needs ndim and bias."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F


def new_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)
'''


def test_one_module_file_can_be_gated(tmp_path):
    """Seen on a real library: --package had to be a folder, so one model file (nanoGPT's
    model.py) could not be gated. A file is its own package; its LayerNorm is built as the tests
    build it."""
    repo = tmp_path / "gpt"
    (repo / "tests").mkdir(parents=True)
    (repo / "model.py").write_text(NANOGPT)
    (repo / "tests" / "test_model.py").write_text(
        "import torch\n\nfrom model import LayerNorm, new_gelu\n\n\ndef test_blocks():\n"
        "    ln = LayerNorm(16, bias=True)\n    for b in (2, 4):\n        assert ln(torch.randn(b, 16)).shape == (b, 16)\n"
        "    assert new_gelu(torch.randn(3, 5)).shape == (3, 5)\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, package="model.py", workflows=False, probe_timeout=20)
    cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
    ops = {o.name: o for o in cfg.ops}
    assert set(ops) == {"model.new_gelu", "model.LayerNorm"}, (sorted(ops), rep.left_out)
    assert cfg.raw["python_path"] == ["."] and ops["model.new_gelu"].sources == ("model.py",)
    assert ops["model.LayerNorm"].construct == (("ndim", 16), ("bias", True))
    with pytest.raises(SetupError, match="no such file"):
        run_init(repo, package="nope.py", workflows=False)


def test_the_env_values_init_was_given_are_set_on_the_action_step():
    from gate.init.workflows import ActionRef, render

    wfs = render(install="pip install -e .", action=ActionRef(sha="a" * 40), env={"TEST_DEVICE": "cpu"})
    for rel, job in ((".github/workflows/dl-gate.yml", "gate"), (".github/workflows/dl-gate-fork.yml", "gate"),
                     (".github/workflows/dl-gate-baselines.yml", "refresh")):
        wf = yaml.safe_load(wfs[rel])
        (step,) = [s for s in wf["jobs"][job]["steps"] if str(s.get("uses", "")).startswith("dl-gate/dl-gate@")]
        assert step["env"] == {"TEST_DEVICE": "cpu"} and step["with"]["install"] == "pip install -e .", rel
    comment = yaml.safe_load(wfs[".github/workflows/dl-gate-comment.yml"])
    (publish,) = [s for s in comment["jobs"]["comment"]["steps"] if str(s.get("uses", "")).startswith("dl-gate/")]
    assert publish["with"]["mode"] == "publish" and "env" not in publish and "install" not in publish["with"]


def test_widened_options_cover_floats_and_sizes_but_not_axes():
    from gate.init.infer import Operator, widened_options

    def param(name, default=None):
        return {"name": name, "kind": "KEYWORD_ONLY", "has_default": default is not None, "default": default}

    op = Operator("lib.f", "lib", "f", "function", "lib.py", 1,
                  params=[param("x"), param("beta", 1.0), param("p", 0.5), param("k", 4), param("dim", -1),
                          param("flag", False)])
    got = widened_options(op, {"params": {"beta": 2.0, "p": {"choices": [0.2]}, "k": 8, "dim": 0, "flag": True}})
    assert got["beta"] == [1.0, 4.0]  # the default, then half (2.0 / 2 is the default already) and twice
    assert got["p"] == [0.5, 0.1, 0.6]  # inside (0, 1)
    assert got["k"] == [4, 16]  # the default, then half (= the default) and twice
    assert "dim" not in got and "flag" not in got  # an axis is another function; a bool is not a size
    assert widened_options(op, {"params": {"k": 1}}) == {"k": [4]}  # 1 has no half: only the default


def test_the_files_framework_is_that_of_most_operators():
    """keras-hub (acceptance): a Keras library with a torch backend module was written under
    `framework: torch`, every row saying tensorflow (and its workflow installed torch first)."""
    from dataclasses import replace

    from gate.init import file_framework

    tf_op, torch_op = replace(_op([("x", None)], kind="layer"), framework="tensorflow"), _op([("x", None)])
    assert torch_op.framework == "torch"
    assert file_framework("torch", [tf_op, tf_op, torch_op]) == "tensorflow"
    assert file_framework("torch", [tf_op, torch_op]) == "torch"  # a tie keeps the import scan's guess
    assert file_framework("tensorflow", []) == "tensorflow"


def test_one_test_module_that_cannot_be_collected_does_not_stop_the_others(tmp_path):
    """keras-cv (acceptance run): one test module downloads a vocabulary at import; with no
    network pytest stopped at collection ("exited 2") and only the calls made before it were
    recorded. The default command collects what it can, and the harvest says what stopped."""
    repo = tmp_path / "collrepo"
    (repo / "colllib").mkdir(parents=True)
    (repo / "colllib" / "__init__.py").write_text("import torch\n\n\ndef softplus(x):\n"
                                                  "    return torch.log1p(torch.exp(x))\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_a_download.py").write_text("raise ConnectionError('no network to fetch the vocabulary')\n")
    (repo / "tests" / "test_ops.py").write_text(
        "import torch\n\nfrom colllib import softplus\n\n\ndef test_it():\n"
        "    assert softplus(torch.linspace(-3, 3, 7).reshape(1, 7)).shape == (1, 7)\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, workflows=False, no_tests=False, probe_timeout=20)
    assert "1 distinct calls of 1 operators" in rep.harvest, rep.harvest
    assert "ConnectionError" in rep.harvest, rep.harvest
    cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
    assert drawn_shape(cfg.ops[0], cfg.ops[0].inputs[0]) == (1, 7)  # from the recorded call


@pytest.mark.slow
def test_a_torch_row_in_a_tensorflow_file_keeps_its_framework(tmp_path, monkeypatch):
    """keras-hub (acceptance): keras_nlp.deserialize, a function classified and probed as torch's,
    was written without `framework:` into a file whose framework is tensorflow, read back as a
    TensorFlow row, and failed every variant of the first refresh (exit 2)."""
    from gate.cli import main
    from gate.config import load_config

    repo = tmp_path / "mixrepo"
    (repo / "mixlib").mkdir(parents=True)
    (repo / "mixlib" / "__init__.py").write_text("from .layers import Scale, Shift\nfrom .fn import twice\n")
    (repo / "mixlib" / "layers.py").write_text(
        "import keras\n\n\nclass Scale(keras.layers.Layer):\n    def call(self, x):\n        return x * 2.0\n\n\n"
        "class Shift(keras.layers.Layer):\n    def call(self, x):\n        return x + 1.0\n")
    (repo / "mixlib" / "fn.py").write_text("import torch\n\n\ndef twice(x):\n    return torch.as_tensor(x) * 2\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    monkeypatch.chdir(repo)
    assert main(["init", "--no-tests", "--no-workflows"]) == 0
    assert "\nframework: tensorflow\n" in (repo / ".dl-gate.yml").read_text()
    rows = {s.name: s for s in load_config(repo / ".dl-gate.yml").ops}
    assert rows["mixlib.twice"].framework == "torch" and rows["mixlib.Scale"].framework == "tensorflow"


def write_files(root: Path, files: dict) -> Path:
    """A library's repository: ``files`` (relative path -> text) under ``root``, in git."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git(root.parent, "init", "-q", "-b", "main", str(root))
    return root


#: the library's tests spend time on a clock they drive (the budget plugin's ``time``): the test
#: does not depend on how fast this machine runs them (each slow test "takes" 10 s, and none sleeps)
SPENDING_CONFTEST = """import time as _time

import pytest

import dl_gate_harvest_budget as budget


class Clock:
    def __init__(self):
        self.now = _time.time()

    def time(self):
        return self.now


budget.time = Clock()


@pytest.fixture
def spend():
    def spend(seconds):
        budget.time.now += seconds
    return spend
"""


def test_a_slow_test_file_does_not_keep_the_files_after_it_from_being_recorded(tmp_path):
    """geoopt (acceptance run): its tests under the recorder took more than init's 600 s and
    stopped in the 8th of 24 files; test_spd_norm.py, the one test calling SPD.norm at a zero
    tangent vector, never ran. Here the first test file alone needs 400 s of a 120 s limit (on
    the clock its tests drive): each file gets its share of the budget, the slow file's other
    test function still runs (round robin over functions), the last file's operator is recorded,
    a test class's setup runs once, and init says what was skipped."""
    repo = write_files(tmp_path / "slowrepo", {
        "slowlib/__init__.py": "import torch\n\n\ndef expmap(x):\n    return torch.exp(x) - 1\n\n\n"
                               "def logmap(x):\n    return torch.log1p(x.abs())\n\n\n"
                               "def norm(x):\n    return torch.sqrt((x * x).sum(-1, keepdim=True))\n",
        "tests/conftest.py": SPENDING_CONFTEST,
        "tests/test_a_reversibility.py":
            "import pytest\nimport torch\n\nfrom slowlib import expmap, logmap\n\n\n"
            "@pytest.mark.parametrize('k', range(40))\ndef test_slow(k, spend):\n    spend(10)\n"
            "    assert expmap(torch.full((2, 3), 0.01 * k)).shape == (2, 3)\n\n\n"
            "def test_logmap():\n    assert logmap(torch.linspace(-1, 1, 6).reshape(2, 3)).shape == (2, 3)\n",
        "tests/test_b_norm.py":
            "import pytest\nimport torch\n\nfrom slowlib import norm\n\n\n"
            "@pytest.mark.parametrize('k', [1, 2])\ndef test_zero_tangent(k):\n"
            "    assert norm(torch.zeros(k, 3)).shape == (k, 1)\n\n\n"
            "class TestBuilt:  # its class-scoped setup (a model built once) must run once\n"
            "    @pytest.fixture(scope='class')\n    def built(self):\n"
            "        with open('setups.txt', 'a') as f:\n            f.write('setup\\n')\n\n"
            "    @pytest.mark.parametrize('k', [1, 2])\n    def test_p(self, built, k):\n"
            "        assert norm(torch.ones(k, 3)).shape == (k, 1)\n\n"
            "    def test_q(self, built):\n        assert norm(torch.ones(1, 3)).shape == (1, 1)\n"})
    rep = run_init(repo, workflows=False, probe_timeout=20, tests_timeout=120)
    cfg = parse_config((repo / ".dl-gate.yml").read_text(), repo / ".dl-gate.yml", repo)
    rows = {o.name: o for o in cfg.ops}
    assert {"slowlib.expmap", "slowlib.logmap", "slowlib.norm"} <= set(rows), sorted(rows)
    assert "calls of 3 operators recorded" in rep.harvest, rep.harvest
    assert "test files skipped once their file's share of the 120s budget was spent" in rep.harvest, rep.harvest
    assert "--tests-timeout" in rep.harvest and "never reached" not in rep.harvest, rep.harvest
    assert (repo / "setups.txt").read_text() == "setup\n"  # the class's tests stayed together


@pytest.mark.tf
def test_init_workers_of_a_tensorflow_library_are_forked_from_its_warm_zygote(tmp_path, monkeypatch):
    """init's three workers (classify, probe, check) of a Keras/TensorFlow library are forked from
    the gate's TensorFlow zygote (TensorFlow imported once: ~3.5 s of CPU a worker here), as a
    torch library's are from torch's; an ``--env`` value TensorFlow or Keras reads at its import
    keeps an interpreter of its own."""
    pytest.importorskip("tensorflow")
    from gate.backends import isolate
    from gate.init.discover import _forked_worker

    monkeypatch.delenv(isolate.SERVER_ENV, raising=False)
    isolate._close_zygotes()
    request = tmp_path / "request.json"
    request.write_text("{}")
    try:
        with open(tmp_path / "err.log", "w") as err:
            proc = _forked_worker("tensorflow", request, tmp_path, dict(os.environ), None, err)
            assert proc is not None
            zygote = isolate._ZYGOTES[isolate.PRELOAD["tensorflow"]].proc.pid
            ppid = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            proc.wait(timeout=60)
            assert ppid == zygote
            for kept in ({"KERAS_BACKEND": "tensorflow"}, {"TF_ENABLE_ONEDNN_OPTS": "0"}):
                assert _forked_worker("tensorflow", request, tmp_path, dict(os.environ), kept, err) is None
            assert _forked_worker("jax", request, tmp_path, dict(os.environ), None, err) is None
    finally:
        isolate._close_zygotes()


UPCASTING_LOSSES = '''import torch
import torch.nn.functional as F


def upcast_focal_loss(input, target, gamma=2.0):
    """As MONAI's FocalLoss at ec63e068fe: the loss computed in float32 whatever its input."""
    input, target = input.float(), target.float()
    logp = F.logsigmoid(input) * target + F.logsigmoid(-input) * (1 - target)
    return (-((1 - logp.exp()) ** gamma) * logp).mean()


def plain_softplus(x):
    return F.softplus(x)
'''


def test_a_dtype_the_operator_does_not_compute_in_is_left_out_of_its_row(tmp_path):
    """A loss that upcasts its input computes in float32 at every input dtype: its float16 and
    bfloat16 runs return float32, so those variants are not-measured at every run (the gate's
    check then ends in an error, exit 2, on every PR: MONAI's focal loss, in a fix direction of
    the zero-config acceptance). init's probe says so and leaves those dtypes out of the row,
    naming why; an operator that computes in each dtype keeps them."""
    repo = write_files(tmp_path / "upcastlib", {"upcastlib/__init__.py": "from .losses import *  # noqa\n",
                                               "upcastlib/losses.py": UPCASTING_LOSSES})
    run_init(repo, no_tests=True, workflows=False)
    text = (repo / ".dl-gate.yml").read_text()
    ops = {o.name: o for o in parse_config(text, repo / ".dl-gate.yml", repo).ops}
    assert ops["upcastlib.upcast_focal_loss"].dtypes == ("float32",), text
    assert "float16 dropped (not measured: its float16 run returns float32" in text, text
    assert "bfloat16 dropped (not measured: its bfloat16 run returns float32" in text, text
    assert set(ops["upcastlib.plain_softplus"].dtypes) >= {"float16", "bfloat16", "float32"}, text


GRADIENT_MAP = '''import torch
import torch.nn.functional as F

# a float32 filter made at import, as piqa's MDSI and other image metrics make theirs
_PREWITT = torch.tensor([[1.0, 0.0, -1.0], [1.0, 0.0, -1.0], [1.0, 0.0, -1.0]], dtype=torch.float32) / 3


def gradient_magnitude(x):
    """Per-channel Prewitt gradient magnitude of an (N, C, H, W) image."""
    c = x.shape[1]
    kx = _PREWITT.view(1, 1, 3, 3).expand(c, 1, 3, 3)
    gx = F.conv2d(x, kx, padding=1, groups=c)
    gy = F.conv2d(x, kx.transpose(-1, -2), padding=1, groups=c)
    return torch.hypot(gx, gy)
'''


def test_an_operator_with_a_float32_constant_of_its_own_is_gated_at_float32(tmp_path):
    """piqa's MDSI in the zero-config acceptance: its filter is a float32 tensor made at import,
    so its float64 run raised ("expected scalar type Double but found Float") on every input and
    init left it out ("no inferred spec runs"). The gate's float64 run now takes the constant's
    float32 values as float64: init writes the row at float32 (its float16 and bfloat16 runs
    raise: dropped, with why) and a PR that replaces hypot by the square root of the squares is a
    regression (new Inf where base is finite)."""
    repo = write_files(tmp_path / "imglib", {
        "imglib/__init__.py": "from .grad import gradient_magnitude\n",
        "imglib/grad.py": GRADIENT_MAP,
        "tests/test_grad.py": "import torch\nfrom imglib import gradient_magnitude\n\n\ndef test_shape():\n"
                              "    x = torch.rand(2, 3, 16, 16)\n    assert gradient_magnitude(x).shape == x.shape\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "imglib")
    res = _cli(repo, "init", "--no-workflows")
    assert res.returncode == 0, res.stderr[-2000:]
    text = (repo / ".dl-gate.yml").read_text()
    (op,) = parse_config(text, repo / ".dl-gate.yml", repo).ops
    assert op.name == "imglib.gradient_magnitude" and op.dtypes == ("float32",), text
    assert "float16 dropped (RuntimeError" in text, text
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "dl-gate init")
    git(repo, "checkout", "-q", "-b", "pr")
    src = repo / "imglib" / "grad.py"
    src.write_text(GRADIENT_MAP.replace("torch.hypot(gx, gy)", "torch.sqrt(gx * gx + gy * gy)"))
    git(repo, "commit", "-q", "-am", "magnitude without hypot")
    res = _cli(repo, "run", "--base", "main", "--evals", "30", "--out", str(tmp_path / "out"))
    import json

    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert res.returncode == 1, (report["reason"], res.stderr[-2000:])
    failed = [v for v in report["verdicts"] if v["outcome"] == "regression"]
    assert failed and all(v["variant"]["dtype"] == "float32" for v in failed), report["verdicts"]


def test_a_test_command_that_runs_another_interpreter_says_so(tmp_path):
    """piqa in this session's acceptance: `--tests "python -m pytest ..."` ran the system's
    Python (the gate's venv not activated), which has no torch; init said "pytest stopped at a
    module it could not import (... No module named 'torch'): add --continue-on-collection-errors",
    a wrong lead. A module the gate's own interpreter imports is another interpreter's absence:
    init names the gate's interpreter to use."""
    repo = tmp_path / "irepo"
    (repo / "ilib").mkdir(parents=True)
    (repo / "ilib" / "__init__.py").write_text("import torch\n\n\ndef twice(x):\n    return 2 * x\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_ops.py").write_text("import torch\n\nfrom ilib import twice\n\n\ndef test_it():\n"
                                                "    assert twice(torch.ones(3)).shape == (3,)\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    # an interpreter without the site packages (as a system Python without the venv's): no pytest, no torch
    rep = run_init(repo, tests=f"{sys.executable} -S -m pytest -q tests", workflows=False, probe_timeout=20)
    assert "0 distinct calls" in rep.harvest and "the tests ran an interpreter without" in rep.harvest, rep.harvest
    assert f'--tests "{sys.executable} -m pytest -q tests"' in rep.harvest, rep.harvest  # the user's own arguments
    assert "continue-on-collection-errors" not in rep.harvest
    # a module of the repository itself that the tests could not import is no such evidence
    from gate.init import _other_interpreter

    sys.path.insert(0, str(repo))  # as the gate's process sees it when run from the repository
    try:
        assert _other_interpreter("ModuleNotFoundError: No module named 'ilib'", repo) is None
        assert _other_interpreter("ModuleNotFoundError: No module named 'ilib'", tmp_path / "elsewhere") == "ilib"
    finally:
        sys.path.remove(str(repo))
    assert _other_interpreter("ModuleNotFoundError: No module named 'torch.nn'", repo) == "torch"
    assert _other_interpreter("ModuleNotFoundError: No module named 'no_such_dependency_x'", repo) is None


def test_tests_that_need_a_module_not_installed_say_which_to_install(tmp_path):
    """SimplexLab/TorchJD: the tests' conftest imports a helper that imports torchvision, a test
    dependency; pytest stopped before any test, and init pointed at an environment variable. A
    module neither the gate's interpreter nor the repository has is named, with the pip line."""
    from gate.init import _missing_module

    repo = tmp_path / "mrepo"
    (repo / "mlib").mkdir(parents=True)
    (repo / "mlib" / "__init__.py").write_text("import torch\n\n\ndef twice(x):\n    return 2 * x\n")
    (repo / "tests" / "helpers").mkdir(parents=True)
    (repo / "tests" / "helpers" / "__init__.py").write_text("")
    (repo / "tests" / "conftest.py").write_text("import no_such_test_dep_x  # noqa: F401\n")
    (repo / "tests" / "test_ops.py").write_text("import torch\n\nfrom mlib import twice\n\n\ndef test_it():\n"
                                                "    assert twice(torch.ones(3)).shape == (3,)\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    rep = run_init(repo, workflows=False, probe_timeout=20)
    assert "the tests need no_such_test_dep_x, which is not installed" in rep.harvest, rep.harvest
    assert "`pip install no_such_test_dep_x`" in rep.harvest and "environment variable" not in rep.harvest, rep.harvest
    # the distribution's name where it differs; the repository's own helper is no such module
    assert _missing_module("ModuleNotFoundError: No module named 'cv2'", repo) == "cv2"
    assert _missing_module("ModuleNotFoundError: No module named 'helpers'", repo) is None
    assert _missing_module("ModuleNotFoundError: No module named 'torch'", repo) is None  # installed here
