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
    """(signature, message): the exception's type and first line (how crashes are told apart),
    and the words shown for it (:func:`first_words`)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}", first_words(exc, 200)


def first_words(exc: BaseException, limit: int = 400) -> str:
    """``Type: first line`` of an exception; for Keras' wrapper ("Exception encountered when
    calling Cross.call().", the cause on a later line in bold) the cause too: the first line
    alone said nothing of TFRS's Cross ("expected a double tensor": its float64 run)."""
    import re

    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    head = lines[0]
    if head.startswith("Exception encountered when calling") and len(lines) > 1:
        head = f"{head.rstrip('.')}: {lines[1]}"
    return f"{type(exc).__name__}: {head}"[:limit]
