"""``dl-gate init``: from an operator library to a working gate, with no hand-written spec.

The stages, each its own module:

1. :mod:`gate.init.discover` — the package (``--package``, the project's declared name, or
   the one package at the root or under ``src/``) and its public definitions (AST), then what
   each one is and its signature (imported in a child process, :mod:`gate.init.worker`);
2. harvest — the library's own tests run with every discovered operator wrapped
   (:func:`gate.search.harvest.run_harvest`), so each call they make is recorded;
3. :mod:`gate.init.infer` — a spec from those calls (shapes → dims, values → domains and
   parameter choices), else small probe shapes of a few ranks;
4. probing and validation in the child process — the first candidate spec that runs with the
   gate's own runner, then once at every variant the gate would plan (each dtype, the
   non-contiguous layout, the gradient): what fails is dropped or turned off, and said so;
5. :mod:`gate.init.yamlio` — a commented ``.dl-gate.yml`` (validated against the schema), merged
   into an existing one without touching the user's rows; :mod:`gate.init.workflows` — the PR
   gate and baseline-refresh workflows; the harvested calls stored as seeds.
"""
from __future__ import annotations

import collections
import datetime
import inspect
import os
import re
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError, SetupError
from .discover import Symbol, default_tests, find_package, run_worker, scan, uses_framework
from .infer import (Operator, constructed, from_records, hinted_options, other_construction, probe_specs, widen,
                    widened_options)

CONFIG = ".dl-gate.yml"
LOW = ("float16", "bfloat16", "float32")


@dataclass
class InitReport:
    package: str = ""
    config: str = ""
    found: List[Tuple[str, str, str]] = field(default_factory=list)  # (name, from, dtypes/notes)
    left_out: List[Tuple[str, str]] = field(default_factory=list)  # (name, why)
    added: List[str] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)
    removed: List[str] = field(default_factory=list)
    workflows: List[str] = field(default_factory=list)
    action: str = ""  # the ``uses:`` the workflows name (OWNER/REPO@SHA, or @TAG when it could not be resolved)
    seeds: int = 0
    harvest: str = ""  # what the test run did
    tested: List[str] = field(default_factory=list)  # operators the tests were recorded calling
    callables: Dict[str, str] = field(default_factory=dict)  # operator name -> module:qualname (of every candidate)
    checked: List[str] = field(default_factory=list)  # rows run once as read back from the written file
    uncalled: List[str] = field(default_factory=list)  # methods left out because no test calls them
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def left_out_table(self) -> List[Tuple[str, str]]:
        """``left_out`` as init prints it: the methods of one class that no test calls on one row
        (a manifold library has a dozen classes of ~15 methods each: a row per class, not 180)."""
        uncalled = set(self.uncalled)
        rows: List[Tuple[str, Optional[str]]] = []
        by_class: Dict[str, List[str]] = {}
        for name, why in self.left_out:
            if name not in uncalled:
                rows.append((name, why))
                continue
            owner, meth = name.rsplit(".", 1)
            if owner not in by_class:
                by_class[owner] = []
                rows.append((owner, None))
            by_class[owner].append(meth)
        out = []
        for name, why in rows:
            if why is not None:
                out.append((name, why))
                continue
            meths = by_class[name]
            out.append((f"{name}.{{{', '.join(meths)}}}" if len(meths) > 1 else f"{name}.{meths[0]}",
                        f"{'methods' if len(meths) > 1 else 'a method'} of {name.rsplit('.', 1)[-1]} that no test "
                        f"calls (--ops {name}.{meths[0]} probes one with small tensors)"))
        return out


class _SignatureOnly:
    """Stands in for a callable when seeds are bound to specs: its signature, no code."""

    def __init__(self, params: Sequence[dict]):
        ps = []
        for p in params:
            kind = getattr(inspect.Parameter, p["kind"])
            default = p["default"] if p["has_default"] and not isinstance(p["default"], dict) else inspect.Parameter.empty
            if p["has_default"] and default is inspect.Parameter.empty:
                default = None
            ps.append(inspect.Parameter(p["name"], kind, default=default))
        try:
            self.__signature__ = inspect.Signature(ps)
        except ValueError:
            self.__signature__ = inspect.Signature([])

    def __call__(self, *a, **k):  # pragma: no cover - never called
        raise RuntimeError("signature only")


def _op_name(sym: Symbol, pkg: str, taken: Dict[str, int]) -> str:
    top = pkg.split(".")[0]
    short = f"{top}.{sym.name}"
    return short if taken.get(sym.name, 0) <= 1 else f"{sym.module}.{sym.name}"


