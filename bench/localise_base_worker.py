"""Why localisation keeps one base worker: the same shrinking rounds asked of base through the
long-lived worker (:class:`gate.localise.evaluate.BaseWorker`) and through one fresh process per
round (:func:`gate.judge.replay.replay_in_tree`, as the judge's one-shot replay does).

Builds a git repository with a small PyTorch operator in a temp dir, then asks ``--rounds``
batches of ``--batch`` inputs both ways, side by side in one run, and prints the seconds and
the ratio.

    python bench/localise_base_worker.py [--rounds 10] [--batch 6]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate.search.inputs import draw  # noqa: E402
from gate.judge.replay import ReplayJob, replay_in_tree, worktree  # noqa: E402
from gate.localise.evaluate import BaseWorker  # noqa: E402
from gate.ops.spec import OpSpec  # noqa: E402
from gate.plan import Variant  # noqa: E402

OP = "import torch\n\n\ndef softplus(x):\n    return torch.log1p(torch.exp(-x.abs())) + x.clamp_min(0)\n"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b", "-c", "commit.gpgsign=false", *args],
                   check=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=6)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-localise-"))
    repo = tmp / "repo"
    (repo / "benchlib").mkdir(parents=True)
    (repo / "benchlib" / "__init__.py").write_text("")
    (repo / "benchlib" / "ops.py").write_text(OP)
    git(tmp, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "op")
    spec = OpSpec.from_dict({"name": "b.softplus", "framework": "torch", "callable": "benchlib.ops:softplus",
                             "inputs": [{"name": "x", "shape": ["N", "D"]}], "dims": {"N": [1, 16], "D": [1, 64]}},
                            origin="user")
    variant = Variant("float16")
    rng = np.random.default_rng(0)
    rounds = [[draw(spec, rng) for _ in range(args.batch)] for _ in range(args.rounds)]

    t0 = time.perf_counter()
    worker = BaseWorker(repo, "main", ["."], "")
    try:
        for cands in rounds:
            res = worker.evaluate([("k", spec, variant, cands)], timeout=120)["k"]
            assert all(r.status == "ok" for r in res), [r.error for r in res]
    finally:
        worker.close()
    persistent = time.perf_counter() - t0

    t0 = time.perf_counter()
    with worktree(repo, "main") as tree:
        for cands in rounds:
            res = replay_in_tree(tree, [str(tree)], [ReplayJob("k", spec, variant, cands)])["k"]
            assert all(r.status == "ok" for r in res), [r.error for r in res]
    per_round = time.perf_counter() - t0

    print(f"{args.rounds} rounds x {args.batch} inputs on base")
    print(f"  one long-lived worker      : {persistent:6.2f} s")
    print(f"  one process per round      : {per_round:6.2f} s")
    print(f"  ratio (per-round / worker) : {per_round / persistent:6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
