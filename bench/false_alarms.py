"""False alarms of dl-gate on benign PRs, over many seeds.

Builds the verdict bed's repository (tests/test_verdict_bed.py: operators modelled on real
fixes), opens each benign refactor and each fix as a PR, runs ``dl-gate run`` with seeds
1..N, and prints how many runs failed (a false alarm: every one of these PRs is benign).

    python bench/false_alarms.py [--seeds 20] [--evals 40]
    python bench/false_alarms.py --bed refactor [--seeds 20]
    python bench/false_alarms.py --gate grad_multiplier_factor=1 --gate grad_floor_factor=1

``--hog N`` keeps N busy processes (one per core: ``--hog 2`` on a 2-core runner) running
through the whole sweep: the verdicts of a budget of evaluations must not move with the load
(only timeouts could move them).

``--gate KEY=VALUE`` sets one of the config's ``gate:`` settings for every run (what a rule's
retirement would change, measured on the same PRs and seeds as the defaults).

``--bed refactor`` runs tests/test_refactor_bed.py's pairs in both directions instead: each
direction whose verdict is "pass" counts a failing run as a false alarm; each direction that
must fail counts a passing run as a miss (and a failure of another outcome as wrong).

``--bed upcast`` (tests/test_upcast_bed.py: fvcore bfff2ef, an upcast fix that returns float32)
and ``--bed reach`` (tests/test_size_reach_bed.py: keras-hub #1508's rotary positions, with the
config `dl-gate init` writes for it) run one fix and its revert: the fix must pass (exit 0), the
revert fail (exit 1).
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import test_verdict_bed as bed  # noqa: E402
from tests.test_gate_run import make_repo  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--evals", type=int, default=40)
    ap.add_argument("--cases", default="", help="comma-separated bed cases (default: all)")
    ap.add_argument("--bed", choices=("verdict", "refactor", "upcast", "reach"), default="verdict")
    ap.add_argument("--gate", action="append", default=[], metavar="KEY=VALUE",
                    help="a gate: setting of the config for every run (repeatable)")
    ap.add_argument("--hog", type=int, default=0, help="busy processes beside the sweep (default none)")
    args = ap.parse_args()
    if args.hog:
        from bench.stages import Hog

        print(f"load: {args.hog} busy process(es) on {os.cpu_count()} cores", flush=True)
        with Hog(args.hog):
            return sweep(args)
    return sweep(args)


def sweep(args) -> int:
    if args.bed == "refactor":
        return refactor_bed(args)
    if args.bed in ("upcast", "reach"):
        return fix_revert_bed(args)
    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-fa-"))
    repo = make_repo(tmp, bed.OPS, config=with_gate(bed.CONFIG, args.gate), package="lib")
    prs = []  # (name, base, op)
    for case, (old, new) in sorted(bed.BENIGN.items()):
        bed.branch(repo, f"benign-{case}", "main", old, new)
        prs.append((f"benign-{case}", "main", case))
    for case, (fixed, buggy) in sorted(bed.CASES.items()):
        if case in bed.REVERT_ONLY:
            continue
        bed.branch(repo, f"buggy-{case}", "main", fixed, buggy)
        bed.branch(repo, f"fix-{case}", f"buggy-{case}", buggy, fixed)
        prs.append((f"fix-{case}", f"buggy-{case}", case))
    runs = alarms = 0
    t0 = time.time()
    want = set(filter(None, args.cases.split(",")))
    prs = [p for p in prs if not want or p[2] in want]
    for name, base, case in prs:
        bad = []
        for seed in range(1, args.seeds + 1):
            from tests.test_gate_run import git

            git(repo, "checkout", "-q", name)
            code, report = bed.run_gate(repo, tmp / f"out-{name}-{seed}", base, f"lib.{case}",
                                        bed.DTYPE.get(case, "float32"), bed.EVALS.get(case, args.evals), seed=seed)
            runs += 1
            if code not in bed.PASSED:  # exit 3 (a variant without a stored row yet) does not fail the check
                alarms += 1
                bad.append((seed, code, [(v.outcome, v.reason) for v in report.verdicts if v.outcome != "pass"][:1]))
        print(f"{name:24s} {args.seeds - len(bad)}/{args.seeds} pass" + (f"  false alarms: {bad}" if bad else ""), flush=True)
    print(f"false alarms: {alarms} of {runs} runs ({len(prs)} benign PRs x {args.seeds} seeds), {time.time() - t0:.0f}s")
    return 1 if alarms else 0


def with_gate(config: str, settings) -> str:
    """``config`` with a ``gate:`` mapping of ``settings`` (KEY=VALUE, values read as YAML)."""
    if not settings:
        return config
    import yaml

    gate = {}
    for kv in settings:
        key, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"--gate {kv!r}: expected KEY=VALUE")
        gate[key.strip()] = yaml.safe_load(value)
    cfg = yaml.safe_load(config)
    cfg.setdefault("gate", {}).update(gate)
    return yaml.safe_dump(cfg, sort_keys=False)


def refactor_bed(args) -> int:
    from tests import test_refactor_bed as rb
    from tests.test_gate_run import git

    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-rb-"))
    repo = make_repo(tmp, rb.OPS, config=with_gate(rb.CONFIG, args.gate), package="lib")
    want = set(filter(None, args.cases.split(",")))
    alarms = misses = runs = 0
    t0 = time.time()
    for name, direction in rb.DIRECTIONS:
        if want and name not in want:
            continue
        op, dtype, _, _, ab, ba = rb.PAIRS[name]
        expect = ab if direction == "ab" else ba
        base = rb.open_direction(repo, name, direction)
        bad = []
        for seed in range(1, args.seeds + 1):
            git(repo, "checkout", "-q", f"{name}-{direction}")
            code, report = bed.run_gate(repo, tmp / f"out-{name}-{direction}-{seed}", base, f"lib.{op}", dtype,
                                        args.evals, seed=seed)
            runs += 1
            try:
                rb.judge(name, direction, code, report)
            except AssertionError:
                bad.append((seed, code, [(v.variant_key if hasattr(v, "variant_key") else v.id, v.outcome, v.reason[:160])
                                         for v in report.verdicts if v.outcome not in bed.PASSING][:2]))
        if expect == "pass":
            alarms += len(bad)
        else:
            misses += len(bad)
        what = "pass" if expect == "pass" else f"fail ({expect[0]})"
        print(f"{name:12s} {direction}  want {what:28s} {args.seeds - len(bad)}/{args.seeds} right"
              + (f"  wrong: {bad}" if bad else ""), flush=True)
    print(f"false alarms: {alarms}, misses or wrong outcomes: {misses}, of {runs} runs, {time.time() - t0:.0f}s")
    return 1 if alarms or misses else 0


def fix_revert_bed(args) -> int:
    """One real fix as a PR on its parent (must pass) and its revert (must fail), seeds 1..N."""
    from tests.test_gate_run import gate, git

    tmp = Path(tempfile.mkdtemp(prefix=f"dl-gate-{args.bed}-"))
    if args.bed == "upcast":
        from tests import test_upcast_bed as ub

        config, fixed, buggy, path = with_gate(ub.CONFIG, args.gate), ub.FIXED, ub.REVERTED, "mylib/ops.py"

        def repo_at(where, src):
            return make_repo(where, ops_src=src, config=config)
    else:
        from gate.init import run_init
        from tests import test_size_reach_bed as rb

        lib = rb._lib(tmp / "init", rb.ROPE.replace("{POS}", rb.FIXED_POS))
        run_init(lib, workflows=False, probe_timeout=20)
        config = with_gate((lib / ".dl-gate.yml").read_text(), args.gate)
        fixed, buggy = rb.ROPE.replace("{POS}", rb.FIXED_POS), rb.ROPE.replace("{POS}", rb.BUGGY_POS)
        path = "ropelib/rope.py"

        def repo_at(where, src):
            repo = rb._lib(where, src)
            (repo / ".dl-gate.yml").write_text(config)
            from tests.test_gate_run import refresh

            refresh(repo)
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", "dl-gate")
            return repo
    alarms = misses = runs = 0
    t0 = time.time()
    for direction, base_src, head_src, want in (("fix", buggy, fixed, 0), ("revert", fixed, buggy, 1)):
        repo = repo_at(tmp / direction, base_src)
        git(repo, "checkout", "-q", "-b", "pr")
        (repo / path).write_text(head_src)
        git(repo, "commit", "-q", "-am", direction)
        bad = []
        for seed in range(1, args.seeds + 1):
            code, report = gate(repo, tmp / direction, seed=seed, evals=args.evals)
            runs += 1
            if code != want:
                bad.append((seed, code, [(v.key, v.outcome, v.reason[:120]) for v in report.verdicts
                                         if v.outcome not in bed.PASSING][:2]))
        alarms += len(bad) if want == 0 else 0
        misses += len(bad) if want == 1 else 0
        print(f"{args.bed} {direction:7s} want exit {want}: {args.seeds - len(bad)}/{args.seeds} right"
              + (f"  wrong: {bad}" if bad else ""), flush=True)
    print(f"false alarms: {alarms}, misses: {misses}, of {runs} runs, {time.time() - t0:.0f}s")
    return 1 if alarms or misses else 0


if __name__ == "__main__":
    sys.exit(main())