def _harvest(ops: Sequence[Operator], command: str, repo: Path, sys_path: Sequence[str], timeout: float,
             log, extra_env: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, list], str]:
    from types import SimpleNamespace

    from ..search.harvest import load_budget, load_records, run_harvest

    argv = shlex.split(command)
    if argv and argv[0] in ("pytest", "py.test"):
        argv = [sys.executable, "-m", "pytest"] + argv[1:]
    argv = ["timeout", "-s", "INT", "-k", "30", str(int(timeout))] + argv
    # a class's constructor is recorded too: the arguments the tests build it with
    targets = [SimpleNamespace(name=o.name, callable=o.harvest_target, construct_of=o.class_path) for o in ops]
    with tempfile.TemporaryDirectory(prefix="dl-gate-init-harvest-") as tmp:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(list(sys_path) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update(extra_env or {})
        log(f"running the library's tests to record how they call its operators: {command}")
        t0 = time.monotonic()
        with open(Path(tmp) / "out.log", "w") as out:
            code = _run_quiet(lambda: run_harvest(argv, targets, Path(tmp), cwd=repo, python_path=(),
                                                  max_calls=64, env=env, budget_s=_test_budget(timeout)), out)
        records = load_records(Path(tmp))
        budget = load_budget(Path(tmp))
        text = (Path(tmp) / "out.log").read_text(errors="replace")
        tail = _last_words(text)
        stopped_at = _collection_stop(text) if "--continue-on-collection-errors" not in command else None
    by: Dict[str, list] = {}
    for r in records:
        if not r.source.startswith("error: "):
            by.setdefault(r.op, []).append(r)
    # a class's constructions are recorded once, under the first of its operators the recorder
    # wrapped __init__ for: each method of the class gets them (its calls name them)
    of_class: Dict[str, list] = {}
    for o in ops:
        if o.class_path:
            of_class.setdefault(o.class_path, []).extend(r for r in by.get(o.name, ()) if r.kind == "init")
    for o in ops:
        if o.kind == "method":
            mine = by.setdefault(o.name, [])
            have = {id(r) for r in mine}
            mine[:0] = [r for r in of_class.get(o.class_path, ()) if id(r) not in have]
    what = (f"`{command}` exited {code}" + (" (stopped at the time limit)" if code in (124, 130, -2) else "") +
            f" in {time.monotonic() - t0:.0f}s; {sum(r.kind == 'call' for v in by.values() for r in v)} distinct "
            f"calls of {sum(any(r.kind == 'call' for r in v) for v in by.values())} operators recorded")
    other = _other_interpreter(text, repo) if not any(r.kind == "call" for v in by.values() for r in v) else None
    if other:
        rest = command.split("pytest", 1)[1] if "pytest" in command else " tests"
        what += (f"; the tests ran an interpreter without {other}, which the gate's own has: name the gate's in "
                 f"--tests, e.g. --tests \"{sys.executable} -m pytest{rest}\"")
    elif not any(r.kind == "call" for v in by.values() for r in v) and stopped_at:
        # pytest ran no test at all: one module failed to import (tensorflow/recommenders: np.str)
        what += (f"; pytest stopped at a module it could not import ({stopped_at}"
                 + (f": {tail}" if tail else "") + "): add --continue-on-collection-errors to --tests "
                 "(the default command has it) or leave that module out")
    elif not any(r.kind == "call" for v in by.values() for r in v) and _missing_module(text, repo):
        # SimplexLab/TorchJD: its conftest imports a helper that imports torchvision (a test
        # dependency); pytest stopped before any test, and init suggested an environment variable
        top = _missing_module(text, repo)
        from .worker import DISTRIBUTIONS

        what += (f"; the tests need {top}, which is not installed (the tests said: {tail}): `pip install "
                 f"{DISTRIBUTIONS.get(top, top)}` (or the library's test dependencies), then re-run dl-gate init")
    elif not any(r.kind == "call" for v in by.values() for r in v):  # why: the test run's own last words
        what += (f"; the tests said: {tail}" if tail else "") + (
            " (a test that needs an environment variable: --env NAME=VALUE; another command: --tests CMD)")
    elif code not in (0, 124, 130, -2) and tail:  # some calls recorded: what stopped the others
        what += f"; the tests said: {tail}"
    return by, what + _budget_words(budget, timeout)


def _not_found(text: str, repo: Path) -> List[Tuple[str, Optional[str]]]:
    """Each top-level module a test run could not import (``No module named 'torch'``), with
    where the gate's own interpreter finds it (its origin; None: not installed here). Only
    top-level names are looked up (``find_spec`` of one executes nothing); a module of the
    repository itself (the library, a local helper the tests did not put on their path) is no
    evidence of either kind and is left out."""
    import importlib.util
    import re

    root = Path(repo).resolve()
    out: List[Tuple[str, Optional[str]]] = []
    for name in dict.fromkeys(n.split(".")[0] for n in re.findall(r"No module named '?([A-Za-z_][\w.]*)'?", text)):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = (spec.origin or (list(spec.submodule_search_locations or ()) or [None])[0]) if spec else None
        if origin in ("built-in", "frozen"):
            continue
        if origin is not None and root in Path(origin).resolve().parents:
            continue
        if origin is None and any(any(root.glob(p)) for p in (name, f"{name}.py", f"src/{name}", f"tests/**/{name}",
                                                               f"tests/**/{name}.py")):
            continue  # the repository's own (a helper the tests' path did not reach)
        out.append((name, origin))
    return out


def _other_interpreter(text: str, repo: Path) -> Optional[str]:
    """The module a test run could not import that the gate's own interpreter has installed: the
    test command ran another Python (a bare `python` of the system, where the user's venv is not
    activated), not a missing dependency of the library."""
    return next((n for n, origin in _not_found(text, repo) if origin is not None), None)


def _missing_module(text: str, repo: Path) -> Optional[str]:
    """The module a test run could not import that neither the gate's interpreter nor the
    repository has: a test dependency to install (TorchJD's conftest imports torchvision)."""
    return next((n for n, origin in _not_found(text, repo) if origin is None), None)


def _test_budget(timeout: float) -> float:
    """The seconds the tests' files share (:mod:`gate.search.harvest_budget`): the time limit
    less a margin for the last test and the recorder's final write (10 %, 5-60 s)."""
    return max(1.0, timeout - min(60.0, max(5.0, 0.1 * timeout)))


def _budget_words(budget: Optional[dict], timeout: float) -> str:
    """What the time budget did to the test run, in words ("" where it cut nothing)."""
    if not budget or not budget.get("files"):
        return ""
    files, started, skipped = budget["files"], budget.get("started", []), budget.get("skipped", {})
    words = []
    if skipped:
        words.append(f"{sum(skipped.values())} tests in {len(skipped)} of {len(files)} test files skipped once "
                     f"their file's share of the {timeout:g}s budget was spent")
    never = [f for f in files if f not in started]
    if never:
        shown = ", ".join(never[:5]) + (f" and {len(never) - 5} more" if len(never) > 5 else "")
        words.append(f"{len(never)} test files never reached ({shown})")
    return ("; " + "; ".join(words) + " (--tests-timeout SECONDS gives them more)") if words else ""


def _collection_stop(out: str) -> Optional[str]:
    """The module pytest could not collect, where a collection error stopped the whole run
    ("Interrupted: 1 error during collection"), else None."""
    if not re.search(r"Interrupted: \d+ errors? during collection", out):
        return None
    m = re.search(r"ERROR collecting (\S+)", out)
    return m.group(1) if m else "a test module"


def _last_words(out: str) -> str:
    """The line of a test run's output that says why it recorded nothing: the first error (a
    collection error, an exception), else its summary line."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    for ln in lines:
        if re.match(r"^(E\s+)?\w*(Error|Exception)\b[:(]", ln) or ln.startswith("ERROR "):
            return ln[2:].strip()[:200] if ln.startswith("E ") else ln[:200]
    summary = [ln for ln in lines if re.search(r"\b(passed|failed|error|errors|skipped|no tests ran)\b", ln)]
    return (summary[-1] if summary else lines[-1] if lines else "")[:200]


def _run_quiet(fn, out):
    """Run ``fn`` with this process's stdout/stderr (and so the child's) sent to ``out``."""
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        return fn()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _after(row: dict, key: str, new: str, value) -> dict:
    """``row`` with ``new: value`` placed right after ``key`` (the row reads in that order)."""
    out = {}
    for k, v in row.items():
        out[k] = v
        if k == key:
            out[new] = value
    return out


#: the modes of a Keras layer class's row: ``input`` (built at the dtype, inputs cast) and
#: ``operator`` (built with ``dtype="mixed_float16"`` / ``"mixed_bfloat16"``, float32 inputs the
#: layer autocasts): a layer that computes its statistics in float32 only under a mixed policy
#: (keras' GroupNormalization turns autocast off) is gated where its users run it
MIXED_MODES = ["input", "operator"]


def _with_modes(spec: dict, modes: List[str]) -> dict:
    """``spec`` with ``modes`` (the file writes it after ``dtypes``: :func:`gate.init.yamlio.op_row`)."""
    return dict(spec, modes=list(modes))


def _finish(op: Operator, answer: dict, candidates: List[dict], origin: str, n_rec: int = 1
            ) -> Tuple[Optional[dict], str]:
    """The spec to write from the probe's answer, with what was dropped, or (None, why)."""
    if "failed" in answer:
        return None, answer["failed"]
    if answer.get("trivial"):
        return None, answer["trivial"]
    if answer.get("chosen") is None:
        tries = answer.get("tries") or []
        last = next((t for t in reversed(tries) if t[1] != "ok"), None)
        first = tries[0] if tries else None
        why = (first or last or [0, "", "no candidate"])[2] or "no candidate ran"
        return None, f"no inferred spec runs ({len(tries)} tried; first: {why})"
    spec = dict(answer.get("candidate") or candidates[answer["chosen"]])  # narrowed by the probe, or as tried
    defaults = {p["name"]: p["default"] for p in op.params if p["has_default"]}
    hinted, widened = [], []
    for pname, values in (answer.get("options") or {}).items():
        spec.setdefault("params", {})
        now = spec["params"].get(pname)
        if now is not None:  # set by the tests: their values first, then the others that run
            seen = now["choices"] if isinstance(now, dict) and "choices" in now else [now]
            spec["params"] = dict(spec["params"], **{pname: {"choices": list(seen) + list(values)}})
            widened.append(pname)
            continue
        spec["params"] = dict(spec["params"], **{pname: {"choices": [defaults.get(pname)] + list(values)}})
        hinted.append(pname)
    variants = answer.get("variants") or {}
    notes = []
    reach = answer.get("reach") or {}
    if reach and isinstance(spec.get("dims"), dict):
        spec["dims"] = {d: (list(r) + [reach[d]] if d in reach else r) for d, r in spec["dims"].items()}
        sized = "the tests' sizes" if answer["chosen"] < n_rec else "the probed sizes"
        notes.append(f"{', '.join(sorted(reach))}: {sized}, reaching {max(reach.values())} by the search's "
                     "size mutation")
    dtypes = []
    for d in LOW:
        st = variants.get(f"{d}/cpu/input")
        if st is None or st[0] == "ok":
            dtypes.append(d)
        else:
            notes.append(f"{d} dropped ({st[1]})")
    if not dtypes:
        return None, "runs at no dtype: " + "; ".join(notes)
    if len(dtypes) < len(LOW):
        spec["dtypes"] = dtypes
    if "operator" in (spec.get("modes") or ()):
        # a layer that does not run under its mixed policy (a constructor without **kwargs takes
        # no dtype=): the row keeps mode input, and says why
        mixed = [v for k, v in variants.items()
                 if k.split("/")[2:3] == ["operator"] and k.split("/")[0] in dtypes]
        bad = next((v for v in mixed if v[0] != "ok"), None) if mixed else ["", ""]
        if bad is not None:
            spec["modes"] = [m for m in spec["modes"] if m != "operator"]
            if spec["modes"] == ["input"]:
                del spec["modes"]
            if mixed:  # else no 16-bit dtype runs: there is no mixed policy to gate
                notes.append(f"mixed-precision policy (mode operator) off ({bad[1]})")
    lay = [v for k, v in variants.items() if k.endswith("/noncontiguous")]
    if lay and all(v[0] != "ok" for v in lay):
        spec["layouts"] = {}
        notes.append(f"non-contiguous inputs off ({lay[0][1]})")
    grad = [v for k, v in variants.items() if k.endswith("/grad")]
    if grad and all(v[0] != "ok" for v in grad):
        spec["grad"] = False
        notes.append(f"gradient check off ({grad[0][1]})")
    narrowed = answer.get("narrowed")
    if narrowed:
        was, now = narrowed["seconds"]
        # "2048 -> 256" (every entry of 2048), "128 (place 1) -> 64", "L: 256 -> 64" (a dim)
        moved = ", ".join(f"{k} -> {b}" if k.split(" ")[0] == str(a) else f"{k}: {a} -> {b}"
                          for k, (a, b) in narrowed["sizes"].items())
        notes.append(f"sizes narrowed from the tests' ({moved}): ~{was:.2g}s of CPU an evaluation at the tests' "
                     f"sizes, ~{now:.2g}s here, for a run's default budget (dl-gate init --keep-sizes keeps them)")
    slow = _too_slow_for_the_default_budget(answer)
    if slow:
        notes.append(slow)
    if answer["chosen"] < n_rec:
        source = origin + ("; real values (the tests use a narrower range)" if n_rec == 2 and answer["chosen"] == 0 else "")
    else:
        source = "probed: the first shape that ran" + (f" ({origin})" if origin else "")
    if widened:
        notes.insert(0, f"{', '.join(widened)}: the tests' values, the default and values around them")
    if hinted:
        notes.insert(0, f"{', '.join(hinted)}: values from the type hints")
    return spec, f"{source}" + ("; " + "; ".join(notes) if notes else "")


