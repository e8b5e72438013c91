"""Operators that take a list of tensors (an input pack): naver/roma's `quat_composition(sequence,
normalize=False)`, `rotvec_composition(sequence)` and `rotmat_composition(sequence)` compose the
rotations of a list; a decoder's `forward(features)` takes the feature maps of every scale. Zero
config left roma's three out ("no inferred spec runs ... AssertionError: Requiring at least two
inputs": the recorder kept the list as an object, and the probe passed one tensor). The recorder's
list of tensors is now bound as the inputs `sequence_0`, `sequence_1`... of one `pack`, which every
caller of the operator (the oracles, the gradient's leaves, the seeds, a repro script) passes as
one list.

The end-to-end bed is roma's 1c27395 ("Fix normalization bug in quat_composition()"): with
`normalize=True` the loop normalised its last operand (`q = q / torch.norm(q)`) instead of the
result, so the composition of non-unit quaternions came back unnormalised."""
from __future__ import annotations

import sys
import uuid

import numpy as np
import pytest
import torch
import yaml

from gate.errors import ConfigError
from gate.init.infer import Operator, from_records
from gate.ops.spec import OpSpec, TensorSpec, arrange
from gate.oracles.registry import build_runner
from gate.plan import Variant
from gate.search import harvest_hook
from gate.search.harvest import _decode
from gate.search.inputs import Candidate, draw
from gate.search.seeds import CallRecord, TensorArg, TensorSeq, candidate_from_call
from tests.helpers.repro import run_script
from tests.test_init import _cli, _refresh_then_run_pr, git

QUATS = '''"""Quaternions, XYZW (after naver/roma's utils.py)."""
import torch


def quat_product(p, q):
    """The product of two batches of quaternions."""
    vector = p[..., 3:4] * q[..., :3] + q[..., 3:4] * p[..., :3] + torch.cross(p[..., :3], q[..., :3], dim=-1)
    last = p[..., 3:4] * q[..., 3:4] - torch.sum(p[..., :3] * q[..., :3], dim=-1, keepdim=True)
    return torch.cat((vector, last), dim=-1)


def quat_composition(sequence, normalize=False):
    """The product of a list of quaternions, optionally normalised."""
    assert len(sequence) > 1, "Requiring at least two inputs."
    res = sequence[0]
    for q in sequence[1:]:
        res = quat_product(res, q)
    if normalize:
        {NORMALIZE}
    return res
'''
FIXED = "res = res / torch.norm(res, dim=-1, keepdim=True)"
BROKEN = "q = q / torch.norm(q, dim=-1, keepdim=True)"  # roma before 1c27395: the result is left as it is

TESTS = '''import torch

from quatlib import quat_composition, quat_product


def test_composition_of_three():
    torch.manual_seed(0)
    q = [torch.randn(10, 4) for _ in range(3)]
    ref = quat_product(quat_product(q[0], q[1]), q[2])
    assert torch.allclose(quat_composition(q), ref)


def test_normalized_composition():
    torch.manual_seed(1)
    q = [torch.randn(10, 4) for _ in range(3)]
    out = quat_composition(q, normalize=True)
    assert out.shape == (10, 4)
'''


def _module(tmp_path, monkeypatch, normalize=FIXED) -> str:
    mod = f"quats_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(QUATS.replace("{NORMALIZE}", normalize))
    monkeypatch.syspath_prepend(str(tmp_path))
    return mod


def _row(mod: str, items: int = 3) -> dict:
    return {"name": "quats.quat_composition", "callable": f"{mod}:quat_composition", "framework": "torch", "kind": "composite",
            "params": {"normalize": True}, "dims": {"N": [1, 8]},
            "inputs": [{"name": f"sequence_{i}", "shape": ["N", 4], "pack": "sequence"} for i in range(items)]}


