"""The Markdown report (job summary / PR comment), its size cuts, and the PNG plot."""
from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest

from gate.judge.verdict import PASS, VariantVerdict
from gate.report import write_all
from gate.report.common import COMMENT_LIMIT, SUMMARY_LIMIT
from gate.report.markdown import mermaid_chart, render_markdown
from gate.report.plot import write_plot
from tests.report_samples import error_report, pass_report, regression, rich_report, variant


def table_rows(md):
    """Rows of the operator x variant table(s): | icon | `op` | variant | ... | outcome |"""
    return [ln for ln in md.splitlines() if re.match(r"^\| \S+ \| `[^`]+` \| ", ln) and ln.count(" | ") == 7]


def test_verdict_line_table_details_and_chart():
    report = rich_report()
    md = render_markdown(report, repo_url="https://github.com/acme/ops")
    first = md.splitlines()[0]
    assert first.startswith("## ❌ dl-gate: **regression**") and "2 regressions in 2 operators" in first
    rows = table_rows(md)
    assert len(rows) == len(report.verdicts)
    assert rows[0].count("|") == 9  # icon, operator, variant, base, head, ratio, threshold, outcome
    sp = next(r for r in rows if "softplus" in r and "float16" in r)
    assert "1.5 ulp" in sp and "48 ulp" in sp and "×32" in sp and "4.5 ulp" in sp and "**regression**" in sp
    assert rows[0].split("|")[-2].strip() == "**regression**"  # failing rows first
    nan_row = next(r for r in rows if "exp_sum" in r)  # new NaN/Inf: the ratio of finite errors means nothing
    # NaN/Inf counted first, on both sides the same way (zero included)
    assert "| 0 NaN/Inf, 1 ulp | 3 NaN/Inf, ∞ ulp |" in nan_row and "| NaN/Inf |" in nan_row
    # localisation in collapsible sections: every key present is rendered
    det = md[md.index("<summary>❌ <b>mylib.softplus</b>"):]
    det = det[:det.index("</details>")]
    for needle in ("`beta=20`", "`x: float16[1] = [-0.0001]`", "index 0: head 3.1e-4", "torch.log1p at mylib/ops.py:14",
                   "[mylib/ops.py:14](https://github.com/acme/ops/blob/" + "b" * 40 + "/mylib/ops.py#L14)",
                   "| x=-1e-4 | 1.5 | 48 |", "```sh\npython dl-gate-out/repro/mylib.softplus_float16.py\n```",
                   "dl-gate-out/repro/mylib.softplus_float16.py"):
        assert needle in det, needle
    # every figure says which input it is on: the judged error on the input as found, the worst
    # element and the base-vs-head rows on the localiser's minimal input (a focal-loss report
    # showed "head 30.9 ulp" beside "head error 173 ulp" with nothing telling the two inputs apart)
    assert "(ratio ×32, threshold 4.5 ulp) on the input as found, `x: float16[3, 4] in [-1e-4, 1e-4]`" in det
    assert "**Minimal input** (each tensor as name[shape][min, max]):" in det
    assert "**Worst element of the minimal input:** index 0" in det
    assert "**Base vs head on the minimal input:**" in det
    # a time-bounded search says that its seed does not fix what it finds
    timed = rich_report()
    timed.env["budget"] = {"seconds": 120.0, "per_op": 10.0}
    assert "seed `1234` (a time budget: a rerun can reach other inputs; `budget.evals` repeats them)" in \
        render_markdown(timed).splitlines()[2]
    plain = render_markdown(pass_report(outcome="regression", reason="r", verdicts=[regression(diagnosis=False)]))
    assert "on the input as found" not in plain and "inimal input" not in plain
    assert "**Input** (each tensor as name[shape][min, max]): `x: float16[3, 4] in [-1e-4, 1e-4]`" in plain
    chart = re.search(r"```mermaid\n(.*?)```", md, re.S).group(1)
    assert chart.startswith("xychart-beta")
    n_labels = len(re.search(r"x-axis \[(.*)\]", chart).group(1).split('", "'))
    series = re.findall(r"^\s+(bar|line) \[(.*)\]$", chart, re.M)
    assert [s[0] for s in series] == ["bar", "line", "line"]
    assert all(len(s[1].split(",")) == n_labels for s in series)