def narrow_target() -> float:
    """CPU seconds of one evaluation above which init narrows a row built from the tests'
    calls (gate.init.worker._narrowed): a run's default total shared by three changed operators
    of seven variants (three dtypes, the mixed-precision mode, the non-contiguous layout, the
    gradient), each evaluating the 20 inputs a pass needs and about as many fixed ones (controls,
    stored, degenerate, structured), on a runner at half speed (a busy process on each of its
    cores): 120 s / (3 x 7 x 40 x 2) = 0.07 s. At 0.17 s (no margin for load) lucidrains'
    memory-efficient attention, narrowed to 0.14 s an evaluation, left 7 of a run's 20 variants
    under-searched beside another process."""
    from ..config import DEFAULT_BUDGET_TOTAL
    from ..judge.decide import MIN_EVALS

    return DEFAULT_BUDGET_TOTAL / (3 * 7 * MIN_EVALS * 2 * 2)


def _too_slow_for_the_default_budget(answer: dict) -> Optional[str]:
    """What to say of a row whose evaluations (the probe's CPU seconds for one) are too slow for
    its variants to reach the evaluations a pass needs within a run's default budget, or None.
    A run then reports them under-searched, an error, on every pull request (lucidrains'
    memory-efficient attention at its tests' sizes: 2.9-5.2 s of CPU an evaluation, 3-6 variants
    a row, 20 evaluations each)."""
    from ..config import DEFAULT_BUDGET_TOTAL as DEFAULT_TOTAL
    from ..judge.decide import MIN_EVALS

    seconds = answer.get("seconds")
    n = sum(1 for st in (answer.get("variants") or {}).values() if st and st[0] == "ok")
    if not seconds or not n or n * MIN_EVALS * seconds <= DEFAULT_TOTAL:
        return None
    need = n * MIN_EVALS * seconds
    return (f"~{seconds:.2g}s of CPU an evaluation: its {n} variant(s) need ~{need / 60:.0f} min for the {MIN_EVALS} "
            f"evaluations a pass needs each, past a run's default budget.total ({DEFAULT_TOTAL:g}s): raise budget.total, "
            "narrow dtypes, or shrink dims, or runs report it under-searched")


