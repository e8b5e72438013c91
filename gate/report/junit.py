"""JUnit XML: one ``testcase`` per operator x variant, written with junitparser, in the shape of
the Jenkins/Ant ``junit-10.xsd`` that CI test reporters follow (tests/data/junit-10.xsd).

    testsuites time=<the run's seconds>
      > testsuite (one per framework; ``dl-gate`` for the run itself)
        > testcase name=<variant key> classname=dl-gate.<framework>.<op> time=<seconds>
                   file=<path> line=<n>
        > testcase name=run classname=dl-gate time=<the rest of the run>

``file`` and ``line``: the changed line the localiser ranked first for a failing testcase, else the
operator's definition - what the reporters that place annotations from JUnit read
(EnricoMi/publish-unit-test-result-action, mikepenz/action-junit-report; pytest's ``xunit1``
family writes the same two attributes). junit-10.xsd itself declares no ``file``/``line`` on a
testcase: a document is junit-10.xsd-valid once they are removed, and valid against that schema
with the two attributes added (tests/test_report_junit.py checks both). The body repeats the
location in words (``changed: path:line (symbol)``, ``source: path:line``).

Times add up: every variant's testcase carries its own seconds, the ``run`` testcase the rest
(selection, base worktree, replay, localisation), so the suites sum to the run's wall time.
Properties are strings; structured values (the run's budget, stages, allocation) are JSON.

* ``failure`` for a variant whose outcome fails the gate (regression; behaviour-change when the
  config says so): message = the one-line diagnosis, body = errors, seed, minimal input, repro.
* ``error`` for a harness fault (variant outcome ``error``, and run-level errors) and for a variant
  the budget left under-searched (fewer evaluations than a pass needs: not judged) or whose runs
  are not what they claim (not-measured: the low run returns a wider dtype, the reference a
  narrower one).
* ``skipped`` for needs-baseline / not-comparable / not-covered / unsupported.

It is written on every outcome: a run that failed before judging anything still gets a
``dl-gate.run`` testcase carrying the error, so CI test reporters always find a file."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import List, Optional

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from .. import HARNESS_VERSION, __version__
from ..judge.verdict import ERROR, NOT_MEASURED, UNDER_SEARCHED, GateReport, VariantVerdict
from .common import SKIPPED_OUTCOMES, changed_code, facts_text, is_failing, one_line, ordered, relpath

# characters XML 1.0 cannot carry at all (control characters but tab/newline/CR, lone surrogates,
# U+FFFE/U+FFFF): replaced, so an untrusted crash message never makes the file unreadable
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text) -> str:
    return _ILLEGAL_XML.sub("?", str(text if text is not None else ""))


def _result(kind, message: str, body: str, type_: str):
    r = kind(_xml_text(message), _xml_text(type_))
    if body:
        r.text = _xml_text(body)
    return r


def _location(report: GateReport, v: VariantVerdict, root: Optional[os.PathLike]):
    """(file, line, symbol, changed?) a reporter should point at: the changed line for a failing
    verdict (the localiser's first), else the operator's source; (None, None, "", False) without one."""
    if is_failing(report, v):
        for c in changed_code(v):
            f = relpath(str(c.get("file")), root)
            if f:
                try:
                    line = max(1, int(c.get("line") or 1))
                except (TypeError, ValueError):
                    line = 1
                return f, line, str(c.get("symbol") or ""), True
    f = relpath(v.source_file, root) if v.source_file else None
    if f:
        return f, max(1, int(v.source_line or 1)), "", False
    return None, None, "", False


def _case(report: GateReport, v: VariantVerdict, root: Optional[os.PathLike]) -> TestCase:
    tc = TestCase(v.key, f"dl-gate.{v.framework}.{v.op}", float(v.seconds or 0.0))
    file, line, symbol, changed = _location(report, v, root)
    if file:
        tc._elem.set("file", _xml_text(file))
        tc._elem.set("line", str(line))
    where = relpath(v.source_file, root) or v.source_file
    body = facts_text(v)
    if where:
        body = f"source: {where}{':' + str(int(v.source_line)) if v.source_line else ''}\n{body}"
    if changed:
        body = f"changed: {file}:{line}{f' ({symbol})' if symbol else ''}\n{body}"
    message = one_line(v.reason)
    if is_failing(report, v):
        tc.result = [_result(Failure, message, body, v.outcome)]
    elif v.outcome in (ERROR, UNDER_SEARCHED, NOT_MEASURED):
        tc.result = [_result(Error, message, body, "harness-error" if v.outcome == ERROR else v.outcome)]
    elif v.outcome in SKIPPED_OUTCOMES:
        tc.result = [_result(Skipped, f"{v.outcome}: {message}", body, v.outcome)]
    else:  # pass, improvement, behaviour-change configured as a warning
        tc.system_out = _xml_text(body)
    return tc


def _run_case(report: GateReport) -> TestCase:
    """The run itself: its errors, and the seconds no variant's testcase carries (selection, the
    base worktree, replay, localisation), so that the testcases' times add up to the run's."""
    errors = [one_line(e, 2000) for e in report.errors]
    if not errors and report.outcome == "error":
        errors = [one_line(report.reason, 2000)]
    rest = max(0.0, float(report.seconds or 0.0) - sum(float(v.seconds or 0.0) for v in report.verdicts))
    tc = TestCase("run", "dl-gate", round(rest, 3))
    if errors:
        tc.result = [_result(Error, errors[0], "\n".join(errors), "harness-error")]
    elif report.outcome == "needs-baseline" and not report.verdicts:
        tc.result = [_result(Skipped, f"needs-baseline: {one_line(report.reason)}", "", "needs-baseline")]
    elif report.outcome == "regression" and not report.verdicts:  # a regression with no verdict to carry it
        tc.result = [_result(Failure, one_line(report.reason), "", "regression")]
    else:
        tc.system_out = _xml_text(f"{one_line(report.reason, 2000)}\n{rest:.1f}s of the run's {float(report.seconds or 0):.1f}s "
                                  "outside the variants' own (selection, base worktree, replay, localisation)")
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
        props[f"env.{k}"] = val if isinstance(val, str) else json.dumps(val, sort_keys=True, default=str)
    return props


def _suite(name: str, cases: List[TestCase], props: dict) -> TestSuite:
    suite = TestSuite(name)
    for k, val in props.items():
        suite.add_property(_xml_text(k), _xml_text(val))
    for case in cases:
        suite.add_testcase(case)
    suite.update_statistics()
    return suite


def build_suites(report: GateReport, root: Optional[os.PathLike] = None) -> List[TestSuite]:
    props = _properties(report)
    by_fw: dict = {}
    for v in ordered(report):
        by_fw.setdefault(v.framework, []).append(_case(report, v, root))
    suites = [_suite(f"dl-gate.{fw}", cases, props) for fw, cases in sorted(by_fw.items())]
    suites.append(_suite("dl-gate", [_run_case(report)], props))
    return suites


def build_xml(report: GateReport, root: Optional[os.PathLike] = None) -> JUnitXml:
    xml = JUnitXml("dl-gate")
    for suite in build_suites(report, root):
        xml.add_testsuite(suite)
    xml.update_statistics()
    xml.time = round(sum(float(s.time or 0.0) for s in xml), 3)  # the run's wall time, as its testcases add it up
    # junit-10.xsd has no ``skipped`` count on <testsuites> (each <testsuite> carries its own)
    xml._elem.attrib.pop("skipped", None)
    return xml


def render_junit(report: GateReport, root: Optional[os.PathLike] = None) -> str:
    xml = build_xml(report, root)
    from xml.etree import ElementTree

    try:
        ElementTree.indent(xml._elem)
        text = ElementTree.tostring(xml._elem, encoding="unicode")
    except TypeError:  # lxml element
        from lxml import etree

        text = etree.tostring(xml._elem, encoding="unicode", pretty_print=True)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + text


def write_junit(report: GateReport, path: os.PathLike, root: Optional[os.PathLike] = None) -> Path:
    """Write the JUnit XML for ``report`` to ``path`` (atomically) and return the path.
    ``root`` (the repository) makes operator source paths relative."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_junit(report, root)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
