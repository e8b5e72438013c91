"""Build an operator library's native extension on each side of a pull request.

The config says how (``build:`` in ``.dl-gate.yml``)::

    build: "python setup.py build_ext --inplace"        # a command run in the tree's root
    build: "pip install -e ."                           # the same, kept out of the environment
    build:
      command: "python setup.py build_ext --inplace"
      inputs: ["csrc/**", "setup.py"]                   # what the cache key hashes (default below)
      cache: .dl-gate-cache/builds                      # default: $DL_GATE_BUILD_CACHE, ~/.cache/dl-gate/builds
      timeout: 1800
    build:
      cpp_extension: {name: mylib._C, sources: [csrc/ops.cpp], extra_cflags: [-O2]}

Head is built in the checkout, base in its worktree, each with its own sources: the extension
files a build leaves in the tree (``*.so``, ``*.pyd``) are what the operator library imports.
They are cached under a key that hashes the build recipe, the Python/torch/platform, and the
contents of the build inputs (tracked C/C++/CUDA sources and build files by default), so a side
whose sources did not change is restored, not rebuilt. A failed build raises
:class:`BuildError` naming the compiler's first error line.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..errors import ConfigError, GateError

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl", ".inc")
BUILD_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "CMakeLists.txt", "MANIFEST.in")
EXT_SUFFIXES = (".so", ".pyd", ".dylib")
SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".venv", "venv", "node_modules", ".eggs"}
LOG_TAIL = 100_000  # a kept log: its first and last characters


class BuildError(GateError):
    """The library did not build: ``str()`` is one line naming the first compiler error."""

    def __init__(self, message: str, log: str = "", first_error: str = ""):
        super().__init__(message)
        self.log = log
        self.first_error = first_error


@dataclass
class BuildSpec:
    command: Optional[str] = None
    cpp_extension: Optional[dict] = None
    inputs: List[str] = field(default_factory=list)
    cache: Optional[Path] = None
    timeout: float = 1800.0

    @classmethod
    def from_config(cls, raw, root: Path) -> Optional["BuildSpec"]:
        if raw is None or raw is False:
            return None
        if isinstance(raw, str):
            raw = {"command": raw}
        if not isinstance(raw, dict) or bool(raw.get("command")) == bool(raw.get("cpp_extension")):
            raise ConfigError("build: give a command (string) or a cpp_extension (mapping), not both")
        ext = raw.get("cpp_extension")
        if ext is not None and (not isinstance(ext, dict) or not ext.get("name") or not ext.get("sources")):
            raise ConfigError("build.cpp_extension: needs a name (the module, e.g. mylib._C) and sources")
        cache = raw.get("cache") or os.environ.get("DL_GATE_BUILD_CACHE")
        return cls(command=raw.get("command"), cpp_extension=ext, inputs=list(raw.get("inputs") or []),
                   cache=(root / cache) if cache else None, timeout=float(raw.get("timeout", 1800)))

    @property
    def recipe(self) -> dict:
        return {"command": self.command, "cpp_extension": self.cpp_extension}

    def cache_dir(self) -> Path:
        if self.cache is not None:
            return Path(self.cache)
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "dl-gate" / "builds"


@dataclass
class BuildResult:
    key: str
    cached: bool
    seconds: float
    files: List[str]  # extension files placed in the tree (relative paths)

    def to_dict(self) -> dict:
        return {"key": self.key[:16], "cached": self.cached, "seconds": round(self.seconds, 2), "files": self.files}


# -- inputs and the cache key -----------------------------------------------------------------
def input_files(tree: Path, spec: BuildSpec) -> List[str]:
    """Build inputs of ``tree`` (relative paths): the tracked files the ``inputs`` globs name, by
    default every tracked C/C++/CUDA source and build file (and the cpp_extension sources)."""
    res = subprocess.run(["git", "-C", str(tree), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True)
    if res.returncode == 0:
        files = [f for f in res.stdout.decode(errors="replace").split("\0") if f]
    else:  # not a git tree: walk it
        files = [str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()
                 and not SKIP_DIRS.intersection(p.relative_to(tree).parts)]
    if spec.inputs:
        chosen = [f for f in files if any(fnmatch.fnmatch(f, g) or f.startswith(g.rstrip("*").rstrip("/") + "/")
                                          for g in spec.inputs)]
    else:
        chosen = [f for f in files if f.endswith(SOURCE_SUFFIXES) or Path(f).name in BUILD_FILES]
        chosen += [s for s in (spec.cpp_extension or {}).get("sources", []) if s in files]
    return sorted(set(f for f in chosen if (tree / f).is_file()))


def cache_key(tree: Path, spec: BuildSpec) -> str:
    h = hashlib.sha256()
    env = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine()}
    try:  # the installed torch's version from its metadata: the judging process does not import torch for a key
        from importlib.metadata import version

        env["torch"] = version("torch")
    except Exception:  # pragma: no cover - torch-less libraries
        pass
    h.update(json.dumps({"recipe": spec.recipe, "env": env}, sort_keys=True).encode())
    for rel in input_files(tree, spec):
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256((tree / rel).read_bytes()).digest())
    return h.hexdigest()


# -- errors -----------------------------------------------------------------------------------
_ERROR_LINE = re.compile(r"(?:^|[\s:(])(?:fatal )?error(?:\s+[A-Z]+\d+)?\s*:", re.I)
_LOCATED = re.compile(r"^\S+?(?::\d+(?::\d+)?|\(\d+\)):\s*(?:fatal )?error", re.I)


def first_error(log: str, tree: Optional[Path] = None) -> str:
    """The compiler's first error line in ``log`` (gcc/clang ``file:line:col: error: ...``, nvcc
    ``file(line): error: ...``, MSVC ``error C1234:``), paths made relative to ``tree``; else the
    first line saying error, else the last line."""
    lines = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    pick = next((ln for ln in lines if _LOCATED.search(ln.strip())), None)
    if pick is None:
        pick = next((ln for ln in lines if _ERROR_LINE.search(ln) and not ln.lstrip().startswith(("FAILED:", "ninja:"))),
                    None)
    if pick is None:
        pick = lines[-1] if lines else "no output"
    pick = pick.strip()
    if tree is not None:
        for prefix in {str(tree), str(Path(tree).resolve())}:
            pick = pick.replace(prefix.rstrip("/") + "/", "")
    return pick[:400]


# -- building ---------------------------------------------------------------------------------
def _ext_files(tree: Path) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for f in filenames:
            if f.endswith(EXT_SUFFIXES):
                p = Path(dirpath) / f
                out[str(p.relative_to(tree))] = p.stat().st_mtime_ns
    return out


def _command(spec: BuildSpec, scratch: Path) -> str:
    """The command to run; a ``pip install`` gets a throw-away prefix so that building base
    never replaces the installed library (an editable install builds its extensions in place)."""
    cmd = spec.command or ""
    words = shlex.split(cmd)
    if len(words) >= 2 and (words[0] == "pip" or words[0].startswith("pip3") or words[:3] == ["python", "-m", "pip"]) \
            and "install" in words:
        rest = words[words.index("install") + 1:]
        extra = ["--no-deps", "--no-build-isolation", "--prefix", str(scratch / "prefix")]
        return shlex.join([sys.executable, "-m", "pip", "install", *extra, *rest])
    return cmd


def _run(cmd, tree: Path, timeout: float, shell: bool) -> subprocess.CompletedProcess:
    from .sandbox import worker_env

    # the build runs the PR's setup.py: the allow-list, no credentials; the inherited
    # PYTHONPATH as it is (the gate's root is not the library's)
    env = worker_env(gate_first=False)
    bindir = str(Path(sys.executable).parent)  # `python`/`pip` in the command: the gate's interpreter
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 2))))
    # builds use the gate's environment (torch is there), also pip calls nested in setuptools'
    # develop (pip reads PIP_NO_BUILD_ISOLATION inverted: 0 turns isolation off)
    env.setdefault("PIP_NO_BUILD_ISOLATION", "0")
    try:
        return subprocess.run(cmd, cwd=str(tree), shell=shell, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or "") if isinstance(exc.stdout, str) else ""
        return subprocess.CompletedProcess(cmd, 124, out, f"build timed out after {timeout:.0f}s")


_CPP_EXT_SCRIPT = """
import json, sys
from torch.utils.cpp_extension import load
cfg = json.loads(sys.argv[1])
load(name=cfg["name"], sources=cfg["sources"], build_directory=cfg["build"], extra_cflags=cfg.get("extra_cflags") or None,
     extra_cuda_cflags=cfg.get("extra_cuda_cflags") or None, extra_include_paths=cfg.get("extra_include_paths") or None,
     verbose=True)
