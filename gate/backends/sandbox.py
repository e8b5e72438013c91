"""The environment of every process that imports or runs the code under test.

A CI job's environment holds credentials (``GITHUB_TOKEN``, the Action's ``INPUT_TOKEN``,
``ACTIONS_RUNTIME_TOKEN``, a workflow's ``secrets.*`` put in ``env:``) and the runner's command
files (``GITHUB_ENV``, ``GITHUB_OUTPUT``, ``GITHUB_PATH``: a line appended there changes later
steps). A pull request's operator is code from the PR: it gets an **allow-list**, never a copy
of the job's environment (issue 27):

* paths, locale, user, temporary directory, time zone, the virtual environment, ``PYTHONPATH``
  (with the gate's own root first), the interpreter's settings (``PYTHONHASHSEED`` …);
* thread settings (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``DL_GATE_THREADS``) and the ``DL_GATE_*`` variables the gate reads in its workers;
* the frameworks' own variables (``TF_*``, ``ABSL_*``, ``TRITON_*``, ``TORCH_*``, ``PYTORCH_*``,
  ``CUDA_*``, ``XLA_*``, ``XDG_CACHE_HOME`` …) and a build's compiler (``CC``, ``CXX``, flags);
* the names the config lists under ``env:`` (:func:`allow`); where the config gives a value
  (``env: {TEST_DEVICE: cpu}``, what ``dl-gate init --env`` was given), the workers get it
  when the job's environment does not set the name (the gate's own process never does: its
  ``git`` and compiler runs see the job's environment only).

Whatever the lists say, a name that looks like a credential (:func:`denied`) is never passed,
and the config may not name one (a one-line error at load, :func:`check_names`).

The variables also live in the memory of the gate's own processes, where ``/proc/PID/environ``
shows them to any process of the same user: :func:`scrub_proc_environ` overwrites the values of
the denied names there (Linux), once the gate has read what it needs.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

#: passed when set, by exact name
ALLOWED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TMPDIR", "TEMP", "TMP", "TZ", "TERM",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
    "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONUTF8", "PYTHONIOENCODING",
    "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONWARNINGS", "PYTHONFAULTHANDLER",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "XDG_CACHE_HOME", "MPLBACKEND", "MPLCONFIGDIR",
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "MAX_JOBS", "NVCC_FLAGS",
    # "is this CI?" (the gate's own progress display asks), never the runner's files or tokens
    "CI",
})
#: passed when set, by prefix (each name still checked by :func:`denied`)
ALLOWED_PREFIXES = ("LC_", "DL_GATE_", "TF_", "ABSL_", "TRITON_", "TORCH_", "PYTORCH_", "CUDA_", "CUDNN_",
                    "CUBLAS_", "NVIDIA_", "XLA_", "KMP_", "MKL_", "OMP_", "OPENBLAS_", "ONEDNN_", "DNNL_")
#: the gate's own variables that stay with the gate: the supervisor's state file (a worker that
#: could find it could write the run's final record)
#: a zygote server's socket (gate.backends.isolate.server_main): the gate's processes use it,
#: their workers never see it
SERVER_ENV = "DL_GATE_ZYGOTE_SERVER"
GATE_PRIVATE = frozenset({"DL_GATE_STATE", SERVER_ENV})
#: the gate's variables that each run sets anew for its processes (its deadline, its mark, its
#: terminal, its quiet output) and that are read when used, never at an import: a zygote forked
#: from a server started in another run's environment takes them from its client
PER_RUN = frozenset({"DL_GATE_DEADLINE_AT", "DL_GATE_RUN", "DL_GATE_TERMINAL", "DL_GATE_QUIET"})

_DENY_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE_KEY", "API_KEY", "ACCESS_KEY")
_DENY_PREFIXES = ("INPUT_", "ACTIONS_")
#: the runner's command files and credentials: a process that can write GITHUB_ENV sets the
#: environment of every later step
_DENY_EXACT = frozenset({"GITHUB_TOKEN", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_OUTPUT", "GITHUB_STATE",
                         "GITHUB_STEP_SUMMARY", "ACTIONS_RUNTIME_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
                         "ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_CACHE_URL", "ACTIONS_RUNTIME_URL"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: names the config's ``env:`` adds (set by :func:`allow`, from ``Config.activate``)
_CONFIG_NAMES: List[str] = []
_CONFIG_VALUES: Dict[str, str] = {}


def denied(name: str) -> bool:
    """True for a name that is never handed to the code under test."""
    up = name.upper()
    return (up in _DENY_EXACT or up.startswith(_DENY_PREFIXES) or any(w in up for w in _DENY_WORDS))


def check_names(names: Iterable[str]) -> Optional[str]:
    """The reason the config's ``env:`` list is refused (None: accepted)."""
    for n in names:
        if not isinstance(n, str) or not _NAME.match(n):
            return f"{n!r} is not an environment variable name"
        if denied(n):
            return (f"{n} is never passed to the code under test (names with TOKEN, SECRET, PASSWORD, "
                    "CREDENTIAL, API_KEY, ACCESS_KEY, INPUT_*, ACTIONS_*, GITHUB_TOKEN and the runner's "
                    "GITHUB_ENV/GITHUB_OUTPUT/GITHUB_PATH files are credentials or runner channels)")
    return None