#: how far past the tests' sizes init lets the search aim a dim: 4096 holds a float16 position or
#: count past 2048 (where consecutive integers stop being representable) and a bfloat16 one past 256
DIM_REACH = 4096


def run_init(repo: Path, *, package: Optional[str] = None, tests: Optional[str] = None, config: str = CONFIG,
             workflows: bool = True, probe_timeout: float = 10.0, tests_timeout: float = 600.0,
             only: Optional[Sequence[str]] = None, no_tests: bool = False, env: Optional[Dict[str, str]] = None,
             action=None, log: Callable[[str], None] = lambda s: None, keep_sizes: bool = False) -> InitReport:
    """Discover, infer, probe and write; returns what was done (nothing is written when no
    operator runs). The steps: classify the package's definitions, harvest its tests' calls,
    infer candidate specs, probe them, write the config, the workflows and the seeds. A
    :class:`SetupError` carries what was found before it stopped (``.report``)."""
    t_start = time.monotonic()
    repo = Path(repo).resolve()
    pkg = find_package(repo, package)
    framework = uses_framework(pkg)
    report = InitReport(package=pkg.name, config=config)
    try:
        return _init(repo, pkg, framework, report, t_start, tests=tests, config=config, workflows=workflows,
                     probe_timeout=probe_timeout, tests_timeout=tests_timeout, only=only, no_tests=no_tests,
                     env=env, action=action, log=log, keep_sizes=keep_sizes)
    except SetupError as exc:
        exc.report = report  # type: ignore[attr-defined]  # what init found before it stopped
        raise


def _init(repo: Path, pkg, framework: str, report: InitReport, t_start: float, *, tests, config, workflows,
          probe_timeout, tests_timeout, only, no_tests, env, action, log, keep_sizes=False) -> InitReport:
    from ..config import parse_config

    syms, bad = scan(pkg, repo, named=only or ())
    for f in bad:
        report.left_out.append((f, "does not parse (SyntaxError)"))
    if not syms:
        if bad:  # an IndentationError in the one module that defines the operators, not "nothing public"
            raise SetupError(f"package {pkg.name}: {bad[0]} does not parse (SyntaxError)"
                             + (f", nor {len(bad) - 1} more file(s)" if len(bad) > 1 else "")
                             + ": fix it, then re-run dl-gate init")
        if only:
            raise SetupError(f"package {pkg.name} defines none of {', '.join(only)} (a name as `_f`, "
                             f"`{pkg.name}.module._f` or `module._f` with its full module path)")
        raise SetupError(f"package {pkg.name} defines no public function or class (a private one is taken "
                         f"when named: dl-gate init --ops {pkg.name}.module._name)")
    sys_path = [str(pkg.root)]
    log(f"package {pkg.name} ({'src/' if pkg.python_path == 'src' else 'repository root'}), "
        f"{sum(len(v) for v in syms.values())} public definitions in {len(syms)} modules")
    env = dict(env or {})
    ops = _classify(repo, pkg, framework, syms, sys_path, only, report, env)
    framework = file_framework(framework, ops)
    # 2. the library's own tests ----------------------------------------------------------
    records: Dict[str, list] = {}
    if tests is None and not no_tests:
        tests = default_tests(repo, pkg)
    if tests:
        records, report.harvest = _harvest(ops, tests, repo, sys_path, tests_timeout, log, env)
        log(report.harvest)
    report.tested = sorted(n for n, recs in records.items() if any(r.kind == "call" for r in recs))
    plans = _candidate_specs(ops, records, report, explicit=bool(only))
    final = _probe(repo, plans, framework, sys_path, probe_timeout, log, report, env, keep_sizes=keep_sizes)

    probed_rows = {spec["name"]: spec for spec, _ in final}

    def check(text: str, path: Path, names: List[str]) -> Dict[str, str]:
        report.checked = list(names)
        # a row read back as exactly the spec the probe ran (at every variant) needs no second
        # run; one that reads back as anything else runs once, as refresh and run will read it
        parsed = {spec.name: spec for spec in parse_config(text, path, repo).ops}
        todo = [n for n in names if not same_as_probed(probed_rows.get(n), parsed.get(n), framework)]
        if not todo:
            return {}
        log(f"checking {len(todo)} row(s) as read back from {path.name} (one evaluation each)")
        answers = run_worker("check", todo, lambda n: n, {"text": text, "path": str(path), "root": str(repo),
                                                          "timeout": probe_timeout},
                             cwd=repo, sys_path=sys_path, item_timeout=probe_timeout * 4 + 30, env_extra=env,
                             framework=framework)
        out = {}
        for n in todo:
            a = answers.get(n, {"failed": "no answer"})
            if "failed" in a or a.get("status") != "ok":
                out[n] = a.get("failed") or f"{a.get('status')}: {a.get('why')}"
        return out

    text, path = _write_config(repo, pkg, framework, syms, config, final, report, ops, check=check, env=env)
    if workflows:
        _write_workflows(repo, config, framework, report, env, action, log)
    if records:
        report.seeds = _store_seeds(parse_config(text, path, repo), records, plans)
    report.seconds = time.monotonic() - t_start
    return report


