"""Replay identical inputs on head and on base.

Head runs in this process. Base runs in a separate process inside a git worktree of the
merge-base, so a Python operator library is imported *as it was* before the PR; the same
quantised inputs go to both, and both outputs and float64 references come back for comparison.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from ..errors import GateError
from ..search.inputs import Candidate
from ..oracles.runner import CRASH, OK, VariantRunner
from ..ops.spec import OpSpec
from ..oracles.precision import Metrics
from ..plan import Variant

UNAVAILABLE = "unavailable"  # the operator cannot be imported on that side (new op, moved, broken)
#: the error of an input the base replay had no time left for (``budget.replay``): not judged
#: against base; a variant with none replayed is held against its stored baseline
OUT_OF_TIME = "not replayed on base: the replay's share of the run ran out"


@dataclass
class ReplayResult:
    status: str
    metrics: Optional[Metrics] = None
    error: Optional[str] = None
    signature: Optional[str] = None
    outputs: Optional[List[np.ndarray]] = None
    reference: Optional[List[np.ndarray]] = None

    def to_json(self) -> dict:
        return {"status": self.status, "metrics": self.metrics.to_dict() if self.metrics else None,
                "error": self.error, "signature": self.signature}


def replay(spec: OpSpec, variant: Variant, candidates: Sequence[Candidate],
           runner: Optional[VariantRunner] = None, isolate=None, deadline: Optional[float] = None) -> List[ReplayResult]:
    """Evaluate ``candidates`` for ``spec``/``variant`` with the runner of the variant's oracle,
    in this process or (``isolate``: :class:`gate.backends.isolate.IsolateOptions`) in a worker
    process, so that replaying a crashing input cannot take the gate down. ``deadline``
    (``time.monotonic()``): the inputs not started by then are :data:`OUT_OF_TIME`."""
    from ..oracles.registry import build_runner

    if deadline is not None and time.monotonic() >= deadline:
        return [ReplayResult(UNAVAILABLE, error=OUT_OF_TIME) for _ in candidates]
    own = runner is None
    try:
        runner = runner or build_runner(spec, variant, isolate=isolate)
    except GateError as exc:
        return [ReplayResult(UNAVAILABLE, error=str(exc)) for _ in candidates]
    out = []
    try:
        for cand in candidates:
            if deadline is not None and time.monotonic() >= deadline:
                out.append(ReplayResult(UNAVAILABLE, error=OUT_OF_TIME))
                continue
            _, ev = runner.evaluate(cand, keep_outputs=True)
            out.append(ReplayResult(
                status=ev.status, metrics=ev.metrics, error=ev.error, signature=ev.signature,
                outputs=[o.array for o in ev.outputs] if ev.outputs is not None else None,
                reference=[o.array for o in ev.reference] if ev.reference is not None else None,
            ))
    finally:
        if own and hasattr(runner, "close"):
            runner.close()
    return out


def replay_head(spec: OpSpec, variant: Variant, candidates: Sequence[Candidate], crashes: Sequence = (),
                isolate=None, deadline: Optional[float] = None) -> List[ReplayResult]:
    """Head's results on ``candidates``. With isolation, an input the search saw crash or hang
    (``crashes``: the finding's :class:`~gate.search.finding.Crash` records) is not run again, its
    record is the result; and an operator that hung is not run on the other inputs either: each
    would cost a full timeout, and its hang is the finding that decides (replayed on base).
    ``deadline`` (``time.monotonic()``): the inputs not started by then are :data:`OUT_OF_TIME`."""
    known = {id(c.candidate): c for c in crashes if c.candidate is not None and isolate is not None}
    hangs = isolate is not None and any(c.signature.startswith("timeout") for c in crashes)
    todo = [] if hangs else [c for c in candidates if id(c) not in known]
    if todo and isolate is not None and hung_before(spec.name):
        # a hang of this operator was confirmed in another variant: replayed one by one until it
        # hangs here too (its record is the finding), not a full timeout per input
        ran_list: List[ReplayResult] = []
        for c in todo:
            r = replay(spec, variant, [c], isolate=isolate, deadline=deadline)[0]
            ran_list.append(r)
            if r.status == CRASH and str(r.signature or "").startswith("timeout"):
                break
        hangs = len(ran_list) < len(todo) or bool(ran_list and str(ran_list[-1].signature or "").startswith("timeout"))
        done = {id(c): r for c, r in zip(todo, ran_list)}
        return [ReplayResult(CRASH, error=known[id(c)].message, signature=known[id(c)].signature) if id(c) in known
                else done[id(c)] if id(c) in done
                else ReplayResult(UNAVAILABLE, error="not replayed: the operator hangs on head")
                for c in candidates]
    ran = iter(replay(spec, variant, todo, isolate=isolate, deadline=deadline) if todo else [])
    out: List[ReplayResult] = []
    for c in candidates:
        if id(c) in known:
            out.append(ReplayResult(CRASH, error=known[id(c)].message, signature=known[id(c)].signature))
        elif hangs:
            out.append(ReplayResult(UNAVAILABLE, error="not replayed: the operator hangs on head"))
        else:
            out.append(next(ran))
    return out


def hung_before(name: str) -> bool:
    """A hang of operator ``name`` was confirmed by an isolated worker of this process."""
    from ..backends.isolate import confirmed_hang

    return confirmed_hang(name)


@dataclass
class ReplayJob:
    key: str
    spec: OpSpec
    variant: Variant
    candidates: List[Candidate]
    #: the inputs the variant's verdict turns on (head's crash or NaN/Inf, its worst, a control):
    #: replayed first, every variant's before any variant's others
    first: Sequence[int] = ()


def suspicion(head: Sequence["ReplayResult"], row) -> tuple:
    """The order in which a short base replay takes the variants (sort key, most suspect first):
    those where head crashed where the stored baseline ``row`` did not, then by how far head's
    figures are past the baseline's (its NaN/Inf count an input over the baseline's, its largest
    error over the baseline's): a stored baseline with NaN/Inf of its own cannot tell whether
    head's are new (naver/roma's revert at load 3: rotvec_to_rotmat's gradient NaN at the zero
    rotation, 612 elements against the baseline's 156, passed; base's replay never reached it)."""
    head = [r for r in head if r is not None]
    crash = any(r.status == CRASH for r in head) and not (row is not None and row.crash)
    nonfinite = max((r.metrics.nonfinite for r in head if r.status == OK and r.metrics is not None), default=0)
    worst = max((r.metrics.ulp for r in head if r.status == OK and r.metrics is not None), default=0.0)
    base_nf = row.nonfinite if row is not None else 0
    base_ulp = row.ulp if row is not None and math.isfinite(row.ulp) else 0.0
    score = max((nonfinite + 1.0) / (base_nf + 1.0), (worst + 1e-30) / (base_ulp + 1e-30) if worst else 0.0)
    return (0 if crash else 1, -score)


def deciding_inputs(head: Sequence["ReplayResult"], cands: Sequence[Candidate]) -> List[int]:
    """The inputs a variant's verdict turns on, replayed on base before any variant's others
    (:attr:`ReplayJob.first`): head's first crash or NaN/Inf on an ordinary input (a control, a
    degenerate or structured one, the library's own test call: where base is expected to give
    numbers) and its first anywhere, its worst error, and the first control input (a behaviour
    change is judged there). naver/roma's revert: the first NaN input was a search extreme where
    base is NaN too; the tests' zero rotation, NaN on head only, came later."""
    bad = [i for i, r in enumerate(head)
           if r.status == CRASH or (r.status == OK and r.metrics is not None and r.metrics.nonfinite)]
    ordinary = [i for i in bad if i < len(cands) and (cands[i].origin == "control" or cands[i].origin.startswith(
        ("degenerate", "structured", "seed")))]
    worst = max((i for i, r in enumerate(head) if r.status == OK and r.metrics is not None),
                key=lambda i: head[i].metrics.ulp, default=None)
    control = next((i for i, c in enumerate(cands) if c.origin == "control"), None)
    return list(dict.fromkeys(i for i in (ordinary[:1] + bad[:1] + [worst, control]) if i is not None))