def test_a_pack_is_one_list_argument_in_its_place():
    def t(name, pack=None, keyword=False):
        return TensorSpec(name=name, shape=(2,), pack=pack, keyword=keyword)

    kwargs = {"alpha": 2.0}
    inputs = [t("x"), t("s_0", "s"), t("s_1", "s"), t("r_0", "r"), t("y"), t("w_0", "w", True), t("w_1", "w", True),
              t("z", keyword=True)]
    args = arrange(zip(inputs, "ABCDEFGH"), kwargs)
    assert args == ["A", ["B", "C"], ["D"], "E"], args  # two packs side by side stay two lists
    assert kwargs == {"alpha": 2.0, "w": ["F", "G"], "z": "H"}, kwargs
    # the config says what is wrong in one line
    base = {"name": "p.f", "callable": "m:f", "framework": "torch", "dims": {"N": [1, 2]}}
    bad = {"not consecutive": [{"name": "a_0", "shape": ["N"], "pack": "a"}, {"name": "x", "shape": ["N"]},
                               {"name": "a_1", "shape": ["N"], "pack": "a"}],
           "mixes positional and keyword": [{"name": "a_0", "shape": ["N"], "pack": "a"},
                                            {"name": "a_1", "shape": ["N"], "pack": "a", "keyword": True}],
           "has the name of an input": [{"name": "a", "shape": ["N"]}, {"name": "b_0", "shape": ["N"], "pack": "a"}]}
    for why, inputs in bad.items():
        with pytest.raises(ConfigError, match=why):
            OpSpec.from_dict({**base, "inputs": inputs}, origin="user")
    spec = OpSpec.from_dict(dict(base, inputs=[{"name": "a_0", "shape": ["N"], "pack": "a"}]), origin="user")
    assert spec.to_dict()["inputs"][0]["pack"] == "a" and "pack" not in TensorSpec("x", (1,)).to_dict()


def test_the_config_schema_takes_a_pack(tmp_path):
    from gate.config import load_config

    cfg = tmp_path / ".dl-gate.yml"
    cfg.write_text(yaml.safe_dump({"version": 1, "ops": [_row("quatlib")]}))
    assert [t.pack for t in load_config(cfg).ops[0].inputs] == ["sequence"] * 3
    row = _row("quatlib")
    row["inputs"][0]["pack"] = "not a name"
    cfg.write_text(yaml.safe_dump({"version": 1, "ops": [row]}))
    with pytest.raises(ConfigError):
        load_config(cfg)


def test_every_oracle_call_passes_the_pack_and_each_item_has_its_gradient(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch)
    spec = OpSpec.from_dict(_row(mod), origin="user")
    cand = draw(spec, np.random.default_rng(0))
    for v in (Variant("float16"), Variant("bfloat16", mode="operator"), Variant("float32", oracle="grad")):
        runner = build_runner(spec, v)
        q, ev = runner.evaluate(cand)
        assert ev.status == "ok" and ev.metrics.ulp < 64, (v.key, ev.status, ev.error)
    runner = build_runner(spec, Variant("float32", oracle="grad"))
    q, _ = runner.evaluate(cand)
    _, grads = runner._vjp(q, "float64", runner.fn, "float32")
    assert len(grads) == 3 and all(g is not None and g.array.shape == q.arrays[f"sequence_{i}"].shape
                                   and np.abs(g.array).max() > 0 for i, g in enumerate(grads))
    # the gradient of the last item is the one the product's last factor gets: not the first's
    assert not np.allclose(grads[0].array, grads[2].array)


def test_a_repro_script_passes_the_pack_as_one_list(tmp_path, monkeypatch):
    from gate.localise.repro import write_repro

    mod = _module(tmp_path, monkeypatch)
    spec = OpSpec.from_dict(_row(mod), origin="user")
    cand = build_runner(spec, Variant("float16")).quantize(draw(spec, np.random.default_rng(0)))
    paths = write_repro(tmp_path / "repro", "pack", spec, Variant("float16"), cand, kind="precision", threshold=1e9,
                        threshold_why="test", repo=tmp_path, python_path=["."], reason="planted", ftz=True)
    res = run_script([paths["script"]], env={"PATH": "/usr/bin:/bin"}, timeout=120)
    # a script that passed three tensors would fail the assertion (exit 2), one given a list runs
    assert res.returncode == 0 and "float16 max error" in res.stdout, res.stdout + res.stderr


