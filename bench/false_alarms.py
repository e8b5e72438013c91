"""False alarms of dl-gate on benign PRs, over many seeds.

Builds the verdict bed's repository (tests/test_verdict_bed.py: operators modelled on real
fixes), opens each benign refactor and each fix as a PR, runs ``dl-gate run`` with seeds
1..N, and prints how many runs failed (a false alarm: every one of these PRs is benign).

    python bench/false_alarms.py [--seeds 20] [--evals 40]
"""
import argparse
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
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-fa-"))
    repo = make_repo(tmp, bed.OPS, config=bed.CONFIG, package="lib")
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


if __name__ == "__main__":
    sys.exit(main())