@contextlib.contextmanager
def worktree(repo: Path, rev: str) -> Iterator[Path]:
    """A detached git worktree of ``rev``, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-base-"))
    path = tmp / "tree"
    res = subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(path), rev],
                         capture_output=True, encoding="utf-8", errors="replace")
    if res.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise GateError(f"cannot check out base {rev}: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else 'git worktree failed'}")
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _inside(path: str, root: Optional[Path]) -> bool:
    if root is None:
        return False
    try:
        p, r = Path(path).resolve(), Path(root).resolve()
    except (OSError, RuntimeError):
        return False
    return p == r or r in p.parents


def base_isolate_options(tree: Path, python_path: Sequence[str], isolate, head_root: Optional[Path]):
    """``isolate`` for workers that import the operator library from ``tree`` (forked by the
    same zygote as head's): the library's directories, the tree, then this process's import
    path without the working directory and anything of head's checkout (what ``python -m`` in
    the tree would have), the tree as working directory."""
    from dataclasses import replace as _replace

    lib = [str((Path(tree) / p).resolve()) for p in (python_path or ["."])]
    rest = [p for p in sys.path if p not in ("", ".") and not _inside(p, head_root) and not _inside(p, tree)]
    return _replace(isolate, sys_path=tuple(dict.fromkeys([*lib, str(Path(tree).resolve()), *rest])), cwd=str(tree))


def _replay_isolated(tree: Path, python_path: Sequence[str], jobs: Sequence[ReplayJob], isolate,
                     head_root: Optional[Path], deadline: Optional[float] = None,
                     sink: Optional[Dict[str, List[ReplayResult]]] = None) -> Dict[str, List[ReplayResult]]:
    """Every job's inputs in two passes when time is counted (``deadline``): each job's
    :attr:`ReplayJob.first` inputs, then the others, so that a replay cut short (its share spent,
    or the run stopped at its deadline on a loaded runner) has compared every variant on the
    inputs its verdict turns on, rather than the first variants on all of theirs and the last on
    none (naver/roma's fix at load 10: 22 variants judged against stored baselines only, 7 false
    regressions). Results land in ``sink``'s lists as they come (what a stopped run judges)."""
    opts = base_isolate_options(tree, python_path, isolate, head_root)
    out = {job.key: [ReplayResult(UNAVAILABLE, error=OUT_OF_TIME) for _ in job.candidates] for job in jobs}
    if sink is not None:
        sink.update(out)  # the same lists, filled in place
    first = {job.key: [i for i in dict.fromkeys(job.first) if 0 <= i < len(job.candidates)] for job in jobs}
    if deadline is None or not any(first.values()):
        passes = [{job.key: list(range(len(job.candidates))) for job in jobs}]
    else:
        passes = [first, {job.key: [i for i in range(len(job.candidates)) if i not in first[job.key]] for job in jobs}]
    for todo in passes:
        for job in jobs:
            idx = todo[job.key]
            if not idx:
                continue
            got = replay(job.spec, job.variant, [job.candidates[i] for i in idx], isolate=opts, deadline=deadline)
            for i, r in zip(idx, got):
                out[job.key][i] = r
    return out


