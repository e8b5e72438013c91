"""User-facing errors and the documented exit codes.

Every failure a user can cause (bad config, unknown operator, missing framework…) is a
:class:`GateError`: the CLI prints its one-line message and exits with ``exit_code``.
"""
from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """One outcome per cause, each with its own exit code."""

    PASS = "pass"
    REGRESSION = "regression"
    ERROR = "error"
    NEEDS_BASELINE = "needs-baseline"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self]


EXIT_CODES = {
    Outcome.PASS: 0,
    Outcome.REGRESSION: 1,
    Outcome.ERROR: 2,
    Outcome.NEEDS_BASELINE: 3,
}


class GateError(Exception):
    """An error the user can act on; ``str(err)`` is one line."""

    exit_code = EXIT_CODES[Outcome.ERROR]

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class ConfigError(GateError):
    pass


class Terminated(BaseException):
    """The run was told to stop (SIGTERM from a CI time limit). A BaseException, so that no
    operator evaluation's ``except Exception`` swallows it: the run stops and writes its report."""


class SetupError(GateError):
    """The run cannot judge anything as set up (no git history, the base ref not fetched, the
    config file missing): unlike a passing glitch, it would stay green on every PR, so the
    Action fails its step on it whatever ``fail-on`` says (the report marks it ``setup_error``)."""


class UnknownOpError(GateError):
    pass


class FrameworkMissing(GateError):
    pass


class UnsupportedVariant(GateError):
    pass
