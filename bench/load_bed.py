"""Verdicts that hold on a slow, busy runner: real fix/revert pairs gated idle and under load.

Each case is an operator as a real library wrote it after a fix, the revert of that fix (a PR
that puts the bug back) and the fix itself (a PR on a base that has the bug). Every PR is gated
with a time budget (``--budget``, the whole fuzz stage) twice, on an idle machine and with a CPU
hog on every core (one busy process per core, as a shared 2-core GitHub runner has), and the
program prints, per run: the exit code and outcome, the failing variants, the seconds the run
took against the deadline its plan line announced at its start, and whether the loaded verdict
is the idle one.

The cases (the first six are tests/test_verdict_bed.py's, the last three are here):

* ``hsv_sat`` (float16): kornia #871/#4561, an eps that rounds to 0 in float16: 0/0 on black pixels
* ``lse``: torch_scatter's max-recentred log-sum-exp vs the naive one (overflow)
* ``softplus``: MLAlgorithms #31 / burn #5374, ``log(1 + exp(z))`` vs ``logaddexp(0, z)``
* ``safe_div``: torchmetrics ``_safe_divide`` (0/0 on a zero denominator)
* ``l2norm``: ``x / x.norm().clamp_min(eps)`` (an all-zero row divided by 0)
* ``layer_norm``: two-pass variance vs ``E[x^2] - E[x]^2`` (cancellation; revert only)
* ``l2_normalize`` (gradient only): keras #23093, the squared norm clamped before the rsqrt so a
  zero vector gets a finite gradient; the revert clamps after it: the same forward everywhere,
  a NaN gradient at zero
* ``heads_merge`` (crash): ``x.transpose(1, 2).reshape(...)`` vs ``.view(...)``, which raises on
  the non-contiguous transpose ("view size is not compatible"; fixed this way in many attention
  codebases)
* ``new_gelu`` (a refinement, both directions pass): transformers' NewGELU with sqrt(2/pi)
  written as 0.79788 and back (within half the float32 digits: reported, not failed)
* ``scan_lse`` (slow backward): a running log-sum-exp written as a Python loop over the sequence
  (its backward is thousands of small autograd nodes: 0.3-0.75 s at 4,096-8,192 steps here,
  a forward and backward up to ~1 s;
  its own budget, 90 s); the revert shifts by the
  first element instead of the running maximum, so a later, larger element overflows exp

    python bench/load_bed.py [--cases a,b] [--budget 30] [--hog 0 (cores; default all)]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stages import Hog, run  # noqa: E402
from tests.test_gate_run import commit_pr, git, make_repo  # noqa: E402
from tests import test_verdict_bed as bed  # noqa: E402

EXTRA_OPS = '''

def l2_normalize(x, epsilon=1e-7):
    square_sum = torch.sum(torch.square(x), dim=-1, keepdim=True)
    inv_norm = torch.rsqrt(torch.clamp_min(square_sum, epsilon * epsilon))
    return x * inv_norm


def heads_merge(x):
    b, h, n, e = x.shape
    return x.transpose(1, 2).reshape(b, n, h * e)


def scan_lse(x):
    m = x[..., 0]
    s = torch.ones_like(m)
    out = [m]
    for i in range(1, x.shape[-1]):
        xi = x[..., i]
        new_m = torch.maximum(m, xi)
        s = s * torch.exp(m - new_m) + torch.exp(xi - new_m)
        m = new_m
        out.append(m + torch.log(s))
    return torch.stack(out, -1)
'''

EXTRA_CONFIG = '''  - {name: lib.l2_normalize, callable: "lib.ops:l2_normalize", sources: [lib/ops.py], dims: {N: [1, 4], D: [1, 16]},
     inputs: [{name: x, shape: [N, D]}]}
  - {name: lib.heads_merge, callable: "lib.ops:heads_merge", sources: [lib/ops.py],
     dims: {B: [1, 2], H: [2, 4], L: [2, 8], E: [1, 8]}, inputs: [{name: x, shape: [B, H, L, E]}]}
  - {name: lib.scan_lse, callable: "lib.ops:scan_lse", sources: [lib/ops.py], dims: {N: [1, 2], L: [1024, 8192]},
     inputs: [{name: x, shape: [N, L]}]}
'''

EXTRA_CASES = {
    "l2_normalize": ("inv_norm = torch.rsqrt(torch.clamp_min(square_sum, epsilon * epsilon))",
                     "inv_norm = torch.clamp_max(torch.rsqrt(square_sum), 1.0 / epsilon)"),
    "heads_merge": (".reshape(b, n, h * e)", ".view(b, n, h * e)"),
    "scan_lse": ("        new_m = torch.maximum(m, xi)\n        s = s * torch.exp(m - new_m) + torch.exp(xi - new_m)\n"
                 "        m = new_m\n", "        s = s + torch.exp(xi - m)\n"),
}
#: a refinement both ways (BERT-GELU's sqrt(2/pi) written to five digits): "fix" and "revert"
#: must both pass, reported as behaviour changes that do not fail (docs/verdicts.md, Refinement)
REFINEMENTS = {"new_gelu": ("math.sqrt(2.0 / math.pi)", "0.79788")}
CASES = {**bed.CASES, **EXTRA_CASES, **REFINEMENTS}
DTYPE = {**bed.DTYPE}
#: a case's own fuzz budget (--budget for the others): the slow operator's gradient evaluations
#: take ~0.3-1.5 s each here, and a judged variant needs gate.min_evals of them
BUDGET = {"scan_lse": 90.0}
REVERT_ONLY = set(bed.REVERT_ONLY)


def summary(r: dict) -> tuple:
    rep = r["report"]
    failing = sorted(v["variant"].get("dtype", "") + "/" + "/".join(
        x for x in (v["variant"].get("layout"), v["variant"].get("oracle")) if x not in (None, "default", "precision"))
        + f":{v['outcome']}" for v in rep.get("verdicts", []) if v["outcome"] in ("regression", "error", "behaviour-change",
                                                                                   "under-searched"))
    return r["code"], rep.get("outcome"), failing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--budget", type=float, default=30.0, help="seconds of the fuzz stage per run")
    ap.add_argument("--hog", type=int, default=0, help="busy processes under load (default: one per core)")
    args = ap.parse_args()
    cores = args.hog or os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-load-bed-"))
    config = bed.CONFIG.rstrip("\n") + "\n" + EXTRA_CONFIG
    config = config.replace("budget: {localise: 15}", "budget: {localise: 30}")
    repo = make_repo(tmp, bed.OPS + EXTRA_OPS, config=config, package="lib")
    print(f"machine: {os.cpu_count()} cores; load: {cores} busy process(es); --budget {args.budget:g}s a run")
    print(f"{'case':13} {'PR':7} {'load':6} {'exit':>4} {'outcome':10} {'run s':>6} {'ends by':>7} {'same':>5}  failing variants")
    same_all, within_all, n = True, True, 0
    for case in args.cases.split(","):
        fixed, buggy = CASES[case]
        commit_pr(repo, f"revert-{case}", "main", fixed, buggy)
        prs = [("revert", f"revert-{case}", "main")]
        if case not in REVERT_ONLY:
            commit_pr(repo, f"fix-{case}", f"revert-{case}", buggy, fixed)
            prs.append(("fix", f"fix-{case}", f"revert-{case}"))
        for label, head, base in prs:
            git(repo, "checkout", "-q", head)
            idle = None
            for load in ("idle", "loaded"):
                extra = ["--ops", f"lib.{case}", "--dtype", DTYPE.get(case, "float32")]
                out = tmp / f"out-{case}-{label}-{load}"
                if load == "idle":
                    r = run(repo, out, BUDGET.get(case, args.budget), base=base, extra=extra)
                else:
                    with Hog(cores):
                        r = run(repo, out, BUDGET.get(case, args.budget), base=base, extra=extra)
                s = summary(r)
                same = "-" if load == "idle" else ("yes" if s[:2] == idle[:2] else "NO")
                if load == "idle":
                    idle = s
                else:
                    same_all &= same == "yes"
                within = r["deadline"] is None or r["wall"] <= r["deadline"] + 1
                within_all &= within
                n += 1
                ends = f"{r['deadline']:.0f}" if r["deadline"] is not None else "-"
                print(f"{case:13} {label:7} {load:6} {s[0]:>4} {str(s[1]):10} {r['wall']:>6.1f} {ends:>7}"
                      f"{'' if within else '!'} {same:>5}  {', '.join(s[2]) or '-'}", flush=True)
    print(f"{n} runs: loaded verdict (exit code and outcome) the idle one: {'all' if same_all else 'NOT all'}; "
          f"every run ended by the deadline its plan announced: {'yes' if within_all else 'NO'}")
    return 0 if same_all and within_all else 1


if __name__ == "__main__":
    sys.exit(main())