def test_the_recorder_keeps_a_list_of_tensors_and_init_binds_it_as_a_pack():
    arrays: dict = {}
    enc = harvest_hook._encode([torch.ones(2, 4), torch.zeros(2, 4)], arrays, 64)
    npz = type("F", (), {"files": list(arrays), "__getitem__": lambda self, k: arrays[k]})()
    got = _decode(enc, npz)
    assert isinstance(got, TensorSeq) and [t.shape for t in got] == [(2, 4), (2, 4)]
    mixed = _decode(harvest_hook._encode([torch.ones(2), 3], {}, 64), npz)
    assert not isinstance(mixed, TensorSeq)  # a list mixing tensors and numbers stays an object
    op = Operator(name="quatlib.quat_composition", module="quatlib", qualname="quat_composition", kind="function",
                  file="quatlib/__init__.py", line=1,
                  params=[{"name": "sequence", "kind": "POSITIONAL_OR_KEYWORD", "has_default": False, "default": None,
                           "annotation": None},
                          {"name": "normalize", "kind": "POSITIONAL_OR_KEYWORD", "has_default": True, "default": False,
                           "annotation": None}])
    rng = np.random.default_rng(0)
    recs = [CallRecord(op=op.name, args=[TensorSeq(TensorArg((n, 4), "float32", rng.standard_normal((n, 4)))
                                                   for _ in range(3))], kwargs=kw)
            for n, kw in ((10, {}), (5, {"normalize": True}), (7, {}))]
    recs.append(CallRecord(op=op.name, args=[TensorSeq([TensorArg((2, 4), "float32", np.ones((2, 4)))] * 2)], kwargs={}))
    spec = from_records(op, recs, "torch", ["quatlib/__init__.py"]).spec
    assert spec is not None
    assert [(t["name"], t.get("pack"), t.get("keyword", False)) for t in spec["inputs"]] == \
        [(f"sequence_{i}", "sequence", False) for i in range(3)], spec["inputs"]
    assert spec["dims"] == {"N": [5, 10]} and all(t["shape"] == ["N", 4] for t in spec["inputs"])
    assert sorted(spec["params"]["normalize"]["choices"]) == [False, True]
    # the same calls seed the search: each item bound to its input; a list of two does not fit three
    row = OpSpec.from_dict({**spec, "framework": "torch"}, origin="user")
    cand, why = candidate_from_call(row, recs[0])
    assert cand is not None and np.array_equal(cand.arrays["sequence_2"], recs[0].args[0][2].values), why
    cand, why = candidate_from_call(row, recs[-1])
    assert cand is None and "list of 3 tensors" in why, why


def _make(tmp_path, fixed: bool):
    repo = tmp_path / "quatrepo"
    (repo / "quatlib").mkdir(parents=True)
    (repo / "quatlib" / "__init__.py").write_text("from .utils import quat_composition, quat_product\n")
    (repo / "quatlib" / "utils.py").write_text(QUATS.replace("{NORMALIZE}", FIXED if fixed else BROKEN))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_quats.py").write_text(TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    return repo


@pytest.mark.slow
@pytest.mark.parametrize("pr", ["revert", "refactor"])
def test_init_gates_the_list_taking_operator_and_its_revert_fails(tmp_path, pr):
    """roma 1c27395 reverted: the normalised composition comes back unnormalised (its float64
    output moved: a behaviour change, failed). The control: a refactor of the loop into
    ``functools.reduce`` that computes the same products passes."""
    repo = _make(tmp_path, fixed=True)
    res = _cli(repo, "init", "--no-workflows", "--ops", "quatlib.quat_composition")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    row = yaml.safe_load((repo / ".dl-gate.yml").read_text())["ops"][0]
    assert [t.get("pack") for t in row["inputs"]] == ["sequence"] * 3, row
    utils = repo / "quatlib" / "utils.py"
    if pr == "revert":
        text = utils.read_text().replace(FIXED, BROKEN)
    else:
        text = utils.read_text().replace(
            "    res = sequence[0]\n    for q in sequence[1:]:\n        res = quat_product(res, q)\n",
            "    res = functools.reduce(quat_product, sequence)\n").replace("import torch\n", "import functools\n\nimport torch\n", 1)
        assert "functools.reduce" in text
    res = _refresh_then_run_pr(repo, tmp_path / "out", 40, utils, text, pr)
    out = res.stdout[-3000:] + res.stderr[-3000:]
    assert res.returncode == (1 if pr == "revert" else 0), out
    import json

    verdicts = json.loads((tmp_path / "out" / "report.json").read_text())["verdicts"]
    if pr == "revert":  # the dropped normalisation fails as a behaviour change, not excused by the "fix" of base's NaN
        assert any(v["outcome"] == "behaviour-change" and "not excused by the stability fix" in v["reason"]
                   for v in verdicts), [(v["outcome"], v["reason"][:120]) for v in verdicts]
    else:  # the same products on every judged input
        assert verdicts and all(v["outcome"] == "pass" and "identical inputs" in v["reason"] for v in verdicts), verdicts