"""


def _build_cpp_extension(spec: BuildSpec, tree: Path, scratch: Path) -> tuple:
    ext = dict(spec.cpp_extension or {})
    module = str(ext["name"])
    short = module.rsplit(".", 1)[-1]
    out_dir = scratch / "ext"
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"name": short, "sources": [str(tree / s) for s in ext["sources"]], "build": str(out_dir),
           "extra_cflags": ext.get("extra_cflags"), "extra_cuda_cflags": ext.get("extra_cuda_cflags"),
           "extra_include_paths": [str(tree / p) for p in ext.get("extra_include_paths") or []]}
    res = _run([sys.executable, "-c", _CPP_EXT_SCRIPT, json.dumps(cfg)], tree, spec.timeout, shell=False)
    built = sorted(out_dir.glob(f"{short}*.so")) + sorted(out_dir.glob(f"{short}*.pyd"))
    placed: List[str] = []
    if res.returncode == 0 and built:
        rel = Path(*module.split(".")[:-1]) / built[0].name if "." in module else Path(built[0].name)
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)
        placed.append(str(rel))
    return res, placed


def build_tree(tree: Path, spec: BuildSpec, side: str = "head", say=None) -> BuildResult:
    """Build (or restore from the cache) the extension of ``tree``; raises :class:`BuildError`."""
    say = say or (lambda s: None)
    tree = Path(tree)
    t0 = time.perf_counter()
    key = cache_key(tree, spec)
    entry = spec.cache_dir() / key
    manifest = entry / "files.json"
    if manifest.exists():
        files = json.loads(manifest.read_text())
        for rel in files:
            dst = tree / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(entry / "files" / rel, dst)
        return BuildResult(key, True, time.perf_counter() - t0, files)
    say(f"building {side} ({spec.command or 'cpp_extension ' + str(spec.cpp_extension.get('name'))})")
    scratch = Path(tempfile.mkdtemp(prefix="dl-gate-build-"))
    try:
        if spec.cpp_extension:
            res, files = _build_cpp_extension(spec, tree, scratch)
        else:
            before = _ext_files(tree)
            res = _run(_command(spec, scratch), tree, spec.timeout, shell=True)
            after = _ext_files(tree)
            files = sorted(f for f, m in after.items() if before.get(f) != m)
        full = (res.stdout or "") + "\n" + (res.stderr or "")
        log = full if len(full) <= 2 * LOG_TAIL else full[:LOG_TAIL] + "\n[...]\n" + full[-LOG_TAIL:]
        if res.returncode != 0:
            first = first_error(full, tree)
            raise BuildError(f"build failed on {side} (exit {res.returncode}): {first}", log=log, first_error=first)
        if not files:
            raise BuildError(f"build on {side} produced no extension module (no new *.so/*.pyd in the tree): "
                             f"{first_error(log, tree)}", log=log)
        tmp = spec.cache_dir() / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for rel in files:
            dst = tmp / "files" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / rel, dst)
        (tmp / "files.json").write_text(json.dumps(files))
        try:
            os.replace(tmp, entry)  # atomic: a concurrent build of the same key keeps the first
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return BuildResult(key, False, time.perf_counter() - t0, files)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_log(out: Path, side: str, err: BuildError) -> Optional[Path]:
    """Keep a failed build's log beside the report."""
    if not err.log:
        return None
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"build-{side}.log"
    p.write_text(err.log)
    return p


__all__ = ["BuildSpec", "BuildResult", "BuildError", "build_tree", "cache_key", "input_files", "first_error"]
