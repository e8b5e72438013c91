"""Step outputs (``GITHUB_OUTPUT``) and the job summary (``GITHUB_STEP_SUMMARY``).

Outputs use GitHub's multi-line ``name<<DELIMITER`` form with a random delimiter, so a value can
never smuggle in another output. The summary is appended and kept within GitHub's 1 MiB per step,
counting what earlier writes in the same step already put there."""
from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Dict, Mapping, Optional

from .common import SUMMARY_LIMIT

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def format_outputs(values: Mapping[str, object]) -> str:
    chunks = []
    for name, value in values.items():
        if not _NAME.match(name):
            raise ValueError(f"invalid output name {name!r}")
        text = "" if value is None else str(value)
        delim = f"ghadelimiter_{uuid.uuid4().hex}"
        while delim in text:  # pragma: no cover - a uuid in the value: pick another
            delim = f"ghadelimiter_{uuid.uuid4().hex}"
        chunks.append(f"{name}<<{delim}\n{text}\n{delim}\n")
    return "".join(chunks)


def write_outputs(values: Mapping[str, object], env: Mapping[str, str] = os.environ) -> Optional[Path]:
    """Append ``values`` to the file named by ``GITHUB_OUTPUT``; None when not on Actions."""
    target = env.get("GITHUB_OUTPUT")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(format_outputs(values))
    return path


def parse_outputs(text: str) -> Dict[str, str]:
    """Read back a ``GITHUB_OUTPUT`` file (both forms), as the runner does; for tests and tools."""
    out: Dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            j = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1:j])
            i = j + 1
            continue
        if "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        i += 1
    return out


def summary_room(env: Mapping[str, str] = os.environ, limit: int = SUMMARY_LIMIT) -> int:
    """Bytes still free in this step's summary."""
    target = env.get("GITHUB_STEP_SUMMARY")
    used = 0
    if target and Path(target).exists():
        used = Path(target).stat().st_size
    return max(0, limit - used)


def append_summary(markdown: str, env: Mapping[str, str] = os.environ) -> Optional[Path]:
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(markdown.rstrip("\n") + "\n")
    return path
