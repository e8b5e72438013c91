"""Argument helpers shared by sub-commands."""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Optional

from ..backends import FRAMEWORKS
from ..config import Config, load_config
from ..ops.catalog import Catalog, load_catalog
from ..ops.spec import FLOAT_DTYPES, MODES


def seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds (``nan``, ``inf``, 0 and negatives are refused)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


def count(text: str) -> int:
    """argparse type: a positive whole number."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return v


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="path to .dl-gate.yml (default: ./.dl-gate.yml if present)")


def add_variant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", action="append", metavar="DTYPE",
                   help=f"dtype(s) to test: {', '.join(FLOAT_DTYPES)} (repeatable or comma-separated)")
    p.add_argument("--device", action="append", metavar="DEVICE", help="cpu or cuda (default: every available one)")
    p.add_argument("--mode", action="append", metavar="MODE", help=f"{', '.join(MODES)} (default: the op's modes)")


def split_list(values) -> Optional[list]:
    if not values:
        return None
    out = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out or None


def load(args) -> tuple[Config, Catalog]:
    cfg = load_config(getattr(args, "config", None))
    cfg.activate()
    return cfg, load_catalog(cfg.ops, builtin=FRAMEWORKS)


def fmt_num(x) -> str:
    """A figure for a table: 3 significant digits, ``inf``, or ``-`` when absent."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def progress_enabled() -> bool:
    from ..cli import in_ci

    # the run process of a supervised `dl-gate run` writes to a pipe the supervisor relays to
    # its terminal: the supervisor says so (DL_GATE_TERMINAL)
    return (sys.stderr.isatty() or os.environ.get("DL_GATE_TERMINAL") == "1") and not in_ci()


def write_json(dest: Optional[str], doc) -> None:
    """``--json FILE`` as every command spells it: ``-`` (or the bare switch) prints to stdout."""
    import json
    from pathlib import Path

    text = json.dumps(doc, indent=1, default=str)
    if not dest or dest == "-":
        print(text)
        return
    path = Path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def print_table(headers, rows, *, file=None, title: Optional[str] = None) -> None:
    """Every console table of the CLI, rendered by rich: columns sized to the content, long cells
    (reasons, inputs) wrapped at word boundaries instead of cut, plain text (no colour, no box
    characters that a log viewer would mangle) when the output is not a terminal."""
    import shutil

    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    tty = bool(getattr(out, "isatty", lambda: False)())
    width = shutil.get_terminal_size((200, 24)).columns if tty else 200
    console = Console(file=out, width=width, no_color=not tty, highlight=False, soft_wrap=False,
                      force_terminal=tty, emoji=False, markup=False)
    table = Table(*headers, box=box.SIMPLE_HEAD if tty else box.ASCII2, title=title, show_edge=False,
                  pad_edge=False, header_style="bold" if tty else "")
    for col in table.columns[:-1]:
        col.overflow = "fold"
    table.columns[-1].overflow = "fold"
    for r in rows:
        table.add_row(*[str(c) for c in r])
    console.print(table)


class Progress:
    """What ``run`` and ``baseline refresh`` say while they work. On a terminal (not in CI): a
    rich status line (spinner, the current step, elapsed time) that the per-variant steps
    update in place, with every other message printed above it; in CI or when stderr is not a
    terminal: one plain ``dl-gate: …`` line per message, no progress display. Use it as a
    context manager, and call it with each message."""

    STEPS = ("fuzzing ", "measuring ", "replaying ", "localising ")

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.live = None

    def __enter__(self):
        if not self.quiet and progress_enabled():
            from rich.console import Console
            from rich.progress import Progress as _Progress
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            self.live = _Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=Console(file=sys.stderr, force_terminal=os.environ.get("DL_GATE_TERMINAL") == "1" or None),
                                  transient=True)
            self.live.start()
            self.task = self.live.add_task("dl-gate: starting", total=None)
        return self

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        if self.live is None:
            print(f"dl-gate: {message}", file=sys.stderr)
            return
        self.live.update(self.task, description=f"dl-gate: {message}")
        if not message.startswith(self.STEPS):
            self.live.console.print(f"dl-gate: {message}", markup=False, highlight=False)

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