FUSE = '''import torch


def fuse(*features, temperature=1.0):
    """A soft maximum over the feature maps of every scale (a decoder's forward(*features))."""
    return temperature * torch.logsumexp(torch.stack(features) / temperature, dim=0)
'''


def test_the_functions_star_args_are_a_pack_passed_one_by_one(tmp_path, monkeypatch):
    from gate.localise.repro import write_repro

    mod = f"fuse_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(FUSE)
    monkeypatch.syspath_prepend(str(tmp_path))
    t = [TensorSpec(name=f"f_{i}", shape=(2,), pack="*features") for i in range(3)]
    kwargs = {"temperature": 2.0}
    assert arrange(zip(t + [TensorSpec("w", (2,), keyword=True)], "ABCD"), kwargs) == ["A", "B", "C"]
    assert kwargs == {"temperature": 2.0, "w": "D"}
    base = {"name": "p.f", "callable": "m:f", "framework": "torch", "dims": {"N": [1, 2]}}
    with pytest.raises(ConfigError, match="cannot be passed by keyword"):
        OpSpec.from_dict({**base, "inputs": [{"name": "a_0", "shape": ["N"], "pack": "*a", "keyword": True}]},
                         origin="user")
    with pytest.raises(ConfigError, match="must be the last positional inputs"):
        OpSpec.from_dict({**base, "inputs": [{"name": "a_0", "shape": ["N"], "pack": "*a"},
                                             {"name": "x", "shape": ["N"]}]}, origin="user")
    # init binds a recorded call's extra positional tensors to the *args as a pack
    op = Operator(name="fl.fuse", module=mod, qualname="fuse", kind="function", file=f"{mod}.py", line=1,
                  params=[{"name": "features", "kind": "VAR_POSITIONAL", "has_default": False, "default": None,
                           "annotation": None},
                          {"name": "temperature", "kind": "KEYWORD_ONLY", "has_default": True, "default": 1.0,
                           "annotation": None}])
    rng = np.random.default_rng(0)
    recs = [CallRecord(op=op.name, args=[TensorArg((n, 8), "float32", rng.standard_normal((n, 8))) for _ in range(3)],
                       kwargs={"temperature": 0.5}) for n in (2, 4)]
    spec = from_records(op, recs, "torch", [f"{mod}.py"]).spec
    assert [(r["name"], r.get("pack"), r.get("keyword", False)) for r in spec["inputs"]] == \
        [(f"features_{i}", "*features", False) for i in range(3)], spec["inputs"]
    row = OpSpec.from_dict({**spec, "framework": "torch"}, origin="user")
    import importlib

    fn = importlib.import_module(mod).fuse
    cand, why = candidate_from_call(row, CallRecord(op=op.name, args=recs[1].args, kwargs=recs[1].kwargs, fn=fn))
    assert cand is not None and np.array_equal(cand.arrays["features_1"], recs[1].args[1].values), why
    for v in (Variant("float16"), Variant("float32", oracle="grad")):
        q, ev = build_runner(row, v).evaluate(cand)
        assert ev.status == "ok", (v.key, ev.error)
    runner = build_runner(row, Variant("float32", oracle="grad"))
    q, _ = runner.evaluate(cand)
    _, grads = runner._vjp(q, "float64", runner.fn, "float32")
    assert len(grads) == 3 and all(g is not None and np.abs(g.array).sum() > 0 for g in grads)
    paths = write_repro(tmp_path / "repro", "fuse", row, Variant("float16"), build_runner(row, Variant("float16")).quantize(cand),
                        kind="precision", threshold=1e9, threshold_why="test", repo=tmp_path, python_path=["."],
                        reason="planted", ftz=True)
    res = run_script([paths["script"]], env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert res.returncode == 0 and "float16 max error" in res.stdout, res.stdout + res.stderr
