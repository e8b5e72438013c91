"""Crash and hang isolation: evaluate candidates in a worker process that may die.

:class:`IsolatedRunner` has the runner interface (``evaluate``, ``backend``, the oracle hooks),
so the engine and :func:`gate.fuzz.fuzz_task` use it unchanged. Each evaluation is sent to a
warm worker (the framework is imported and the oracle's runner built once per worker, not per
evaluation) and must answer within ``timeout`` seconds. When the worker dies (segfault, abort,
the OOM killer) or does not answer in time, the evaluation becomes a CRASH whose signature is
the signal name or ``timeout after Xs`` plus the innermost Python frame that ``faulthandler``
printed, the worker is restarted, and the search goes on.

Why ``subprocess`` + pipes rather than ``multiprocessing``: the worker is ``python -m
gate.fuzz.isolate`` with two inherited pipe file descriptors, so

* nothing of the parent is forked: torch/TensorFlow thread pools and CUDA contexts are not
  fork-safe, which rules ``fork`` out;
* unlike the ``spawn`` and ``forkserver`` start methods, the caller's ``__main__`` is never
  re-imported in the worker, so the gate works from any entry point (CLI, pytest, a user's
  script without an ``if __name__ == "__main__"`` guard);
* the protocol uses dedicated descriptors, not stdin/stdout, so an operator that prints cannot
  corrupt it; its output goes to a log the parent reads for the crash signature.

The price is a fresh interpreter (and framework import) per restart, i.e. per crash or hang:
``bench/isolation_cost.py`` measures steady-state throughput, in-process vs isolated, side by
side. Messages are pickled over ``multiprocessing.connection.Connection`` framing; both ends
are this package.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from .. import errors
from ..errors import GateError
from ..ops.spec import OpSpec
from ..plan import Variant
from .inputs import Candidate
from .runner import CRASH, Evaluation

_TIMEOUT = "timeout"
_DEAD = "dead"


@dataclass(frozen=True)
class IsolateOptions:
    timeout: float = 10.0  # seconds one evaluation may take before it counts as a hang
    start_timeout: float = 180.0  # worker start: interpreter, framework import, runner build
    warmup_factor: float = 3.0  # the first evaluation of a fresh worker may compile: allow more
    standby: bool = True  # after a first crash/hang, keep a second worker ready: the next costs no wait

    def to_dict(self) -> dict:
        return {"timeout": self.timeout, "start_timeout": self.start_timeout, "warmup_factor": self.warmup_factor,
                "standby": self.standby}


def isolate_options(enabled: Optional[bool], timeout: Optional[float] = None,
                    gate_cfg: Optional[dict] = None) -> Optional[IsolateOptions]:
    """Options from a flag and the config's ``gate.isolate`` / ``gate.eval_timeout`` (the flag
    wins); ``None`` when evaluations run in-process."""
    g = dict(gate_cfg or {})
    on = enabled if enabled is not None else bool(g.get("isolate", False))
    timeout = timeout if timeout is not None else g.get("eval_timeout")
    if timeout is not None and float(timeout) <= 0:
        raise GateError("the evaluation timeout must be a positive number of seconds")
    if not on:
        return None
    return IsolateOptions(timeout=float(timeout)) if timeout is not None else IsolateOptions()


class _RemoteBackend:
    """What :func:`gate.fuzz.fuzz_task` asks of ``runner.backend``, answered by the worker."""

    def __init__(self, owner: "IsolatedRunner"):
        self._owner = owner

    @property
    def name(self) -> str:
        return self._owner.spec.framework

    def seed(self, seed: int) -> None:
        self._owner.seed(seed)

    def environment(self, device: str) -> dict:
        return dict(self._owner.env)

    def devices(self) -> list:
        return list(self._owner.devices)


class _Worker:
    """One ``python -m gate.fuzz.isolate`` process, its two pipes and its log."""

    def __init__(self, spec: OpSpec, variant: Variant):
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        fd, self.log = tempfile.mkstemp(prefix="dl-gate-worker-", suffix=".log")
        os.close(fd)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory that holds ``gate``
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "gate.fuzz.isolate", str(p2c_r), str(c2p_w)],
                    pass_fds=(p2c_r, c2p_w), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                )
        finally:
            os.close(p2c_r)
            os.close(c2p_w)
        self.tx = Connection(p2c_w, readable=False)
        self.rx = Connection(c2p_r, writable=False)
        self.fresh = True
        self.env: Optional[dict] = None
        self.devices: list = []
        # sent now, answered when the worker has imported the framework and built the runner
        self.tx.send(("init", {"sys_path": list(sys.path), "spec": spec, "variant": variant}))

    def receive(self, timeout: float) -> Tuple[str, Any]:
        try:
            if not self.rx.poll(timeout):
                return _TIMEOUT, None
            return "reply", self.rx.recv()
        except (EOFError, OSError):
            return _DEAD, None

    def ready(self, timeout: float, what: str) -> dict:
        """Wait for the init reply; a worker that cannot build its runner raises the
        worker's own one-line :class:`GateError` here."""
        if self.env is not None:
            return self.env
        kind, reply = self.receive(timeout)
        if kind == "reply" and reply[0] == "ready":
            self.env = dict(reply[1].get("env") or {})
            self.devices = list(reply[1].get("devices") or [])
            return self.env
        if kind == "reply" and reply[0] == "error":
            cls = getattr(errors, reply[1], GateError)
            if not (isinstance(cls, type) and issubclass(cls, GateError)):
                cls = GateError
            self.kill()
            raise cls(reply[2])
        detail = self.log_tail().strip()[-500:]
        self.kill()
        raise GateError(f"isolated worker for {what} did not start ({kind}): {detail}")

    def call(self, msg: tuple, timeout: float) -> Any:
        self.tx.send(msg)
        kind, reply = self.receive(timeout)
        if kind != "reply":
            raise GateError(f"isolated worker stopped answering ({kind})")
        return reply

    def log_size(self) -> int:
        return os.path.getsize(self.log) if os.path.exists(self.log) else 0

    def log_tail(self, pos: int = 0, limit: int = 20000) -> str:
        if not os.path.exists(self.log):
            return ""
        with open(self.log, "rb") as fh:
            fh.seek(max(pos, os.path.getsize(self.log) - limit))
            return fh.read().decode("utf-8", "replace")

    def dump_stack(self, wait: float = 1.0) -> None:
        """Ask a hung worker for its Python stack (faulthandler on SIGUSR1) before killing it."""
        if self.proc.poll() is not None or not hasattr(signal, "SIGUSR1"):
            return
        size = self.log_size()
        try:
            self.proc.send_signal(signal.SIGUSR1)
        except OSError:
            return
        deadline = time.perf_counter() + wait
        while time.perf_counter() < deadline:
            time.sleep(0.02)
            if self.log_size() > size and "most recent call first" in self.log_tail(size):
                time.sleep(0.05)  # let the dump finish
                return

    def exit_code(self) -> Optional[int]:
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            return None

    def kill(self) -> None:
        for conn in (self.tx, self.rx):
            try:
                conn.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.tx.send(("exit",))
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if os.path.exists(self.log):
            os.unlink(self.log)


