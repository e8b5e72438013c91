"""Finding a repository's operator package and its public callables.

The AST says what each module *defines* (public top-level functions and classes, and functions
decorated with ``torch.library.custom_op``), without running anything; importing the modules in
a child process (:mod:`gate.init.worker`) then says what each one *is* (function, ``nn.Module``,
Keras ``Layer``, ``autograd.Function``, custom op) and its signature. Names alone never decide."""
from __future__ import annotations

import ast
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import SetupError

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover - 3.10
    tomllib = None  # type: ignore[assignment]

SKIP_DIRS = {"tests", "test", "testing", "docs", "doc", "examples", "example", "benchmarks", "bench", "scripts",
             "build", "dist", "site-packages", "node_modules", "baselines", "dl-gate-out"}


@dataclass
class Package:
    name: str  # import name of the top-level package (or a sub-package)
    root: Path  # the folder on sys.path that holds it (repository root or src/)
    python_path: str  # that folder relative to the repository root ("." or "src")
    dependencies: List[str] = field(default_factory=list)

    def files(self) -> List[Path]:
        """Its Python files: the package folder's, or the one module file (``--package model.py``)."""
        base = self.root / Path(*self.name.split("."))
        if not base.is_dir() and base.with_suffix(".py").is_file():
            return [base.with_suffix(".py")]
        return sorted(base.rglob("*.py"))


def _project_meta(repo: Path) -> Tuple[Optional[str], List[str]]:
    name, deps = None, []
    pp = repo / "pyproject.toml"
    if pp.is_file() and tomllib is not None:
        try:
            data = tomllib.loads(pp.read_text())
            proj = data.get("project") or {}
            name = proj.get("name")
            deps = list(proj.get("dependencies") or [])
        except Exception:
            pass
    req = repo / "requirements.txt"
    if req.is_file():
        for line in req.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-"):
                deps.append(line)
    if name is None and (repo / "setup.py").is_file():
        m = re.search(r"name\s*=\s*['\"]([A-Za-z0-9_.\-]+)['\"]", (repo / "setup.py").read_text(errors="replace"))
        if m:
            name = m.group(1)
    return name, deps


def find_package(repo: Path, package: Optional[str] = None) -> Package:
    """The operator package of ``repo``: ``package`` if given (``pkg`` or ``pkg.sub``), else the
    project's declared name, else the one top-level package outside tests/docs/examples."""
    repo = repo.resolve()
    declared, deps = _project_meta(repo)
    roots = [(repo / "src", "src"), (repo, ".")]
    candidates: List[Tuple[str, Path, str]] = []
    # namespace packages (PEP 420: a folder without __init__.py holding packages, deel-lip's
    # deel/lip): taken where no regular package is there
    namespaced: List[Tuple[str, Path, str]] = []
    for root, rel in roots:
        if not root.is_dir():
            continue
        for child in sorted(root.iterdir()):
            if not child.is_dir() or child.name in SKIP_DIRS or child.name.startswith((".", "_")) \
                    or not child.name.isidentifier():
                continue
            if (child / "__init__.py").is_file():
                candidates.append((child.name, root, rel))
                continue
            for sub in sorted(child.iterdir()):
                if sub.is_dir() and (sub / "__init__.py").is_file() and sub.name not in SKIP_DIRS \
                        and sub.name.isidentifier() and not sub.name.startswith((".", "_")):
                    namespaced.append((f"{child.name}.{sub.name}", root, rel))
    if package and package.endswith(".py"):  # one module file: model.py, src/lib/layers.py
        return _module_file(repo, package, deps)
    if package:
        top = package.split(".")[0]
        for name, root, rel in candidates + [(n.split(".")[0], r, rl) for n, r, rl in namespaced]:
            if name == top:
                where = root / Path(*package.split("."))
                if not where.is_dir() and not where.with_suffix(".py").is_file():
                    raise SetupError(f"--package {package}: no folder {where} nor module {where.with_suffix('.py')}")
                return Package(package, root, rel, deps)
        raise SetupError(f"--package {package}: no package folder {top}/ (with __init__.py) at the repository root "
                         "or under src/")
    if not candidates:
        candidates = namespaced
    if not candidates:
        raise SetupError(f"no Python package (a folder with __init__.py) at {repo} or {repo / 'src'}: "
                         "run dl-gate init at the repository root, or pass --package NAME")
    if declared:
        norm = declared.replace("-", "_").lower()
        for name, root, rel in candidates:
            if name.lower().replace(".", "_") in (norm, norm.replace("pytorch_", "").replace("torch_", "")):
                return Package(name, root, rel, deps)
    if len(candidates) == 1:
        name, root, rel = candidates[0]
        return Package(name, root, rel, deps)
    raise SetupError(f"several packages here ({', '.join(c[0] for c in candidates)}): pass --package NAME")


