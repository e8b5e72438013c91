"""Crash and hang isolation: evaluate candidates in a worker process that may die.

:class:`IsolatedRunner` has the runner interface (``evaluate``, ``backend``, the oracle hooks),
so the engine and :func:`gate.fuzz.fuzz_task` use it unchanged. Each evaluation is sent to a
warm worker (the framework is imported and the oracle's runner built once per worker, not per
evaluation) and must answer within ``timeout`` seconds. When the worker dies (segfault, abort,
the OOM killer) or does not answer in time, the evaluation becomes a CRASH whose signature is
the signal name or ``timeout after Xs`` plus the innermost frame of the operator's own code
that ``faulthandler`` printed (a hung worker is asked for its stack with SIGUSR1 before it is
killed), the worker is replaced, and the search goes on.

Processes. Workers are forked by a **zygote**: one ``python -m gate.backends.isolate --zygote``
process per framework (shared by every isolated runner of this gate process) that imports the
framework once and never runs an operator, then forks a worker on request; the worker's two
pipes are handed over with ``SCM_RIGHTS``. Why not ``multiprocessing``:

* ``fork`` of the gate itself is unsafe once torch/TensorFlow thread pools or CUDA exist; the
  zygote forks from a process that only *imported* the framework (what a DataLoader's workers
  do: neither torch's nor TensorFlow's import starts a thread pool or a runtime);
* ``spawn`` and ``forkserver`` re-import the caller's ``__main__`` in every worker, so a user's
  script without an ``if __name__ == "__main__"`` guard would re-run; our processes start from
  ``-m gate.backends.isolate``;
* the protocol runs on dedicated descriptors, not stdin/stdout, so an operator that prints
  cannot corrupt it; its output goes to a log the parent reads for the crash signature.

A replacement worker is a fork (tens of milliseconds), not an interpreter start plus a
framework import (seconds): that matters when an operator crashes on many inputs. A user
operator's workers are forked from a **library zygote** (:class:`_LibraryZygote`), a fork of the
framework's zygote that has imported the operator's module too, one per import path and
directory (head's checkout, base's worktree), unless that import starts a thread. The zygote
also forks the localisation workers (:func:`spawn_module`: ``python -m gate.localise.worker``
with its own stdio), which would otherwise each start an interpreter and import the framework.
``IsolateOptions(zygote=False)`` starts every worker as a fresh interpreter instead (and is the
fallback where ``fork`` does not exist). The kernel kills the zygote and workers when the gate
process dies (Linux ``PR_SET_PDEATHSIG``). ``bench/isolation_cost.py`` measures throughput
in-process vs isolated and the cost of a crash, side by side.
"""
from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import errors, freeze_imports, tune_gc
from ..errors import GateError
from .ipc import Receiver, Sender, SharedMemoryError
from .sandbox import PER_RUN, SERVER_ENV, worker_env

_TIMEOUT = "timeout"
_DEAD = "dead"
_UNREADABLE = "unreadable"
#: what a zygote imports before it forks: the framework (and numpy.random, which every worker's
#: search imports). TensorFlow through the gate's backend module, which loads Triton first
#: (gate.backends.base.before_tensorflow) and sets its log level; importing TensorFlow (and Keras)
#: starts no thread and builds no runtime (its eager context and thread pools are made on a
#: worker's first operation, after the fork), so its workers are forked warm as torch's are: each
#: imported it anew before (~3.5 s a worker, measured idle on this 2-core machine)
PRELOAD = {"torch": ("torch", "numpy.random"), "tensorflow": ("gate.backends.tf_backend", "numpy.random")}
#: what the zygote imports before it forks the first worker of a gradient variant: what the
#: framework imports on a worker's first backward pass (torch.autograd.grad's first call imports
#: symbolic_shapes, and with it sympy: ~0.3 s of CPU that every gradient worker paid anew, a third
#: of a gradient bed's CPU time; imported once in the zygote, only by runs that take gradients)
PRELOAD_GRAD = {"torch": ("torch.fx.experimental.symbolic_shapes",)}
GRAD_ORACLES = ("grad", "gradcheck")  # the oracles (by name) whose workers run backward passes
#: what a worker calls to build its runner, ``module:function(spec, variant)``: a name, not an
#: import, so that this module knows no oracle (the zygote imports the module once)
RUNNER_FACTORY = "gate.oracles.registry:build_runner"
#: what a zygote (and the suite's zygote server) calls once before it forks: the compiled loops
#: every worker's search and scoring use, loaded once instead of in each worker
WARM_UP = "gate.oracles.registry:warm_kernels"


@dataclass(frozen=True)
class IsolateOptions:
    #: seconds one evaluation may take before it is *suspected* of hanging: the floor of the
    #: limit, which grows with the operator's own measured cost (``hang_factor`` x the median of
    #: its evaluations so far), so that a slow call on a loaded machine is not called a hang
    timeout: float = 10.0
    hang_factor: float = 10.0
    #: a suspected hang is confirmed before it is a crash: the worker is given ``confirm_factor``
    #: x the limit in all, at least twice what it was suspected at (once a hang of the operator is
    #: confirmed, twice); a call that answers within that is a slow evaluation, not a hang
    confirm_factor: float = 3.0
    start_timeout: float = 180.0  # worker start: interpreter, framework import, runner build
    warmup_factor: float = 3.0  # the first evaluation of a fresh worker may compile: allow more
    zygote: bool = True  # fork workers from a warm zygote (False: a fresh interpreter each)
    #: address-space limit of a worker (MiB): an operator that allocates past it gets a
    #: MemoryError in its worker instead of the machine's OOM killer; None: 80% of the memory
    memory_mb: Optional[int] = None
    #: the worker's import path and working directory (default: this process's): the base
    #: replay's workers import the operator library from the base worktree
    sys_path: Optional[Tuple[str, ...]] = None
    cwd: Optional[str] = None

    def to_dict(self) -> dict:
        return {"timeout": self.timeout, "hang_factor": self.hang_factor, "confirm_factor": self.confirm_factor,
                "start_timeout": self.start_timeout, "warmup_factor": self.warmup_factor,
                "zygote": self.zygote, "memory_mb": self.memory_mb,
                "sys_path": list(self.sys_path) if self.sys_path is not None else None, "cwd": self.cwd}

    def memory_limit(self) -> Optional[int]:
        """Bytes a worker may map (the option, else 80% of physical memory; None if unknown)."""
        if self.memory_mb is not None:
            return int(self.memory_mb) * 1024 * 1024
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)
        except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
            return None


