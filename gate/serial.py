"""Strict-JSON helpers shared by every stage's serialisable types, and the YAML reader of the
bundled tables."""
from __future__ import annotations

import math
from typing import Any


def json_safe(v: Any) -> Any:
    """``v`` with non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (strict
    JSON), tuples as lists, NumPy scalars as Python numbers."""
    if hasattr(v, "item") and callable(v.item) and not isinstance(v, (str, bytes, dict, list, tuple)):
        try:
            v = v.item()
        except (TypeError, ValueError):
            return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def scrub_text(v: Any) -> Any:
    """``v`` with every string made encodable: a lone surrogate (valid in JSON's ``\\ud800``,
    invalid in XML and UTF-8) becomes ``?``."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
            return v
        except UnicodeEncodeError:
            return v.encode("utf-8", "replace").decode("utf-8")
    if isinstance(v, dict):
        return {scrub_text(k): scrub_text(x) for k, x in v.items()}
    if isinstance(v, list):
        return [scrub_text(x) for x in v]
    return v


def from_json_safe(v: Any) -> Any:
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    if v == "nan":
        return math.nan
    if isinstance(v, dict):
        return {k: from_json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json_safe(x) for x in v]
    return v


def load_yaml(text: str) -> Any:
    """A YAML document read safely, with libyaml's parser when PyYAML has it (the same documents,
    about 7x faster than the pure-Python loader: the bundled tables are read on every run)."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
