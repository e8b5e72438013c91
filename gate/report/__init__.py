"""Report: verdicts -> what a user sees.

* :func:`write_all` writes the files of a run into its output directory: ``report.json`` (the
  :class:`~gate.judge.verdict.GateReport`), ``junit.xml``, ``report.md`` (the full Markdown
  report) and ``errors.png`` (when matplotlib is installed).
* :mod:`.junit`, :mod:`.markdown`, :mod:`.plot`: one renderer each.
* :func:`gate.report.github.publish_to_github`: job summary, step outputs, annotations and the
  sticky PR comment (:mod:`.comment`, :mod:`.annotations`, :mod:`.outputs`).

This stage never imports torch or TensorFlow: it runs on plain data, also in the fork-safe
``workflow_run`` job that only has the report artifact."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Dict, Optional

from ..judge.verdict import GateReport

FILES = {"report": "report.json", "junit": "junit.xml", "markdown": "report.md", "plot": "errors.png"}


def make_output_dir(path: os.PathLike) -> Path:
    """Create an output directory; the topmost directory this creates gets a ``.gitignore``
    of ``*`` (as pytest does for its cache), so ``git add -A`` in a repository never commits a
    run's outputs. An existing directory is left as it is."""
    path = Path(path)
    top = None
    p = path.absolute()
    while not p.exists():
        top = p
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    if top is not None:
        (top / ".gitignore").write_text("# created by dl-gate: run outputs are not source\n*\n")
    return path


def _write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_all(report: GateReport, out_dir: os.PathLike, root: Optional[os.PathLike] = None) -> Dict[str, Path]:
    """Write report.json, junit.xml, report.md and the PNG plot into ``out_dir``; return
    ``{"report", "junit", "markdown"[, "plot"]}`` -> path. ``root`` (the repository) makes
    operator source paths relative in the JUnit file. The report's ``artifacts`` list the files
    (names relative to ``out_dir``)."""
    from .junit import write_junit
    from .markdown import render_markdown
    from .plot import write_plot

    from ..serial import scrub_text

    # text from the diff or the operator's own messages may hold undecodable bytes (kept as lone
    # surrogates): every file below is UTF-8
    report = GateReport.from_dict(scrub_text(report.to_dict()))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: Dict[str, Path] = {}
    paths["junit"] = write_junit(report, out / FILES["junit"], root)
    plot = write_plot(report, out / FILES["plot"])
    if plot is not None:
        paths["plot"] = plot
    artifacts = dict(report.artifacts or {})
    artifacts.update({k: p.name for k, p in paths.items()})
    artifacts.update({"report": FILES["report"], "markdown": FILES["markdown"]})
    report = dataclasses.replace(report, artifacts=artifacts)
    paths["markdown"] = _write_text(out / FILES["markdown"], render_markdown(report))
    paths["report"] = _write_text(out / FILES["report"], json.dumps(report.to_dict(), indent=1) + "\n")
    return paths


__all__ = ["write_all", "FILES"]