def isolate_options(enabled: Optional[bool], timeout: Optional[float] = None,
                    gate_cfg: Optional[dict] = None) -> Optional[IsolateOptions]:
    """Options from a flag and the config's ``gate.isolate`` / ``gate.eval_timeout`` /
    ``gate.eval_memory_mb`` (the flag wins); isolation is on unless turned off (trusted code
    only); ``None`` when evaluations run in-process."""
    g = dict(gate_cfg or {})
    on = enabled if enabled is not None else bool(g.get("isolate", True))
    timeout = timeout if timeout is not None else g.get("eval_timeout")
    if timeout is not None and float(timeout) <= 0:
        raise GateError("the evaluation timeout must be a positive number of seconds")
    if not on:
        return None
    kw: Dict[str, Any] = {}
    if timeout is not None:
        kw["timeout"] = float(timeout)
    if g.get("eval_memory_mb") is not None:
        kw["memory_mb"] = int(g["eval_memory_mb"])
    return IsolateOptions(**kw)


def _child_env() -> Dict[str, str]:
    """The zygote's and the workers' environment: the allow-list of :mod:`gate.backends.sandbox`
    (no credentials), the gate's root first on the import path."""
    return worker_env()


def _new_log() -> str:
    fd, path = tempfile.mkstemp(prefix="dl-gate-worker-", suffix=".log")
    os.close(fd)
    return path


def _decode(status: int) -> int:
    """A ``waitpid`` status as a ``Popen.returncode`` (negative: the signal that killed it)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255


# ---------------------------------------------------------------------------------------
# the zygote: imports the framework once, forks workers
# ---------------------------------------------------------------------------------------
def _wait_polling(proc: Any, timeout: Optional[float]) -> Optional[int]:
    """``Popen.wait`` for a process this one cannot ``waitpid`` (a worker the zygote forked, a
    zygote the server forked): ``proc.poll()`` until it has a return code."""
    deadline = time.perf_counter() + (timeout if timeout is not None else 1e9)
    while proc.poll() is None:
        if time.perf_counter() >= deadline:
            raise subprocess.TimeoutExpired(str(proc.pid), timeout)
        time.sleep(0.005)
    return proc.returncode


class _Served:
    """The ``Popen``-like handle of a zygote forked by a zygote server (not this process's child:
    the server reaps it)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -int(signal.SIGKILL)
            except PermissionError:  # pragma: no cover - a reused pid of another user
                self.returncode = -int(signal.SIGKILL)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        return _wait_polling(self, timeout)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _from_server(preload: Tuple[str, ...], env: Dict[str, str], log: str) -> Optional[Tuple[Connection, _Served]]:
    """A zygote forked for this process by the zygote server :data:`SERVER_ENV` names (``python
    -m gate.backends.isolate --zygote-server PATH``: torch imported once per server, not per gate
    run): it takes this process's working directory and log, and answers only if the server's
    environment is ``env`` (:func:`server_main`); None otherwise, and where no server is named:
    the caller starts its own. A facility for processes that run the gate many times (the test
    suite: tests/conftest.py); the Action never sets it, and workers never see it
    (sandbox.GATE_PRIVATE). Not for a run that must contain its operators: a process detached
    from a served zygote is outside the supervisor's tree and keeps the server's environment
    block (no run mark)."""
    from multiprocessing.reduction import send_handle

    path = server_paths(os.environ.get(SERVER_ENV, "")).get(
        next((fw for fw, mods in PRELOAD.items() if tuple(mods) == tuple(preload)), ""))
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5.0)
        sock.connect(path)
        sock.settimeout(None)
    except OSError:
        sock.close()
        return None
    conn = Connection(sock.detach())
    try:
        conn.send(("attach", env, os.getcwd()))
        with open(log, "ab") as fh:
            send_handle(conn, fh.fileno(), 0)
        if not conn.poll(10.0):
            raise OSError("no answer")
        reply = conn.recv()
    except (EOFError, OSError):
        conn.close()
        return None
    if reply[0] != "attached":  # said where the server was asked for: a developer's setting
        print(f"dl-gate: zygote server {path} not used: {reply[1]}", file=sys.stderr, flush=True)
        conn.close()
        return None
    return conn, _Served(int(reply[1]))


def server_paths(value: str) -> Dict[str, str]:
    """The zygote servers :data:`SERVER_ENV` names, by framework: ``os.pathsep``-separated
    ``framework=path`` entries, a bare path being torch's (``/tmp/zs/torch:tensorflow=/tmp/zs/tf``)."""
    out: Dict[str, str] = {}
    for entry in filter(None, value.split(os.pathsep)):
        fw, eq, path = entry.partition("=")
        if eq and fw in PRELOAD:
            out[fw] = path
        elif not eq:
            out["torch"] = entry
    return out


