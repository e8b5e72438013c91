"""Which oracles apply to which operators (data: gate/ops/catalog/oracles.yaml), the plan's
``oracles=`` filter, the registry behind fuzz_task's dispatch, serialisation of the oracles'
facts, the CLI's --oracle, and the lazy-import rule (a torch-only run never imports TF)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.errors import ConfigError, UnsupportedVariant
from gate.fuzz import Finding
from gate.oracles.registry import RUNNERS
from gate.ops.catalog import load_builtin
from gate.ops.rules import load_rules
from gate.oracles.precision import Metrics
from gate.plan import FUZZ_ORACLES as ORACLES, Budget, Variant, plan, variants_for

from tests.oracle_support import user_ops

ROOT = Path(__file__).resolve().parents[1]
SPECS = {s.name: s for s in load_builtin(("torch", "tensorflow"))}


def by_oracle(spec, **kw):
    out = {}
    for v in variants_for(spec, oracles=list(ORACLES), **kw):
        out.setdefault(v.oracle, []).append(v)
    return out


def test_default_is_precision_only_and_unchanged():
    vs = variants_for(SPECS["torch.relu"])
    assert {v.oracle for v in vs} == {"precision"}
    assert [v.key for v in vs] == ["float16/cpu/input", "float16/cpu/operator", "bfloat16/cpu/input",
                                   "bfloat16/cpu/operator", "float32/cpu/input"]
    tasks = plan([SPECS["torch.relu"]], Budget(evals=50))
    assert [t.variant for t in tasks] == vs


def test_rules_select_oracles_per_operator():
    relu = by_oracle(SPECS["torch.relu"])
    assert set(relu) == {"precision", "nan", "xfw", "compiled", "dtype_eq", "contig_eq", "length_eq", "batch_eq",
                         "inplace_eq", "grad", "gradcheck"}
    assert {v.dtype for v in relu["dtype_eq"]} == {"float16", "bfloat16"}
    assert [v.dtype for v in relu["gradcheck"]] == ["float64"]
    assert all(v.mode == "input" for o, vs in relu.items() if o != "precision" for v in vs)
    conv = by_oracle(SPECS["torch.conv2d"], dtypes=["float32"])
    assert [v.key for v in conv["layout_eq"]] == ["float32/cpu/input/channels_last/layout_eq"]
    assert "length_eq" not in conv and "inplace_eq" not in conv  # not elementwise; no in-place form
    tf = by_oracle(SPECS["tf.relu"], dtypes=["float32"])
    assert {"compiled", "compiled_xla", "xfw"} <= set(tf)
    assert not {"contig_eq", "inplace_eq", "grad"} & set(tf)
    hs = by_oracle(SPECS["torch.hardswish"])
    assert "xfw" not in hs  # no TensorFlow twin


def test_explicit_oracles_on_a_row(tmp_path):
    specs = user_ops(tmp_path, """
    - name: mine.relu
      callable: torch.relu
      batch_dim: 0
      oracles: [batch_eq, nan]
      inputs: [{name: x, shape: [4, 3]}]
      dtypes: [float32]
      modes: [input]
    """)
    assert {v.oracle for v in variants_for(specs["mine.relu"], oracles=list(ORACLES))} == {"precision", "batch_eq", "nan"}
    bad = specs["mine.relu"].replace(oracles=("layout_eq",))
    with pytest.raises(ConfigError, match="operator mine.relu lists oracle layout_eq needs declared layouts"):
        variants_for(bad, oracles=["layout_eq"])


def test_unknown_oracle_is_a_one_line_error(tmp_path):
    with pytest.raises(UnsupportedVariant, match="unknown oracle bogus"):
        variants_for(SPECS["torch.relu"], oracles=["bogus"])
    (tmp_path / ".dl-gate.yml").write_text("ops:\n  - name: a\n    callable: torch.relu\n    oracles: [bogus]\n"
                                           "    inputs: [{name: x, shape: [2]}]\n")
    from gate.config import load_config

    with pytest.raises(ConfigError, match=r"\.dl-gate\.yml:4: ops\.0\.oracles\.0"):
        load_config(tmp_path / ".dl-gate.yml")


def test_registry_rules_schema_and_plan_agree():
    assert set(RUNNERS) == set(ORACLES) == set(load_rules().names())
    from gate.config import _schema

    assert set(_schema()["$defs"]["oracle"]["enum"]) == set(ORACLES)
    v = Variant("float32", "cpu", "input", "channels_last", "layout_eq")
    assert Variant.parse(v.key) == v and v.key == "float32/cpu/input/channels_last/layout_eq"


def test_nightly_oracles_are_rules_too():
    """``export`` and ``graph`` are rows of oracles.yaml with ``schedule: nightly``: named (variant
    keys parse), never planned per operator, never given a runner."""
    from gate.ops.rules import parse_rules
    from gate.plan import CAMPAIGN_ORACLES

    rules = load_rules()
    assert CAMPAIGN_ORACLES == tuple(rules.nightly) == ("export", "graph")
    assert not set(CAMPAIGN_ORACLES) & (set(RUNNERS) | set(ORACLES) | set(rules.names()))
    assert Variant.parse("float32/cpu/onnx/export") == Variant("float32", "cpu", "onnx", oracle="export")
    assert "export" not in rules.applicable(SPECS["torch.exp"])
    with pytest.raises(ConfigError, match="takes a description only"):
        parse_rules("rules: {late: {schedule: nightly, runner: 'gate.oracles.late:LateRunner'}}")
    with pytest.raises(ConfigError, match="unknown schedule 'weekly'"):
        parse_rules("rules: {late: {schedule: weekly}}")


def test_finding_extra_round_trips():
    f = Finding(op="torch.exp", framework="torch", variant=Variant("float32", oracle="xfw"),
                metrics=Metrics(ulp=3.0, spread=2.0),
                extra={"closer": "torch", "float64_mismatch": math.inf, "pair": ["torch.exp", "tf.exp"]})
    back = Finding.from_dict(json.loads(json.dumps(f.to_dict())))
    assert back.extra == f.extra and back.variant == f.variant and back.metrics.spread == 2.0


def test_cli_oracles_from_flag_and_config(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = subprocess.run([sys.executable, "-m", "gate.cli", "fuzz", "torch.relu", "--oracle", "bogus"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("dl-gate: error: unknown oracle 'bogus'")
    (tmp_path / ".dl-gate.yml").write_text("builtin: true\ngate: {oracles: [nan, batch_eq]}\n")
    out = tmp_path / "f.json"
    # the lazy-import rule: this torch-only run must never import TensorFlow
    code = ("import sys; from gate.cli import main; rc = main(sys.argv[1:]); "
            "assert 'tensorflow' not in sys.modules, 'TF imported'; sys.exit(rc)")
    run = subprocess.run([sys.executable, "-c", code, "fuzz", "torch.relu", "--dtype", "float32", "--evals", "30",
                          "--json", str(out), "--save-inputs", ""], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    keys = [f["variant"] for f in json.loads(out.read_text())["findings"]]
    assert [Variant(**k).key for k in keys] == ["float32/cpu/input/nan", "float32/cpu/input/batch_eq"]
    assert "batch_eq]: a=batch, b=per-item" in run.stdout
