"""Report: verdicts -> what a user sees.

* :func:`write_all` writes the files of a run into its output directory: ``report.json`` (the
  :class:`~gate.judge.verdict.GateReport`), ``junit.xml``, ``report.md`` (the full Markdown
  report) and ``errors.png`` (when matplotlib is installed).
* :mod:`.junit`, :mod:`.markdown`, :mod:`.plot`: one renderer each.
* :func:`gate.report.github.publish_to_github`: job summary, step outputs, annotations and the
  sticky PR comment (:mod:`.comment`, :mod:`.annotations`, :mod:`.outputs`).
* :mod:`.sinks`: the registry of both kinds of sink, files and publishers.

This stage never imports torch or TensorFlow: it runs on plain data, also in the fork-safe
``workflow_run`` job that only has the report artifact."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Dict, Optional

from ..judge.verdict import GateReport

from .sinks import FILE_SINKS

FILES = {s.key: s.filename for s in FILE_SINKS}


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


def write_json(report: GateReport, path: os.PathLike, root: Optional[os.PathLike] = None) -> Path:
    """``report.json``: the report itself, what ``dl-gate publish`` reads back."""
    return _write_text(Path(path), json.dumps(report.to_dict(), indent=1) + "\n")


def write_markdown(report: GateReport, path: os.PathLike, root: Optional[os.PathLike] = None) -> Path:
    """``report.md``: the full Markdown report; its next steps name the folder it is written to
    (relative to the working directory when inside it: ``out`` for ``--out out``; the Action's
    is ``dl-gate-out``, the folder its artifact downloads to)."""
    from .markdown import render_markdown

    return _write_text(Path(path), render_markdown(report, out=shown_folder(Path(path).parent)))


def shown_folder(folder: Path) -> str:
    """``folder`` as a command run from the working directory names it (POSIX separators)."""
    try:
        rel = Path(os.path.relpath(Path(folder).resolve(), Path.cwd().resolve()))
    except ValueError:  # another drive (Windows)
        return Path(folder).resolve().as_posix()
    return rel.as_posix() if not rel.as_posix().startswith("..") else Path(folder).resolve().as_posix()


def write_all(report: GateReport, out_dir: os.PathLike, root: Optional[os.PathLike] = None) -> Dict[str, Path]:
    """Write every file sink of :data:`gate.report.sinks.FILE_SINKS` into ``out_dir`` (junit.xml,
    the PNG plot, report.md, report.json); return their key -> path, in the order written.
    ``root`` (the repository) makes operator source paths relative in the JUnit file. The
    report's ``artifacts`` list the files (names relative to ``out_dir``), so the sink that
    writes it (report.json) comes after the others."""
    from ..serial import scrub_text

    # text from the diff or the operator's own messages may hold undecodable bytes (kept as lone
    # surrogates): every file below is UTF-8
    report = GateReport.from_dict(scrub_text(report.to_dict()))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: Dict[str, Path] = {}
    for sink in FILE_SINKS:
        if not sink.lists_artifacts:
            path = sink.write(report, out / sink.filename, root)
            if path is not None:
                paths[sink.key] = path
    artifacts = dict(report.artifacts or {})
    artifacts.update({s.key: s.filename for s in FILE_SINKS if s.key in paths or s.lists_artifacts})
    report = dataclasses.replace(report, artifacts=artifacts)
    for sink in FILE_SINKS:
        if sink.lists_artifacts:
            paths[sink.key] = sink.write(report, out / sink.filename, root)
    return paths


def written(out_dir: os.PathLike) -> Dict[str, Path]:
    """The files of :func:`write_all` that ``out_dir`` holds, by key, in the order it writes them."""
    out = Path(out_dir)
    order = [s for s in FILE_SINKS if not s.lists_artifacts] + [s for s in FILE_SINKS if s.lists_artifacts]
    return {s.key: out / s.filename for s in order if (out / s.filename).exists()}


__all__ = ["write_all", "written", "write_json", "write_markdown", "FILES"]