class _Zygote:
    def __init__(self, preload: Tuple[str, ...], start_timeout: float):
        self.log = _new_log()
        env = _child_env()
        served = _from_server(preload, env, self.log)
        if served is not None:
            self.conn, self.proc = served
        else:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with open(self.log, "ab") as log:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-m", "gate.backends.isolate", "--zygote", str(child.fileno())],
                        pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                    )
            finally:
                child.close()
            self.conn = Connection(parent.detach())
        self.lock = threading.Lock()
        # the framework import runs while the gate goes on (it is answered before the first fork)
        self.start_timeout = start_timeout
        self._preloaded = False
        self._more: set = set()  # modules imported since, on request (preload_more)
        self.conn.send(("preload", list(preload)))

    def _await_preload(self) -> None:
        if self._preloaded:
            return
        with self.lock:
            try:
                if not self.conn.poll(self.start_timeout):
                    raise GateError(f"the isolation zygote did not start within {self.start_timeout:g}s")
                self.conn.recv()
            except (EOFError, OSError) as exc:
                raise GateError(f"the isolation zygote is gone ({type(exc).__name__})") from None
            self._preloaded = True

    def _request(self, msg: tuple, timeout: float, fds: Tuple[int, ...] = ()) -> Any:
        from multiprocessing.reduction import send_handle

        with self.lock:
            try:
                self.conn.send(msg)
                for fd in fds:
                    send_handle(self.conn, fd, self.proc.pid)
                if not self.conn.poll(timeout):
                    raise GateError(f"the isolation zygote did not answer within {timeout:g}s")
                return self.conn.recv()
            except (EOFError, OSError) as exc:
                raise GateError(f"the isolation zygote is gone ({type(exc).__name__})") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def preload_more(self, modules: Tuple[str, ...], timeout: float) -> None:
        """Have the zygote import ``modules`` too (once) before its next fork."""
        todo = tuple(m for m in modules if m not in self._more)
        if not todo:
            return
        self._await_preload()
        self._request(("preload", list(todo)), timeout)
        self._more.update(todo)

    def where(self, module: str, timeout: float) -> Optional[str]:
        """The file the zygote imported ``module`` from, None where it has not imported it (asked
        once a module)."""
        known = self.__dict__.setdefault("_where", {})
        if module not in known:
            self._await_preload()
            known[module] = self._request(("where", module), timeout)[1]
        return known[module]

    def fork(self, rfd: int, wfd: int, timeout: float) -> "_Forked":
        self._await_preload()
        reply = self._request(("fork",), timeout, fds=(rfd, wfd))
        return _Forked(int(reply[1]), self)

    def status(self, pid: int, block: bool) -> Optional[int]:
        reply = self._request(("wait", pid, block), 30.0 if block else 5.0)
        return None if reply[1] is None else _decode(reply[1])

    def _stop(self) -> None:
        """Its connection closed (its loop ends, and its workers with it: PR_SET_PDEATHSIG), the process gone."""
        try:
            self.conn.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass

    def close(self) -> None:
        self._stop()
        if os.path.exists(self.log):
            os.unlink(self.log)


class _Forked:
    """A worker forked by the zygote, with the part of ``Popen``'s interface we use."""

    def __init__(self, pid: int, zygote: _Zygote):
        self.pid = pid
        self.zygote = zygote
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.zygote.alive():
            try:
                self.returncode = self.zygote.status(self.pid, block=False)
            except GateError:
                self.returncode = -int(signal.SIGKILL)
        elif self.returncode is None:
            self.returncode = -int(signal.SIGKILL)  # the zygote died: so did its children
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        return _wait_polling(self, timeout)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Spawned(_Forked):
    """``python -m MODULE`` forked by the zygote (:func:`spawn_module`): ``Popen``'s text-mode
    ``stdin`` and ``stdout`` besides the process interface of :class:`_Forked`."""

    def __init__(self, pid: int, zygote: _Zygote, stdin: Any, stdout: Any):
        super().__init__(pid, zygote)
        self.stdin = stdin
        self.stdout = stdout


def spawn_module(framework: str, module: str, argv: List[str], cwd: str, stderr_fd: int,
                 options: Optional["IsolateOptions"] = None,
                 env: Optional[Dict[str, str]] = None) -> Optional[_Spawned]:
    """``python -m module *argv`` in ``cwd``, forked from the warm zygote of ``framework``
    instead of a fresh interpreter (the framework's import, seconds of CPU, is the zygote's):
    stdin and stdout are pipes to this process, stderr is ``stderr_fd``; its environment is the
    zygote's, the allow-list (:func:`gate.backends.sandbox.worker_env`), with ``env`` set on top
    before the module runs (values read when used: not what the framework read at its import).
    ``None`` where no zygote can serve it (no ``fork``, zygotes off, the zygote did not start or
    answer): the caller starts an interpreter as before."""
    options = options or IsolateOptions()
    if not options.zygote:
        return None
    try:
        z = _zygote(PRELOAD.get(framework, ()), options.start_timeout)
        if z is None:
            return None
        z._await_preload()
    except (GateError, OSError):
        return None
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    try:
        reply = z._request(("spawn", module, list(argv), str(cwd), dict(env or {})), options.start_timeout,
                           fds=(r_in, w_out, stderr_fd))
    except (GateError, OSError):
        os.close(w_in)
        os.close(r_out)
        return None
    finally:
        os.close(r_in)
        os.close(w_out)
    return _Spawned(int(reply[1]), z, os.fdopen(w_in, "w", buffering=1), os.fdopen(r_out, "r"))


#: operators (by name) a hang of which this process has confirmed: later suspicions wait less
_CONFIRMED_HANGS: set = set()
_ZYGOTES: Dict[Tuple[str, ...], _Zygote] = {}


def confirmed_hang(name: str) -> bool:
    """A hang of operator ``name`` has been confirmed by a worker of this process."""
    return name in _CONFIRMED_HANGS
_ZYGOTE_LOCK = threading.Lock()


def prestart(frameworks, options: Optional["IsolateOptions"] = None) -> None:
    """Start the zygotes of ``frameworks`` now, so that their framework import overlaps with the
    gate's own work (selection, planning) instead of delaying the first evaluation."""
    options = options or IsolateOptions()
    if not options.zygote:
        return
    for fw in sorted(set(frameworks)):
        try:
            _zygote(PRELOAD.get(fw, ()), options.start_timeout)
        except (GateError, OSError):  # the first runner will say what is wrong
            pass


def _zygote(preload: Tuple[str, ...], start_timeout: float) -> Optional[_Zygote]:
    """The shared zygote for ``preload`` (started on first use); ``None`` without ``fork``."""
    if not hasattr(os, "fork") or not hasattr(socket, "AF_UNIX"):
        return None
    with _ZYGOTE_LOCK:
        z = _ZYGOTES.get(preload)
        if z is None or not z.alive():
            if z is not None:
                z.close()
            z = _ZYGOTES[preload] = _Zygote(preload, start_timeout)
        return z


