"""Asking head and base the same questions.

Head runs in this process (its operator library is already imported by the pipeline). Base runs
in one long-lived worker process inside a git worktree of the merge-base
(:mod:`gate.localise.worker`), started once per localisation run and fed batches of inputs, so
that shrinking pays for one interpreter start instead of one per round. Every wait on the worker
is bounded by the localisation deadline; a worker that does not answer in time is stopped and
base answers become ``unavailable`` (the predicate then says "cannot tell").
"""
from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import GateError
from ..search.inputs import Candidate
from ..oracles.runner import VariantRunner
from ..judge.replay import UNAVAILABLE, ReplayResult, replay, worktree
from ..ops.spec import OpSpec
from ..oracles.precision import Metrics
from ..plan import Variant


class Head:
    """Evaluation with one cached runner (of the variant's oracle) per operator x variant, in
    this process or, with ``isolate`` (:class:`gate.backends.isolate.IsolateOptions`), in worker
    processes that a crashing input cannot take down with the gate."""

    def __init__(self, isolate=None):
        self._runners: Dict[Tuple[str, Variant], Optional[VariantRunner]] = {}
        self.calls = 0
        self.isolate = isolate

    def runner(self, spec: OpSpec, variant: Variant) -> Optional[VariantRunner]:
        key = (spec.name, variant)
        if key not in self._runners:
            from ..oracles.registry import build_runner

            try:
                self._runners[key] = build_runner(spec, variant, isolate=self.isolate)
            except GateError:
                self._runners[key] = None
        return self._runners[key]

    def close(self) -> None:
        for r in self._runners.values():
            if r is not None and hasattr(r, "close"):
                r.close()
        self._runners.clear()

    def quantize(self, spec: OpSpec, variant: Variant, cand: Candidate) -> Candidate:
        r = self.runner(spec, variant)
        return r.quantize(cand) if r is not None else cand

    def evaluate(self, spec: OpSpec, variant: Variant, cands: Sequence[Candidate]) -> List[ReplayResult]:
        r = self.runner(spec, variant)
        self.calls += len(cands)
        if r is None:
            return [ReplayResult(UNAVAILABLE, error=f"variant {variant.key} cannot run here") for _ in cands]
        with np.errstate(all="ignore"):
            return replay(spec, variant, cands, runner=r)


MAX_LATE = 2  # unanswered questions in a row before the base worker is given up
STARTUP_GRACE = 10.0  # seconds a base worker may take to import the framework, beyond a question's share


