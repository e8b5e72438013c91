"""JUnit XML: validated against the Jenkins/Ant junit-10.xsd (tests/data), read back with junitparser
the way the reporters that place annotations read it (a testcase's ``file`` and ``line``), and
rendered by a real reporter (junit2html)."""
from __future__ import annotations

from pathlib import Path

import pytest
import xmlschema
from junitparser import Error, Failure, JUnitXml, Skipped

from gate.judge.verdict import BEHAVIOUR_CHANGE, REGRESSION
from gate.report.junit import render_junit, write_junit
from tests.report_samples import error_report, pass_report, regression, rich_report

XSD = Path(__file__).parent / "data" / "junit-10.xsd"
SCHEMA = xmlschema.XMLSchema(str(XSD))


def _with_locations(xsd: str) -> str:
    """junit-10.xsd with the two attributes pytest's xunit1 family and the annotating reporters
    use added to ``testcase`` (the only change: the test below checks it)."""
    start = xsd.index('<xs:element name="testcase">')
    end = xsd.index("</xs:complexType>", start)
    extra = ('<xs:attribute name="file" type="xs:string"/>'
             '<xs:attribute name="line" type="xs:nonNegativeInteger"/>')
    return xsd[:end] + extra + xsd[end:]


LOCATED = xmlschema.XMLSchema(_with_locations(XSD.read_text()))


def validate(doc) -> None:
    """Valid with the location attributes declared, and valid junit-10.xsd without them."""
    from xml.etree import ElementTree

    text = Path(doc).read_text() if isinstance(doc, Path) else doc
    LOCATED.validate(text)
    root = ElementTree.fromstring(text.split("?>", 1)[1] if text.startswith("<?xml") else text)
    for tc in root.iter("testcase"):
        tc.attrib.pop("file", None)
        tc.attrib.pop("line", None)
    SCHEMA.validate(ElementTree.tostring(root, encoding="unicode"))


def cases(path):
    xml = JUnitXml.fromfile(str(path))
    return {(c.classname, c.name): c for suite in xml for c in suite}


def test_schema_rejects_malformed_junit():
    # the schema is strict enough to fail: a testcase without a name, and what junit-xml used to
    # write (file/line on a testcase, a ``disabled`` count, ``skipped`` on <testsuites>)
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        SCHEMA.validate('<testsuites><testsuite name="s" tests="1" failures="0" errors="0">'
                        '<testcase classname="c"/></testsuite></testsuites>')
    for bad in ('<testsuites><testsuite name="s" tests="1" failures="0" errors="0">'
                '<testcase name="n" file="a.py" line="10"/></testsuite></testsuites>',
                '<testsuites><testsuite name="s" tests="0" failures="0" errors="0" disabled="0"/></testsuites>',
                '<testsuites skipped="0"><testsuite name="s" tests="0" failures="0" errors="0"/></testsuites>'):
        with pytest.raises(xmlschema.XMLSchemaValidationError):
            SCHEMA.validate(bad)


def test_the_location_schema_is_junit_10_with_two_attributes_more():
    derived, original = _with_locations(XSD.read_text()), XSD.read_text()
    assert len(derived) - len(original) < 120 and derived.replace(
        '<xs:attribute name="file" type="xs:string"/><xs:attribute name="line" type="xs:nonNegativeInteger"/>', "") == original
    with pytest.raises(xmlschema.XMLSchemaValidationError):  # still strict about everything else
        LOCATED.validate('<testsuites><testsuite name="s" tests="1" failures="0" errors="0">'
                         '<testcase name="n" file="a.py" line="x"/></testsuite></testsuites>')


@pytest.mark.parametrize("make", [rich_report, pass_report, error_report, lambda: pass_report(verdicts=[])])
def test_every_outcome_gives_schema_valid_junit(tmp_path, make):
    path = write_junit(make(), tmp_path / "junit.xml")
    validate(path)
    assert cases(path)


def test_failing_testcases_carry_the_changed_line_as_reporters_read_it(tmp_path):
    # EnricoMi/publish-unit-test-result-action reads file/line with junitparser attributes like these
    from junitparser import Attr, IntAttr, TestCase

    class Located(TestCase):
        file = Attr()
        line = IntAttr()

    report = rich_report()
    xml = JUnitXml.fromfile(str(write_junit(report, tmp_path / "junit.xml")))
    got = {(c.classname, c.name): Located.fromelem(c._elem) for suite in xml for c in suite}
    sp = got[("dl-gate.torch.mylib.softplus", "float16/cpu/input")]
    assert (sp.file, sp.line) == ("mylib/ops.py", 14)  # the changed line, not the definition (line 10)
    assert sp.result[0].text.startswith("changed: mylib/ops.py:14 (softplus)\nsource: mylib/ops.py:10\n")
    ok = got[("dl-gate.torch.mylib.softplus", "float32/cpu/input")]
    assert (ok.file, ok.line) == ("mylib/ops.py", 10)  # a passing one: its operator's source
    assert got[("dl-gate.tensorflow.tf.math.tanh", "float32/cpu/operator")].file is None  # no location known


