"""Each stage's wall time against its share, idle and under load, side by side in one run.

Builds an operator library of 10 small PyTorch operators (normalisations, activations, a
reduction, attention-like softmax), records its baselines, and opens pull requests that refactor
1, 3 and 10 of them (the same arithmetic, reorganised: every verdict should be a pass). Each PR
is gated with a time budget (``--budget``: seconds for the whole fuzz stage, 5 s per changed
operator by default) twice: on an idle machine, and with a CPU hog on every core (one busy
process per core, as a shared CI runner has). Printed per run: the seconds of each stage from
report.json's ``env.stages`` (the fuzz stage against its share, localisation against its
share), the whole run against the deadline its plan line announced, the verdicts, and the
fewest searched evaluations a judged variant got.

    python bench/stages.py [--sizes 1,3,10] [--per-op 5] [--hog 0 (cores; default all)]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_gate_run import git, make_repo  # noqa: E402

#: (name, base body, refactored body): the same arithmetic in another form
OPS = [
    ("softmax", "return torch.softmax(x, -1)", "y = torch.softmax(x, dim=-1)\n    return y"),
    ("log_softmax", "return torch.log_softmax(x, -1)", "y = torch.log_softmax(x, dim=-1)\n    return y"),
    ("rms_norm", "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)",
     "ms = x.pow(2).mean(-1, keepdim=True)\n    return x * torch.rsqrt(ms + 1e-6)"),
    ("layer_norm", "return torch.nn.functional.layer_norm(x, x.shape[-1:])",
     "shape = x.shape[-1:]\n    return torch.nn.functional.layer_norm(x, shape)"),
    ("gelu", "return torch.nn.functional.gelu(x)", "out = torch.nn.functional.gelu(x)\n    return out"),
    ("silu", "return x * torch.sigmoid(x)", "s = torch.sigmoid(x)\n    return x * s"),
    ("logsumexp", "return torch.logsumexp(x, -1)", "r = torch.logsumexp(x, dim=-1)\n    return r"),
    ("softplus", "return torch.nn.functional.softplus(x)", "r = torch.nn.functional.softplus(x)\n    return r"),
    ("tanh_gelu", "return torch.nn.functional.gelu(x, approximate='tanh')",
     "r = torch.nn.functional.gelu(x, approximate='tanh')\n    return r"),
    ("mean_center", "return x - x.mean(-1, keepdim=True)", "m = x.mean(-1, keepdim=True)\n    return x - m"),
]


def source(refactored: int) -> str:
    out = ["import torch\n"]
    for i, (name, body, new) in enumerate(OPS):
        out.append(f"\n\ndef {name}(x):\n    {new if i < refactored else body}\n")
    return "".join(out)


CONFIG = "version: 1\nframework: torch\npython_path: [\".\"]\nbuiltin: false\ngate: {dtypes: [float16, float32]}\nops:\n" + "".join(
    f"  - name: mylib.{n}\n    callable: mylib.ops:{n}\n    kind: {'normalization' if 'norm' in n or 'soft' in n else 'activation'}\n"
    f"    sources: [mylib/ops.py]\n    dims: {{N: [1, 16], D: [2, 128]}}\n    inputs: [{{name: x, shape: [N, D]}}]\n"
    for n, _, _ in OPS)


def _spin() -> None:  # pragma: no cover - a CPU hog
    while True:
        pass


class Hog:
    """One busy process per core while the block runs."""

    def __init__(self, cores: int):
        self.cores, self.procs = cores, []

    def __enter__(self):
        ctx = mp.get_context("fork")
        self.procs = [ctx.Process(target=_spin, daemon=True) for _ in range(self.cores)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.join()


def run(repo: Path, out: Path, budget: float, base: str = "main", extra=()) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "gate.cli", "run", "--base", base, "--out", str(out),
                          "--budget", f"{budget:g}", "--seed", "0", *extra], cwd=repo, env=env, capture_output=True,
                         text=True)
    wall = time.time() - t0
    text = res.stdout + res.stderr
    m = re.search(r"ends by (\d\d:\d\d:\d\d)", text)
    deadline = None
    if m:
        h, mi, s = map(int, m.group(1).split(":"))
        lt = time.localtime(t0)
        deadline = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, h, mi, s, 0, 0, -1)) - t0
    report = json.loads((out / "report.json").read_text())
    return {"code": res.returncode, "wall": wall, "deadline": deadline, "report": report}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,3,10")
    ap.add_argument("--per-op", type=float, default=5.0, help="seconds of budget per changed operator")
    ap.add_argument("--hog", type=int, default=0, help="busy processes under load (default: one per core)")
    args = ap.parse_args()
    cores = args.hog or os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-stages-"))
    repo = make_repo(tmp, ops_src=source(0), config=CONFIG)
    sizes = [int(s) for s in args.sizes.split(",")]
    for n in sizes:
        git(repo, "checkout", "-q", "-b", f"pr-{n}", "main")
        (repo / "mylib" / "ops.py").write_text(source(n))
        git(repo, "commit", "-q", "-am", f"refactor {n} operator(s)")
    cols = ["setup", "select", "plan", "fuzz", "replay", "judge", "localise"]
    print(f"machine: {os.cpu_count()} cores; load: {cores} busy process(es); budget {args.per_op:g}s per changed operator")
    print(f"{'ops':>3} {'load':6} " + " ".join(f"{c:>14}" for c in cols)
          + f" {'run s':>6} {'ends by':>7} {'exit':>4} {'outcomes':30} {'min evals':>9}")
    for n in sizes:
        git(repo, "checkout", "-q", f"pr-{n}")
        for load in ("idle", "loaded"):
            budget = args.per_op * n
            if load == "idle":
                r = run(repo, tmp / f"out-{n}-{load}", budget)
            else:
                with Hog(cores):
                    r = run(repo, tmp / f"out-{n}-{load}", budget)
            rep = r["report"]
            st = rep.get("env", {}).get("stages", {})
            cells = []
            for c in cols:
                row = st.get(c)
                if row is None:
                    cells.append(f"{'-':>14}")
                else:
                    share = f"/{row['share']:g}" if row.get("share") is not None else ""
                    cells.append(f"{row['seconds']:>8.1f}{share:<6}")
            outcomes: dict = {}
            for v in rep.get("verdicts", []):
                outcomes[v["outcome"]] = outcomes.get(v["outcome"], 0) + 1
            judged = [v.get("evals") for v in rep.get("verdicts", []) if v.get("evals") is not None]
            ends = f"{r['deadline']:.0f}" if r["deadline"] is not None else "-"
            print(f"{n:>3} {load:6} " + " ".join(cells) + f" {r['wall']:>6.1f} {ends:>7} {r['code']:>4} "
                  f"{','.join(f'{k} {v}' for k, v in sorted(outcomes.items())):30} {min(judged) if judged else '-':>9}",
                  flush=True)
    print("fuzz and localise: seconds/share; 'ends by': seconds from the start to the deadline the plan line "
          "announced; min evals: the fewest evaluations a judged variant got")
    return 0


if __name__ == "__main__":
    sys.exit(main())
