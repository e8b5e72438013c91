"""``dl-gate harvest [--config F] [--out DIR] -- pytest …``: run a project's own tests with its
operators' callables wrapped, and store every distinct call they make as a seed beside the
baselines (``<baselines>/seeds``), where ``dl-gate fuzz`` and the gate run them first."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import GateError
from .common import add_config_arg, load, print_table, split_list


def register(sub) -> None:
    p = sub.add_parser("harvest", help="record operator calls made by the project's tests as fuzzing seeds",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  dl-gate harvest --ops mylib.fused_gelu -- python -m pytest -x tests/ops",
                       description="Run COMMAND (e.g. pytest tests/) recording the calls of the configured "
                                   "operators, and store them as seeds under the baselines directory.")
    add_config_arg(p)
    p.add_argument("--out", metavar="DIR", help="seed store directory (default: <baselines>/seeds)")
    p.add_argument("--ops", action="append", metavar="OP",
                   help="operator(s) to record (default: every operator declared in the config)")
    p.add_argument("--op", action="append", dest="ops", help=argparse.SUPPRESS)  # deprecated spelling of --ops
    p.add_argument("--max-calls", type=int, default=256, metavar="N",
                   help="distinct calls recorded per operator (default 256)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the test command")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..backends.base import resolve_callable
    from ..search.harvest import harvest
    from ..search.seeds import SeedStore

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise GateError("nothing to run: give the test command after --, e.g. dl-gate harvest -- pytest tests/")
    if args.max_calls <= 0:
        raise GateError("--max-calls must be a positive number")
    cfg, catalog = load(args)
    names = split_list(args.ops)
    specs = [catalog.get(n) for n in names] if names else list(cfg.ops)
    if not specs:
        raise GateError("no operators to record: declare ops in .dl-gate.yml or pass --op")
    out = Path(args.out) if args.out else cfg.baselines_dir / "seeds"
    store = SeedStore(out, opinfo=False)
    py_path = [str((cfg.root / p).resolve()) for p in (cfg.raw.get("python_path") or ["."])]
    print(f"dl-gate harvest: recording {', '.join(s.name for s in specs)} while running: {' '.join(command)}",
          file=sys.stderr)
    report = harvest(command, specs, store, cwd=Path.cwd(), python_path=py_path, resolve=resolve_callable,
                     max_calls=args.max_calls)
    rows = []
    for s in specs:
        skipped = report.skipped.get(s.name, {})
        why = "; ".join(f"x{n}: {reason}" for reason, n in sorted(skipped.items(), key=lambda x: -x[1])[:5])
        rows.append((s.name, report.recorded.get(s.name, 0), report.stored.get(s.name, 0), sum(skipped.values()), why))
    print_table(("operator", "calls", "new seeds", "skipped", "why skipped"), rows)
    for e in report.errors[:10]:
        print(f"recording error: {e}", file=sys.stderr)
    print(f"\nseeds stored under {out}/ (index: {out / 'index.json'})")
    if report.returncode != 0:
        raise GateError(f"the test command exited with status {report.returncode} "
                        f"(seeds from the calls it made were stored)")
    return 0
