"""Loading a ``report.json`` that may not be ours: the fork-safe ``workflow_run`` job publishes
an artifact produced by PR code, so the file is data to check, never to trust. It is size-capped,
parsed as JSON (nothing is executed, no path in it is opened), validated against a JSON Schema
of :meth:`GateReport.to_dict`, and only then turned into a :class:`GateReport`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema

from ..errors import GateError
from ..judge.verdict import VARIANT_OUTCOMES, GateReport
from ..serial import scrub_text

MAX_REPORT_BYTES = 32 * 1024 * 1024
RUN_OUTCOMES = ["pass", "regression", "needs-baseline", "error"]

_STR = {"type": "string", "maxLength": 20000}
_OPT_STR = {"type": ["string", "null"], "maxLength": 20000}
_NUM = {"oneOf": [{"type": "number"}, {"enum": ["inf", "-inf", "nan"]}]}
_OPT_NUM = {"oneOf": [{"type": ["number", "null"]}, {"enum": ["inf", "-inf", "nan"]}]}
_OPT_INT = {"type": ["integer", "null"]}
_SHA = {"type": ["string", "null"], "pattern": "^[0-9a-fA-F]{4,64}$"}

VERDICT_SCHEMA = {
    "type": "object",
    "required": ["op", "framework", "variant", "outcome", "reason"],
    "properties": {
        "op": {"type": "string", "minLength": 1, "maxLength": 300},
        "framework": {"type": "string", "minLength": 1, "maxLength": 50},
        "variant": {"type": "object", "maxProperties": 20,
                    "additionalProperties": {"type": "string", "maxLength": 100}},
        "outcome": {"enum": list(VARIANT_OUTCOMES)},
        "reason": _STR,
        "metric": {"type": ["string", "null"], "maxLength": 30},
        "base_error": _OPT_NUM,
        "head_error": _OPT_NUM,
        "threshold": _OPT_NUM,
        "base_nonfinite": {"type": "integer", "minimum": 0},
        "head_nonfinite": {"type": "integer", "minimum": 0},
        "base_crash": _OPT_STR,
        "head_crash": _OPT_STR,
        "seed": _OPT_INT,
        "evals": {"type": "integer", "minimum": 0},
        "seconds": {"type": "number", "minimum": 0},
        "source_file": {"type": ["string", "null"], "maxLength": 1000},
        "source_line": {"type": ["integer", "null"], "minimum": 0},
        "input_summary": _OPT_STR,
        "repro_command": _OPT_STR,
        "details": {"type": "object"},
        "diagnosis": {"type": ["object", "null"], "properties": {
            "parameter": _OPT_STR,
            "minimal_input": _OPT_STR,
            "worst_element": _OPT_STR,
            "base_vs_head": {"type": ["array", "null"], "maxItems": 1000},
            "suboperation": {"type": ["object", "null"]},
            "changed_code": {"type": ["array", "null"], "maxItems": 1000, "items": {
                "type": "object", "required": ["file"],
                "properties": {"file": {"type": "string", "maxLength": 1000},
                               "line": {"type": ["integer", "null"], "minimum": 0},
                               "symbol": {"type": ["string", "null"], "maxLength": 300},
                               "deleted": {"type": "array", "maxItems": 50,
                                           "items": {"type": "string", "maxLength": 2000}}}}},
            "repro_script": _OPT_STR,
            "repro_command": _OPT_STR,
        }},
    },
}

REPORT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "dl-gate report.json (GateReport.to_dict())",
    "type": "object",
    "required": ["outcome", "reason"],
    "properties": {
        "outcome": {"enum": RUN_OUTCOMES},
        "reason": _STR,
        "verdicts": {"type": "array", "maxItems": 100000, "items": VERDICT_SCHEMA},
        "selected": {"type": "array", "maxItems": 100000},
        "not_covered": {"type": "array", "items": _STR},
        "errors": {"type": "array", "maxItems": 10000, "items": _STR},
        "warnings": {"type": "array", "maxItems": 10000, "items": _STR},
        "base_ref": {"type": ["string", "null"], "maxLength": 300},
        "base_sha": _SHA,
        "head_sha": _SHA,
        "seed": _OPT_INT,
        "seconds": {"type": "number", "minimum": 0},
        "env": {"type": "object", "maxProperties": 200},
        "artifacts": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 1000}},
        "fail_outcomes": {"type": "array", "items": {"enum": list(VARIANT_OUTCOMES)}},
    },
}


def validate_report_dict(raw: object, where: str = "report") -> GateReport:
    if not isinstance(raw, dict):
        raise GateError(f"{where}: not a dl-gate report (expected a JSON object)")
    validator = jsonschema.Draft202012Validator(REPORT_SCHEMA)
    err = jsonschema.exceptions.best_match(validator.iter_errors(raw))
    if err is not None:
        path = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise GateError(f"{where}: invalid report at {path}: {err.message[:200]}")
    return GateReport.from_dict(raw)


def load_report(path: os.PathLike) -> GateReport:
    """Read and validate ``path`` (a report.json, possibly from an untrusted artifact)."""
    p = Path(path)
    if not p.is_file():
        raise GateError(f"report {p} does not exist")
    size = p.stat().st_size
    if size > MAX_REPORT_BYTES:
        raise GateError(f"report {p} is {size} bytes, more than the {MAX_REPORT_BYTES} accepted")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise GateError(f"report {p} is not valid JSON: {exc}") from None
    return validate_report_dict(scrub_text(raw), str(p))
