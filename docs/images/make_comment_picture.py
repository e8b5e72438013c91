"""Draw the sticky PR comment of a report as an SVG picture (the README's): the comment's
Markdown exactly as `dl-gate publish --github` would post it, rendered by rich (headings, lists,
tables, code blocks) and exported with rich's SVG writer. A browser's rendering of GitHub's page is
not available on the machines that build this project; rich's is the closest one that is.

    python docs/images/make_comment_picture.py dl-gate-out/report.json docs/images/comment-regression.svg

(the report of `dl-gate run --example regression --out dl-gate-out`)."""
from __future__ import annotations

import re
import sys
from pathlib import Path


def picture(report_path: str, out: str, width: int = 118) -> str:
    from rich.console import Console
    from rich.markdown import Markdown

    from gate.report.github import comment_footer
    from gate.report.markdown import render_comment
    from gate.report.schema import load_report

    report = load_report(report_path)
    body = render_comment(report, full_report="https://github.com/you/your-lib/actions/runs/1234567890",
                          run_id="1234567890", repository="you/your-lib",
                          footer=comment_footer(report, None, None))
    # what GitHub does not show: the footer's <sub> tags; links as their text
    text = re.sub(r"</?sub>", "", body)
    console = Console(record=True, width=width, file=open("/dev/null", "w"), force_terminal=True, color_system="truecolor")
    console.print(Markdown(text, hyperlinks=False))
    svg = console.export_svg(title="dl-gate's PR comment (run --example regression)")
    Path(out).write_text(svg)
    return body


if __name__ == "__main__":
    picture(sys.argv[1], sys.argv[2])