class _LibraryZygote(_Zygote):
    """A zygote that has imported an operator library as well as its framework, so that the
    library's import (seconds for a real library: ``import monai.losses`` 4-9 s here) is paid once
    per side of a run instead of by each of a variant's workers (its search, base's contrast
    worker, head's replay, base's replay). Forked by the framework's zygote (its import is
    shared), with the workers' import path and directory (head's checkout, or base's worktree),
    it imports the operators' modules (:meth:`preload_more`) and forks workers as its parent does.

    A library whose import starts a thread (a pool, a CUDA context: fork is unsafe after it), or
    that does not import, crash or hang there, is not served so: its workers import it
    themselves, as before, and report what went wrong with the operator's context."""

    def __init__(self, parent: _Zygote, sys_path: Tuple[str, ...], cwd: Optional[str], start_timeout: float):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            parent._await_preload()
            reply = parent._request(("fork-zygote", list(sys_path), cwd), start_timeout, fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.log = parent.log
        self.conn = Connection(ours.detach())
        self.proc: Any = _Forked(int(reply[1]), parent)
        self.lock = threading.Lock()
        self.start_timeout = start_timeout
        self._preloaded = True
        self._more: set = set()
        self.users = 0  # workers forked by it that are still open
        self.refused: Optional[str] = None  # why it no longer forks (a thread started by an import)

    def preload_more(self, modules: Tuple[str, ...], timeout: float) -> None:
        todo = tuple(m for m in modules if m not in self._more)
        if not todo:
            return
        reply = self._request(("preload", list(todo)), timeout)
        self._more.update(todo)
        if len(reply) > 1 and int(reply[1]) > 1:  # a fork has one thread: the import started others
            self.refused = f"importing {', '.join(todo)} started {int(reply[1]) - 1} thread(s)"

    def close(self) -> None:
        self._stop()  # the log is its parent's: left to it


#: library zygotes by (framework preload, import path, directory); None: that library is not served so
_LIBRARY_ZYGOTES: Dict[Tuple[Any, ...], Optional[_LibraryZygote]] = {}
#: the idle library zygotes kept (a process that runs many gates, the suite, keeps the latest)
LIBRARY_ZYGOTES_KEPT = 4


def _library_module(spec: Any) -> Optional[str]:
    """The module of a user operator's callable (``pkg.mod:Name`` -> ``pkg.mod``), else None."""
    if getattr(spec, "origin", None) != "user" or not isinstance(getattr(spec, "callable", None), str):
        return None
    module = spec.callable.partition(":")[0]
    return module or None


def shadowed(zygote: _Zygote, spec: Any, options: "IsolateOptions") -> Optional[str]:
    """Why ``zygote`` cannot serve ``spec``'s workers, or None: the library's top-level package
    is one the zygote imported with its framework, from another place than the workers' import
    path finds it (a gated checkout of Keras itself: the TensorFlow zygote imports the installed
    ``keras``, and every worker forked from it ran the installed layers on head and on base
    alike, keras-team/keras d863dc8a5b's revert judged on identical outputs). Such workers start
    as fresh interpreters, which import the framework from the checkout."""
    module = _library_module(spec)
    if module is None:
        return None
    top = module.split(".")[0]
    where = zygote.where(top, options.start_timeout)
    if where is None:
        return None
    import importlib.machinery

    cwd = options.cwd if options.cwd is not None else os.getcwd()
    path = [os.path.join(cwd, p) if not os.path.isabs(p) else p
            for p in (options.sys_path if options.sys_path is not None else sys.path)]
    found = importlib.machinery.PathFinder.find_spec(top, path)
    mine = getattr(found, "origin", None) if found is not None else None
    if mine in (None, "namespace") and found is not None and found.submodule_search_locations:
        mine = os.path.join(list(found.submodule_search_locations)[0], "__init__.py")
    if mine is None or os.path.realpath(mine) == os.path.realpath(where):
        return None
    return f"{top} is imported from {os.path.dirname(mine)}, not the framework's copy ({os.path.dirname(where)})"


def _library_zygote(parent: _Zygote, spec: Any, preload: Tuple[str, ...], options: "IsolateOptions",
                    more: Tuple[str, ...] = ()) -> Optional[_LibraryZygote]:
    """The zygote that has imported ``spec``'s library (and ``more``) for workers with
    ``options``' import path and directory, started on first use; None where it cannot serve
    them (it was refused)."""
    module = _library_module(spec)
    if module is None:
        return None
    sys_path = tuple(options.sys_path if options.sys_path is not None else sys.path)
    # the directory too: a relative entry of the path ("", ".") is another library in another
    # repository (two runs in one process, the suite: one repository's `lib` must not serve another's)
    cwd = options.cwd if options.cwd is not None else os.getcwd()
    key = (preload, sys_path, cwd)
    with _ZYGOTE_LOCK:
        if key in _LIBRARY_ZYGOTES and _LIBRARY_ZYGOTES[key] is None:
            return None
        z = _LIBRARY_ZYGOTES.get(key)
        if z is not None and not z.alive():
            z.close()
            z = None
        try:
            if z is None:
                idle = [k for k, v in _LIBRARY_ZYGOTES.items() if v is not None and v.users == 0]
                for k in idle[:max(0, len(idle) - LIBRARY_ZYGOTES_KEPT + 1)]:
                    _LIBRARY_ZYGOTES.pop(k).close()
                z = _LibraryZygote(parent, sys_path, cwd, options.start_timeout)
                _LIBRARY_ZYGOTES[key] = z
            z.preload_more((module, *more), options.start_timeout)
        except GateError:  # it crashed or hung importing: the workers import it and say so
            if z is not None:
                z.close()
            _LIBRARY_ZYGOTES[key] = None
            return None
        if z.refused:
            z.close()
            _LIBRARY_ZYGOTES[key] = None
            return None
        return z


@atexit.register
def _close_zygotes() -> None:
    for lz in list(_LIBRARY_ZYGOTES.values()):
        if lz is not None:
            lz.close()
    _LIBRARY_ZYGOTES.clear()
    for z in list(_ZYGOTES.values()):
        z.close()
    _ZYGOTES.clear()


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
    """One worker process (forked by the zygote, or a fresh interpreter), its pipes and log."""

    def __init__(self, spec: Any, variant: Any, options: IsolateOptions, factory: str = RUNNER_FACTORY):
        zygote = _zygote(PRELOAD.get(spec.framework, ()), options.start_timeout) if options.zygote else None
        if zygote is not None and shadowed(zygote, spec, options):
            zygote = None  # a fresh interpreter imports the framework from the library's checkout
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        self.own_log = zygote is None
        self.library: Optional[_LibraryZygote] = None
        try:
            if zygote is not None:
                self.log = zygote.log  # forked workers write where the zygote writes
                grad = PRELOAD_GRAD.get(spec.framework, ()) if getattr(variant, "oracle", None) in GRAD_ORACLES else ()
                if grad:
                    zygote.preload_more(grad, options.start_timeout)
                library = _library_zygote(zygote, spec, PRELOAD.get(spec.framework, ()), options, grad)
                self.proc: Any = (library or zygote).fork(p2c_r, c2p_w, options.start_timeout)
                if library is not None:
                    self.library = library
                    library.users += 1
            else:
                self.log = _new_log()
                with open(self.log, "ab") as log:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-m", "gate.backends.isolate", str(p2c_r), str(c2p_w)],
                        pass_fds=(p2c_r, c2p_w), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_child_env(),
                    )
        except BaseException:
            os.close(p2c_w)
            os.close(c2p_r)
            raise
        finally:
            os.close(p2c_r)
            os.close(c2p_w)
        self.log_start = self.log_size()  # what the log held before this worker wrote to it
        self.tx = Sender(Connection(p2c_w, readable=False))  # large arrays through shared memory (ipc)
        self.rx = Receiver(Connection(c2p_r, writable=False))
        self.init(spec, variant, options, factory)

    def init(self, spec: Any, variant: Any, options: IsolateOptions, factory: str = RUNNER_FACTORY) -> None:
        """Ask the worker to build the runner of ``spec`` under ``variant``: sent now, answered
        (:meth:`ready`) once it has built it (the framework imported by its zygote, or by itself
        when started as a fresh interpreter)."""
        self.fresh = True
        self.env: Optional[dict] = None
        self.flush_subnormals = False
        self.devices: list = []
        self.tx.send(("init", {"sys_path": list(options.sys_path if options.sys_path is not None else sys.path),
                               "spec": spec, "variant": variant, "memory": options.memory_limit(),
                               "cwd": options.cwd, "factory": factory}))

    def receive(self, timeout: float) -> Tuple[str, Any]:
        try:
            if not self.rx.poll(timeout):
                return _TIMEOUT, None
            return "reply", self.rx.recv()
        except SharedMemoryError as exc:  # the reply arrived, its arrays could not be read
            return _UNREADABLE, str(exc)
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
            self.flush_subnormals = bool(reply[1].get("flush_subnormals"))
            return self.env
        if kind == "reply" and reply[0] == "error":
            cls = getattr(errors, reply[1], GateError)
            if not (isinstance(cls, type) and issubclass(cls, GateError)):
                cls = GateError
            self.kill()
            raise cls(reply[2])
        detail = self.log_tail(self.log_start).strip()[-500:]
        code = self.exit_code() if kind == _DEAD else None
        self.kill()
        how = f"{kind}, {_describe_exit(code)[1]}" if code is not None else kind
        # one line: the log's last line is what the worker said last (a traceback's exception)
        last = detail.splitlines()[-1].strip() if detail else ""
        raise GateError(f"isolated worker for {what} did not start ({how})" + (f": {last}" if last else ""))

    def call(self, msg: tuple, timeout: float) -> Any:
        self.tx.send(msg)
        kind, reply = self.receive(timeout)
        if kind != "reply":
            raise GateError(f"isolated worker stopped answering ({kind})")
        return reply

    def gone(self) -> bool:
        """Dead already: its end of the pipe is closed, so ours reads EOF without waiting (a
        local check, no round trip)."""
        try:
            return self.rx.poll(0)
        except (EOFError, OSError):
            return True

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
        self.proc.send_signal(signal.SIGUSR1)
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
        if self.library is not None:
            self.library.users -= 1
            self.library = None
        if self.own_log and os.path.exists(self.log):
            os.unlink(self.log)


