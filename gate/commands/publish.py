"""``dl-gate publish REPORT.json``: render and publish an existing report.

Writes junit.xml, report.md, report.json and the plot into ``--out``; with ``--github`` also
the job summary, annotations, step outputs and the sticky PR comment. This is what the
fork-safe ``workflow_run`` job runs on the artifact of a fork's run: the file is validated as
data (:mod:`gate.report.schema`) and nothing in it is executed or opened."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..report.sinks import PUBLISHERS


def register(sub) -> None:
    p = sub.add_parser("publish", help="render and publish an existing report.json (JUnit, Markdown, GitHub)", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  dl-gate publish artifact/report.json --github --no-annotations")
    p.add_argument("report", metavar="REPORT.json", help="a report written by `dl-gate run`")
    p.add_argument("--out", metavar="DIR", help="write junit.xml, report.md, report.json and errors.png here")
    for pub in PUBLISHERS:  # --github, ...
        p.add_argument(f"--{pub.name}", action="store_true", help=pub.help)
    p.add_argument("--comment", action=argparse.BooleanOptionalAction, default=True,
                   help="with --github: create/update the sticky PR comment (default: on)")
    p.add_argument("--annotations", action=argparse.BooleanOptionalAction, default=True,
                   help="with --github: print ::error/::warning annotations (default: on)")
    p.add_argument("--summary", action=argparse.BooleanOptionalAction, default=True,
                   help="with --github: append the report to GITHUB_STEP_SUMMARY (default: on)")
    p.add_argument("--comment-key", default="default", metavar="KEY",
                   help="keeps one sticky comment per key (e.g. cpu and gpu jobs)")
    p.add_argument("--comment-author", default=None, metavar="LOGIN",
                   help="login that owns the sticky comment (default github-actions[bot])")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..report import write_all
    from ..report.markdown import render_markdown
    from ..report.schema import load_report

    report = load_report(args.report)
    paths = {}
    root = os.environ.get("GITHUB_WORKSPACE") or None
    if args.out:
        paths = write_all(report, Path(args.out), root=root)
        for name, p in sorted(paths.items()):
            print(f"{name}: {p}", file=sys.stderr)
    chosen = [pub for pub in PUBLISHERS if getattr(args, pub.name.replace("-", "_"))]
    for pub in chosen:
        pub.publish(report, os.environ, paths=paths, comment=args.comment, annotations=args.annotations,
                    summary=args.summary, comment_key=args.comment_key, comment_author=args.comment_author)
    if not chosen and not args.out:
        print(render_markdown(report))
    return 0