class IsolatedRunner:
    """The runner of ``variant.oracle`` for ``spec``, living in a worker process (plus, with
    ``options.standby`` and once a worker has died, a second one starting in the background to
    replace the next casualty at once)."""

    def __init__(self, spec: OpSpec, variant: Variant, options: IsolateOptions = IsolateOptions()):
        from .registry import hooks, runner_options

        self.spec = spec
        self.variant = variant
        self.options = options
        self.oracle_options = runner_options(spec, variant.oracle)
        # the oracle's hooks are data: answered here without importing a framework
        self.search_spec, self.guidance, self.extra_mutators = hooks(spec, variant, self.oracle_options)
        self.backend = _RemoteBackend(self)
        self.env: Dict[str, Any] = {}
        self.devices: list = [variant.device]
        self.stats = {"evaluations": 0, "starts": 0, "crashes": 0, "timeouts": 0}
        self._seed: Optional[int] = None
        self._active: Optional[_Worker] = None
        self._standby: Optional[_Worker] = None
        self._ensure_active()  # fails here, in the caller, if the runner cannot be built

    @property
    def what(self) -> str:
        return f"{self.spec.name}[{self.variant.key}]"

    # -- worker lifecycle ----------------------------------------------------------------
    def _spawn(self) -> _Worker:
        self.stats["starts"] += 1
        return _Worker(self.spec, self.variant)

    def _ensure_active(self) -> _Worker:
        if self._active is None:
            worker, self._standby = (self._standby or self._spawn()), None
            try:
                self.env = worker.ready(self.options.start_timeout, self.what)
                self.devices = worker.devices or self.devices
            except BaseException:
                worker.close()
                raise
            self._active = worker
            if self._seed is not None:
                worker.call(("seed", self._seed), self.options.start_timeout)
        lost = self.stats["crashes"] + self.stats["timeouts"] + self.stats.get("lost", 0)
        if self.options.standby and self._standby is None and lost:  # it crashed once: it may again
            self._standby = self._spawn()
        return self._active

    def _discard_active(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None

    def close(self) -> None:
        for w in (self._active, self._standby):
            if w is not None:
                w.close()
        self._active = self._standby = None

    def __enter__(self) -> "IsolatedRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- the runner interface ------------------------------------------------------------
    def seed(self, seed: int) -> None:
        self._seed = seed
        if self._active is not None:
            self._active.call(("seed", seed), self.options.start_timeout)

    def quantize(self, cand: Candidate) -> Candidate:
        """The candidate as the worker's runner quantises it (no operator call)."""
        worker = self._ensure_active()
        try:
            reply = worker.call(("quantize", cand), self.options.start_timeout)
        except (GateError, OSError):
            self._discard_active()
            return cand
        return reply[1] if reply[0] == "result" else cand

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        worker = self._ensure_active()
        if worker.proc.poll() is not None:  # died between evaluations (killed from outside)
            self.stats["lost"] = self.stats.get("lost", 0) + 1
            self._discard_active()
            worker = self._ensure_active()
        timeout = self.options.timeout * (self.options.warmup_factor if worker.fresh else 1.0)
        log_pos = worker.log_size()
        t0 = time.perf_counter()
        try:
            worker.tx.send(("eval", cand, keep_outputs, quantized))
            kind, reply = worker.receive(timeout)
        except OSError:  # the pipe broke under us: the worker is gone
            kind, reply = _DEAD, None
        worker.fresh = False
        self.stats["evaluations"] += 1
        if kind == "reply" and reply[0] == "result":
            return reply[1], reply[2]
        if kind == "reply" and reply[0] == "raise":
            raise RuntimeError(f"oracle runner failed in the isolated worker:\n{reply[1]}")
        if kind == _TIMEOUT:
            worker.dump_stack()
            where = _innermost_frame(worker.log_tail(log_pos))
            self.stats["timeouts"] += 1
            signature = f"timeout after {timeout:g}s" + (f" in {where}" if where else "")
            message = f"{signature} (a hang); the worker was killed and replaced"
        else:
            name, why = _describe_exit(worker.exit_code())
            where = _innermost_frame(worker.log_tail(log_pos))
            self.stats["crashes"] += 1
            signature = name + (f" in {where}" if where else "")
            message = why + (f" in {where}" if where else "") + "; the worker died and was replaced"
        self._discard_active()
        ev = Evaluation(CRASH, error=message, signature=signature, seconds=time.perf_counter() - t0,
                        extra={"isolated": True})
        return cand, ev


_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)', re.M)