def file_framework(guess: str, ops: Sequence["Operator"]) -> str:
    """The file's top-level ``framework``: that of most operator candidates (a Keras library that
    also imports torch in a backend module is a TensorFlow one: keras-hub's layers were written
    under ``framework: torch``, each row saying tensorflow), else the import scan's ``guess``."""
    counts = collections.Counter(op.framework for op in ops)
    if not counts:
        return guess
    top, n = counts.most_common(1)[0]
    return top if n > counts.get(guess, 0) else guess


def _died_hint(failed: str) -> str:
    """What to do about an import whose child process died, from the last line it wrote."""
    if "registered more than once" in failed and "LLVM" in failed:
        # keras's torch backend (acceptance run): importing it loaded TensorFlow beside torch, both
        # bundle LLVM, and the process aborted (exit -6); Keras 3 picks its backend from KERAS_BACKEND
        return ("two frameworks that each bundle LLVM (TensorFlow and torch) were loaded in one process: if the "
                "library picks its backend from an environment variable (Keras 3: KERAS_BACKEND=torch or "
                "=tensorflow), give it: `dl-gate init --env KERAS_BACKEND=torch` (the config's env: keeps it)")
    return ""


def _classify(repo: Path, pkg, framework: str, syms, sys_path, only, report: InitReport,
              env: Optional[Dict[str, str]] = None) -> List[Operator]:
    """1. What each public definition is, in a child process: the operator candidates."""
    names = {m: [s.name for s in ss] for m, ss in syms.items()}
    answers = run_worker("classify", list(syms), lambda m: m, {"names": names, "package": pkg.name}, cwd=repo, sys_path=sys_path,
                         item_timeout=120.0, env_extra=env, framework=framework)
    import_errors = {m: a["error"] for m, a in answers.items() if "error" in a}
    import_errors.update({m: {"error": a["failed"], "hint": _died_hint(a["failed"])} for m, a in answers.items()
                          if "failed" in a})
    if import_errors and len(import_errors) == len(syms):
        first = next(iter(import_errors.values()))
        hint = first.get("hint") or "make it importable from the repository root (its declared dependencies installed)"
        missing = re.search(r"No module named '([\w.]+)'", first["error"])
        if missing:
            top = missing.group(1).split(".")[0]
            declared = [d for d in pkg.dependencies
                        if re.split(r"[<>=!~;\[ ]", d, 1)[0].strip().lower().replace("-", "_") == top.lower()]
            if declared:
                hint = (f"{top} is a declared dependency of the project ({declared[0]}): install the project's "
                        "dependencies (`pip install -e .`), then re-run dl-gate init")
        raise SetupError(f"cannot import {pkg.name}: {first['error']}: {hint}")
    for m, e in import_errors.items():
        report.left_out.append((m, f"module does not import: {e['error']}" + (f" ({e['hint']})" if e.get("hint") else "")))
    rows = {(r["module"], r["name"]): r for a in answers.values() for r in a.get("rows", []) if "name" in r}
    counts: Dict[str, int] = {}
    for ss in syms.values():
        for s in ss:
            counts[s.name] = counts.get(s.name, 0) + 1
    ops: List[Operator] = []
    by_sym: Dict[str, Symbol] = {}
    for m, ss in syms.items():
        for s in ss:
            r = rows.get((m, s.name))
            name = _op_name(s, pkg.name, counts)
            report.callables[name] = f"{m}:{s.name}"
            if r is not None and r.get("kind") == "methods":
                # a class whose operators are its methods (geoopt's manifolds): one per method
                for meth in r["methods"]:
                    # a plain class called as a function (its __call__): the row is the class's
                    mname = name if meth["name"] == "__call__" else f"{name}.{meth['name']}"
                    report.callables[mname] = f"{m}:{s.name}.{meth['name']}"
                    if only and not ({name, s.name, f"{m}.{s.name}"} & set(only)) and not (
                            {mname, f"{s.name}.{meth['name']}", f"{m}.{s.name}.{meth['name']}"} & set(only)):
                        continue
                    ops.append(Operator(name=mname, module=m, qualname=f"{s.name}.{meth['name']}", kind="method",
                                        file=s.file, line=s.line, framework=r.get("framework", framework),
                                        params=meth.get("params") or [], init=r.get("init") or []))
                    by_sym[mname] = s
                continue
            if only and name not in only and s.name not in only and f"{m}.{s.name}" not in only:
                continue
            if r is None:
                if m not in import_errors:
                    report.left_out.append((name, "no answer from the import (the child process stopped)"))
                continue
            if "skip" in r:
                if not r["skip"].startswith("re-exported"):
                    report.left_out.append((name, r["skip"]))
                continue
            op = Operator(name=name, module=m, qualname=s.name, kind=r["kind"], file=s.file, line=s.line,
                          framework=r.get("framework", framework), params=r.get("params") or [],
                          init=r.get("init") or [], loss=bool(r.get("loss")), method=r.get("method") or "call")
            ops.append(op)  # a constructor that needs arguments: built as the tests build it, if they do
            by_sym[name] = s
    if not ops:
        raise SetupError(f"no operator candidates in {pkg.name}: " +
                         ("; ".join(f"{n}: {w}" for n, w in report.left_out[:3]) or "nothing public"))

    return ops