def test_times_add_up_to_the_run_and_properties_are_json(tmp_path):
    import json

    report = rich_report(env={"budget": {"seconds": 30, "replay": 60}, "torch": "2.13.0"})
    xml = JUnitXml.fromfile(str(write_junit(report, tmp_path / "junit.xml")))
    assert xml.time == pytest.approx(report.seconds)
    assert sum(c.time for s in xml for c in s) == pytest.approx(report.seconds)
    run = next(c for s in xml for c in s if c.name == "run")
    assert run.time == pytest.approx(report.seconds - sum(v.seconds or 0 for v in report.verdicts))
    props = {p.name: p.value for p in next(iter(xml)).properties()}
    assert json.loads(props["env.budget"]) == {"seconds": 30, "replay": 60} and props["env.torch"] == "2.13.0"


def test_a_real_reporter_renders_it(tmp_path):
    # junit2html: a reporter CI users run on these files; it must read every testcase and failure
    from junit2htmlreport import parser as j2h

    path = write_junit(rich_report(), tmp_path / "junit.xml")
    html = j2h.Junit(str(path)).html()
    assert "mylib.softplus" in html and "float16/cpu/input" in html
    assert "max error 48 ulp" in html and "changed: mylib/ops.py:14" in html


def test_a_testcase_per_operator_variant_with_location_and_outcome(tmp_path):
    report = rich_report()
    path = write_junit(report, tmp_path / "out" / "junit.xml")
    got = cases(path)
    assert len(got) == len(report.verdicts) + 1  # and the run's own testcase
    sp = got[("dl-gate.torch.mylib.softplus", "float16/cpu/input")]
    assert sp.time == pytest.approx(2.5)
    (failure,) = [r for r in sp.result if isinstance(r, Failure)]
    assert failure.message == report.verdicts[1].reason  # the one-line diagnosis
    assert failure.type == REGRESSION
    body = failure.text
    assert body.startswith("changed: mylib/ops.py:14 (softplus)\nsource: mylib/ops.py:10\n")
    for needle in ("head 48 ulp, base 1.5 ulp", "seed: 1234", "minimal input: x: float16[1] = [-0.0001]",
                   "repro: python dl-gate-out/repro/mylib.softplus_float16.py", "mylib/util.py:7 (_stable_exp)"):
        assert needle in body
    tanh_err = got[("dl-gate.tensorflow.tf.math.tanh", "float32/cpu/operator")]
    assert any(isinstance(r, Error) for r in tanh_err.result)
    for key in (("dl-gate.torch.mylib.gelu", "float64/cpu/input"), ("dl-gate.torch.mylib.gelu", "float16/cuda/input")):
        assert any(isinstance(r, Skipped) for r in got[key].result)
    assert got[("dl-gate.torch.mylib.gelu", "bfloat16/cpu/input")].is_passed
    assert got[("dl-gate.tensorflow.tf.math.tanh", "float16/cpu/input")].is_passed  # behaviour change: warn
    xml = JUnitXml.fromfile(str(path))
    assert sum(s.failures for s in xml) == 2 and sum(s.errors for s in xml) == 1 and sum(s.skipped for s in xml) == 2


def test_behaviour_change_fails_when_configured(tmp_path):
    report = rich_report(fail_outcomes=[REGRESSION, BEHAVIOUR_CHANGE])
    got = cases(write_junit(report, tmp_path / "j.xml"))
    res = got[("dl-gate.tensorflow.tf.math.tanh", "float16/cpu/input")].result
    assert [r.type for r in res if isinstance(r, Failure)] == [BEHAVIOUR_CHANGE]


def test_error_run_without_verdicts_still_has_a_testcase(tmp_path):
    path = write_junit(error_report(), tmp_path / "j.xml")
    (case,) = cases(path).values()
    assert case.classname == "dl-gate" and case.name == "run"
    (err,) = case.result
    assert isinstance(err, Error) and "unknown revision" in err.message


def test_absolute_sources_become_relative_to_the_repository(tmp_path):
    v = regression()
    v.source_file = str(tmp_path / "repo" / "mylib" / "ops.py")
    report = pass_report(verdicts=[v], outcome="regression")
    got = cases(write_junit(report, tmp_path / "j.xml", root=tmp_path / "repo"))
    case = got[("dl-gate.torch.mylib.softplus", "float16/cpu/input")]
    assert "source: mylib/ops.py:" in case.result[0].text


def test_control_characters_and_markup_in_messages_stay_valid_xml(tmp_path):
    v = regression()
    v.reason = 'crash: \x00\x1b[31m <tag attr="x"> & ]]> done'
    v.head_crash = "Traceback\n  File \"x\", line 1\x07"
    text = render_junit(pass_report(verdicts=[v], outcome="regression"))
    validate(text)
    path = tmp_path / "j.xml"
    path.write_text(text)
    (case,) = [c for c in cases(path).values() if c.name != "run"]
    assert "<tag" in case.result[0].message


def test_a_lone_surrogate_in_an_untrusted_report_still_gives_valid_junit(tmp_path):
    import json

    from gate.report.schema import load_report

    raw = json.dumps(rich_report().to_dict()).replace('"reason": "', '"reason": "\\ud800 ', 1)
    (tmp_path / "report.json").write_text(raw)
    report = load_report(tmp_path / "report.json")
    path = write_junit(report, tmp_path / "junit.xml")
    assert JUnitXml.fromfile(str(path)) is not None and "?" in report.reason
