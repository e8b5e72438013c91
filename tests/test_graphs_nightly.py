"""The scheduled run: graph and export rows from run_nightly and `dl-gate nightly`."""
from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("torch")

from gate.cli import main  # noqa: E402
from gate.config import parse_config  # noqa: E402
from gate.graphs.nightly import nightly, run_nightly  # noqa: E402
from gate.plan import Variant  # noqa: E402

USER_OPS = textwrap.dedent('''
    def scale300(x):
        return x * 300.0

    def sq_ratio(x):
        s = x * x
        return s / (1.0 + s)

    def branchy(x):
        if x.sum() > 0:
            return x * 2.0
        return x * -0.5
''')

CONFIG = textwrap.dedent('''
    version: 1
    framework: torch
    python_path: ["."]
    ops:
      - name: user.scale300
        callable: dlgate_nightly_userops.scale300
        inputs: [{name: x, shape: [N, D]}]
        dims: {N: [1, 8], D: [1, 32]}
      - name: user.sq_ratio
        callable: dlgate_nightly_userops.sq_ratio
        inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 2}}]
        dims: {N: [1, 8], D: [1, 32]}
      - name: user.branchy
        callable: dlgate_nightly_userops.branchy
        inputs: [{name: x, shape: [N, D]}]
        dims: {N: [1, 8], D: [1, 32]}
''')


@pytest.fixture()
def project(tmp_path, monkeypatch):
    (tmp_path / "dlgate_nightly_userops.py").write_text(USER_OPS)
    (tmp_path / ".dl-gate.yml").write_text(CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_run_nightly_returns_graph_and_export_rows(project):
    cfg = parse_config((project / ".dl-gate.yml").read_text(), project / ".dl-gate.yml")
    res = nightly(cfg.ops, budget_seconds=60, seed=3, max_graphs=12, export_paths=("torchscript", "onnx"),
                  export_graphs=1, export_evals=6)
    oracles = {f.variant.oracle for f in res.findings}
    assert oracles == {"graph", "export"}
    graphs = [f for f in res.findings if f.variant.oracle == "graph"]
    assert all(f.op.startswith("graph:") and f.variant == Variant("float16", "cpu", "input", "default", "graph")
               for f in graphs)
    exports = [f for f in res.findings if f.variant.oracle == "export"]
    assert {f.variant.mode for f in exports} == {"torchscript", "onnx"}
    ops = {f.op for f in exports}
    assert {"user.scale300", "user.sq_ratio", "user.branchy"} <= ops
    assert any(o.startswith("graph:") for o in ops)  # the worst graph exported too
    branchy = {f.variant.mode: f for f in exports if f.op == "user.branchy"}
    assert branchy["torchscript"].extra["diverges"] and branchy["onnx"].extra["diverges"]
    assert res.campaigns["torch"].graphs == 12
    assert set(res.coverage["torch"]) == {"operator_type", "in_degree", "out_degree", "edge", "shape_param"}
    for f in res.findings:  # strict JSON, the baselines stage stores these
        json.dumps(f.to_dict(), allow_nan=False)
    rows = run_nightly(cfg.ops, budget_seconds=20, seed=3, share={"graphs": 1.0, "export": 0.0}, max_graphs=3)
    assert rows and all(f.variant.oracle == "graph" for f in rows)


def test_cli_nightly(project, capsys):
    code = main(["nightly", "--ops", "user.scale300", "--ops", "user.sq_ratio", "--ops", "user.branchy",
                 "--graphs", "8", "--export-path", "torchscript", "--budget", "30", "--seed", "1",
                 "--json", "out/nightly.json"])
    out = capsys.readouterr().out
    assert code == 0
    assert "coverage (torch): operator-type 3/3" in out
    assert "user.branchy[float32/cpu/torchscript/export]" in out
    doc = json.loads((project / "out" / "nightly.json").read_text())
    assert doc["seed"] == 1 and doc["campaigns"]["torch"]["graphs"] == 8
    assert any(f["variant"]["oracle"] == "export" for f in doc["findings"])
    assert main(["nightly", "--export-path", "nope", "--budget", "5"]) == 2
