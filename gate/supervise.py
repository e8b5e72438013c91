"""The process that sets the gate's exit code never runs the code under test.

``dl-gate run`` is two processes. The **supervisor** (this module, the process the user or the
Action started) parses the arguments, starts the **run** (``python -m gate.cli run ...`` with
``DL_GATE_STATE`` set) in a new session, and waits for it under a wall-clock deadline. The run
imports the operator library and evaluates it (by default in worker processes again, see
:mod:`gate.backends.isolate`); after every progress line it saves its partial report to the state
file, and when it has written ``report.json`` and ``junit.xml`` it saves a final record.

The supervisor's exit code comes from the report the run handed over in its final record, and
only when the run ended the way the run itself said it would (its exit status equals the final
record's, the report has that outcome). Anything else is an ``error`` report written by the supervisor from the last
saved state, whatever the run's exit status was:

* the code under test ended the run's process (``os._exit(0)``, ``sys.exit`` at import, a
  segfault or abort outside a worker, the OOM killer);
* the run passed its deadline (budget + localisation + a stated grace): it is sent SIGTERM (the
  run stops and writes its report), then SIGKILL after :data:`KILL_AFTER` seconds;
* the supervisor itself got SIGTERM or SIGINT (a CI time limit, Ctrl-C): forwarded the same way.

Every process the run started (workers, zygotes, an operator's own children) is killed when the
run is over, before its result is taken: the run's process group first, then every process in
the supervisor's tree (it is a child subreaper, so a process that detached itself with a double
fork and ``setsid`` is re-parented to it) or carrying the run's random :data:`RUN_MARK_ENV`
mark, until none is left (:meth:`Supervisor.kill_descendants`). The files the run wrote are then
checked against the hashes of its final record and written again from it when something changed
them (:func:`changed_files`).

The run's environment is the workers' allow-list (:mod:`gate.backends.sandbox`), and its
relayed output never carries a workflow command to a CI runner (:class:`CommandGuard`).
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from .backends.sandbox import SERVER_ENV, scrub_proc_environ, worker_env

STATE_ENV = "DL_GATE_STATE"
#: seconds the run is given to write its report after SIGTERM before it is killed
KILL_AFTER = 20.0
#: seconds on top of the fuzzing and localisation budgets: interpreter and framework start, the
#: base worktree, the base replay, the report
GRACE = 120.0
#: deadline of a run whose budget is a number of evaluations (no seconds to add up)
EVALS_DEADLINE = 1800.0
#: the bundled example records baselines on its main branch before the gate runs
EXAMPLE_EXTRA = 180.0


# ---------------------------------------------------------------------------------------
# the run's side: save state as it goes
# ---------------------------------------------------------------------------------------
def state_path() -> Optional[Path]:
    p = os.environ.get(STATE_ENV)
    return Path(p) if p else None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def checkpoint(report, line: str) -> None:
    """Save the partial report and the last progress line (the run's side; no-op unsupervised)."""
    path = state_path()
    if path is None:
        return
    try:
        _write_json(path, {"last": line, "report": report.to_dict(), "done": False})
    except (OSError, TypeError, ValueError):  # the state is a help for a crash report, never fatal
        pass


def file_digest(path: Path) -> Optional[str]:
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def finished(report, exit_code: int, files: Optional[dict] = None) -> None:
    """The final record: written after report.json and junit.xml, just before the run exits. It
    holds the report itself and a hash of every file written, so that the supervisor can tell a
    file changed afterwards (by a process the code under test left behind) and write it again."""
    path = state_path()
    if path is None:
        return
    digests = {}
    for p in (files or {}).values():
        p = Path(p)
        digests[p.name] = file_digest(p)
    _write_json(path, {"last": "done", "report": None, "done": True, "exit_code": int(exit_code),
                       "outcome": report.outcome, "final": report.to_dict(), "files": digests})


# ---------------------------------------------------------------------------------------
# the supervisor's side
# ---------------------------------------------------------------------------------------
def deadline_for(budget_total: Optional[float], evals: Optional[int], localise: Optional[float],
                 explicit: Optional[float], example: bool = False) -> tuple:
    """(seconds, how it was made) of the run's wall-clock deadline."""
    if explicit is not None:
        return float(explicit), f"--deadline {explicit:g}s"
    extra = EXAMPLE_EXTRA if example else 0.0
    if evals:
        return EVALS_DEADLINE + extra, f"{EVALS_DEADLINE:g}s for an --evals run" + (
            f" + {extra:g}s for the example's baselines" if extra else "")
    from .config import DEFAULT_BUDGET_TOTAL

    total = float(budget_total if budget_total is not None else DEFAULT_BUDGET_TOTAL)
    loc = float(localise if localise is not None else 60.0)
    text = f"budget {total:g}s + localisation {loc:g}s + grace {GRACE:g}s"
    if extra:
        text += f" + {extra:g}s for the example's baselines"
    return total + loc + GRACE + extra, text


#: every process of a run carries this variable (value: the run's random mark), so that one that
#: left the supervisor's tree (no subreaper) is still found
RUN_MARK_ENV = "DL_GATE_RUN"
PR_SET_CHILD_SUBREAPER = 36


def set_subreaper(on: bool) -> bool:
    """Make this process the one that orphaned descendants are re-parented to (Linux): a
    process the code under test starts and detaches (double fork, ``setsid``) stays in the
    supervisor's tree, where it is found and killed. False where it cannot be set."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _processes() -> dict:
    """pid -> (ppid, state, process group) of every process in /proc."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            table[int(name)] = (int(fields[1]), fields[0], int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _marked(pids, mark: str) -> set:
    needle = f"{RUN_MARK_ENV}={mark}".encode()
    found = set()
    for pid in pids:
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.add(pid)
        except OSError:
            continue
    return found


def descendants(root: int, table: dict, exclude=()) -> set:
    """Every process whose chain of parents leads to ``root`` (not through ``exclude``)."""
    children: dict = {}
    for pid, row in table.items():
        children.setdefault(row[0], []).append(pid)
    out, todo = set(), [c for c in children.get(root, []) if c not in exclude]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def run_env(state: str, env_names: Sequence[str] = ()) -> dict:
    """The run process's environment: the workers' allow-list (it imports the operator library
    to find source lines, and runs it in-process with ``--no-isolate``), the state file, and
    what the run itself reads: the PR's base branch, whether this is CI, git's
    ``safe.directory`` settings (``dl-gate action`` sets them as ``GIT_CONFIG_*``), a zygote
    server (gate.backends.isolate.SERVER_ENV: the run's, never its workers')."""
    run_own = {k: v for k, v in os.environ.items()
               if k in ("GITHUB_BASE_REF", "GITHUB_ACTIONS", SERVER_ENV) or k.startswith("GIT_CONFIG_")}
    return worker_env({**run_own, STATE_ENV: state}, names=list(env_names))


class Supervisor:
    """Start ``argv`` (the run) and wait for it; :meth:`wait` returns what the run left."""

    def __init__(self, argv: List[str], deadline: float, deadline_text: str,
                 say: Callable[[str], None] = lambda s: None, env_names: Sequence[str] = ()):
        self.deadline, self.deadline_text, self.say = deadline, deadline_text, say
        fd, self.state = tempfile.mkstemp(prefix="dl-gate-state-", suffix=".json")
        os.close(fd)
        env = run_env(self.state, env_names)
        env["DL_GATE_DEADLINE_AT"] = f"{time.time() + deadline:.0f}"  # the run's plan line says when it ends
        self.mark = secrets.token_hex(12)
        env[RUN_MARK_ENV] = self.mark
        self.subreaper = set_subreaper(True)
        me = os.getpid()
        # children this process had before the run (a caller's own): never the run's to kill
        self.foreign = {pid for pid, row in _processes().items() if row[0] == me}
        self.survivors = 0
        if sys.stderr.isatty():  # the run's progress display: its stderr is a pipe to this terminal
            env["DL_GATE_TERMINAL"] = "1"
        # what the run may not see, this process's own /proc/PID/environ may not show either
        scrub_proc_environ()
        # on a GitHub runner, the run's relayed output is also fenced: between these two lines
        # the runner processes no workflow command, whatever the escaping missed
        self.fence = secrets.token_hex(16) if os.environ.get("GITHUB_ACTIONS") == "true" else None
        if self.fence:
            _say_raw(f"::stop-commands::{self.fence}")
        self.t0 = time.monotonic()
        # the run's output is relayed through this process's sys.stdout/sys.stderr (what a caller
        # of gate.cli.main captures), as it comes: progress bars end lines with \r
        self.proc = subprocess.Popen([sys.executable, "-m", "gate.cli", *argv], env=env, start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stopped_by: Optional[str] = None
        self.relays = [threading.Thread(target=_relay, args=(pipe, name), daemon=True)
                       for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))]
        for t in self.relays:
            t.start()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, why: str) -> None:
        """SIGTERM (the run writes its report), then SIGKILL if it does not end in time."""
        if self.stopped_by is None:
            self.stopped_by = why
        self.say(f"{why}: stopping the run (SIGTERM; killed after {KILL_AFTER:g}s)")
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=KILL_AFTER)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()

    def wait(self) -> dict:
        def forward(signum, frame):
            name = signal.Signals(signum).name
            self.stop(f"dl-gate got {name}")

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while True:
                left = self.deadline - (time.monotonic() - self.t0)
                try:
                    self.proc.wait(timeout=max(0.05, min(left, 1.0)))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - self.t0 >= self.deadline:
                        self.stop(f"the run passed its deadline of {self.deadline:g}s ({self.deadline_text})")
                        break
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self._signal_group(signal.SIGKILL)  # what the run started and left behind
            self.survivors = self.kill_descendants()  # also what left the run's session
            if self.subreaper:  # the caller's other children are its own business again
                set_subreaper(False)
            for t in self.relays:  # a child that left the session may hold a pipe: do not wait on it
                t.join(timeout=5)
            if self.fence:
                _say_raw(f"::{self.fence}::")
                self.fence = None
        state = {}
        try:
            state = json.loads(Path(self.state).read_text() or "{}")
        except (OSError, ValueError):
            state = {}
        finally:
            try:
                os.unlink(self.state)
            except OSError:
                pass
        return {"returncode": self.proc.returncode, "state": state, "seconds": time.monotonic() - self.t0,
                "stopped_by": self.stopped_by, "survivors": self.survivors}

    def kill_descendants(self, rounds: int = 200) -> int:
        """Kill every process the run left (in this process's tree, re-parented here as the
        subreaper, or carrying the run's mark) and reap those that are this process's children,
        until none is left. Returns how many were found alive outside the run's process group
        (which was killed just before): the ones that detached themselves."""
        me, escaped = os.getpid(), set()
        for _ in range(rounds):
            table = _processes()
            tree = descendants(me, table, exclude=self.foreign | {self.proc.pid})
            tree |= _marked([p for p in table if p != me and p not in self.foreign], self.mark)
            alive = {p for p in tree if table.get(p, (0, "Z", 0))[1] not in ("Z", "X")}
            escaped |= {p for p in alive if table[p][2] != self.proc.pid}
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            zombies = [p for p in tree if table.get(p, (0, "", 0))[0] == me]
            for pid in zombies:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            if not alive and not zombies:
                break
            time.sleep(0.02)
        return len(escaped)


