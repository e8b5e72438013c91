"""``dl-gate init [--tests CMD] [--package NAME]``: discover a library's operators, infer their
specs from its own tests, signatures and small probes, check each one runs at every dtype, and
write a commented ``.dl-gate.yml`` plus the workflows (the PR gate, the fork pair, the baseline refresh: gate/init/workflows.py). Re-running
adds new operators and reports removed ones without touching rows already in the file."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .common import print_table


def register(sub) -> None:
    p = sub.add_parser("init", help="write .dl-gate.yml (and the workflows) for this repository's operators",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  dl-gate init\n  dl-gate init --tests \"pytest tests/test_ops.py\" "
                              "--package mylib",
                       description="Find the operators of the package in the current repository (public "
                                   "functions, nn.Module / Keras Layer and Loss classes, autograd.Functions, torch.library "
                                   "custom ops), infer their inputs and parameters from the calls the library's "
                                   "own tests make, from signatures and by probing small tensors (in a child "
                                   "process), run every spec once at each dtype, and write the config. "
                                   "See docs/config.md.")
    p.add_argument("--tests", metavar="CMD",
                   help="the library's test command to record calls from (default: pytest on tests/ if present); "
                        "it runs through the shell, so name the interpreter that has the library and dl-gate "
                        "installed (e.g. \"$(which python) -m pytest tests\") if `python` on PATH is another")
    p.add_argument("--no-tests", action="store_true", help="do not run the tests (signatures and probing only)")
    p.add_argument("--package", metavar="NAME", help="the package (or sub-package, pkg.sub), or one module file (model.py), to gate")
    p.add_argument("--config", default=".dl-gate.yml", metavar="FILE", help="the config to write (default .dl-gate.yml)")
    p.add_argument("--no-workflows", action="store_true", help="do not write .github/workflows/dl-gate*.yml")
    p.add_argument("--ops", action="append", metavar="NAME", help="only these operators (repeatable)")
    p.add_argument("--probe-timeout", type=float, default=10.0, metavar="S",
                   help="seconds of CPU time one probe evaluation may take (default 10; 6x that of wall-clock time: "
                        "a call that waits is stopped there)")
    p.add_argument("--keep-sizes", action="store_true",
                   help="write the tests' sizes as they are, also for an operator whose evaluation there costs more "
                        "than a run's default budget allows (by default init halves its largest sizes until it does)")
    p.add_argument("--tests-timeout", type=float, default=600.0, metavar="S",
                   help="seconds the test command may run (default 600; the calls made until then are kept; a pytest "
                        "run shares them among its test files, so that every file runs)")
    p.add_argument("--env", action="append", metavar="NAME=VALUE", default=[],
                   help="an environment variable the library's tests (and its import) need, e.g. TEST_DEVICE=cpu "
                        "(repeatable); its name is written to the config's env, so the gate's workers get it")
    p.add_argument("--action", metavar="OWNER/REPO[@REF]",
                   help="the Action the workflows use (default dl-gate/dl-gate at this version's major tag, e.g. v0), "
                        "pinned by the commit SHA the ref has now")
    p.add_argument("--json", metavar="FILE", help="also write what init did as JSON (also when init stops)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import GateError
    from ..init import run_init
    from .common import split_list

    if args.probe_timeout <= 0 or args.tests_timeout <= 0:
        raise GateError("--probe-timeout and --tests-timeout must be positive numbers of seconds")
    env = {}
    for item in args.env:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise GateError(f"--env {item!r}: give NAME=VALUE, e.g. --env TEST_DEVICE=cpu")
        env[name] = value
    from ..backends.sandbox import check_names

    refused = check_names(list(env))
    if refused:
        raise GateError(f"--env: {refused}")

    from ..init.workflows import parse_action

    action = parse_action(args.action) if args.action else None

    def log(line: str) -> None:
        print(f"dl-gate init: {line}", file=sys.stderr, flush=True)

    try:
        rep = run_init(Path.cwd(), package=args.package, tests=None if args.no_tests else args.tests,
                       no_tests=args.no_tests, config=args.config, workflows=not args.no_workflows,
                       probe_timeout=args.probe_timeout, tests_timeout=args.tests_timeout,
                       only=split_list(args.ops) or None, env=env, action=action, log=log,
                       keep_sizes=args.keep_sizes)
    except GateError as exc:  # what was found before it stopped is not lost: every reason, on the terminal
        part = getattr(exc, "report", None)
        if part is not None and part.left_out:
            print_table(("left out", "why"), part.left_out_table(), title=f"{len(part.left_out)} left out")
        if part is not None and args.json:
            Path(args.json).write_text(json.dumps(part.to_dict(), indent=2, default=str))
        raise
    print_table(("operator", "is", "spec"), rep.found, title=f"{len(rep.found)} operators gated")
    if rep.left_out:
        print()
        print_table(("left out", "why"), rep.left_out_table(), title=f"{len(rep.left_out)} left out")
    print()
    if rep.kept or rep.removed:
        print(f"{args.config}: {len(rep.added)} operators added, {len(rep.kept)} kept as they are in the file")
        for n in rep.removed:
            print(f"  removed from the library (still in {args.config}: delete its row): {n}")
    else:
        print(f"wrote {args.config} ({len(rep.added)} operators)")
    for w in rep.workflows:
        print(f"wrote {w}")
    if rep.workflows:
        print(f"  (they use {rep.action}; the fork pair comments on pull requests from forks)")
    if rep.seeds:
        print(f"stored {rep.seeds} harvested calls as seeds under baselines/seeds/")
    failed = re.search(r"` exited (-?\d+)", rep.harvest or "")
    if failed and failed.group(1) != "0":
        # the file is written, but the operators the tests would have shown may be probed only or
        # missing (nflows without torchtestcase: 19 of 40; roma's pytest: 28 of 30)
        print(f"warning: the library's tests did not pass ({rep.harvest.split(';')[0]}): operators they call may be "
              "missing or probed only; make the test command run (--tests CMD, --env NAME=VALUE, the "
              "library's test dependencies) and run `dl-gate init` again")
    plan, narrow = refresh_plan(*_rows_and_per_op(args.config, len(rep.added) + len(rep.kept)))
    print(f"done in {rep.seconds:.0f}s. Next:\n"
          f"  dl-gate baseline refresh          # measure the baselines: {plan}\n"
          f"  git add {args.config} baselines .github/workflows && git commit -m 'Add dl-gate'   # then push and open a PR\n"
          "  dl-gate run --base origin/main    # (optional) the gate on your branch, as the PR's check will run it")
    if narrow:
        print(narrow)
    if args.json:
        Path(args.json).write_text(json.dumps(rep.to_dict(), indent=2, default=str))
    return 0


def refresh_plan(n_ops: int, per_op: float):
    """(what the first refresh will take, in words; a line saying how to shorten it, or None when
    it takes at most 15 minutes)."""
    from ..errors import GateError
    from .baseline import refresh_jobs, refresh_minutes

    try:
        jobs = refresh_jobs(None, max(1, n_ops), isolate=True)  # the refresh's default: one operator a core
    except GateError:  # a bad $DL_GATE_JOBS / $DL_GATE_THREADS: the refresh itself says so; the file is written
        jobs = 1
    took = refresh_minutes(n_ops, per_op, jobs)
    narrow = None
    if -(-n_ops // jobs) * per_op > 900:  # longer than a user waits for a first baseline
        narrow = (f"  (a refresh of {took}: gate the part of the library a PR changes with `dl-gate init --package "
                  "PKG.SUB` in a fresh config, or lower budget.per_op in it; `dl-gate baseline refresh --ops NAME` "
                  "measures one operator)")
    at_once = f", {jobs} at a time" if jobs > 1 else ""
    return f"{n_ops} operators x {per_op:g}s{at_once}, at least {took}", narrow


def _rows_and_per_op(config: str, rows: int):
    """The operator rows of the config init wrote and its per-operator budget (``budget.per_op``,
    10 s by default); ``rows`` where the file cannot be read back."""
    import yaml

    try:
        raw = yaml.safe_load(Path(config).read_text()) or {}
        return len(raw.get("ops") or []), float((raw.get("budget") or {}).get("per_op") or 10.0)
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return rows, 10.0
