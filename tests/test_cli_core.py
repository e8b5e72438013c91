"""`dl-gate ops` / `dl-gate fuzz` as a user runs them: output, exit codes, one-line errors."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gate.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_one_line_error(code, err, needle):
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("dl-gate: error:") and needle in lines[0], lines[0]


def test_ops_lists_catalogue(capsys):
    code, out, _ = run_cli(capsys, "ops")
    assert code == 0
    assert "torch.conv2d" in out and "tf.conv2d" in out
    code, out, _ = run_cli(capsys, "ops", "--json")
    rows = json.loads(out)
    torch_ops = [r for r in rows if r["framework"] == "torch"]
    tf_ops = [r for r in rows if r["framework"] == "tensorflow"]
    assert len(torch_ops) >= 40 and len(tf_ops) >= 30
    names = {r["name"] for r in rows}
    for fw in ("torch", "tf"):
        for op in ("conv2d", "norm", "max_pool2d", "relu", "sigmoid", "softmax", "tanh"):
            assert f"{fw}.{op}" in names


def test_fuzz_prints_table_json_and_saves_inputs(capsys, tmp_path):
    js = tmp_path / "f.json"
    code, out, err = run_cli(capsys, "fuzz", "torch.tanh", "--dtype", "float16,float32", "--evals", "60",
                             "--seed", "5", "--json", str(js), "--save-inputs", str(tmp_path / "inp"))
    assert code == 0
    assert "seed 5" in err
    assert "torch.tanh[float16/cpu/input]" in out and "torch.tanh[float32/cpu/input]" in out
    data = json.loads(js.read_text())
    assert data["seed"] == 5 and len(data["findings"]) == 3  # fp16 input + operator, fp32 input
    assert all(f["evals"] > 0 for f in data["findings"])
    saved = list((tmp_path / "inp" / "torch.tanh").glob("*.npz"))
    assert len(saved) == 3
    assert (tmp_path / "inp" / ".gitignore").read_text().splitlines()[-1] == "*"  # never committed by `git add -A`
    from gate.search.inputs import Candidate

    cand = Candidate.load(saved[0].read_bytes())
    assert cand.arrays["x"].ndim == 2


def test_unknown_op(capsys):
    code, _, err = run_cli(capsys, "fuzz", "torch.sofmax", "--evals", "5")
    assert_one_line_error(code, err, "did you mean torch.softmax")


def test_unsupported_dtype(capsys):
    code, _, err = run_cli(capsys, "fuzz", "torch.relu", "--dtype", "float8", "--evals", "5")
    assert_one_line_error(code, err, "unknown dtype 'float8'")
    code, _, err = run_cli(capsys, "fuzz", "torch.relu", "--dtype", "float64", "--evals", "5")
    assert_one_line_error(code, err, "does not support dtype float64")


def test_bad_flag_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fuzz", "torch.relu", "--evals", "many"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected a positive whole number, got 'many'" in err[0]


@pytest.mark.parametrize("argv", [
    ["fuzz", "torch.relu", "--budget", "nan"],
    ["fuzz", "torch.relu", "--budget", "inf"],
    ["fuzz", "torch.relu", "--evals", "0"],
    ["run", "--base", "HEAD", "--budget", "-1"],
    ["run", "--base", "HEAD", "--per-op", "nan"],
    ["baseline", "refresh", "--budget", "-1"],
    ["baseline", "refresh", "--evals", "-5"],
])
def test_budgets_must_be_positive_and_finite(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("positive number of seconds" in err[0] or "positive whole number" in err[0]), err


def test_run_with_a_bad_dtype_still_writes_the_error_report(capsys, tmp_path):
    out = tmp_path / "out"
    code, stdout, _ = run_cli(capsys, "run", "--base", "HEAD", "--dtype", "float8", "--out", str(out))
    assert code == 2 and "unknown dtype 'float8'" in stdout
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"] == "error" and (out / "junit.xml").exists()


@pytest.mark.parametrize(
    "config,needle",
    [
        ("version: 1\nops: [\n", "invalid YAML"),
        ("version: 1\nops:\n  - name: a\n    callable: m:f\n    inputs: [{name: x, shape: [N]}]\n    dtypes: [float8]\n",
         ":6: ops.0.dtypes.0"),
        ("version: 1\nbudgett: {total: 3}\n", ":2: budgett: unknown key"),
        ("version: 1\nops:\n  - name: a\n    inputs: [{name: x, shape: [3]}]\n", "ops.0: 'callable' is a required property"),
    ],
)
def test_broken_config_names_key_and_line(capsys, tmp_path, config, needle):
    cfg = tmp_path / ".dl-gate.yml"
    cfg.write_text(config)
    code, _, err = run_cli(capsys, "ops", "--config", str(cfg))
    assert_one_line_error(code, err, needle)


def test_unimportable_callable(capsys, tmp_path):
    cfg = tmp_path / ".dl-gate.yml"
    cfg.write_text(textwrap.dedent("""
        version: 1
        ops:
          - name: mine.op
            callable: no_such_module_xyz:fn
            dims: {N: [1, 4]}
            inputs: [{name: x, shape: [N]}]
    """))
    code, _, err = run_cli(capsys, "fuzz", "mine.op", "--config", str(cfg), "--evals", "5")
    assert_one_line_error(code, err, "cannot import callable 'no_such_module_xyz:fn'")


def test_a_module_that_fails_to_import_names_file_and_line(capsys, tmp_path):
    (tmp_path / "broken_ops_mod.py").write_text("import math\n\ndef fn(x):\n    return (x + 1\n")
    cfg = tmp_path / ".dl-gate.yml"
    cfg.write_text(textwrap.dedent("""
        version: 1
        python_path: ["."]
        ops:
          - name: mine.broken
            callable: broken_ops_mod:fn
            dims: {N: [1, 4]}
            inputs: [{name: x, shape: [N]}]
    """))
    code, _, err = run_cli(capsys, "fuzz", "mine.broken", "--config", str(cfg), "--evals", "5")
    assert_one_line_error(code, err, "module broken_ops_mod fails to import at ")
    assert "broken_ops_mod.py:4: SyntaxError" in err and "internal error" not in err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "ops", "--config", str(tmp_path / "nope.yml"))
    assert_one_line_error(code, err, "does not exist")


def test_torch_run_never_imports_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from gate.cli import main\n"
        "rc = main(['fuzz', 'torch.sigmoid', '--evals', '10', '--dtype', 'float32', '--save-inputs', ''])\n"
        "assert rc == 0\n"
        "print('TF-LOADED' if 'tensorflow' in sys.modules else 'TF-NOT-LOADED')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent.parent)})
    assert res.returncode == 0, res.stderr
    assert "TF-NOT-LOADED" in res.stdout


def test_missing_framework_names_the_extra(tmp_path):
    # hide tensorflow from the interpreter: the error names the extra to install
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'tensorflow' or name.startswith('tensorflow.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "import importlib.util\n"
        "_orig = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'tensorflow' else _orig(n, *a)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from gate.cli import main\n"
        "sys.exit(main(['fuzz', 'tf.relu', '--evals', '3']))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent.parent)})
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'dl-gate[tensorflow]'" in lines[0], res.stderr


def test_sigterm_stops_a_run_and_still_writes_the_report(tmp_path):
    """A CI time limit sends SIGTERM: the run stops (even inside an operator call) and the
    report and JUnit say so."""
    import os
    import signal
    import time

    repo = tmp_path / "r"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                                                 "--allow-empty", "-m", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    out = tmp_path / "out"
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-m", "gate.cli", "run", "--base", "main", "--ops", "torch.exp",
                             "--budget", "300", "--out", str(out)], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": root})
    deadline = time.time() + 120
    while not out.exists() and proc.poll() is None and time.time() < deadline:  # the run has started
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 2 and report["outcome"] == "error" and "SIGTERM" in report["reason"], stderr[-2000:]
    assert (out / "junit.xml").exists()


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for inner, p in _subparsers(sub):
                    yield f"{name} {inner}", p


def test_every_help_has_an_example_and_one_grammar_for_budgets_ops_and_json():
    from gate.cli import build_parser

    parser = build_parser()
    assert "example" in parser.format_help()
    seen = 0
    for name, sub in _subparsers(parser):
        if name == "baseline":  # a group: its actions carry the examples
            continue
        text = sub.format_help()
        assert "example" in text and " dl-gate " in text.split("example", 1)[1], name
        opts = {o for a in sub._actions for o in a.option_strings if a.help != "==SUPPRESS=="}
        assert "--op" not in opts, name  # --ops everywhere (--op only as a hidden old spelling)
        budget = [a for a in sub._actions if "--budget" in a.option_strings]
        if budget:
            assert budget[0].help.startswith("total"), name
        per_op = [a for a in sub._actions if "--per-op" in a.option_strings]
        assert all("per operator" in a.help for a in per_op), name
        js = [a for a in sub._actions if "--json" in a.option_strings]
        assert all(a.metavar == "FILE" for a in js), name  # --json FILE everywhere
        seen += 1
    assert seen >= 10
    # the old spellings still parse, into the new destinations
    args = parser.parse_args(["nightly", "--op", "torch.relu", "--ops", "torch.tanh"])
    assert args.ops == ["torch.relu", "torch.tanh"]
    args = parser.parse_args(["baseline", "refresh", "--budget", "60", "--per-op", "5"])
    assert (args.budget, args.per_op) == (60.0, 5.0)


def test_ops_json_file_and_operators_by_import_path(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "ops", "--json", str(tmp_path / "ops.json"))
    assert code == 0 and out == ""
    rows = json.loads((tmp_path / "ops.json").read_text())
    assert any(r["name"] == "torch.softmax" for r in rows)

    from gate.ops.catalog import UnknownOpError, load_catalog

    cat = load_catalog([], builtin=("torch",))
    # the row's callable, as written, and an import path naming the same function object
    assert cat.get("torch.nn.functional.softmax").name == "torch.softmax"
    assert cat.get("torch.nn.functional.conv2d").name == "torch.conv2d"
    assert cat.get("torch.nn.modules.conv.F.conv2d").name == "torch.conv2d"
    # a Python wrapper of the framework's own function (F.relu calls torch.relu): the row of its name
    assert cat.get("torch.nn.functional.relu").name == "torch.relu"
    assert cat.get("torch.nn.functional.gelu").name == "torch.gelu"
    with pytest.raises(UnknownOpError, match="unknown operator 'torch.nn.functional.no_such_op'"):
        cat.get("torch.nn.functional.no_such_op")


def test_progress_is_rich_on_a_terminal_and_plain_lines_elsewhere(monkeypatch, capsys):
    import io

    from gate.commands import common

    with common.Progress() as say:  # pytest's stderr is no terminal: one line per message
        say("selected 2 operator(s)")
        say("fuzzing torch.relu[float32/cpu/input]")
    assert capsys.readouterr().err.splitlines() == ["dl-gate: selected 2 operator(s)",
                                                    "dl-gate: fuzzing torch.relu[float32/cpu/input]"]
    monkeypatch.setenv("CI", "true")  # in CI, even on a terminal: no progress display
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert common.progress_enabled() is False
    monkeypatch.delenv("CI")
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    fake = io.StringIO()
    monkeypatch.setattr(common, "progress_enabled", lambda: True)
    monkeypatch.setattr(common.sys, "stderr", fake)
    with common.Progress() as say:
        assert say.live is not None  # the rich status line
        say("selected 2 operator(s)")
        say("fuzzing torch.relu[float32/cpu/input]")  # updates the status line in place only
    text = fake.getvalue()
    assert "dl-gate: selected 2 operator(s)" in text and "dl-gate: fuzzing" not in text


def test_refresh_budget_is_total_seconds_shared_by_the_operators_and_per_op_is_per_operator(tmp_path, capsys):
    """One grammar: ``--budget`` is the refresh's total (split over the operators, then over each
    operator's variants), ``--per-op`` each operator's seconds, as for ``run``."""
    import os
    import re

    from tests.test_gate_run import make_repo

    repo = make_repo(tmp_path, baselines=False)
    old = os.getcwd()
    os.chdir(repo)
    try:
        def budgets(*argv):
            code = main(["baseline", "refresh", "--dtype", "float32", "--mode", "input", *argv])
            err = capsys.readouterr().err
            assert code == 0, err
            got = {}
            for op, sec in re.findall(r"measuring (\S+?)\[\S+\] \(([0-9.e+-]+)s\)", err):
                got[op] = got.get(op, 0.0) + float(sec)
            return got

        total = budgets("--budget", "3")
        per_op = budgets("--per-op", "1")
    finally:
        os.chdir(old)
    assert len(total) >= 2, total
    assert abs(sum(total.values()) - 3.0) < 0.02, total  # the total, shared (messages round to 3 digits)
    for op, sec in total.items():
        assert abs(sec - 3.0 / len(total)) < 0.01 and abs(per_op[op] - 1.0) < 0.01, (op, sec, per_op)


def test_the_terminal_table_shows_nan_on_both_sides_and_the_reports_warnings(capsys):
    # AMPLIFY's RMSNorm run: head "19 NaN/Inf", base 0 for the same NaN outputs, and the warning
    # that one side's reference is not float64 only in report.md
    from gate.commands.run import print_report
    from tests.report_samples import pass_report
    from gate.judge.verdict import PASS, VariantVerdict
    from tests.report_samples import variant

    v = VariantVerdict(op="amplify.rmsnorm", framework="torch", variant=variant("float32"), outcome=PASS,
                       reason="NaN/Inf in both", base_error=0.0, head_error=0.0, threshold=4.0,
                       head_nonfinite=19, base_nonfinite=19)
    print_report(pass_report(verdicts=[v], warnings=["amplify.rmsnorm[float32/cpu/input]: base's reference does not run in float64"]))
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "amplify.rmsnorm[" in line and "NaN/Inf in both" in line)
    assert row.count("19 NaN/Inf, 0 ulp") == 2, row  # both sides, written alike
    assert "  warning: amplify.rmsnorm[float32/cpu/input]: base's reference does not run in float64" in out


def test_the_selection_line_says_how_an_operator_was_selected(capsys):
    # geoopt acceptance run with --ops: the line read "selected geoopt.SPD.norm: None:None geoopt.SPD.norm"
    from gate.commands.run import print_report
    from tests.report_samples import pass_report

    print_report(pass_report(selected=[
        {"op": "mylib.softplus", "reasons": [{"kind": "forced", "file": None, "line": None, "symbol": "mylib.softplus",
                                               "path": ["mylib.softplus"]}]},
        {"op": "mylib.gelu", "reasons": [{"kind": "python", "file": "mylib/ops.py", "line": 12, "symbol": "gelu",
                                           "path": ["gelu"]}]}]))
    out = capsys.readouterr().out
    assert "  selected mylib.softplus: named with --ops" in out and "None" not in out, out
    assert "  selected mylib.gelu: mylib/ops.py:12 gelu" in out, out


def test_a_pr_run_spreads_its_total_over_the_operators_it_changes():
    """Issue 28's acceptance: init wrote `total: 300, per_op: 10`, and a PR that changed one
    operator searched it for 10 s, leaving 290 s of its budget unspent. Each changed operator
    gets the total spread over them, and at least per_op (never past the total)."""
    from gate.pipeline import op_share

    assert op_share(120.0, 10.0, 1) == 120.0  # one operator: the whole total
    assert op_share(120.0, 10.0, 3) == 40.0
    assert op_share(120.0, 10.0, 20) == 10.0  # many: per_op each, the allocation spends the total by priority
    assert op_share(120.0, None, 4) == 30.0
    assert op_share(5.0, 10.0, 1) == 5.0  # never past the total
