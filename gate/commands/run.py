"""``dl-gate run``: the gate's main job on a pull request (or ``--example``: on the bundled one)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import Terminated
from .common import Progress, add_config_arg, add_variant_args, count, print_table, seconds, split_list
from .common import fmt_num as _f


def register(sub) -> None:
    p = sub.add_parser("run", help="run the gate on a pull request: select, fuzz, compare with base, report",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  dl-gate run --base origin/main --budget 120 --per-op 20\n"
                              "  dl-gate run --example regression")
    p.add_argument("--base", metavar="REF", help="the PR's base (default: origin/$GITHUB_BASE_REF in Actions)")
    p.add_argument("--head", metavar="REF", default="HEAD", help="the PR's head (default HEAD)")
    p.add_argument("--repo", metavar="DIR", default=".", help="repository root (default .)")
    add_config_arg(p)
    p.add_argument("--out", metavar="DIR", default="dl-gate-out", help="report directory (default dl-gate-out)")
    p.add_argument("--budget", type=seconds, metavar="SECONDS", help="total fuzzing budget (config budget.total, else 120)")
    p.add_argument("--per-op", type=seconds, metavar="SECONDS", help="budget per operator (config budget.per_op)")
    p.add_argument("--evals", type=count, metavar="N", help="evaluations per variant instead of seconds (deterministic)")
    p.add_argument("--seed", type=int, help="random seed (default: the config's, else 0)")
    p.add_argument("--ops", action="append", metavar="OP", help="gate these operators instead of selecting from the diff")
    p.add_argument("--strategy", help="guidance: linf, l1 or random")
    p.add_argument("--oracle", action="append", metavar="ORACLE",
                   help="oracle(s) to judge, repeatable or comma-separated (default: the config's gate.oracles, "
                        "else precision); see docs/oracles.md")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="evaluate the operators in worker processes, so that an exit, a segfault or a hang is a "
                        "crash finding (the default; --no-isolate runs trusted code in the gate's run process; "
                        "config gate.isolate)")
    p.add_argument("--eval-timeout", type=seconds, metavar="SECONDS",
                   help="seconds before an isolated evaluation counts as a hang (config gate.eval_timeout, else 10)")
    p.add_argument("--deadline", type=seconds, metavar="SECONDS",
                   help="wall-clock limit of the whole run, after which it is stopped and reported as an error "
                        "(config budget.deadline; default: budget + localisation + 120s)")
    add_variant_args(p)
    p.add_argument("--example", nargs="?", const="improve", choices=["improve", "regression"],
                   help="run on the bundled example library and one of its PRs (default: improve)")
    p.set_defaults(func=run)


def _default_base() -> str | None:
    ref = os.environ.get("GITHUB_BASE_REF")
    return f"origin/{ref}" if ref else None


def run(args) -> int:
    from .. import supervise

    if supervise.state_path() is None:  # this process sets the exit code: the run goes to a child
        return _supervise(args)
    from ..pipeline import RunOptions, run_gate

    progress = Progress(quiet=bool(os.environ.get("DL_GATE_QUIET")))  # rich on a terminal, lines in CI
    say = None if progress.quiet else progress
    opts = RunOptions(
        repo=Path(args.repo), base=args.base or _default_base(), head=args.head,
        config=Path(args.config) if args.config else None, out=Path(args.out),
        budget_total=args.budget, budget_per_op=args.per_op, evals=args.evals, seed=args.seed,
        ops=split_list(args.ops), dtypes=split_list(args.dtype), devices=split_list(args.device),
        modes=split_list(args.mode), strategy=args.strategy, progress=say,
        oracles=_oracles(split_list(args.oracle)), isolate=args.isolate, eval_timeout=args.eval_timeout,
        checkpoint=supervise.checkpoint,
    )
    if args.example:
        from ..example import prepare_example

        opts = prepare_example(args.example, opts, say or (lambda s: None))
    import faulthandler
    import signal

    try:  # a segfault in an operator (without --isolate) leaves a traceback at least
        faulthandler.enable(file=sys.__stderr__)
    except (AttributeError, ValueError, OSError):  # no real stderr (embedded, redirected)
        pass

    def terminated(signum, frame):  # a CI timeout: stop, and still write what was computed
        raise Terminated("terminated by SIGTERM (a CI time limit?): the report holds what was computed so far")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with progress:
            report = run_gate(opts)
    finally:
        signal.signal(signal.SIGTERM, previous)
    files = write_outputs(report, Path(args.out))
    supervise.finished(report, report.exit_code, files)  # the supervisor prints the report
    return report.exit_code


def _supervise(args) -> int:
    """Run the gate in a child process and judge by the report it leaves (see gate.supervise)."""
    from .. import supervise

    say = (lambda s: print(f"dl-gate: {s}", file=sys.stderr)) if not os.environ.get("DL_GATE_QUIET") else (lambda s: None)
    out = Path(args.out)
    raw = _config_raw(args)
    budget = {k: v for k, v in (raw.get("budget") or {}).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)} if isinstance(raw.get("budget"), dict) else {}
    # the run's environment is the workers' allow-list plus the names the config's env: lists
    # (the run validates them: a credential's name is refused there)
    from ..backends.sandbox import env_names as _env_names

    env_names = [n for n in _env_names(raw.get("env")) if isinstance(n, str)] \
        if isinstance(raw.get("env"), (list, dict)) else []
    seconds_, text = supervise.deadline_for(
        args.budget if args.budget is not None else budget.get("total", 60.0 if args.example else None),
        args.evals or budget.get("evals"), budget.get("localise"),
        args.deadline if args.deadline is not None else budget.get("deadline"), example=bool(args.example))
    from ..pipeline import clear_previous_run

    clear_previous_run(out)  # never judge by an earlier run's report
    sup = supervise.Supervisor(list(args.argv), seconds_, text, say=say, env_names=env_names)
    result = sup.wait()
    report, trusted = supervise.verdict_of_run(result, out)
    if result.get("survivors"):
        report.warnings.append(f"{result['survivors']} process(es) started by the code under test outlived the "
                               "run and were killed")
    changed = supervise.changed_files(result, out) if trusted else []
    if changed:  # rewritten after the run wrote them: the run's own report is written again
        report.warnings.append(f"{', '.join(changed)} changed after the run wrote them (by a process the code "
                               "under test left behind?): written again from the run's final record")
    if trusted and not changed and not result.get("survivors"):
        from ..report import written

        paths = {k: str(p) for k, p in written(out).items()}
    else:
        paths = write_outputs(report, out)
    import contextlib
    import io

    # the report quotes the code under test (exception texts, warnings): escaped like the run's
    # relayed output, so that no line of it is a workflow command
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_report(report)
        print("\n" + ", ".join(f"{k}: {v}" for k, v in paths.items()))
        print_next_step(report, out)
    sys.stdout.write(supervise.CommandGuard().feed(buf.getvalue(), final=True))
    sys.stdout.flush()
    return report.exit_code


def _config_raw(args) -> dict:
    """The config the run will use, read as plain YAML (the run validates it and reports its
    errors; here it only sets the deadline and the run's environment); {} when there is none."""
    import yaml

    from ..config import CONFIG_NAMES

    if args.config:
        candidates = [Path(args.config)]
    else:
        d = Path(args.repo).resolve()
        candidates = []
        for parent in [d, *d.parents]:
            candidates += [parent / n for n in CONFIG_NAMES]
            if (parent / ".git").exists():
                break
    for c in candidates:
        try:
            raw = yaml.safe_load(c.read_text(errors="replace"))
        except (OSError, yaml.YAMLError):
            continue
        return raw if isinstance(raw, dict) else {}
    return {}


def _oracles(names):
    if not names:
        return None
    from .fuzz import oracle_list

    return oracle_list(names)


def write_outputs(report, out: Path) -> dict:
    """report.json always; JUnit/Markdown/plots through the report stage."""
    from ..report import write_all  # the report stage

    out.mkdir(parents=True, exist_ok=True)
    return {k: str(v) for k, v in write_all(report, out).items()}




def print_next_step(report, out: Path) -> None:
    """The run's last lines: the root causes by changed line, and what to run next (the same
    step the PR comment gives)."""
    from ..report.digest import causes, head_vs_base, next_step

    cs = causes(report)
    for i, c in enumerate(cs, 1):
        where = f"{'deleted code above ' if c.deleted else ''}{c.where}" + (f" ({c.symbol})" if c.symbol else "")
        if not c.located:
            where = f"no changed line located for {c.symbol} (operator at {c.where})"
        sm = c.smallest
        print(f"\ncause {i}: {where}: {len(c.verdicts)} failing variant(s) of {', '.join(c.ops)}")
        print(f"  smallest input ({sm.id}): {(sm.diagnosis or {}).get('minimal_input') or sm.input_summary or '-'}")
        print(f"  {head_vs_base(sm)}")
    step = next_step(report, out=out.as_posix())
    if step is not None:
        print("\nnext: " + step.explain)
        if step.repro:
            print("      " + step.repro + "   # exits 1 on head, 0 on base")
    elif report.outcome == "error":
        print(f"\nnext: {report.reason}")


def _why(reason: dict) -> str:
    """One reason an operator was selected, in words: the changed place, or how it was named."""
    if reason.get("kind") == "forced" or not reason.get("file"):
        return "named with --ops"
    return f"{reason.get('file')}:{reason.get('line')} {reason.get('symbol')}"


def print_report(report) -> None:
    print(f"dl-gate: {report.outcome.upper()}: {report.reason}")
    if report.base_sha:
        print(f"base {report.base_ref} ({report.base_sha[:10]}) -> head {report.head_sha[:10]}, seed {report.seed}, {report.seconds:.1f}s")
    for s in report.selected:
        why = "; ".join(_why(r) for r in (s.get("reasons") or [])[:2])
        print(f"  selected {s['op']}: {why}")
    if not report.verdicts:
        return
    from ..report.digest import sides

    rows = []
    for v in report.verdicts:
        head, base = sides(v)  # NaN/Inf counted the same way on both sides, as every report does
        rows.append((v.id, v.outcome, base, head, _f(v.threshold), str(v.evals) if v.evals else "-", v.reason))
    print_table(("operator[variant]", "outcome", "base", "head", "threshold", "evals", "reason"), rows)
    if report.not_covered:
        print(f"  not covered (budget): {', '.join(report.not_covered)}")
    for w in report.warnings:  # what report.md says under its warnings, on the terminal too
        print(f"  warning: {w}")