def _candidate_specs(ops: List[Operator], records: Dict[str, list], report: InitReport, explicit: bool = False) -> dict:
    """Name -> (operator, candidate specs, where they came from, how many from the tests);
    ``explicit``: the operators were named (``--ops``): a method no test calls is probed too."""
    # 3. candidate specs ------------------------------------------------------------------
    plans: Dict[str, Tuple[Operator, List[dict], str]] = {}
    for op in ops:
        sources = [op.file]
        cands: List[dict] = []
        origin = ""
        n_rec = 0
        recs = all_recs = records.get(op.name, [])
        if op.kind == "method" and not explicit and not any(r.kind == "call" for r in recs):
            # a class's methods are many (geoopt: a dozen manifolds of ~15 each) and what their
            # tensors must be (a point on the manifold) shows only in how the tests call them
            report.left_out.append((op.name, f"a method of {op.class_name} that no test calls (name it with "
                                             f"--ops {op.name} to probe it with small tensors)"))
            report.uncalled.append(op.name)
            continue
        construct: Optional[dict] = None
        if op.kind in ("module", "layer", "method") and op.required_init():
            construct, recs, why = constructed(op, recs)
            if construct is None:
                report.left_out.append((op.name, why))
                continue
        # a constructor with defaults only that the tests build with their own arguments: its
        # calls as they were made, on those instances, are the first candidates, the default-built
        # ones after them (keras' GroupNormalization(groups=4) on 4 channels: built with the
        # default groups=32 every recorded call raises; PNPLoss(variant='Ds'): the tests' setting)
        as_built: List[dict] = []
        if op.kind in ("module", "layer", "method") and construct is None and any(r.kind == "init" for r in recs):
            built, mine, _ = constructed(op, recs)
            if built:
                inf = from_records(op, mine, op.framework, sources)
                if inf.spec is not None:
                    as_built = [_after(c, "callable", "construct", built)
                                for c in ([widen(inf.spec)] if widen(inf.spec) is not None else []) + [inf.spec]]
        recs = [r for r in recs if r.kind == "call"]
        if recs:
            inf = from_records(op, recs, op.framework, sources)
            if inf.spec is not None:
                # the tests' value range shows what runs, not what must: real values first (a
                # logit drawn from [0, 1) never overflows a sigmoid), the tests' range if not
                wide = widen(inf.spec)
                if wide is not None:
                    cands.append(wide)
                cands.append(inf.spec)
                n_rec = len(cands)
                tests_of = sorted({r.source.split("::")[0] for r in recs if r.source})
                origin = f"from {inf.calls} test call(s)" + (f" in {', '.join(tests_of[:2])}" if tests_of else "")
            else:
                origin = f"test calls not usable: {inf.why}"
        if as_built:
            # built as the tests build it first (their calls were made on those instances: the
            # arguments are settings the library is used with, PNPLoss(variant='Ds')); the
            # default-built instance, with every recorded call, after it
            cands[:0] = as_built
            n_rec = len(cands)
            origin = origin or f"from {len(mine)} test call(s)"
            origin = (f"{origin}; built as {op.class_name}({', '.join(f'{k}={v!r}' for k, v in built.items())}) as the "
                      "tests build it, else with its defaults")
        probes, why = probe_specs(op, op.framework, sources)
        cands.extend(probes)
        if not cands:
            report.left_out.append((op.name, why if not origin else f"{origin}; {why}"))
            continue
        if construct is not None:  # every candidate builds the instance the tests built
            cands = [_after(c, "callable", "construct", construct) for c in cands]
            origin = f"{origin}; built as {op.class_name}({', '.join(f'{k}={v!r}' for k, v in construct.items())})"
        # a layer under Keras's mixed-precision policies too (gate.backends.base.keras_mixed_policy);
        # not a Loss: a model's loss computes at its own dtype (float32 unless given one)
        if op.kind == "layer" and not op.loss:
            cands = [_with_modes(c, MIXED_MODES) for c in cands]
        plans[op.name] = (op, cands, origin, n_rec)
        if op.kind in ("module", "layer", "method") and any(r.kind == "init" for r in all_recs):
            primary = construct if construct is not None else (built if as_built else {})
            other = _other_plan(op, all_recs, primary, sources)
            if other is not None and other[0] not in plans:
                plans[other[0]] = other[1]

    return plans


def _other_plan(op: Operator, recs: list, primary: dict, sources: List[str]):
    """``(name, plan)`` of a second row for a class the tests also build with other settings
    (:func:`gate.init.infer.other_construction`): named by the first argument that differs
    (``deel.KR(multi_gpu=False)``), built that way, fed the calls made on those instances; None
    where there is no such construction or its calls give no spec."""
    other = other_construction(op, recs, primary)
    if other is None:
        return None
    kw, calls, differ = other
    inf = from_records(op, calls, op.framework, sources)
    if inf.spec is None:
        return None
    full = {**{p["name"]: p["default"] for p in op.init if p["has_default"]}, **kw}
    k = differ[0]
    name = f"{op.name}({k}={full.get(k)!r})"
    wide = widen(inf.spec)
    cands = [dict(c, name=name) for c in ([wide] if wide is not None else []) + [inf.spec]]
    if kw:
        cands = [_after(c, "callable", "construct", kw) for c in cands]
    if op.kind == "layer" and not op.loss:
        cands = [_with_modes(c, MIXED_MODES) for c in cands]
    built = f"{op.class_name}({', '.join(f'{a}={v!r}' for a, v in kw.items())})"
    origin = (f"from {inf.calls} test call(s); built as {built}: the tests build {op.class_name} with other "
              f"settings too ({', '.join(f'{a}={full.get(a)!r}' for a in differ)} here), another path of its code")
    return name, (op, cands, origin, len(cands))