def replay_in_tree(tree: Path, python_path: Sequence[str], jobs: Sequence[ReplayJob],
                   timeout: float = 600.0, isolate=None, head_root: Optional[Path] = None,
                   seconds: Optional[float] = None,
                   sink: Optional[Dict[str, List[ReplayResult]]] = None) -> Dict[str, List[ReplayResult]]:
    """Run ``jobs`` with the operator library imported from ``tree``: in isolated workers forked
    by the same warm zygote as head's (their import path the tree's, nothing of ``head_root``),
    or, without isolation, in a fresh interpreter. ``seconds``: the replay's share of the run;
    the inputs it leaves are :data:`OUT_OF_TIME` (their variants judged without base where none
    was replayed), never a lost run. ``sink``: each job's results as they come (isolated: input
    by input pass by pass, :func:`_replay_isolated`; a fresh interpreter: at its end)."""
    if not jobs:
        return {}
    deadline = time.monotonic() + seconds if seconds is not None else None
    if isolate is not None:
        return _replay_isolated(tree, python_path, jobs, isolate, head_root, deadline, sink)
    if seconds is not None:
        timeout = min(timeout, seconds + 30.0)  # the interpreter's start, beyond the share
    work = Path(tempfile.mkdtemp(prefix="dl-gate-replay-"))
    try:
        req = {"root": str(tree), "python_path": list(python_path), "jobs": [],
               "isolate": isolate.to_dict() if isolate is not None else None}
        for j, job in enumerate(jobs):
            files = []
            for i, c in enumerate(job.candidates):
                name = f"in-{j}-{i}.npz"
                c.save(work / name, compress=False)
                files.append(name)
            req["jobs"].append({"key": job.key, "spec": job.spec.to_dict(), "variant": job.variant.to_dict(), "inputs": files})
        (work / "request.json").write_text(json.dumps(req))
        from ..backends.sandbox import worker_env

        env = worker_env()  # the allow-list: no credentials reach base's code
        try:
            res = subprocess.run([sys.executable, "-m", "gate.judge.replay_worker", str(work)], cwd=str(tree),
                                 capture_output=True, encoding="utf-8", errors="replace", timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            if seconds is None:
                raise GateError(f"base replay timed out after {timeout:.0f}s") from None
            return {job.key: [ReplayResult(UNAVAILABLE, error=OUT_OF_TIME) for _ in job.candidates] for job in jobs}
        if res.returncode != 0 or not (work / "response.json").exists():
            tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise GateError(f"base replay failed (exit {res.returncode}): {tail}")
        resp = json.loads((work / "response.json").read_text())
        out: Dict[str, List[ReplayResult]] = {}
        for job in resp["jobs"]:
            results = []
            for i, r in enumerate(job["results"]):
                rr = ReplayResult(status=r["status"], metrics=Metrics.from_dict(r["metrics"]) if r.get("metrics") else None,
                                  error=r.get("error"), signature=r.get("signature"))
                npz = work / f"out-{job['index']}-{i}.npz"
                if npz.exists():
                    with np.load(npz) as z:
                        rr.outputs = [z[k] for k in sorted((k for k in z.files if k.startswith("o")), key=lambda k: int(k[1:]))]
                        rr.reference = [z[k] for k in sorted((k for k in z.files if k.startswith("r")), key=lambda k: int(k[1:]))]
                results.append(rr)
            out[job["key"]] = results
        if sink is not None:
            sink.update(out)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
