"""Report sinks: every place a report goes, registered here as data.

A sink is a function named ``module:function`` (imported only when it is used), of one of two
kinds:

* a **file** of the run's output directory, written by every run and by ``dl-gate publish
  --out`` (:func:`gate.report.write_all`): ``write(report, path, root) -> Path | None`` (``None``:
  not written, e.g. the plot without matplotlib; ``root``, the repository, makes source paths
  relative). ``report.json`` lists the files (``GateReport.artifacts``, in this table's order),
  so it is written last;
* a **publisher**, somewhere outside the run (a CI platform), chosen with ``dl-gate publish
  --NAME``: ``publish(report, env, *, paths, comment, annotations, summary, comment_key,
  comment_author) -> dict`` (``env``: the CI environment; ``paths``: the files written, by key;
  the rest: ``dl-gate publish``'s switches, each used where it applies). It never raises on a
  platform's API failure and returns what it did.

A new sink is its module plus one line below. Nothing here imports torch or TensorFlow.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


def _load(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class FileSink:
    key: str  # its name in GateReport.artifacts and in write_all's answer
    filename: str
    writer: str  # "module:function": write(report, path, root) -> Path | None
    lists_artifacts: bool = False  # written after the others, with the list of what they wrote

    def write(self, report, path, root=None):
        return _load(self.writer)(report, path, root)


@dataclass(frozen=True)
class Publisher:
    name: str  # the ``dl-gate publish --NAME`` switch
    help: str
    target: str  # "module:function": publish(report, env, *, paths, **switches) -> dict

    def publish(self, report, env, **kw) -> dict:
        return _load(self.target)(report, env, **kw)


#: the files of a run, in the order ``report.json`` lists them
FILE_SINKS = (
    FileSink("junit", "junit.xml", "gate.report.junit:write_junit"),
    FileSink("plot", "errors.png", "gate.report.plot:write_plot"),
    FileSink("report", "report.json", "gate.report:write_json", lists_artifacts=True),
    FileSink("markdown", "report.md", "gate.report:write_markdown"),
)

#: where ``dl-gate publish --NAME`` sends a report
PUBLISHERS = (
    Publisher("github", "publish on GitHub Actions: job summary, annotations, step outputs, PR comment",
              "gate.report.github:publish_to_github"),
)

__all__ = ["FileSink", "Publisher", "FILE_SINKS", "PUBLISHERS"]
