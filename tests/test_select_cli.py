"""``dl-gate select`` as a user runs it: text report, --json, --config, --repo, one-line errors."""
import json

import pytest

from gate.cli import main
from gate.select.model import Selection
from tests.fixtures.select_trees import PYLIB, PYLIB_CONFIG
from tests.helpers.gitrepo import GitRepo


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    r = GitRepo.init(tmp_path_factory.mktemp("cli") / "lib")
    r.write({**PYLIB, ".dl-gate.yml": PYLIB_CONFIG})
    r.commit("base")
    r.branch("pr")
    src = r.read("src/mylib/_helpers.py").replace("0.044715", "0.0447").replace("return x\n", "return x + 0\n")
    r.write({"src/mylib/_helpers.py": src, "README.md": "# mylib 2\n"}, dedent=False)
    r.write({"src/mylib/ops.py": r.read("src/mylib/ops.py").replace("(tanh approximation)", "(tanh form)")}, dedent=False)
    r.commit("pr")
    r.checkout("main")
    return r


def test_text_report_and_json(lib, tmp_path, capsys):
    out = tmp_path / "out" / "sel.json"
    code = main(["select", "--base", "main", "--head", "pr", "--repo", str(lib.path), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "selected 1 operator:" in text and "\n  mylib.gelu\n" in text
    assert "src/mylib/_helpers.py:5  [python]  mylib._helpers:poly -> mylib.ops:gelu -> mylib:gelu -> mylib.gelu" in text
    assert "mylib._helpers:unused: not reachable from any operator in the catalogue" in text
    assert "mylib.ops:gelu: docstring/comment/annotation/format-only change" in text
    assert "README.md: no analyser reads this file type" in text
    sel = Selection.from_dict(json.loads(out.read_text()))
    assert sel.op_names() == ["mylib.gelu"] and sel.head_sha == lib.git("rev-parse", "pr")


def test_json_to_stdout_with_explicit_config(lib, tmp_path, capsys):
    cfg = tmp_path / "other.yml"
    cfg.write_text(PYLIB_CONFIG.replace("python_path: [src]", f"python_path: [{lib.path / 'src'}]"))
    code = main(["select", "--base", "main", "--head", "pr", "--repo", str(lib.path), "--config", str(cfg), "--json", "-"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["op"] for s in data["selected"]] == ["mylib.gelu"]


@pytest.mark.parametrize("argv,needle", [
    (["--base", "no-such-ref"], "unknown git ref 'no-such-ref'"),
    (["--base", "main", "--head", "nope"], "unknown git ref 'nope'"),
])
def test_bad_refs_are_one_line_exit_2(lib, capsys, argv, needle):
    code = main(["select", *argv, "--repo", str(lib.path)])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1


def test_not_a_repository_is_one_line_exit_2(tmp_path, capsys):
    code = main(["select", "--base", "main", "--repo", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "is not a git repository" in err and err.count("\n") == 1
