"""docs/config.md against the schema it documents: every key and every enumerated value of
``gate/config_schema.json`` is named on the page, and every YAML example on it validates (the
real validator, ``gate.config.parse_config``). A key added to the schema without a line in the
docs, or an example the schema no longer accepts, fails here."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from gate.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "config.md"
SCHEMA = json.loads((ROOT / "gate" / "config_schema.json").read_text())


def schema_words(schema: dict) -> set:
    """Every property name, enum value and oneOf-required form of the schema."""
    out = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in (node.get("properties") or {}).items():
                out.add(k)
            for v in node.get("enum") or []:
                if isinstance(v, str):
                    out.add(v)
            for alt in node.get("oneOf") or []:
                for r in alt.get("required", []) if isinstance(alt, dict) else []:
                    out.add(r)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return out


def undocumented(schema: dict, text: str) -> list:
    return sorted(w for w in schema_words(schema) if f"`{w}" not in text and not re.search(
        rf"(^|[\s{{\[,(]){re.escape(w)}(:|[\s,\]}})])", text))


def yaml_blocks(text: str) -> list:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


def test_every_schema_key_and_value_is_documented():
    missing = undocumented(SCHEMA, DOC.read_text())
    assert not missing, f"docs/config.md does not mention: {missing}"


def test_the_check_catches_a_key_added_to_the_schema_only():
    schema = copy.deepcopy(SCHEMA)
    schema["$defs"]["op"]["properties"]["warp_speed_factor"] = {"type": "number"}
    assert undocumented(schema, DOC.read_text()) == ["warp_speed_factor"]


@pytest.mark.parametrize("i", range(len(yaml_blocks(DOC.read_text()))))
def test_every_example_validates(i, tmp_path):
    block = yaml_blocks(DOC.read_text())[i]
    cfg = parse_config(block, tmp_path / ".dl-gate.yml", tmp_path)
    assert cfg.raw.get("version") == 1


def test_an_invalid_example_would_fail(tmp_path):
    from gate.errors import ConfigError

    bad = yaml_blocks(DOC.read_text())[0].replace("per_op: 15", "per_op: -1")
    with pytest.raises(ConfigError, match="per_op"):
        parse_config(bad, tmp_path / ".dl-gate.yml", tmp_path)


def test_the_param_forms_each_have_an_example():
    text = DOC.read_text()
    examples = "\n".join(yaml_blocks(text))
    for form in ("choices", "range", "float", "value", "expr", "import", "default", "index_hi", "dtype",
                 "keyword", "layouts", "domain"):
        assert re.search(rf"\b{form}:", examples), f"no YAML example uses {form}"


def test_the_verdict_page_states_the_numbers_and_outcomes_the_judge_uses():
    """docs/verdicts.md in plain words, held to the code: multipliers, the gradient factor, the
    minimum evaluations, the hang factor, and every outcome a verdict can have."""
    from gate.backends.isolate import IsolateOptions
    from gate.judge import decide as D
    from gate.judge import verdict as V

    text = (ROOT / "docs" / "verdicts.md").read_text()
    flat = " ".join(text.split())
    m = D.DEFAULT_MULTIPLIERS
    assert m["float16"] == m["bfloat16"] == 3.0 and m["float32"] == m["float64"] == 2.0
    assert "`m` is 3 for float16 and bfloat16, 2 for float32 and float64" in flat
    assert f"and {D.GRAD_MULTIPLIER_FACTOR:g} times that for a gradient variant" in flat
    assert f"`gate.min_evals` ({D.MIN_EVALS})" in flat
    assert IsolateOptions().hang_factor == 10 and "ten times the operator's median call" in flat
    for outcome in (V.PASS, V.IMPROVEMENT, V.NEEDS_BASELINE, V.NOT_COVERED, V.UNSUPPORTED):
        assert outcome.replace("-", " ").lower() in flat.lower(), outcome
    for outcome in (V.REGRESSION, V.BEHAVIOUR_CHANGE, V.UNDER_SEARCHED, V.NOT_MEASURED):
        assert f"**{outcome.capitalize()}" in flat or f"**{outcome.replace('-', ' ').capitalize()}" in flat, outcome
    assert "(2^(p/2) ulp" in flat and D.half_digits_ulps("float16") == 2.0 ** 5.5
    # the refinement's bound, as the docs spell it out per dtype
    halves = {d: D.half_digits_ulps(d) for d in ("float32", "float16", "bfloat16")}
    assert (f"(2^(p/2) ulp: {halves['float32']:.0f} for float32, {halves['float16']:.0f} for float16, "
            f"{halves['bfloat16']:.0f} for bfloat16)") in flat, halves
