"""Helpers for tests/test_oracles_*.py: declare planted-defect operators (tests/fixtures/
planted_ops.py) as user op specs in a real .dl-gate.yml, and build tasks for one oracle."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, Optional

from gate.config import load_config
from gate.ops.spec import OpSpec
from gate.plan import Budget, Task, Variant

FIXTURES = Path(__file__).parent / "fixtures"


def user_ops(tmp_path: Path, ops_yaml: str, extra: str = "") -> Dict[str, OpSpec]:
    """Write a .dl-gate.yml whose ``ops`` are ``ops_yaml`` (a YAML list, indented freely),
    load it as the CLI would, make the fixtures importable, and return the specs by name."""
    text = f"python_path: [{FIXTURES}]\n{textwrap.dedent(extra)}ops:\n" + textwrap.indent(textwrap.dedent(ops_yaml), "  ")
    (tmp_path / ".dl-gate.yml").write_text(text)
    cfg = load_config(tmp_path / ".dl-gate.yml")
    cfg.activate()
    return {s.name: s for s in cfg.ops}


def task(spec: OpSpec, oracle: str, *, dtype: str = "float32", layout: str = "default",
         seconds: Optional[float] = 10.0, evals: Optional[int] = None, seed: int = 0,
         strategy: str = "linf") -> Task:
    return Task(op=spec, variant=Variant(dtype, "cpu", "input", layout, oracle),
                budget=Budget(seconds=seconds, evals=evals), seed=seed, strategy=strategy)
