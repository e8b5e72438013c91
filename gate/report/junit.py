"""JUnit XML: one ``testcase`` per operator x variant, written with the junit-xml library.

    testsuites > testsuite (one per framework, plus ``dl-gate`` for run-level faults)
               > testcase name=<variant key> classname=dl-gate.<framework>.<op>
                          time=<seconds> file=<operator source> line=<line>

* ``failure`` for a variant whose outcome fails the gate (regression; behaviour-change when the
  config says so): message = the one-line diagnosis, body = errors, seed, minimal input, repro.
* ``error`` for a harness fault (variant outcome ``error``, and run-level errors).
* ``skipped`` for needs-baseline / not-comparable / not-covered / unsupported.

It is written on every outcome: a run that failed before judging anything still gets a
``dl-gate.run`` testcase carrying the error, so CI test reporters always find a file."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

from junit_xml import TestCase, TestSuite, to_xml_report_string

from .. import HARNESS_VERSION, __version__
from ..judge.verdict import ERROR, GateReport, VariantVerdict
from .common import SKIPPED_OUTCOMES, facts_text, is_failing, one_line, ordered, relpath


def _case(report: GateReport, v: VariantVerdict, root: Optional[os.PathLike]) -> TestCase:
    tc = TestCase(
        name=v.key,
        classname=f"dl-gate.{v.framework}.{v.op}",
        elapsed_sec=float(v.seconds or 0.0),
        file=relpath(v.source_file, root) or v.source_file,
        line=int(v.source_line) if v.source_line else None,
    )
    body = facts_text(v)
    message = one_line(v.reason)
    if is_failing(report, v):
        tc.add_failure_info(message=message, output=body, failure_type=v.outcome)
    elif v.outcome == ERROR:
        tc.add_error_info(message=message, output=body, error_type="harness-error")
    elif v.outcome in SKIPPED_OUTCOMES:
        tc.add_skipped_info(message=f"{v.outcome}: {message}", output=body)
    else:  # pass, improvement, behaviour-change configured as a warning
        tc.stdout = body
    return tc


def _run_case(report: GateReport) -> Optional[TestCase]:
    """A run-level testcase when the run has errors of its own or judged nothing."""
    errors = [one_line(e, 2000) for e in report.errors]
    if not errors and report.outcome == "error":
        errors = [one_line(report.reason, 2000)]
    if not errors and report.verdicts:
        return None
    tc = TestCase(name="run", classname="dl-gate", elapsed_sec=float(report.seconds or 0.0))
    if errors:
        tc.add_error_info(message=errors[0], output="\n".join(errors), error_type="harness-error")
    elif report.outcome == "needs-baseline":
        tc.add_skipped_info(message=f"needs-baseline: {one_line(report.reason)}")
    elif report.outcome == "regression":  # a regression with no verdict to carry it
        tc.add_failure_info(message=one_line(report.reason), failure_type="regression")
    else:
        tc.stdout = one_line(report.reason, 2000)
    return tc


def _properties(report: GateReport) -> dict:
    props = {
        "dl-gate.version": __version__,
        "dl-gate.harness": HARNESS_VERSION,
        "outcome": report.outcome,
        "reason": one_line(report.reason),
    }
    for key in ("base_ref", "base_sha", "head_sha", "seed"):
        val = getattr(report, key)
        if val is not None:
            props[key] = str(val)
    for k, val in sorted((report.env or {}).items()):
        props[f"env.{k}"] = one_line(val, 200)
    return props


def build_suites(report: GateReport, root: Optional[os.PathLike] = None) -> List[TestSuite]:
    props = _properties(report)
    by_fw: dict = {}
    for v in ordered(report):
        by_fw.setdefault(v.framework, []).append(_case(report, v, root))
    suites = [TestSuite(f"dl-gate.{fw}", cases, properties=props, package="dl-gate")
              for fw, cases in sorted(by_fw.items())]
    run_case = _run_case(report)
    if run_case is not None:
        suites.append(TestSuite("dl-gate", [run_case], properties=props, package="dl-gate"))
    return suites


def render_junit(report: GateReport, root: Optional[os.PathLike] = None) -> str:
    return to_xml_report_string(build_suites(report, root), prettyprint=True, encoding="utf-8")


def write_junit(report: GateReport, path: os.PathLike, root: Optional[os.PathLike] = None) -> Path:
    """Write the JUnit XML for ``report`` to ``path`` (atomically) and return the path.
    ``root`` (the repository) makes operator source paths relative."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_junit(report, root)
    if not text.lstrip().startswith("<?xml"):
        text = '<?xml version="1.0" encoding="utf-8"?>\n' + text
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
