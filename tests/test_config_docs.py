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