def _probe(repo: Path, plans: dict, framework: str, sys_path, probe_timeout: float, log,
           report: InitReport, env: Optional[Dict[str, str]] = None, keep_sizes: bool = False
           ) -> List[Tuple[dict, str]]:
    """Run each operator's candidate specs once at every dtype and variant in a child process;
    the first that runs is its row."""
    # 4. probe and validate in the child process -------------------------------------------
    done = [0]

    def progress(msg):
        done[0] += 1
        if done[0] % 10 == 0:
            log(f"probed {done[0]}/{len(plans)} operators")

    probe_req = [{"name": n, "candidates": c, "options": {**hinted_options(op, c[0]), **widened_options(op, c[0])},
                  "recorded": n_rec, "reach": DIM_REACH, "narrow": 0.0 if keep_sizes else narrow_target()}
                 for n, (op, c, _, n_rec) in plans.items()]
    log(f"probing {len(plans)} operators (each inferred spec runs once at every dtype and variant)")
    answers = run_worker("probe", probe_req, lambda it: it["name"], {"timeout": probe_timeout}, cwd=repo,
                         sys_path=sys_path, item_timeout=probe_timeout * 40 + 30, progress=progress, env_extra=env,
                         framework=framework if all(op.framework == framework for op, *_ in plans.values()) else "")
    final: List[Tuple[dict, str]] = []
    for name, (op, cands, origin, n_rec) in plans.items():
        spec, note = _finish(op, answers.get(name, {"failed": "no answer"}), cands, origin, n_rec)
        if spec is None:
            report.left_out.append((name, note))
            continue
        fw = spec.get("framework", "torch")  # a spec without one is torch's (gate.init.infer)
        if fw == framework:
            spec.pop("framework", None)  # the file's own framework: said once at the top
        else:
            # a torch row in a TensorFlow file says so (keras-hub: keras_nlp.deserialize, probed
            # with torch tensors, was read back as a TensorFlow row and failed every refresh)
            spec["framework"] = fw
        final.append((spec, f"{name}: {note}"))
        report.found.append((name, op.kind, note))

    return final


def _write_config(repo: Path, pkg, framework: str, syms, config: str, final: List[Tuple[dict, str]],
                  report: InitReport, ops: Sequence[Operator] = (), check=None,
                  env: Optional[Dict[str, str]] = None) -> Tuple[str, Path]:
    """Write a new config, or merge the rows into the existing one; returns (its text, its path).
    ``check(text, path, names)``: {name: why} of the added rows that do not run as read back from
    the file (refresh and run read the file, not init's rows): those are left out, and said so."""
    from ..config import parse_config
    from . import yamlio

    # 5. the seeds, the config, the workflows ------------------------------------------------
    path = repo / config
    existing = path.is_file()
    if not final and not existing:
        raise SetupError(_nothing_runs(pkg.name, report))
    left_before = list(report.left_out)
    while True:
        report.left_out = list(left_before)
        text = _render(pkg, framework, syms, path, existing, final, report, ops, dict(sorted((env or {}).items())))
        try:
            parse_config(text, path, repo)
        except ConfigError as exc:  # a bug of init, or a user's edit that was already invalid
            raise ConfigError(f"the config dl-gate init would write does not validate: {exc}") from None
        wrong = yamlio.read_back_errors(text, [spec for spec, _ in final if spec["name"] in set(report.added)])
        if wrong:  # the file, not the rows in memory, is what refresh and run will read
            raise ConfigError(f"the config dl-gate init would write does not read back as probed ({len(wrong)} "
                              f"value(s)), e.g. {wrong[0]}: a bug of dl-gate init, please report it")
        failed = check(text, path, list(report.added)) if check is not None and report.added else {}
        if not failed:
            break
        # one evaluation per row from the file did not run: left out, the file written without them
        final = [(spec, note) for spec, note in final if spec["name"] not in failed]
        left_before += [(n, f"does not run as read back from the file it was written to ({why}): a bug of "
                            "dl-gate init, please report it") for n, why in failed.items()]
        report.found = [f for f in report.found if f[0] not in failed]
        if not final and not existing:
            report.left_out = left_before
            raise SetupError(_nothing_runs(pkg.name, report))
    path.write_text(text, encoding="utf-8")
    return text, path


