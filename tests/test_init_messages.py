"""What init and refresh say when a library's environment is not the one it needs (acceptance
runs on larq and kornia): each message names what to do."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from gate.init.worker import _import_error
from gate.search.harvest import load_records
from tests.test_gate_run import CONFIG, make_repo


def test_keras2_code_under_keras3_gets_the_legacy_keras_hint(monkeypatch):
    # larq: "module 'keras._tf_keras.keras.layers' has no attribute 'LocallyConnected1D'"
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    err = AttributeError("module 'keras._tf_keras.keras.layers' has no attribute 'LocallyConnected1D'")
    hint = _import_error(err, "larq.layers")["hint"]
    assert "TF_USE_LEGACY_KERAS=1" in hint and "--env" in hint, hint
    assert _import_error(AttributeError("module 'numpy' has no attribute 'float'"), "x")["hint"] == ""


def test_a_torn_record_file_loses_its_own_calls_only(tmp_path):
    # kornia's test_hd killed a recording process mid-write: init died on a JSONDecodeError
    rec = tmp_path / "records"
    rec.mkdir()
    (rec / "raw-1.json").write_text('{"records": [{"op": "lib.f", "args": [{"t": "arr", "k')
    (rec / "raw-2.json").write_text(json.dumps({"records": [{"op": "lib.g", "args": [], "kwargs": {},
                                                             "source": "tests/test_g.py::test_g"}]}))
    np.savez(rec / "raw-2.npz", unused=np.zeros(1))
    out = load_records(tmp_path)
    assert [r.op for r in out if not r.source.startswith("error: ")] == ["lib.g"]
    assert any("unreadable record file raw-1.json" in r.source for r in out)


def test_refresh_names_a_config_env_variable_that_is_not_set(tmp_path, monkeypatch):
    monkeypatch.delenv("DL_GATE_TEST_UNSET_VAR", raising=False)
    repo = make_repo(tmp_path, config=CONFIG + "env: [DL_GATE_TEST_UNSET_VAR]\n", baselines=False)
    res = subprocess.run([sys.executable, "-m", "gate.cli", "baseline", "refresh", "--evals", "3", "--ops",
                          "mylib.log1p"], cwd=repo, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert "env: names DL_GATE_TEST_UNSET_VAR, not set in this environment" in out, out[-2000:]
