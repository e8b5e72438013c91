"""What the README and docs/action.md say about the tool, held to the tool (issue 29): the first
screen (what, picture, quickstart), every `dl-gate ...` command they show parses with the real
CLI, every path they name exists, the workflow step they show is the one `dl-gate init` writes,
the outcome table is the exit codes, help texts' examples are accepted."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gate.cli import build_parser
from gate.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ACTION_DOC = (ROOT / "docs" / "action.md").read_text()


def blocks(text: str, lang: str):
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_the_first_screen_is_the_two_commands_then_what_picture_and_quickstart():
    lines = README.splitlines()
    assert lines[2] == "```bash" and lines[3].endswith(".venv/bin/dl-gate run --example")
    assert lines[4].endswith(".venv/bin/python -m pytest") and lines[5] == "```"
    first_screen = "\n".join(lines[:60])
    what = first_screen.index("**dl-gate fails a pull request when it makes a deep-learning operator less precise")
    picture = first_screen.index("](docs/images/comment-regression.svg)")
    quick = first_screen.index("## Quickstart: your repository")
    assert what < picture < quick and "dl-gate init" in first_screen[quick:]
    # the terms are defined before the rules use them
    words = README.index("**Words used below.**")
    assert all(README.index(w) > words for w in ("## What a run tells you", "## Commands"))
    for term in ("*variant*", "*mode*", "*ulp*"):
        assert term in README[words:words + 900]


def test_the_picture_is_the_comment_of_the_bundled_regression(tmp_path):
    svg = (ROOT / "docs" / "images" / "comment-regression.svg").read_text()
    assert svg.startswith("<svg") and "dl-gate" in svg and "Next" in svg and "step" in svg
    # the script draws it from a report: on a sample report, its text is the comment's
    import runpy

    from gate.report.markdown import render_comment
    from gate.report.schema import validate_report_dict
    from tests.report_samples import rich_report

    report_path = tmp_path / "report.json"
    import json

    report_path.write_text(json.dumps(rich_report().to_dict()))
    make = runpy.run_path(str(ROOT / "docs" / "images" / "make_comment_picture.py"))["picture"]
    body = make(str(report_path), str(tmp_path / "c.svg"))
    assert body.startswith(render_comment(validate_report_dict(json.loads(report_path.read_text())))[:60])
    drawn = (tmp_path / "c.svg").read_text()
    assert "mylib.softplus" in drawn.replace("&#160;", " ")


def commands(text: str):
    """Each `dl-gate ...` line of the shell blocks: continuation lines joined, a synopsis's
    optional `[--flag VALUE]` taken as given, comments dropped."""
    for block in blocks(text, "bash") + blocks(text, "sh"):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("dl-gate "):
                yield re.sub(r"\[(--[^\]]+)\]", r"\1", line)


@pytest.mark.parametrize("doc", ["README.md", "docs/action.md", "docs/contributing.md"])
def test_every_command_shown_parses_with_the_real_cli(doc):
    text = (ROOT / doc).read_text()
    shown = list(commands(text))
    if doc == "README.md":
        assert len(shown) >= 12
    parser = build_parser()
    for line in shown:
        argv = shlex.split(line)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # argparse's way of refusing
            pytest.fail(f"{doc}: `{line}` does not parse ({exc})")


def test_every_repository_path_named_exists():
    named = set(re.findall(r"\]\(((?:docs|gate|bench|tests)/[^)#\s]+)\)", README))
    named |= set(re.findall(r"`((?:docs|gate|bench|tests|\.github)/[\w./-]+\.(?:md|py|yml|yaml|json|xsd|svg))`",
                            README + ACTION_DOC))
    assert len(named) >= 10
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_the_workflow_step_shown_is_the_one_init_writes():
    from gate.init.workflows import ActionRef, render

    sha = "0123456789abcdef0123456789abcdef01234567"
    written = render(install="pip install -e .", action=ActionRef(sha=sha))[".github/workflows/dl-gate.yml"]
    (shown,) = [b for b in blocks(README, "yaml") if "dl-gate/dl-gate@" in b]
    assert shown.replace("<commit of v0>", sha) in written
    (doc_step,) = [b for b in blocks(ACTION_DOC, "yaml") if "dl-gate/dl-gate@<commit SHA of v0>" in b]
    step = "\n".join(ln[6:] if ln.startswith("      ") else ln for ln in written.splitlines())
    assert doc_step.replace("<commit SHA of v0>", sha) in step
    # the install the quickstart shows is the one pip can read, at the tag init pins
    assert 'pip install "dl-gate[torch] @ git+https://github.com/dl-gate/dl-gate@v0"' in README


def test_the_outcome_table_is_the_exit_codes():
    rows = re.findall(r"^\| (pass|regression|error|needs-baseline) \| (\d) \|", README, re.M)
    assert {o: int(c) for o, c in rows} == {o.value: code for o, code in EXIT_CODES.items()}


def test_the_action_help_example_is_accepted():
    from gate.commands.action import ActionInputs

    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if a.choices)  # noqa: SLF001 - argparse's own tree
    epilog = sub.choices["action"].epilog
    example = epilog.split("\n")[-1].split()
    env = dict(kv.split("=", 1) for kv in example if "=" in kv)
    assert ActionInputs.from_env(env).mode == "gate"


def test_the_comment_size_the_docs_state_is_the_code():
    from gate.report.markdown import COMMENT_BUDGET

    assert "at most 6 KB" in ACTION_DOC and COMMENT_BUDGET == 6 * 1024
    assert "tests/data/junit.xsd" not in ACTION_DOC + README  # the schema file is junit-10.xsd
