"""What one evaluation of a candidate returns to the search: a status, the score
(:class:`gate.search.score.Metrics`) and, for a crash, a signature to group it by."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .score import Metrics

OK, INVALID, CRASH, UNSUPPORTED = "ok", "invalid", "crash", "unsupported"


@dataclass
class Evaluation:
    status: str
    metrics: Optional[Metrics] = None
    error: Optional[str] = None  # one-line exception summary
    signature: Optional[str] = None  # exception type + first line, for grouping crashes
    seconds: float = 0.0
    extra: Dict[str, Any] = field(default_factory=dict)  # oracle facts: sides, closer side, rule…
    outputs: Optional[List[Any]] = field(default=None, repr=False)
    reference: Optional[List[Any]] = field(default=None, repr=False)


def exit_signature(exc: SystemExit) -> Tuple[str, str]:
    """A ``sys.exit()`` inside the operator, with the place it was called from."""
    import traceback as tb

    frames = tb.extract_tb(exc.__traceback__)
    where = f" in {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} {frames[-1].name}" if frames else ""
    text = f"SystemExit({exc.code!r}): the operator called sys.exit(){where}"
    return text, text


def exception_signature(exc: BaseException) -> Tuple[str, str]:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}", f"{type(exc).__name__}: {first[:160]}"