def test_error_and_pass_reports():
    md = render_markdown(error_report())
    assert md.startswith("## ⚠️ dl-gate: **error**") and "unknown revision origin/nope" in md
    assert "<details open><summary>Harness errors (1)</summary>" in md
    md = render_markdown(pass_report())
    assert md.startswith("## ✅ dl-gate: **pass**") and "<details>" not in md.split("```mermaid")[0]


def test_untrusted_text_is_escaped():
    v = regression()
    v.op = "evil|op"
    v.reason = "<img src=x onerror=alert(1)> @maintainers ``` </details>"
    v.diagnosis["repro_command"] = "echo ```\n</details><script>x</script>"
    md = render_markdown(pass_report(verdicts=[v], outcome="regression"))
    assert "<img" not in md and "@maintainers" not in md
    assert "&lt;img src=x" in md and "&#64;maintainers" in md
    assert "evil\\|op" in md
    fence = re.search(r"(`{4,})sh\necho ```\n</details><script>x</script>\n\1\n", md)
    assert fence, "the repro block's fence must be longer than the backticks inside it"
    outside = md.replace(fence.group(0), "")
    assert "<script>" not in outside and outside.count("<details") == outside.count("</details>")


def test_chart_labels_cannot_end_the_mermaid_block():
    v = regression()
    v.op = 'lib.x\n```\n@acme/admins ![px](https://evil.example/p.png)\n```mermaid'
    v.metric = "ulp`\n@x"
    chart = mermaid_chart(pass_report(verdicts=[v], outcome="regression"))
    body = chart.split("\n")
    assert body[0] == "```mermaid" and body[-1] == "```" and all("`" not in ln for ln in body[1:-1])
    assert "@" not in chart and "![" not in chart and len(body) == 9


def big_report(n=3000, failing=12):
    vs = [regression(op=f"lib.fail{i}") for i in range(failing)]
    for i in range(n):
        vs.append(VariantVerdict(op=f"lib.op{i:05d}", framework="torch", variant=variant("float32"), outcome=PASS,
                                 reason="max error 0.9 ulp <= threshold 2 ulp " + "x" * 80, base_error=0.8,
                                 head_error=0.9, threshold=2.0))
    return rich_report(verdicts=vs)


@pytest.mark.parametrize("limit", [COMMENT_LIMIT, 20_000, SUMMARY_LIMIT])
def test_cut_to_the_limit_keeping_what_matters(limit):
    report = big_report(n=12_000 if limit == SUMMARY_LIMIT else 3000)
    md = render_markdown(report, limit=limit, full_report="https://github.com/acme/ops/actions/runs/9")
    assert len(md.encode()) <= limit
    assert md.startswith("## ❌ dl-gate: **regression**")
    rows = table_rows(md)
    assert all(f"`lib.fail{i}`" in md for i in range(12))  # every failing row survives
    assert len(rows) < len(report.verdicts)
    assert "Cut to fit GitHub's size limit" in md and "https://github.com/acme/ops/actions/runs/9" in md
    assert md.count("<details") == md.count("</details>")


def test_a_huge_single_section_is_hard_cut():
    v = regression()
    v.reason = "r" * 300
    md = render_markdown(pass_report(verdicts=[v], outcome="regression", errors=["e" * 5000]), limit=1500)
    assert len(md.encode()) <= 1500 and "Cut to fit" in md


