"""Acceptance of ``dl-gate init`` on a real operator library and one of its real numerical fixes.

    python bench/init_acceptance.py REPO FIX_SHA [--scenario revert|fix|both] [--init-args "..."]

REPO is a git repository (a clone or a bare mirror). For each scenario it clones REPO into a
temporary folder and measures, side by side, the wall time of each step from the clone to the
gate's first verdict, with no edit of the generated config:

* ``revert``: main = the fix commit; ``dl-gate init``; ``dl-gate baseline refresh``; a PR that
  reverts the fix; ``dl-gate run --base main`` must fail (exit 1);
* ``fix``: main = the fix's parent; the same steps; the PR applies the fix; the gate must pass
  (exit 0).

``--refresh selected``: instead of the full refresh, the PR is gated once without baselines to
find the rows it selects, those rows alone are refreshed on main, and the PR (rebased) is gated
again: how this session's geoopt and keras-cv figures were taken (their full refresh: ~52 min).

It prints one line per step (seconds, exit code) and a verdict line per scenario."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GATE = Path(__file__).resolve().parents[1]


def sh(cmd, cwd, env=None, log=None):
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log is not None:
        log.write(f"$ {' '.join(map(str, cmd))}\n{p.stdout}\n")
        log.flush()
    return p.returncode, time.monotonic() - t0, p.stdout


def scenario(repo: str, fix: str, which: str, init_args: str, run_args: str, keep: Path, refresh: str = "all") -> bool:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(GATE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("GIT_AUTHOR_NAME", "bench")
    env.setdefault("GIT_AUTHOR_EMAIL", "bench@example.com")
    env["GIT_COMMITTER_NAME"] = env["GIT_AUTHOR_NAME"]
    env["GIT_COMMITTER_EMAIL"] = env["GIT_AUTHOR_EMAIL"]
    gate = [sys.executable, "-m", "gate.cli"]
    work = Path(tempfile.mkdtemp(prefix=f"dl-gate-acc-{which}-"))
    lib = work / "lib"
    log = open(keep / f"{Path(repo).parent.name if Path(repo).name == 'repo' else Path(repo).name}-{which}.log", "w")
    t_start = time.monotonic()
    steps = []
    base = fix if which == "revert" else f"{fix}^"
    code, dt, _ = sh(["git", "clone", "-q", "--no-checkout", repo, str(lib)], work, env, log)
    steps.append(("clone", code, dt))
    sh(["git", "checkout", "-q", "-B", "main", base], lib, env, log)
    # a mirror may lack some large binary blobs (LFS-like assets): drop them from the index so
    # commits work; the library's code and tests are all there
    _, _, status = sh(["git", "status", "--porcelain"], lib, env, log)
    missing = [line[3:] for line in status.splitlines() if line.startswith(" D ")]
    if missing:
        sh(["git", "rm", "-q", "--cached", "--", *missing], lib, env, log)
        sh(["git", "commit", "-qm", f"drop {len(missing)} files absent from the mirror"], lib, env, log)
        print(f"  ({len(missing)} binary files absent from the mirror dropped: {', '.join(missing[:3])}...)")
    code, dt, out = sh(gate + ["init", *shlex.split(init_args)], lib, env, log)
    steps.append(("init", code, dt))
    sh(["git", "add", "-A"], lib, env, log)
    sh(["git", "commit", "-qm", "dl-gate init"], lib, env, log)
    if refresh == "all":
        code, dt, _ = sh(gate + ["baseline", "refresh"], lib, env, log)
        steps.append(("baseline refresh", code, dt))
        sh(["git", "add", "-A"], lib, env, log)
        sh(["git", "commit", "-qm", "baselines"], lib, env, log)
    sh(["git", "checkout", "-q", "-b", "pr"], lib, env, log)
    if which == "revert":
        code, dt, _ = sh(["git", "revert", "--no-edit", fix], lib, env, log)
    else:
        code, dt, _ = sh(["git", "cherry-pick", fix], lib, env, log)
    steps.append((f"PR ({which} {fix[:10]})", code, dt))
    if refresh == "selected":  # the rows the PR selects, refreshed on main; the PR rebased on them
        sel_out = work / "selection"
        code, dt, _ = sh(gate + ["run", "--base", "main", "--out", str(sel_out), *shlex.split(run_args)], lib, env, log)
        steps.append(("run without baselines", code, dt))
        try:
            ops = [s["op"] for s in json.loads((sel_out / "report.json").read_text()).get("selected", [])]
        except (OSError, ValueError):
            ops = []
        sh(["git", "checkout", "-q", "main"], lib, env, log)
        if ops:
            code, dt, _ = sh(gate + ["baseline", "refresh", "--ops", ",".join(ops)], lib, env, log)
            steps.append((f"refresh of {len(ops)} selected", code, dt))
            sh(["git", "add", "-A"], lib, env, log)
            sh(["git", "commit", "-qm", "baselines of the selected rows"], lib, env, log)
        sh(["git", "checkout", "-q", "pr"], lib, env, log)
        sh(["git", "rebase", "-q", "main"], lib, env, log)
    code, dt, out = sh(gate + ["run", "--base", "main", *shlex.split(run_args)], lib, env, log)
    steps.append(("run", code, dt))
    total = time.monotonic() - t_start
    want = 1 if which == "revert" else 0
    for name, c, d in steps:
        print(f"  {which:6s} {name:28s} exit {c:3d}  {d:7.1f}s")
    ok = steps[-1][1] == want
    print(f"{Path(repo).name} {which}: gate exit {steps[-1][1]} (want {want}) -> {'OK' if ok else 'WRONG'}; "
          f"clone to verdict {total:.0f}s; workdir {work}")
    sys.stdout.flush()
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo")
    ap.add_argument("fix")
    ap.add_argument("--scenario", choices=["revert", "fix", "both"], default="both")
    ap.add_argument("--init-args", default="")
    ap.add_argument("--run-args", default="")
    ap.add_argument("--refresh", choices=["all", "selected"], default="all",
                    help="all: `dl-gate baseline refresh` as a user runs it; selected: only the rows the PR "
                         "selects (a large library's full refresh takes an hour), measured after a run "
                         "without baselines that finds them")
    ap.add_argument("--logs", default=str(Path(tempfile.gettempdir()) / "dl-gate-acceptance"))
    a = ap.parse_args()
    keep = Path(a.logs)
    keep.mkdir(parents=True, exist_ok=True)
    which = ["revert", "fix"] if a.scenario == "both" else [a.scenario]
    results = [scenario(a.repo, a.fix, w, a.init_args, a.run_args, keep, a.refresh) for w in which]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