def _say_raw(line: str) -> None:
    """A line of the gate's own (a workflow command) on the runner's log."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


class CommandGuard:
    """The run's output made safe for a CI runner's log: no line of it is a workflow command.

    The GitHub runner reads a line (ended by ``\\n`` or ``\\r``) as a command when, after its
    leading whitespace, it starts with ``::`` (``::error::``, ``::add-mask::``,
    ``::stop-commands::TOKEN``), and in the old form wherever ``##[`` appears in it. Code under
    test prints into the run's output (at import, in an operator run in the run process), so
    such a line is relayed with its leading ``::`` as ``: :`` and every ``##[`` as ``# #[``.
    Text that could still become a command with what comes next (blank so far, one ``:``, a
    trailing ``#``) is held until it cannot."""

    def __init__(self):
        self.pending = ""
        self.line = ""  # what was written of the current line so far

    @staticmethod
    def _escape_line(line: str, start_blank: bool) -> str:
        if start_blank:
            stripped = line.lstrip()
            if stripped.startswith("::"):
                line = line[:len(line) - len(stripped)] + ": :" + stripped[2:]
        return line.replace("##[", "# #[")

    def feed(self, text: str, final: bool = False, idle: bool = False) -> str:
        """What may be written now of ``text`` (appended to what is held); ``idle``: nothing
        followed for a while (a trailing ``#`` goes out, the start of a line still waits);
        ``final``: the end of the output, everything goes out."""
        self.pending += text
        out = []
        while True:
            cut = min((i for i in (self.pending.find("\n"), self.pending.find("\r")) if i >= 0), default=-1)
            if cut < 0:
                break
            seg, end, self.pending = self.pending[:cut], self.pending[cut], self.pending[cut + 1:]
            out.append(self._emit(seg) + end)
            self.line = ""
        if self.pending:
            seg = self.pending
            if not final:
                # hold what the next chunk could still turn into a command
                whole = (self.line + seg).lstrip()
                if not self.line.strip() and whole in ("", ":"):
                    return "".join(out)
                keep = 0 if idle else min(len(seg) - len(seg.rstrip("#")), 2)
                seg, self.pending = (seg[:len(seg) - keep], seg[len(seg) - keep:]) if keep else (seg, "")
            else:
                self.pending = ""
            if seg:
                out.append(self._emit(seg))
        return "".join(out)

    def _emit(self, seg: str) -> str:
        text = self._escape_line(seg, not self.line.strip())
        if self.line.endswith("#") and text.startswith("#[") or self.line.endswith("##") and text.startswith("["):
            text = " " + text  # a ``##[`` split over two writes
        self.line += text
        return text


def _relay(pipe, name: str) -> None:
    import codecs
    import select

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    guard = CommandGuard()
    fd = pipe.fileno()

    def write(text: str) -> None:
        if not text:
            return
        stream = getattr(sys, name)
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # closed (a pipe into `head`): keep draining
            pass

    while True:
        if guard.pending:  # held text goes out once nothing follows it for a moment
            try:
                ready = select.select([fd], [], [], 0.2)[0]
            except (OSError, ValueError):
                ready = [fd]
            if not ready:
                write(guard.feed("", idle=True))
                if not guard.pending:
                    continue
                # else the start of a line: wait for the rest of it, however long
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        write(guard.feed(decoder.decode(chunk)))
    write(guard.feed(decoder.decode(b"", final=True), final=True))
    pipe.close()


def describe_end(returncode: Optional[int]) -> str:
    if returncode is None:
        return "an unknown status"
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
            return f"{sig.name} ({signal.strsignal(sig) or sig.name})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def verdict_of_run(result: dict, out: Path):
    """(report, trusted): the run's own report when it ended as it said it would; otherwise an
    ``error`` report from the last saved state that says how the run ended. A trusted report's
    files are checked with :func:`changed_files` before they are taken as the result."""
    from .errors import EXIT_CODES, Outcome
    from .judge import verdict as V
    from .report.schema import load_report

    state, rc = result["state"], result["returncode"]
    report = None
    if state.get("done"):
        try:
            # the report the run handed over in its final record, not the file on disk (which
            # anything the code under test left running could have rewritten)
            report = V.GateReport.from_dict(state["final"]) if state.get("final") else load_report(out / "report.json")
        except Exception:  # noqa: BLE001 - unreadable or forged: not trusted
            report = None
        if (report is not None and result["stopped_by"] is None and rc == state.get("exit_code")
                and report.outcome == state.get("outcome") and EXIT_CODES.get(Outcome(report.outcome)) == rc
                and (out / "junit.xml").exists()):
            return report, True
    if report is None:
        partial = state.get("report")
        try:
            report = V.GateReport.from_dict(partial) if partial else V.GateReport(outcome="error", reason="")
        except Exception:  # noqa: BLE001 - a half-written partial report: start from nothing
            report = V.GateReport(outcome="error", reason="")
    last = state.get("last")
    if result["stopped_by"] and state.get("done"):  # it stopped and wrote what it had
        why = f"{result['stopped_by']}; the run stopped early: its report holds what was judged by then"
    elif result["stopped_by"]:
        why = f"{result['stopped_by']}; the run did not write its report in time"
    elif state.get("done"):
        why = (f"the run's process ended with {describe_end(rc)} after it had finished "
               f"(it said exit code {state.get('exit_code')}): code under test that outlived the run?")
    else:
        why = (f"the run's process ended with {describe_end(rc)} before writing its report: code under test "
               "ended the process (os._exit, sys.exit at import, a segfault or an abort outside an isolated "
               "worker, the out-of-memory killer)")
    if last and last != "done":
        why += f"; its last step: {last}"
    # a regression judged before the run was stopped or ended stands (exit 1, "localisation
    # incomplete" on its row); with none, the run is an error. Safe to take from an untrusted
    # report: a failing verdict can only turn the check red, and without one it is red anyway
    report.stopped(why)
    if report.outcome != Outcome.REGRESSION.value:
        report.outcome, report.reason = Outcome.ERROR.value, why
    # nothing was judged to the end: like a setup error, this fails the Action's step whatever
    # its fail-on input says (the code under test must not be able to make it green)
    report.env["run_incomplete"] = True
    report.seconds = round(result["seconds"], 2)
    return report, False


def changed_files(result: dict, out: Path) -> List[str]:
    """The files the run listed in its final record that are no longer what it wrote."""
    files = (result.get("state") or {}).get("files") or {}
    return sorted(name for name, digest in files.items() if file_digest(Path(out) / name) != digest)