def test_mermaid_chart_log_scale_and_infinity():
    report = rich_report()
    chart = mermaid_chart(report)
    assert 'y-axis "log10(1 + ulp)"' in chart  # 0.5 .. inf spans decades
    bars = [float(x) for x in re.search(r"bar \[(.*)\]", chart).group(1).split(",")]
    assert max(bars) == bars[0]  # the infinite head error is drawn tallest, not as 1e30
    assert max(bars) < 5
    assert mermaid_chart(pass_report(verdicts=[])) is None


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_png_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    from gate.report import plot

    monkeypatch.setenv("DL_GATE_PLOT", "0")  # the switch the suite's end-to-end runs use
    assert write_plot(rich_report(), tmp_path / "off.png") is None and "DL_GATE_PLOT=0" in plot.LAST_SKIP
    assert not (tmp_path / "off.png").exists()
    monkeypatch.delenv("DL_GATE_PLOT")
    path = write_plot(rich_report(), tmp_path / "errors.png")
    w, h = png_size(path)
    assert w >= 600 and h >= 200
    big = write_plot(big_report(n=100), tmp_path / "big.png")
    assert png_size(big)[1] > h  # one bar pair per variant: taller for more variants
    assert write_plot(error_report(), tmp_path / "none.png") is None


def test_without_matplotlib_the_report_is_complete(tmp_path, monkeypatch):
    from gate.report import plot

    monkeypatch.delenv("DL_GATE_PLOT", raising=False)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert write_plot(rich_report(), tmp_path / "x.png") is None
    assert "pip install 'dl-gate[plot]'" in plot.LAST_SKIP
    paths = write_all(rich_report(), tmp_path / "out")
    assert sorted(paths) == ["junit", "markdown", "report"]


def test_write_all_writes_every_file_and_lists_them(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    monkeypatch.delenv("DL_GATE_PLOT", raising=False)
    paths = write_all(rich_report(), tmp_path / "out")
    assert {p.name for p in paths.values()} == {"junit.xml", "report.md", "report.json", "errors.png"}
    saved = json.loads(paths["report"].read_text())
    assert saved["artifacts"] == {"junit": "junit.xml", "plot": "errors.png", "report": "report.json",
                                  "markdown": "report.md"}
    assert paths["markdown"].read_text().startswith("## ❌ dl-gate")
    assert not list((tmp_path / "out").glob("*.tmp"))


def _write_csv(report, path, root=None):
    Path(path).write_text("".join(f"{v.id},{v.outcome}\n" for v in report.verdicts))
    return Path(path)


def test_a_new_file_sink_is_one_registry_line(tmp_path, monkeypatch):
    import gate.report as rep
    from gate.report.sinks import FileSink

    monkeypatch.setattr(rep, "FILE_SINKS", rep.FILE_SINKS + (FileSink("csv", "verdicts.csv",
                                                                      "tests.test_report_markdown:_write_csv"),))
    paths = write_all(rich_report(), tmp_path / "out")
    assert paths["csv"].read_text().startswith("mylib.")
    assert json.loads(paths["report"].read_text())["artifacts"]["csv"] == "verdicts.csv"
    assert list(rep.written(tmp_path / "out"))[-2:] == ["csv", "report"]  # report.json last, as written


def test_report_md_next_steps_name_the_folder_it_was_written_to(tmp_path, monkeypatch):
    """A local `dl-gate run --out out` writes report.md whose next steps say `out/...` (they said
    `dl-gate-out/`, the Action's artifact folder, whatever --out was); a folder outside the working
    directory is named in full."""
    from gate.report import write_markdown

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    md = write_markdown(rich_report(), tmp_path / "out" / "report.md").read_text()
    assert "dl-gate explain 'out/report.json#" in md and "python out/repro/" in md
    assert "explain 'dl-gate-out" not in md and "`python dl-gate-out" not in md  # (a verdict's own stored command is its own)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    md = write_markdown(rich_report(), tmp_path / "out" / "report.md").read_text()
    assert f"python {(tmp_path / 'out').resolve().as_posix()}/repro/" in md