class IsolatedRunner:
    """The runner of ``variant.oracle`` for ``spec``, living in a worker process."""

    def __init__(self, spec: Any, variant: Any, options: IsolateOptions = IsolateOptions(), *,
                 hooks: Tuple[Any, Optional[str], Dict[str, Any]], crash: Callable[..., Any],
                 factory: str = RUNNER_FACTORY):
        """``hooks``: the oracle's (candidate spec, guidance, extra mutators), answered by the
        caller from data; ``crash(error=, signature=, seconds=, extra=)``: the caller's
        evaluation of a worker that died or hung; ``factory``: the worker's runner builder."""
        self.spec = spec
        self.variant = variant
        self.options = options
        self.factory = factory
        self.crash = crash
        self.search_spec, self.guidance, self.extra_mutators = hooks
        self.backend = _RemoteBackend(self)
        self.env: Dict[str, Any] = {}
        self.devices: list = [variant.device]
        self.stats = {"evaluations": 0, "starts": 0, "crashes": 0, "timeouts": 0, "lost": 0, "slow": 0}
        self._costs: list = []  # seconds of this runner's answered evaluations (the last 64)
        self._hang_confirmed = False  # a suspected hang of this operator has been confirmed once
        self._warmed = False  # whether a worker of this runner has had its warm-up evaluation
        self._seed: Optional[int] = None
        self._active: Optional[_Worker] = None
        self.figures = "all"  # what the worker's runner measures (gate.oracles.runner.VariantRunner.figures)
        self._ensure_active()  # fails here, in the caller, if the runner cannot be built

    @property
    def what(self) -> str:
        return f"{self.spec.name}[{self.variant.key}]"

    # -- worker lifecycle ----------------------------------------------------------------
    def _ensure_active(self) -> _Worker:
        if self._active is None:
            self.stats["starts"] += 1
            worker = _Worker(self.spec, self.variant, self.options, self.factory)
            try:
                self.env = worker.ready(self.options.start_timeout, self.what)
                self.devices = worker.devices or self.devices
            except BaseException:
                worker.close()
                raise
            self._active = worker
            if self._seed is not None:
                worker.call(("seed", self._seed), self.options.start_timeout)
        return self._active

    def _discard_active(self, kill: bool = False) -> None:
        """Close the worker (``kill``: at once, for one that hung or died: no polite exit)."""
        if self._active is not None:
            if kill:
                self._active.kill()
            self._active.close()
            self._active = None

    def close(self) -> None:
        """Done with this runner: its worker goes (the next runner's is forked warm)."""
        self._discard_active()

    def __enter__(self) -> "IsolatedRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self._discard_active()
        except Exception:
            pass

    def typical_cost(self) -> Optional[float]:
        """Median seconds of this runner's answered evaluations (None before the first)."""
        if not self._costs:
            return None
        c = sorted(self._costs)
        return c[len(c) // 2]

    def hang_limit(self) -> float:
        """Seconds after which an evaluation is suspected of hanging: the configured floor, or
        ``hang_factor`` x the operator's own median call when that is longer."""
        typical = self.typical_cost()
        return max(self.options.timeout, self.options.hang_factor * typical) if typical else self.options.timeout

    # -- the runner interface ------------------------------------------------------------
    def seed(self, seed: int) -> None:
        self._seed = seed
        if self._active is not None:
            self._active.call(("seed", seed), self.options.start_timeout)

    def quantize(self, cand: Any) -> Any:
        """The candidate as the worker's runner quantises it (no operator call)."""
        worker = self._ensure_active()
        try:
            reply = worker.call(("quantize", cand), self.options.start_timeout)
        except (GateError, OSError):
            self._discard_active()
            return cand
        return reply[1] if reply[0] == "result" else cand

    def evaluate(self, cand: Any, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Any, Any]:
        worker = self._ensure_active()
        if worker.gone():  # died between evaluations (killed from outside)
            self.stats["lost"] += 1
            self._discard_active()
            worker = self._ensure_active()
        # only the runner's first worker gets the warm-up allowance: a replacement (after a crash
        # or a hang) is forked from the warm zygote, and a hanging input must not cost 3x again
        warm = worker.fresh and not self._warmed
        limit = self.hang_limit()
        timeout = limit * (self.options.warmup_factor if warm else 1.0)
        self._warmed = True
        log_pos = worker.log_size()
        t0 = time.perf_counter()
        try:
            worker.tx.send(("eval", cand, keep_outputs, quantized, self.figures))
            kind, reply = worker.receive(timeout)
            if kind == _TIMEOUT and self.options.confirm_factor > 1:
                # suspected: the same call is given longer before it is called a hang (a loaded
                # machine slows every call; a hang does not answer at any limit); once a hang of
                # this operator is confirmed (in any of its variants), twice the limit will do
                known = self._hang_confirmed or self.spec.name in _CONFIRMED_HANGS
                total = timeout * 2.0 if known else max(timeout * 2.0, limit * self.options.confirm_factor)
                kind, reply = worker.receive(total - timeout)
                if kind == _TIMEOUT:
                    self._hang_confirmed = True
                    _CONFIRMED_HANGS.add(self.spec.name)
                elif kind == "reply":
                    self.stats["slow"] += 1
        except OSError:  # the pipe broke under us: the worker is gone
            kind, reply = _DEAD, None
        if kind == "reply":  # a warm-up's cost too: an upper estimate, never a reason to suspect sooner
            self._costs.append(time.perf_counter() - t0)
            del self._costs[:-64]
        worker.fresh = False
        self.stats["evaluations"] += 1
        if kind == "reply" and reply[0] == "result":
            return reply[1], reply[2]
        if kind == "reply" and reply[0] == "raise":
            raise RuntimeError(f"oracle runner failed in the isolated worker:\n{reply[1]}")
        if kind == _UNREADABLE or (kind == "reply" and reply[0] == "lost"):
            # the input or the result could not pass through shared memory (a memory limit): as
            # an unpicklable-for-memory message through the pipe was, a crash of this evaluation,
            # said as what it is
            where = "the worker's result" if kind == _UNREADABLE else "the input"
            signature = f"{where} could not pass between the gate and the worker"
            self.stats["crashes"] += 1
            self._discard_active(kill=True)
            return cand, self.crash(error=f"{signature}: {reply if kind == _UNREADABLE else reply[1]}",
                                    signature=signature, seconds=time.perf_counter() - t0,
                                    extra={"isolated": True})
        if kind == _TIMEOUT:
            worker.dump_stack()
            where = _innermost_frame(worker.log_tail(log_pos))
            self.stats["timeouts"] += 1
            signature = f"timeout after {timeout:.3g}s" + (f" in {where}" if where else "")
            typical = self.typical_cost()
            basis = (f"the limit {limit:.3g}s: max({self.options.timeout:g}s, {self.options.hang_factor:g} x its "
                     f"median call {typical:.3g}s)" if typical is not None else
                     f"the limit {limit:.3g}s, no call of it answered yet")
            allowance = (f" x{self.options.warmup_factor:g} for a worker's first evaluation (it may compile)"
                         if warm else "")
            waited = time.perf_counter() - t0
            message = (f"{signature} (a hang: {basis}{allowance}; no answer after {waited:.3g}s in all); "
                       "the worker was killed and replaced")
        else:
            name, why = _describe_exit(worker.exit_code())
            where = _innermost_frame(worker.log_tail(log_pos))
            self.stats["crashes"] += 1
            signature = name + (f" in {where}" if where else "")
            message = why + (f" in {where}" if where else "") + "; the worker died and was replaced"
        self._discard_active(kill=True)
        ev = self.crash(error=message, signature=signature, seconds=time.perf_counter() - t0,
                        extra={"isolated": True})
        return cand, ev


@dataclass(frozen=True)
class _FrameworkOnly:
    """What a facts worker is built for: a framework, no operator."""
    framework: str
    name: str = "backend facts"


class _Facts:
    def __init__(self, spec: Any, variant: Any):
        from . import get_backend

        self.backend = get_backend(spec.framework)


def facts_runner(spec: Any, variant: Any) -> _Facts:
    """The worker-side "runner" of :func:`backend_facts`: the backend alone, no operator imported."""
    return _Facts(spec, variant)


def backend_facts(framework: str, options: IsolateOptions) -> Dict[str, Any]:
    """``{"devices": [...], "env": {device: environment}, "flush_subnormals": bool}`` of
    ``framework`` as a worker sees it (forked from the warm zygote: no interpreter start), so
    that the judging process need not import the framework to key its baselines."""
    from ..plan import Variant

    def ask(device: str) -> _Worker:
        w = _Worker(_FrameworkOnly(framework), Variant("float32", device), options, factory=FACTS_FACTORY)
        try:
            w.ready(options.start_timeout, f"{framework} on {device}")
        except BaseException:
            w.close()
            raise
        return w

    w = ask("cpu")
    try:
        facts = {"devices": list(w.devices or ["cpu"]), "env": {"cpu": dict(w.env or {})},
                 "flush_subnormals": w.flush_subnormals}
    finally:
        w.close()
    for device in facts["devices"]:
        if device != "cpu":
            w = ask(device)
            try:
                facts["env"][device] = dict(w.env or {})
            finally:
                w.close()
    return facts


FACTS_FACTORY = "gate.backends.isolate:facts_runner"


@dataclass(frozen=True)
class _ImportProbe:
    """What an import-probe worker is built for: callables to import, no operator to run."""
    framework: str
    callables: Tuple[str, ...]
    name: str = "import probe"


class _ImportBackend:
    """The probe's answer rides in the ready reply's environment (plain values only)."""

    def __init__(self, framework: str, answers: Dict[str, Optional[str]]):
        from . import get_backend

        self._real = get_backend(framework)
        self._answers = answers
        self.flush_subnormals = False

    def environment(self, device: str) -> dict:
        import json

        return {"imports": json.dumps(self._answers)}

    def devices(self) -> list:
        return ["cpu"]


def import_answers(names) -> Dict[str, Optional[str]]:
    """Import each ``module:attr`` of ``names`` in this process (a worker's, or the probe's
    separate process without isolation): name -> None, or the error its import raised."""
    import importlib

    answers: Dict[str, Optional[str]] = {}
    for name in names:
        mod, _, attr = name.partition(":")
        if not attr:
            mod, _, attr = name.rpartition(".")
        try:
            obj = importlib.import_module(mod)
            for a in [a for a in attr.split(".") if a]:
                obj = getattr(obj, a)
            answers[name] = None
        except BaseException as exc:  # noqa: BLE001 - the import's own words are the answer
            answers[name] = (type(exc).__name__ + ": " + " ".join(str(exc).split()))[:300]
    return answers


class _ImportRunner:
    def __init__(self, spec: Any, variant: Any):
        self.backend = _ImportBackend(spec.framework, import_answers(spec.callables))


def import_runner(spec: Any, variant: Any) -> _ImportRunner:
    return _ImportRunner(spec, variant)


def import_errors(framework: str, callables, options: IsolateOptions) -> Dict[str, Optional[str]]:
    """Import each of ``callables`` (``module:attr``) in a worker forked from the warm zygote
    (the framework already imported there: no interpreter start) with the workers' import path:
    name -> None, or the error its import raised. A probe that ends its worker (``os._exit`` at
    import) answers for every name with how it ended."""
    import json

    from ..plan import Variant

    names = tuple(callables)
    w = _Worker(_ImportProbe(framework, names), Variant("float32", "cpu"), options, factory=IMPORT_FACTORY)
    try:
        env = w.ready(options.start_timeout, f"importing {len(names)} operator(s)")
        return dict(json.loads(env.get("imports") or "{}"))
    except GateError as exc:
        return {n: str(exc)[:300] for n in names}
    finally:
        w.close()


IMPORT_FACTORY = "gate.backends.isolate:import_runner"

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
# the worker and the zygote (run as ``python -m gate.backends.isolate``)
# ---------------------------------------------------------------------------------------
def _os_threads() -> int:
    """This process's threads as the kernel counts them (a library's own thread pools too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # pragma: no cover - not Linux
        return threading.active_count()


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the gate process dies (no orphan hangs)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover - best effort
            pass


def _limit_memory(limit: Optional[int]) -> None:
    """The worker's address space: an allocation past it fails in the operator (MemoryError)."""
    if not limit:
        return
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX, or not allowed
        pass


def _resolve(path: str) -> Callable[..., Any]:
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def worker_main(rfd: int, wfd: int) -> int:
    import faulthandler
    import traceback

    _die_with_parent()
    faulthandler.enable(file=sys.stderr, all_threads=False)  # fatal signals: where it crashed
    if hasattr(signal, "SIGUSR1"):  # the parent's "where are you?" before it kills a hang
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)
    rx = Receiver(Connection(rfd, writable=False))
    tx = Sender(Connection(wfd, readable=False))
    runner = None
    while True:
        try:
            msg = rx.recv()
        except SharedMemoryError as exc:  # the request arrived, its arrays could not be read
            tx.send(("lost", str(exc)))
            continue
        except (EOFError, OSError):
            return 0
        kind = msg[0]
        if kind == "exit":
            return 0
        if kind == "init":
            info = msg[1]
            # the parent's import path, in the parent's order (the user's library first)
            sys.path[:] = list(info["sys_path"]) + [p for p in sys.path if p not in info["sys_path"]]
            _limit_memory(info.get("memory"))
            if info.get("cwd"):
                os.chdir(info["cwd"])
            try:
                runner = _resolve(info.get("factory") or RUNNER_FACTORY)(info["spec"], info["variant"])
                # plain values: a framework's own types (torch's TorchVersion, a str subclass)
                # would import the framework in the gate when unpickled
                env = {str(k): v if isinstance(v, (bool, int, float, type(None))) else str(v)
                       for k, v in runner.backend.environment(info["variant"].device).items()}
                tx.send(("ready", {"env": env, "devices": [str(d) for d in runner.backend.devices()], "pid": os.getpid(),
                                   "flush_subnormals": bool(getattr(runner.backend, "flush_subnormals", False))}))
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
            _, cand, keep_outputs, quantized, figures = msg
            if hasattr(runner, "figures"):  # a runner that measures every figure has none to choose
                runner.figures = figures
            try:
                q, ev = runner.evaluate(cand, keep_outputs=keep_outputs, quantized=quantized)
            except Exception:
                tx.send(("raise", traceback.format_exc()))
                continue
            tx.send(("result", q, ev))