def _module_file(repo: Path, package: str, deps: List[str]) -> Package:
    """``--package path/to/module.py``: the module, imported as its folders' package path allows
    (the folders above it with an ``__init__.py`` are its package; the first without is put on
    the import path)."""
    f = (repo / package).resolve()
    if not f.is_file():
        raise SetupError(f"--package {package}: no such file under {repo}")
    try:
        f.relative_to(repo)
    except ValueError:
        raise SetupError(f"--package {package}: the file is outside the repository {repo}") from None
    parts = [f.stem]
    root = f.parent
    while root != repo and (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    rel = root.relative_to(repo).as_posix() or "."
    return Package(".".join(parts), root, rel, deps)


def _decorator_name(d: ast.expr) -> str:
    if isinstance(d, ast.Call):
        d = d.func
    parts = []
    while isinstance(d, ast.Attribute):
        parts.append(d.attr)
        d = d.value
    if isinstance(d, ast.Name):
        parts.append(d.id)
    return ".".join(reversed(parts))


@dataclass
class Symbol:
    module: str
    name: str
    file: str  # relative to the repository root
    line: int
    ast_kind: str  # function | class | custom_op


def scan(pkg: Package, repo: Path, named: Sequence[str] = ()) -> Tuple[Dict[str, List[Symbol]], List[str]]:
    """Public top-level definitions per module of ``pkg`` (AST only), and files that do not parse.
    A private module's (``_geometric_mean.py``) public definitions count where a public module
    re-exports them (``from ._geometric_mean import GeometricMean`` in the package's
    ``__init__``), under that module's name: SimplexLab/TorchJD defines every aggregator and
    scalarizer so, and zero config said "defines no public function or class". ``named``
    (``dl-gate init --ops``): definitions asked for by name are taken even when private
    (``_normalize_tensor``, ``pkg.mod._f``, or anything in a private module named in full)."""
    named = set(named)
    out: Dict[str, List[Symbol]] = {}
    bad: List[str] = []
    parsed: Dict[str, Tuple[Path, ast.Module, bool]] = {}  # module -> (file, tree, private)
    for f in pkg.files():
        rel_parts = f.relative_to(pkg.root).with_suffix("").parts
        if any(p in SKIP_DIRS or p.startswith(".") for p in rel_parts[:-1]):
            continue
        if rel_parts[-1].startswith("test_") or rel_parts[-1].endswith("_test") or rel_parts[-1] == "conftest":
            continue  # the library's tests: they call the operators, they are not operators
        mod = ".".join(rel_parts[:-1] if rel_parts[-1] == "__init__" else rel_parts)
        private = any(p.startswith("_") and p != "__init__" for p in rel_parts[len(pkg.name.split(".")):]) \
            and not any(n.startswith(mod + ".") for n in named)
        try:
            tree = ast.parse(f.read_text(encoding="utf-8", errors="replace"), filename=str(f))
        except SyntaxError:
            bad.append(str(f.relative_to(repo)))
            continue
        parsed[mod] = (f, tree, private)
    exports = _reexports(parsed)
    for mod, (f, tree, private) in parsed.items():
        exported = _all_names(tree)
        syms = []
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            asked = node.name in named or f"{mod}.{node.name}" in named
            if not asked and (node.name.startswith("_") or (exported is not None and node.name not in exported)):
                continue
            home = mod
            if private and not asked:
                home = exports.get((mod, node.name))
                if home is None:
                    continue  # private and not re-exported: reached only through what calls it
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            if kind == "function" and any(_decorator_name(d).endswith(("custom_op", "triton_op"))
                                          for d in node.decorator_list):
                kind = "custom_op"
            if kind == "function" and any(_decorator_name(d) in ("property", "overload", "typing.overload")
                                          for d in node.decorator_list):
                continue
            sym = Symbol(home, node.name, str(f.relative_to(repo)), node.lineno, kind)
            if any(s.module == home and s.name == node.name for s in out.get(home, ())):
                continue
            out.setdefault(home, []).append(sym)
    return out, bad


def _all_names(tree: ast.Module) -> Optional[set]:
    """The module's ``__all__`` when it is a literal list (what narrows what is public)."""
    exported = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                exported = set(ast.literal_eval(node.value))
            except Exception:
                exported = None
    return exported


def _reexports(parsed: Dict[str, Tuple[Path, ast.Module, bool]]) -> Dict[Tuple[str, str], str]:
    """(private module, name) -> the public module that re-exports it (``from ._mod import
    Name``, relative or absolute, or ``from ._mod import *``), the shallowest where several do;
    a re-export of a re-export (a private ``_impl/__init__`` importing from ``_impl/_x``) is
    followed to the public module at the end of the chain."""
    direct: Dict[Tuple[str, str], List[str]] = {}
    for mod, (f, tree, private) in parsed.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        public_names = _all_names(tree)
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module
            if src not in parsed:
                continue
            for alias in node.names:
                if alias.name == "*":
                    names = [n.name for n in parsed[src][1].body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                             and not n.name.startswith("_")]
                    star = _all_names(parsed[src][1])
                    names = [n for n in names if star is None or n in star]
                else:
                    if (alias.asname or alias.name).startswith("_") or alias.asname not in (None, alias.name):
                        continue  # renamed or private: not the definition's public name
                    if public_names is not None and alias.name not in public_names:
                        continue
                    names = [alias.name]
                for n in names:
                    direct.setdefault((src, n), []).append(mod)
    out: Dict[Tuple[str, str], str] = {}
    for key in direct:
        seen, todo, homes = set(), [key[0]], []
        while todo:  # follow the chain of re-exports to public modules
            cur = todo.pop()
            for m in direct.get((cur, key[1]), ()):
                if m in seen:
                    continue
                seen.add(m)
                if parsed[m][2]:
                    todo.append(m)
                else:
                    homes.append(m)
        if homes:
            out[key] = min(homes, key=lambda m: (m.count("."), m))
    return out


def default_tests(repo: Path, pkg: Package) -> Optional[str]:
    """The library's test command: pytest on tests/ (or test/), else on the package when its
    test modules live inside it; a test module that cannot be collected (one that downloads a
    vocabulary at import, with no network: keras-cv) does not stop the others from running; a
    deprecation the installed framework announces does not fail them either where the library's
    own configuration turns warnings into errors (geoopt's ``filterwarnings = ["error"]``: every
    test module failed to collect on torch's torch.jit.script deprecation, and nothing was
    recorded). The tests run to record calls, not to judge the library."""
    run = ("pytest -q -p no:cacheprovider --continue-on-collection-errors -W ignore::DeprecationWarning "
           "-W ignore::FutureWarning")
    for d in ("tests", "test"):
        if (repo / d).is_dir():
            return f"{run} {d}"
    base = pkg.root / Path(*pkg.name.split("."))
    if base.is_dir() and (any(base.rglob("test_*.py")) or any(base.rglob("*_test.py"))):
        return f"{run} {base.relative_to(repo)}"
    return None


def uses_framework(pkg: Package) -> str:
    """``tensorflow`` when the package imports TensorFlow/Keras and not torch, else ``torch``."""
    tf = torch = False
    for f in pkg.files():
        text = f.read_text(encoding="utf-8", errors="replace")
        torch = torch or bool(re.search(r"^\s*(import|from)\s+torch\b", text, re.M))
        tf = tf or bool(re.search(r"^\s*(import|from)\s+(tensorflow|keras)\b", text, re.M))
    return "tensorflow" if tf and not torch else "torch"


# ---------------------------------------------------------------------------------------
# the child process
# ---------------------------------------------------------------------------------------
def _gate_root() -> str:
    return str(Path(__file__).resolve().parents[2])


#: variables a user's ``--env`` may set that the framework reads when it is imported: a worker
#: that needs one starts an interpreter of its own instead of being forked from the warm zygote
_COMMON_IMPORT_TIME = ("OMP_", "MKL_", "KMP_", "CUDA_", "LD_", "PYTHON")
_IMPORT_TIME = {"torch": ("TORCH_", "PYTORCH_", *_COMMON_IMPORT_TIME),
                "tensorflow": ("TF_", "XLA_", "ABSL_", "KERAS_", *_COMMON_IMPORT_TIME)}


def _forked_worker(framework: str, path: Path, cwd: Path, env: Dict[str, str], env_extra, err):
    """``python -m gate.init.worker`` forked from the gate's warm zygote of ``framework`` (torch or
    TensorFlow imported once for init's three workers: ~2 s of CPU each for torch, ~3.5 s for
    TensorFlow here), in the worker's environment: the zygote's allow-list with the worker's own
    values on top (its import path is the request's ``sys_path``, which the worker puts first
    itself); None where it cannot be (an ``--env`` value the framework reads at its import, no
    zygote)."""
    if framework not in _IMPORT_TIME or any(k.startswith(_IMPORT_TIME[framework]) for k in (env_extra or {})):
        return None
    from ..backends.isolate import spawn_module

    overlay = {k: v for k, v in env.items() if k != "PYTHONPATH" and os.environ.get(k) != v}
    proc = spawn_module(framework, "gate.init.worker", [str(path)], str(cwd), err.fileno(), env=overlay)
    if proc is not None:
        proc.stdin.close()
    return proc


def run_worker(job: str, items: Sequence[Any], key, req: dict, *, cwd: Path, sys_path: Sequence[str],
               item_timeout: float, start_timeout: float = 180.0, progress=None,
               env_extra: Optional[Dict[str, str]] = None, framework: str = "") -> Dict[str, dict]:
    """Run ``gate.init.worker`` on ``items`` (``req[job_key]`` built by ``key``); answers by item
    key. A worker that dies or stops answering costs the item it was on (answered with
    ``{"failed": why}``); a new worker goes on with the items after it."""
    answers: Dict[str, dict] = {}
    pending = list(items)
    while pending:
        with tempfile.TemporaryDirectory(prefix="dl-gate-init-") as tmp:
            body = dict(req, job=job, cwd=str(cwd), sys_path=list(sys_path))
            if job == "classify":
                body["modules"] = {key(it): it_names for it, it_names in ((i, req["names"][key(i)]) for i in pending)}
            else:
                body["ops"] = list(pending)
            path = Path(tmp) / "request.json"
            path.write_text(json.dumps(body, default=str))
            from ..backends.sandbox import worker_env

            # the allow-list (no credentials): the library's folders, then the gate's root
            env = worker_env(path_front=[*sys_path, _gate_root()], gate_first=False)
            env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
            env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")  # probing is a CPU job
            env.update(env_extra or {})  # what the library needs to import or run (init --env)
            err_path = Path(tmp) / "stderr.log"
            with open(err_path, "w") as err:
                proc = _forked_worker(framework, path, cwd, env, env_extra, err)
                if proc is None:
                    proc = subprocess.Popen([sys.executable, "-m", "gate.init.worker", str(path)], cwd=str(cwd), env=env,
                                            stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
                lines: "queue.Queue[Optional[str]]" = queue.Queue()

                def reader():
                    for line in proc.stdout:  # type: ignore[union-attr]
                        lines.put(line)
                    lines.put(None)

                threading.Thread(target=reader, daemon=True).start()
                first = True
                while True:
                    try:
                        line = lines.get(timeout=start_timeout + item_timeout if first else item_timeout)
                    except queue.Empty:
                        line, why = None, "hung"
                    else:
                        why = "died"
                    if line is None:
                        break
                    first = False
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    if msg.get("done"):
                        pending = []
                        break
                    k = msg.get("module") if job == "classify" else msg.get("op")
                    if job == "classify":
                        answers.setdefault(k, {"rows": []})
                        answers[k]["rows"].append(msg)
                        if "error" in msg:
                            answers[k]["error"] = msg
                    else:
                        answers[k] = msg
                        if progress:
                            progress(msg)
                    done_keys = set(answers)
                    pending = [i for i in pending if key(i) not in done_keys or job == "classify" and
                               len(answers[key(i)]["rows"]) < len(req["names"][key(i)]) and "error" not in answers[key(i)]]
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, 9)
                    except OSError:
                        proc.kill()  # forked by the zygote: no session of its own
                proc.wait()
            if pending:  # the worker died or hung on the first pending item
                culprit = pending.pop(0)
                tail = err_path.read_text(errors="replace").strip().splitlines()[-3:] if err_path.exists() else []
                what = ("stopped answering" if why == "hung" else f"died (exit {proc.returncode})")
                answers.setdefault(key(culprit), {}).update(failed=f"the child process {what}" +
                                                             (f": {tail[-1][:200]}" if tail else ""))
    return answers
