"""init's probe worker run in the test's own process, on a module the test writes."""
from __future__ import annotations

import contextlib
import signal
from typing import Iterator, List

from gate.init import worker


@contextlib.contextmanager
def worker_answers(tmp_path, monkeypatch, module: str, text: str) -> Iterator[List[dict]]:
    """``module``.py holding ``text`` importable; the worker's answers (its stdout) collected in
    the list yielded; its deadline signals armed, and given back after."""
    (tmp_path / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    out: List[dict] = []
    monkeypatch.setattr(worker, "_emit", out.append)
    saved = worker.deadline_signals()
    try:
        yield out
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