def _spawned_main(module: str, argv: List[str], cwd: str, fds: List[int]) -> int:
    """The child of a ``spawn`` request: becomes ``python -m module *argv`` run in ``cwd``
    with ``fds`` as its stdin, stdout and stderr (what :func:`spawn_module` asked for)."""
    import runpy

    _die_with_parent()
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    # ``-m`` puts the working directory first on the import path: the zygote's, here; the
    # module's own (a base worktree) must take its place, not follow it
    if sys.path and sys.path[0] == os.getcwd():
        sys.path[0] = os.path.abspath(cwd)
    os.chdir(cwd)
    sys.argv = [module, *argv]
    code: Any = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


#: the environment variables each framework reads, by the module that reads them
_FRAMEWORK_VARS = {"tensorflow": ("TF_", "XLA_"), "absl": ("ABSL_",), "triton": ("TRITON_",)}


def server_main(path: str, framework: str = "torch") -> int:
    """A zygote server (:data:`SERVER_ENV`): imports ``framework`` (torch, or TensorFlow: ~6 s
    of CPU a zygote here) and what its workers import, listens
    on ``path``, and forks a zygote for each process that connects. The forked zygote answers
    only a client whose workers' environment is the server's own but for the per-run variables
    (gate.backends.sandbox.PER_RUN), those of frameworks it has not imported, and those its own
    imports set (TensorFlow sets ``ABSL_MIN_LOG_LEVEL`` as it loads: a client that imported it
    too has it, one that did not has not, and the server's import is done either way) (else it
    says so and exits),
    takes the client's working directory and log, and runs :func:`zygote_main` on the
    connection: it exits when the client closes it or dies, and its workers with it."""
    import importlib
    from multiprocessing.reduction import recv_handle

    _die_with_parent()
    before = dict(os.environ)
    for mod in (*PRELOAD[framework], *PRELOAD_GRAD.get(framework, ()), RUNNER_FACTORY.partition(":")[0]):
        importlib.import_module(mod)
    _warm_up()
    freeze_imports()
    start_env, start_cwd = dict(os.environ), os.getcwd()
    set_by_import = frozenset(k for k in set(before) | set(start_env) if before.get(k) != start_env.get(k))
    # the variables of a framework the server has not imported are read where its workers import
    # it, after they take the client's environment: a client may differ in them (a test process
    # that imported TensorFlow has ABSL_MIN_LOG_LEVEL set; a Triton bed, TRITON_INTERPRET)
    unread = tuple(p for mod, prefixes in _FRAMEWORK_VARS.items() if mod not in sys.modules for p in prefixes)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its zygotes are reaped by the kernel
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)
    while True:
        sock, _ = listener.accept()
        pid = os.fork()
        if pid:
            sock.close()
            continue
        code = 1
        try:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote waits for its workers itself
            conn = Connection(sock.detach())
            _, env, cwd = conn.recv()
            log = recv_handle(conn)
            diff = sorted(k for k in set(env) | set(start_env) if env.get(k) != start_env.get(k)
                          and k not in PER_RUN and k not in set_by_import and not k.startswith(unread))
            if diff:
                conn.send(("refused", f"another environment ({', '.join(diff[:5])})"))
                os._exit(0)
            for fd in (1, 2):
                os.dup2(log, fd)
            os.close(log)
            if sys.path and sys.path[0] == start_cwd:  # as ``-m`` run in the client's directory
                sys.path[0] = os.path.abspath(cwd)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)  # the run's own values of PER_RUN
            conn.send(("attached", os.getpid()))
            code = zygote_main(conn)
        finally:
            os._exit(code)