def _library_dirs() -> Tuple[str, ...]:
    import sysconfig

    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def _innermost_frame(log: str) -> Optional[str]:
    """``file.py:LINE function`` of the last faulthandler dump: the innermost frame outside the
    standard library, installed packages and the gate itself (the operator's own code), else
    the innermost frame outside the standard library, else the innermost one."""
    starts = [m.start() for m in re.finditer(r"\(most recent call first\):", log)]
    if not starts:
        return None
    end = log.find("\n\n", starts[-1])
    frames = _FRAME.findall(log, starts[-1], end if end > 0 else len(log))
    if not frames:
        return None
    libs = _library_dirs()
    gate_dir = os.path.realpath(str(Path(__file__).resolve().parents[1])) + os.sep
    import sysconfig

    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep

    def real(f: str) -> str:
        return os.path.realpath(f)

    pick = next((fr for fr in frames if not real(fr[0]).startswith(libs + (gate_dir,))), None)
    pick = pick or next((fr for fr in frames if not real(fr[0]).startswith(stdlib)), None) or frames[0]
    return f"{os.path.basename(pick[0])}:{pick[1]} {pick[2]}"


def _describe_exit(rc: Optional[int]) -> Tuple[str, str]:
    if rc is None:
        return "worker lost", "an unknown status"
    if rc < 0:
        try:
            sig = signal.Signals(-rc)
        except ValueError:
            return f"signal {-rc}", f"signal {-rc}"
        text = signal.strsignal(sig) or sig.name
        if sig == signal.SIGKILL:
            text += ", e.g. by the out-of-memory killer"
        return sig.name, f"{sig.name} ({text})"
    return f"exit code {rc}", f"exit code {rc}"


# ---------------------------------------------------------------------------------------
# the worker
# ---------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the gate process dies (no orphan hangs)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover - best effort
            pass


def worker_main(rfd: int, wfd: int) -> int:
    import faulthandler
    import traceback

    _die_with_parent()
    faulthandler.enable(file=sys.stderr, all_threads=False)  # fatal signals: where it crashed
    if hasattr(signal, "SIGUSR1"):  # the parent's "where are you?" before it kills a hang
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)
    rx = Connection(rfd, writable=False)
    tx = Connection(wfd, readable=False)
    runner = None
    while True:
        try:
            msg = rx.recv()
        except (EOFError, OSError):
            return 0
        kind = msg[0]
        if kind == "exit":
            return 0
        if kind == "init":
            info = msg[1]
            for p in reversed(info["sys_path"]):
                if p not in sys.path:
                    sys.path.insert(0, p)
            try:
                from .registry import build_runner

                runner = build_runner(info["spec"], info["variant"])
                env = runner.backend.environment(info["variant"].device)
                tx.send(("ready", {"env": env, "devices": runner.backend.devices(), "pid": os.getpid()}))
            except GateError as exc:
                tx.send(("error", type(exc).__name__, str(exc)))
            except Exception as exc:
                tx.send(("error", "GateError", f"{type(exc).__name__}: {exc}"))
        elif kind == "seed":
            runner.backend.seed(msg[1])
            tx.send(("ok",))
        elif kind == "quantize":
            tx.send(("result", runner.quantize(msg[1])))
        elif kind == "eval":
            _, cand, keep_outputs, quantized = msg
            try:
                q, ev = runner.evaluate(cand, keep_outputs=keep_outputs, quantized=quantized)
            except Exception:
                tx.send(("raise", traceback.format_exc()))
                continue
            tx.send(("result", q, ev))


if __name__ == "__main__":
    sys.exit(worker_main(int(sys.argv[1]), int(sys.argv[2])))