def env_names(env) -> List[str]:
    """The names of a config's ``env:``: a list of names, or a mapping of names to values
    (``None``: no value of its own, the job's)."""
    if isinstance(env, Mapping):
        return [str(k) for k in env]
    return list(env or [])


def env_values(env) -> Dict[str, str]:
    """The values a config's ``env:`` mapping gives (numbers and booleans as YAML wrote them)."""
    if not isinstance(env, Mapping):
        return {}
    out = {}
    for k, v in env.items():
        if v is None:
            continue
        out[str(k)] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def unset_names(env, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Names of ``env:`` that neither this environment nor the config gives a value."""
    environ = os.environ if environ is None else environ
    given = env_values(env)
    return [n for n in env_names(env) if n not in environ and n not in given]


def config_values() -> Dict[str, str]:
    """The values the active config's ``env:`` gives (what the workers get where the job sets
    none): a repro script sets them too, so that it runs the operator as the gate did."""
    return dict(_CONFIG_VALUES)


def allow(names) -> None:
    """Pass the config's ``env:`` (names, or names with values) to the workers this process
    starts from now on."""
    values = env_values(names)
    names = env_names(names)
    reason = check_names(names)
    if reason is not None:  # parse_config refused it already; a second line of defence
        from ..errors import ConfigError

        raise ConfigError(f"env: {reason}")
    _CONFIG_NAMES[:] = names
    _CONFIG_VALUES.clear()
    _CONFIG_VALUES.update(values)


def allowed(name: str, extra_names: Sequence[str] = ()) -> bool:
    if denied(name) or name in GATE_PRIVATE:
        return False
    return (name in ALLOWED or name.startswith(ALLOWED_PREFIXES) or name in _CONFIG_NAMES
            or name in extra_names)


def gate_root() -> str:
    """The directory holding the ``gate`` package (first on a worker's import path)."""
    return str(Path(__file__).resolve().parents[2])


def worker_env(extra: Optional[Mapping[str, str]] = None, *, path_front: Sequence[str] = (),
               names: Sequence[str] = (), gate_first: bool = True,
               source: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a process that imports or runs the code under test.

    ``source`` (default ``os.environ``) filtered through the allow-list (plus ``names``);
    ``PYTHONPATH`` is ``path_front``, then the gate's root (``gate_first``), then the inherited
    one; ``extra`` is set on top (the caller's own values, e.g. the state file of the run) and
    is not filtered, except that a denied name in it is still dropped."""
    src = os.environ if source is None else source
    env = {k: v for k, v in src.items() if allowed(k, names)}
    for k, v in _CONFIG_VALUES.items():  # the config's values, where the job sets none
        if k not in env and allowed(k, names):
            env[k] = v
    parts = [str(p) for p in path_front] + ([gate_root()] if gate_first else [])
    if src.get("PYTHONPATH"):
        parts.append(src["PYTHONPATH"])
    if parts:  # each entry once (a process of the gate started by another inherits its gate root)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for part in parts for p in part.split(os.pathsep)))
    for k, v in (extra or {}).items():
        if not denied(k):
            env[k] = v
    return env


def scrub_proc_environ() -> int:
    """Overwrite, in this process's initial environment block (what ``/proc/self/environ`` and
    so any process of the same user reads), the values of the denied names with ``*``. Python's
    ``os.environ`` keeps its copy (the Action still publishes with its token). Returns how many
    values were overwritten (0 where this is not Linux or the block cannot be found)."""
    try:
        import ctypes

        stat = Path("/proc/self/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        # man 5 proc: fields 50/51 (env_start, env_end); ``fields`` starts at field 3
        start, end = int(fields[50 - 3]), int(fields[51 - 3])
        if not 0 < start < end or end - start > (1 << 24):
            return 0
        block = ctypes.string_at(start, end - start)
        if block != Path("/proc/self/environ").read_bytes()[:end - start]:
            return 0  # not the block the kernel shows: leave it alone
    except (OSError, ValueError, IndexError, ImportError):
        return 0
    done, pos = 0, 0
    for entry in block.split(b"\0"):
        eq = entry.find(b"=")
        if eq > 0:
            name = entry[:eq].decode("latin-1")
            vlen = len(entry) - eq - 1
            if denied(name) and vlen:
                ctypes.memset(start + pos + eq + 1, ord("*"), vlen)
                done += 1
        pos += len(entry) + 1
    return done