_WARMED: List[bool] = []


def _warm_up() -> None:
    """:data:`WARM_UP`, once per process."""
    if not _WARMED:
        _WARMED.append(True)
        _resolve(WARM_UP)()


#: a library zygote imports with one thread for each pool a library loads then: a BLAS that a
#: library's own dependency brings (scipy's OpenBLAS starts its pool as it loads), or torch's
#: OpenMP pool started by an operation at import; the pools are left as they are for the
#: workers (an OpenMP pool in use before a fork hangs the child's first parallel region)
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMEXPR_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1", "BLIS_NUM_THREADS": "1"}


def _import_with_one_thread(mod: str) -> None:
    """``import mod`` in a library zygote without starting a thread pool: a newly loaded BLAS
    reads its thread count from the environment as it loads, torch's pool is set to one thread
    (a worker sets its own count); the environment is restored after."""
    import importlib

    saved = {k: os.environ.get(k) for k in _ONE_THREAD}
    os.environ.update(_ONE_THREAD)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        if torch is not None and threads != 1:
            torch.set_num_threads(1)
        importlib.import_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if torch is not None and threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def zygote_main(fd: "int | Connection", library: bool = False) -> int:
    """Import the framework(s) once, then fork a worker per request (never run an operator).
    ``library``: a library zygote (:class:`_LibraryZygote`), which imports with one thread."""
    import faulthandler
    import importlib
    from multiprocessing.reduction import recv_handle

    _die_with_parent()
    faulthandler.enable(file=sys.stderr, all_threads=False)
    conn = fd if isinstance(fd, Connection) else Connection(fd)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if msg[0] == "preload":
            for mod in msg[1]:
                try:
                    if library:
                        _import_with_one_thread(mod)
                    else:
                        importlib.import_module(mod)
                except Exception:  # the worker will report it, with the operator's context
                    pass
            importlib.import_module(RUNNER_FACTORY.partition(":")[0])  # the gate's runners, imported once too
            _warm_up()
            freeze_imports()
            conn.send(("ok", _os_threads()))
        elif msg[0] == "fork-zygote":  # a library zygote (_LibraryZygote): this one's imports, then the library's
            _, sys_path, cwd = msg
            sock = recv_handle(conn)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    conn.close()
                    sys.path[:] = list(sys_path) + [p for p in sys.path if p not in sys_path]
                    if cwd:
                        os.chdir(cwd)
                    code = zygote_main(Connection(sock), library=True)
                finally:
                    os._exit(code)
            os.close(sock)
            conn.send(("forked", pid))
        elif msg[0] == "fork":
            rfd, wfd = recv_handle(conn), recv_handle(conn)
            pid = os.fork()
            if pid == 0:  # the worker
                code = 1
                try:
                    conn.close()
                    code = worker_main(rfd, wfd)
                finally:
                    os._exit(code)
            os.close(rfd)
            os.close(wfd)
            conn.send(("forked", pid))
        elif msg[0] == "spawn":  # a gate module run as a process of its own (spawn_module)
            _, module, argv, cwd, env = msg
            fds = [recv_handle(conn) for _ in range(3)]
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    conn.close()
                    os.environ.update(env)
                    code = _spawned_main(module, argv, cwd, fds)
                finally:
                    os._exit(code)
            for f in fds:
                os.close(f)
            conn.send(("forked", pid))
        elif msg[0] == "where":  # the file of a module this zygote has imported (None: not imported)
            mod = sys.modules.get(msg[1])
            conn.send(("where", getattr(mod, "__file__", None) if mod is not None else None))
        elif msg[0] == "wait":
            _, pid, block = msg
            try:
                got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                got, status = pid, 9  # already reaped: report it as killed
            conn.send(("status", status if got else None))


if __name__ == "__main__":
    tune_gc()
    if sys.argv[1] == "--zygote":
        sys.exit(zygote_main(int(sys.argv[2])))
    if sys.argv[1] == "--zygote-server":
        sys.exit(server_main(*sys.argv[2:4]))
    sys.exit(worker_main(int(sys.argv[1]), int(sys.argv[2])))
