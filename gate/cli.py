"""``dl-gate``: arguments and environment -> one run of the pipeline.

Each sub-command lives in ``gate/commands/<name>.py`` and exposes ``register(subparsers)``;
adding a command is adding a module to :data:`COMMANDS`. Every user error is one line on
stderr and a documented exit code (see :mod:`gate.errors`)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from . import __version__, tune_gc
from .errors import EXIT_CODES, GateError, Outcome

COMMANDS = [
    "gate.commands.ops",
    "gate.commands.fuzz",
    "gate.commands.harvest",
    "gate.commands.select",
    "gate.commands.run",
    "gate.commands.baseline",
    "gate.commands.nightly",
    "gate.commands.publish",
    "gate.commands.action",
    "gate.commands.explain",
    "gate.commands.init",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + error
        self.exit(EXIT_CODES[Outcome.ERROR], f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dl-gate", description="CI regression gate for deep-learning operators.",
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="examples:\n  dl-gate run --example regression\n"
                            "  dl-gate run --base origin/main --budget 120\n  dl-gate COMMAND --help")
    parser.add_argument("--version", action="version", version=f"dl-gate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    tune_gc()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a supervised command re-runs itself in a child
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_CODES[Outcome.ERROR]
    try:
        return int(args.func(args) or 0)
    except GateError as exc:
        print(f"dl-gate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("dl-gate: interrupted", file=sys.stderr)
        return 130


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or "GITHUB_ACTIONS" in os.environ


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