class BaseWorker:
    """The base worktree and its worker process (started on first use). With ``rev`` None: a
    worker on the checked-out tree itself (head), so that the gate's run process traces head's
    operator without importing it."""

    def __init__(self, repo: Path, rev: Optional[str], python_path: Sequence[str], cfg_dir: str, prepare=None,
                 spawn=None):
        self.repo, self.rev = Path(repo), rev
        self.prepare = prepare  # called with the worktree before the worker starts (builds an extension)
        #: ``spawn(module, argv, cwd, stderr_fd)``: the worker forked from the isolation zygote,
        #: whose framework is already imported (:func:`gate.backends.isolate.spawn_module`);
        #: None, or a spawn that answers None: a fresh interpreter
        self.spawn = spawn
        self.started: Optional[str] = None  # "zygote" or "interpreter", once started
        self.python_path = list(python_path)
        self.cfg_dir = cfg_dir
        self.proc: Optional[subprocess.Popen] = None
        self.dead: Optional[str] = None
        self.work: Optional[Path] = None
        self.tree: Optional[Path] = None
        self._stack = ExitStack()
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._next = 0
        self.requests = 0
        self._hello: Optional[int] = None
        self._late = 0  # questions in a row not answered within their share of the budget

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Check out the base and launch the worker without waiting for it."""
        if self.proc is not None or self.dead:
            return
        try:
            self.tree = self.repo if self.rev is None else self._stack.enter_context(worktree(self.repo, self.rev))
            if self.prepare is not None:
                self.prepare(self.tree)
        except GateError as exc:
            self.dead = str(exc)
            return
        self.work = Path(tempfile.mkdtemp(prefix="dl-gate-localise-"))
        root = self.tree / self.cfg_dir if self.cfg_dir else self.tree
        (self.work / "setup.json").write_text(json.dumps({"root": str(self.tree), "python_path": [
            str((root / p)) for p in self.python_path]}))
        from ..backends.sandbox import worker_env

        env = worker_env()  # the allow-list: no credentials reach the code under test
        self._err = open(self.work / "worker.stderr", "wb")
        if self.spawn is not None:
            self.proc = self.spawn("gate.localise.worker", [str(self.work)], str(self.tree), self._err.fileno())
        self.started = "zygote"
        if self.proc is None:
            self.started = "interpreter"
            self.proc = subprocess.Popen([sys.executable, "-m", "gate.localise.worker", str(self.work)],
                                         cwd=str(self.tree), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._err, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()
        self._hello = self._send({"type": "hello"})

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def close(self) -> None:
        if self.proc is not None:
            try:
                if self.proc.poll() is None:
                    self.proc.stdin.write(json.dumps({"type": "exit"}) + "\n")
                    self.proc.stdin.flush()
                    self.proc.wait(timeout=5)
            except Exception:
                pass
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._err.close()
        self.proc = None
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
        self._stack.close()

    def _fail(self, why: str) -> None:
        self.dead = why
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # -- protocol -----------------------------------------------------------------------
    def _send(self, req: dict) -> int:
        self._next += 1
        req = {**req, "id": self._next}
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        self.requests += 1
        return self._next

    def _wait(self, rid: int, timeout: float, fatal: bool = True) -> Optional[dict]:
        while True:
            try:
                line = self._lines.get(timeout=max(timeout, 0.01))
            except queue.Empty:
                if fatal:
                    self._fail(f"base worker did not answer within the localisation budget ({timeout:.1f}s)")
                return None
            if line is None:
                tail = ""
                try:
                    tail = (self.work / "worker.stderr").read_text(errors="replace").strip().splitlines()[-1]
                except Exception:
                    pass
                self._fail(f"base worker exited{': ' + tail if tail else ''}")
                return None
            resp = json.loads(line)
            if resp.get("id") == rid:
                return resp

    def request(self, req: dict, timeout: float) -> Optional[dict]:
        """Send ``req`` and wait for its answer at most ``timeout`` seconds (None: no answer)."""
        self.start()
        if self.dead or self.proc is None:
            return None
        try:
            if self._hello is not None:
                # start-up (a fresh interpreter importing the framework) gets a grace period of
                # its own, and a slow start is not fatal: the next question waits for it again
                if self._wait(self._hello, max(timeout, STARTUP_GRACE), fatal=False) is None:
                    return None
                self._hello = None
            rid = self._send(req)
            # a late answer is not fatal: a loaded machine or one slow input runs past one
            # finding's share of the budget, and killing the worker left every later finding
            # without base (the late reply is skipped by its id); two in a row mean it is stuck
            resp = self._wait(rid, timeout, fatal=False)
            if resp is None and not self.dead:
                self._late += 1
                if self._late >= MAX_LATE:
                    self._fail(f"base worker did not answer {MAX_LATE} questions in a row within their share of the "
                               f"localisation budget (the last {timeout:.1f}s)")
            elif resp is not None:
                self._late = 0
            return resp
        except (BrokenPipeError, OSError, ValueError) as exc:
            self._fail(f"base worker: {exc}")
            return None

    def _silence(self) -> str:
        if self._hello is not None:
            return f"the base worker is still starting (it had {STARTUP_GRACE:g}s beyond the budget share)"
        return "no answer"

    # -- questions ----------------------------------------------------------------------
    def evaluate(self, jobs: Sequence[Tuple[str, OpSpec, Variant, Sequence[Candidate]]], timeout: float
                 ) -> Dict[str, List[ReplayResult]]:
        """Replay batches of inputs on base: ``{key: [ReplayResult, ...]}`` (unavailable on failure)."""
        def unavailable(why):
            return {k: [ReplayResult(UNAVAILABLE, error=why) for _ in cs] for k, _, _, cs in jobs}

        if not jobs:
            return {}
        self.start()
        if self.dead or self.work is None:
            return unavailable(self.dead or "no base")
        req_jobs = []
        for j, (key, spec, variant, cands) in enumerate(jobs):
            files = []
            for i, c in enumerate(cands):
                name = f"in{self._next + 1}-{j}-{i}.npz"
                c.save(self.work / name, compress=False)
                files.append(name)
            req_jobs.append({"key": key, "spec": spec.to_dict(), "variant": variant.to_dict(), "inputs": files})
        resp = self.request({"type": "replay", "jobs": req_jobs}, timeout)
        if resp is None:
            return unavailable(self.dead or self._silence())
        if resp.get("error"):
            return unavailable(resp["error"])
        out: Dict[str, List[ReplayResult]] = {}
        for job in resp["jobs"]:
            results = []
            for r in job["results"]:
                rr = ReplayResult(status=r["status"], metrics=Metrics.from_dict(r["metrics"]) if r.get("metrics") else None,
                                  error=r.get("error"), signature=r.get("signature"))
                if r.get("arrays"):
                    p = self.work / r["arrays"]
                    with np.load(p) as z:
                        rr.outputs = [z[k] for k in sorted((k for k in z.files if k.startswith("o")), key=lambda k: int(k[1:]))]
                        rr.reference = [z[k] for k in sorted((k for k in z.files if k.startswith("r")), key=lambda k: int(k[1:]))]
                    p.unlink()
                results.append(rr)
            out[job["key"]] = results
        for j in req_jobs:
            for f in j["inputs"]:
                (self.work / f).unlink(missing_ok=True)
        return out

    def trace(self, spec: OpSpec, variant: Variant, cand: Candidate, timeout: float, float64_run: bool = False):
        """The sub-operation trace of base on ``cand`` (see :func:`gate.localise.trace.trace_op`)."""
        from .trace import OpTrace

        self.start()
        if self.dead or self.work is None:
            return None, self.dead or "no base"
        name = f"tin{self._next + 1}.npz"
        cand.save(self.work / name, compress=False)
        resp = self.request({"type": "trace", "spec": spec.to_dict(), "variant": variant.to_dict(), "input": name,
                             "float64_run": float64_run}, timeout)
        if resp is None:
            return None, self.dead or self._silence()
        if resp.get("error"):
            return None, resp["error"]
        return OpTrace.load(resp["trace"], self.work), None


# ---------------------------------------------------------------------------------------
# one question to both sides: does the finding hold on these inputs?
# ---------------------------------------------------------------------------------------
class Check:
    """One input judged on head and base: ``holds`` is True/False, or None (cannot tell)."""

    __slots__ = ("cand", "variant", "holds", "head", "base", "severity")

    def __init__(self, cand, variant, holds, head, base, severity):
        self.cand, self.variant, self.holds, self.head, self.base, self.severity = cand, variant, holds, head, base, severity


class Session:
    """Head, base and the clock shared by every localisation of one gate run."""

    def __init__(self, head: Head, base: Optional[BaseWorker], head_worker: Optional[BaseWorker] = None):
        self.head = head
        self.base = base
        self.head_worker = head_worker  # traces head in a worker (an isolated gate never runs it here)
        self.checks = 0

    def check(self, spec: OpSpec, target, pairs: Sequence[Tuple[Variant, Candidate]], use_base: bool,
              deadline) -> List[Check]:
        """Evaluate ``(variant, candidate)`` pairs on head, then (in one batch) the ones head
        makes suspect on base, and apply ``target``'s predicate."""
        qs = [(v, self.head.quantize(spec, v, c)) for v, c in pairs]
        hres: List[Optional[ReplayResult]] = [None] * len(qs)
        by_variant: Dict[Variant, List[int]] = {}
        for i, (v, _) in enumerate(qs):
            by_variant.setdefault(v, []).append(i)
        for v, idx in by_variant.items():
            for i in idx:  # one at a time: a spent budget stops the batch (large inputs are slow)
                if deadline.expired():
                    hres[i] = ReplayResult(UNAVAILABLE, error="localisation budget spent")
                else:
                    hres[i] = self.head.evaluate(spec, v, [qs[i][1]])[0]
        bres: List[Optional[ReplayResult]] = [None] * len(qs)
        if use_base and self.base is not None:
            jobs, where = [], []
            for v, idx in by_variant.items():
                sus = [i for i in idx if target.head_suspect(hres[i], v.dtype)]
                if sus:
                    jobs.append((str(len(jobs)), spec, v, [qs[i][1] for i in sus]))
                    where.append(sus)
            if jobs:
                answers = self.base.evaluate(jobs, timeout=max(deadline.left, 0.5))
                for (key, _, _, _), sus in zip(jobs, where):
                    for i, r in zip(sus, answers.get(key, [])):
                        bres[i] = r
        out = []
        self.checks += len(qs)
        for i, (v, q) in enumerate(qs):
            h, b = hres[i], bres[i]
            if use_base and b is None and target.head_suspect(h, v.dtype):
                b = ReplayResult(UNAVAILABLE, error="base not asked")
            if h.status == UNAVAILABLE:
                holds = None
            else:
                holds = target.holds(h, b if use_base else None, v) if target.head_suspect(h, v.dtype) else False
            sev = target.severity(h, b, v.dtype) if holds else 0.0
            out.append(Check(q, v, holds, h, b, sev))
        return out