def _render(pkg, framework: str, syms, path: Path, existing: bool, final: List[Tuple[dict, str]],
            report: InitReport, ops: Sequence[Operator], env: Optional[Dict[str, str]] = None) -> str:
    """The config's text: a new document, or the rows merged into the existing file. ``env``:
    the ``--env`` values, written as the config's ``env:`` mapping (the workers get them where
    the job's environment sets none: refresh and run need no export)."""
    from .. import __version__
    from . import yamlio

    tail = ""
    if existing:
        doc = yamlio.load(path)
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: not a mapping; move it away to start afresh")
        scanned = {f"{m}:{s.name}" for m, ss in syms.items() for s in ss}
        known_mods = set(syms)

        def gone(row) -> bool:
            c = str(row.get("callable", ""))
            mod = c.split(":")[0] if ":" in c else c.rsplit(".", 1)[0]
            if not mod.startswith(pkg.name.split(".")[0]):
                return False
            return c not in scanned and (":" in c or mod not in known_mods)

        keep_out = yamlio.skipped(path.read_text(encoding="utf-8"))
        rows = {r.get("name") for r in doc.get("ops") or [] if isinstance(r, dict)}
        # what this run could not build but the file has (a row the user wrote or kept) or keeps out
        report.left_out = [(n, w) for n, w in report.left_out if n not in rows and n not in keep_out]
        for name in sorted(keep_out & ({spec["name"] for spec, _ in final} | {o.name for o in ops})):
            report.left_out.append((name, "kept out by a `# dl-gate init: skip` line"))
        report.added, report.kept, _ = yamlio.merge(doc, [r for r in final if r[0]["name"] not in keep_out], [])
        rows_now = {r.get("name") for r in doc.get("ops") or [] if isinstance(r, dict)}
        listed = _not_gated(report)
        kept_listed = [e for e in doc.get("not_gated") or [] if isinstance(e, dict) and e.get("name") not in rows_now
                       and e.get("name") not in {x["name"] for x in listed}]
        if listed or kept_listed or "not_gated" in doc:
            doc["not_gated"] = yamlio.not_gated_list(kept_listed + listed)
        report.removed = [r.get("name") for r in doc.get("ops") or [] if isinstance(r, dict) and gone(r)]
        if env:
            cur = doc.get("env")
            merged = dict(cur) if isinstance(cur, dict) else {str(n): None for n in cur or []}
            merged.update(env)  # a name given again takes its new value
            doc["env"] = merged
    else:
        when = datetime.date.today().isoformat()
        top = {"version": 1, "framework": framework, "python_path": [pkg.python_path], "seed": 0,
               "budget": {"total": 120, "per_op": 10, "localise": 60},
               "gate": {"dtypes": list(LOW), "behaviour_change": "fail"}}
        if env:
            top["env"] = dict(env)
        comments = {"python_path": "where the package imports from (relative to this file)",
                    "env": "variables the library needs (dl-gate init --env): the gate's workers get these "
                           "values where the job's environment sets none (a list of names takes the job's)",
                    "budget": "seconds: a PR's fuzzing in all, spread over the operators it changes (at least "
                              "per_op each; per_op is also each operator's baseline), localisation",
                    "gate": "only a real regression fails the check"}
        unlisted = [(n, w) for n, w in report.left_out if n not in report.callables]  # no callable: not_gated cannot name them
        if unlisted:
            tail = "Left out by dl-gate init (add a row by hand to gate them):\n" + "\n".join(
                f"  {n}: {w}" for n, w in unlisted)
        header = yamlio.HEADER.format(when=f"dl-gate {__version__}, {when}")
        doc = yamlio.new_document(top, final, header, comments)
        listed = _not_gated(report)
        if listed:  # after the rows: what is not gated and why; a run names a change that reaches one
            doc["not_gated"] = yamlio.not_gated_list(listed)
            doc.yaml_set_comment_before_after_key(
                "not_gated", before="\nNot gated: dl-gate init could not build a row for these (why below). A pull "
                "request that changes one is named in the run's report as not gated; add a row to gate it.")
        report.added = [s["name"] for s, _ in final]
    text = yamlio.dump(doc)
    if not existing and tail:
        text += yamlio.comment_block(tail)
    return text


def _not_gated(report: InitReport) -> List[Dict[str, str]]:
    """``not_gated:`` entries (name, callable, why) of what was left out that has a callable."""
    return [{"name": n, "callable": report.callables[n], "why": w} for n, w in report.left_out if n in report.callables]


def same_as_probed(row: Optional[dict], spec, framework: str) -> bool:
    """Is ``spec`` (a row as the config reader built it) the spec the probe built from ``row``
    (the same defaults as :func:`gate.init.worker.probe`)?"""
    from ..ops.spec import OpSpec
    from .worker import probe_defaults

    if row is None or spec is None:
        return False
    try:
        fw = row.get("framework", framework)
        return OpSpec.from_dict(dict(row, framework=fw), probe_defaults(fw), origin="user") == spec
    except Exception:  # noqa: BLE001 - anything that does not build the same is run again
        return False


def _nothing_runs(package: str, report: InitReport) -> str:
    """One line: no operator runs; the reasons of those the tests called first (they matter most),
    then a few others, and what to do."""
    tested = set(report.tested)
    ordered = sorted(report.left_out, key=lambda nw: nw[0] not in tested)
    shown = "; ".join(f"{n}: {w}" for n, w in ordered[:3])
    more = f" (+{len(ordered) - 3} more: --json FILE lists every one)" if len(ordered) > 3 else ""
    called = (f"the tests called {len(tested)} of them, first below" if tested else
              "the tests recorded no call of any (--tests CMD names the test command, --env NAME=VALUE its environment)")
    return (f"no operator of {package} runs with an inferred spec ({len(ordered)} left out; {called}): {shown}{more}. "
            "Name the operators to gate (--ops NAME) or write their rows by hand (docs/config.md)")


def _write_workflows(repo: Path, config: str, framework: str, report: InitReport, env: Dict[str, str],
                     action=None, log: Callable[[str], None] = lambda s: None) -> None:
    from . import workflows as wf

    todo = {rel: None for rel in wf.render() if not (repo / rel).exists()}
    if not todo:
        return
    ref = wf.resolve(action or wf.ActionRef())
    report.action = ref.uses().split("  #")[0]
    if not ref.sha:
        log(f"could not resolve {ref.repo}@{ref.tag} to a commit (offline?): the workflows use the tag; "
            "pin it by the tag's commit SHA")
    install = wf.install_command(repo, framework)
    for rel, body in wf.render(config=config, install=install, action=ref, env=env).items():
        if rel in todo:
            p = repo / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(body)
            report.workflows.append(rel)


def _store_seeds(cfg, records: Dict[str, list], plans) -> int:
    """The harvested calls, stored as seeds beside the baselines (where the fuzzer finds them)."""
    from ..search.harvest import store_records
    from ..search.seeds import CallRecord, Opaque, SeedStore

    store = SeedStore(cfg.baselines_dir / "seeds", opinfo=False)
    specs = [s for s in cfg.ops if s.name in records]
    sigs = {n: _SignatureOnly(plans[n][0].params) for n in records if n in plans}
    flat = []
    for n, recs in records.items():
        op = plans.get(n, (None,))[0]
        for r in recs:
            if r.kind != "call":
                continue
            args = list(r.args)
            if op is not None and op.kind in ("module", "layer", "method") and args and isinstance(args[0], Opaque):
                args = args[1:]
            flat.append(CallRecord(op=n, args=args, kwargs=r.kwargs, source=r.source))
    by_callable = {s.callable: sigs.get(s.name) for s in specs}
    rep = store_records(flat, specs, store, resolve=lambda c, construct=(): by_callable.get(c))
    if sum(rep.stored.values()):
        from ..judge.baselines import keep_tracked

        keep_tracked(cfg.baselines_dir)  # committed whatever the library's ignore patterns say
    return sum(rep.stored.values())


__all__ = ["run_init", "InitReport"]
