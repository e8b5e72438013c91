"""The part of ``dl-gate init`` that runs the library's code: run as ``python -m gate.init.worker
REQUEST.json`` in a child process (never in the gate's own), one JSON line per answer on
stdout, so that a library that hangs, crashes or exits at import or on a probe costs the
answers after it, never the ones before it (the parent restarts it past the culprit).

Two jobs:

* ``classify``: import each module and say what each public name found by the AST scan is
  (function, ``nn.Module`` / Keras ``Layer`` class, ``autograd.Function``, ``torch.library``
  custom op), with its signature (names, defaults, annotations), or why it is not an operator;
* ``probe``: for each operator, try its candidate specs in order with the gate's own runners
  (:func:`gate.oracles.registry.build_runner`, the code path the fuzzer takes) on inputs drawn
  as the fuzzer draws them (:func:`gate.search.inputs.draw`), keep the first that runs, then run
  it once at every variant the gate would plan for it (each dtype, the non-contiguous layout,
  the gradient) and report each one's outcome.

Each evaluation gets a SIGALRM deadline, the worker the gate's memory limit and the
die-with-parent flag (:mod:`gate.backends.isolate`)."""
from __future__ import annotations

import importlib
import inspect
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Dict, List, Optional


class _Deadline(BaseException):
    """Raised by SIGPROF (the probe's CPU time is spent) or SIGALRM (its wall-clock backstop) in
    a probe that runs too long (a BaseException: the library's own ``except Exception`` does not
    swallow it); ``args[0]``: the signal."""


#: the wall-clock backstop of one evaluation, in multiples of its CPU-time limit: a call that
#: waits without computing (a deadlock, a sleep) is a hang too
WALL_FACTOR = 6.0


def _arm(timeout: float) -> None:
    """Limit the next evaluation to ``timeout`` seconds of this process's CPU time, and
    ``WALL_FACTOR`` times that of wall-clock time. CPU time, not wall time: on a loaded machine
    (a CI runner with two cores, the library's own test processes beside it) a heavy call gets a
    share of a core and takes several times its CPU time, and was left out as a hang; its CPU
    time is what it is either way (the backend computes on one thread: gate.backends)."""
    signal.setitimer(signal.ITIMER_PROF, timeout)
    signal.setitimer(signal.ITIMER_REAL, timeout * WALL_FACTOR)


def _disarm() -> None:
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)


def _no_answer(exc: "_Deadline", timeout: float) -> str:
    if exc.args and exc.args[0] == signal.SIGALRM:
        return f"no answer within {timeout * WALL_FACTOR:g}s (it used less than {timeout:g}s of CPU time: waiting)"
    return f"no answer within {timeout:g}s of CPU time"


def _emit(obj: dict) -> None:
    sys.__stdout__.write(json.dumps(obj, default=str) + "\n")
    sys.__stdout__.flush()


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float, str, type(None))) for x in v):
        return [_jsonable(x) for x in v]
    return {"opaque": type(v).__name__}


def _params_of(fn, drop_first: bool = False) -> List[dict]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    out = []
    for i, p in enumerate(sig.parameters.values()):
        if drop_first and i == 0:
            continue
        ann = p.annotation
        ann_s = None if ann is inspect.Parameter.empty else (
            ann if isinstance(ann, str) else ann.__name__ if isinstance(ann, type) else str(ann))
        out.append({
            "name": p.name,
            "kind": p.kind.name,
            "has_default": p.default is not inspect.Parameter.empty,
            "default": None if p.default is inspect.Parameter.empty else _jsonable(p.default),
            "annotation": ann_s,
        })
    return out


#: modules installed by a distribution of another name: what `pip install` needs to be told
#: (tensorflow/model-remediation imports tensorflow_hub, which imports pkg_resources: setuptools
#: dropped that module in its release 81, and "pip install pkg_resources" installs nothing useful)
DISTRIBUTIONS = {
    "pkg_resources": "'setuptools<81'", "yaml": "pyyaml", "cv2": "opencv-python", "sklearn": "scikit-learn",
    "skimage": "scikit-image", "PIL": "pillow", "attr": "attrs", "dateutil": "python-dateutil",
    "absl": "absl-py", "tensorflow_hub": "tensorflow-hub", "tf_keras": "tf-keras",
    "bs4": "beautifulsoup4", "jwt": "pyjwt", "serial": "pyserial", "Crypto": "pycryptodome",
    "tensorflow_probability": "tensorflow-probability", "tensorflow_addons": "tensorflow-addons",
    "tensorflow_datasets": "tensorflow-datasets", "torch_geometric": "torch-geometric",
}


def _import_error(exc: BaseException, module: str) -> dict:
    """One line saying why ``module`` does not import, and what to do about it."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    hint = ""
    if name == "PackageNotFoundError" or "No package metadata was found" in text or "DistributionNotFound" in name:
        hint = ("the package reads its own installed version (importlib.metadata): install it first, "
                "e.g. `pip install --no-deps -e .` in the repository, then re-run dl-gate init")
    elif isinstance(exc, ModuleNotFoundError) and getattr(exc, "name", None):
        top = exc.name.split(".")[0]
        hint = f"a dependency is missing: `pip install {DISTRIBUTIONS.get(top, top)}` (or the package's declared dependencies), then re-run"
    elif _keras2_under_keras3(exc, text):
        # larq (acceptance run): tf.keras code that Keras 3 no longer has (LocallyConnected1D)
        hint = ("Keras 2 code under Keras 3: `pip install tf-keras`, then `export TF_USE_LEGACY_KERAS=1` and "
                "re-run `dl-gate init --env TF_USE_LEGACY_KERAS=1` (the job gets it from the config's env:)")
    return {"error": f"{name}: {text}", "where": where, "hint": hint}


def _keras2_under_keras3(exc: BaseException, text: str) -> bool:
    """An import that fails inside Keras 3 on a name only Keras 2 (tf.keras, tf-keras) has."""
    if os.environ.get("TF_USE_LEGACY_KERAS") or not isinstance(exc, (AttributeError, ImportError)):
        return False
    return "keras" in text and ("has no attribute" in text or "cannot import name" in text)


def _mro_names(cls) -> List[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__[1:]]


def classify(req: dict) -> None:
    top = req.get("package", "").split(".")[0]
    if top:  # the package itself first: a failure there (its version check) is everyone's
        try:
            importlib.import_module(top)
        except BaseException as exc:
            err = _import_error(exc, top)
            for mod_name in req["modules"]:
                _emit({"module": mod_name, **err})
            return
    for mod_name, names in req["modules"].items():
        try:
            mod = importlib.import_module(mod_name)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt from library code included
            _emit({"module": mod_name, **_import_error(exc, mod_name)})
            continue
        for name in names:
            obj = getattr(mod, name, None)
            row: Dict[str, Any] = {"module": mod_name, "name": name}
            if obj is None:
                row["skip"] = "not an attribute after import"
            elif inspect.isclass(obj):
                mro = _mro_names(obj)
                if any(m.startswith("torch.autograd.function.") and m.endswith("Function") for m in mro):
                    row.update(kind="autograd_function", params=_params_of(obj.forward, drop_first=True),
                               framework="torch")
                elif any(m.startswith("torch.nn.modules.module.Module") for m in mro) and _no_forward(obj):
                    # geoopt's manifolds: its operators are its methods, each one a row of its own
                    # where the tests call it (gate.init.__init__: kind "method")
                    methods = _public_methods(obj)
                    if methods:
                        row.update(kind="methods", framework="torch", init=_params_of(obj.__init__, drop_first=True),
                                   methods=[{"name": n, "params": _params_of(f, drop_first=True)} for n, f in methods])
                    else:
                        row["skip"] = "an nn.Module with no forward and no public method"
                elif any(m.startswith("torch.nn.modules.module.Module") for m in mro):
                    init = _params_of(obj.__init__, drop_first=True)
                    row.update(kind="module", params=_params_of(obj.forward, drop_first=True), init=init,
                               framework="torch")
                elif any(m.endswith(".Layer") and ("keras" in m or "tensorflow" in m) for m in mro):
                    init = _params_of(obj.__init__, drop_first=True)
                    # a layer that overrides __call__ (TFRS's SamplingProbablityCorrection) is
                    # called through it: its own signature, its calls recorded there
                    from ..backends.base import keras_call_method

                    method = keras_call_method(obj)
                    row.update(kind="layer", params=_params_of(getattr(obj, method), drop_first=True), init=init,
                               framework="tensorflow", **({"method": method} if method != "call" else {}))
                elif any(m.endswith(".Loss") and "keras" in m for m in mro) and callable(getattr(obj, "call", None)):
                    # a Keras Loss class (FocalLoss(gamma=2)): built like a layer, in the variant's dtype
                    # (its dtype= is the dtype it computes in: float32 by default, whatever it is given)
                    init = _params_of(obj.__init__, drop_first=True)
                    row.update(kind="layer", params=_params_of(obj.call, drop_first=True), init=init,
                               framework="tensorflow", loss=True)
                elif _own_call(obj) is not None:
                    # a plain class whose instances are called (tensorflow/model-remediation's
                    # MinDiffKernel and its LaplacianKernel: ``kernel(x, y)``): its __call__, of an
                    # instance built as the tests build it (gate.init.__init__ names the row after
                    # the class)
                    fw = "tensorflow" if "tensorflow" in sys.modules and "torch" not in sys.modules else "torch"
                    row.update(kind="methods", framework=fw, init=_params_of(obj.__init__, drop_first=True),
                               methods=[{"name": "__call__", "params": _params_of(_own_call(obj), drop_first=True)}])
                else:
                    row["skip"] = ("a class that is not an nn.Module, a Keras Layer or Loss, or an "
                                   "autograd.Function, and whose instances are not called")
            elif type(obj).__name__ in ("CustomOpDef",) and hasattr(obj, "_init_fn"):
                row.update(kind="custom_op", params=_params_of(obj._init_fn), framework="torch")
            elif inspect.isfunction(obj) or inspect.isbuiltin(obj) or callable(obj):
                if inspect.isfunction(obj) and getattr(obj, "__module__", mod_name) != mod_name:
                    row["skip"] = f"re-exported from {obj.__module__}"
                else:
                    fw = "torch"
                    if "tensorflow" in sys.modules and "torch" not in sys.modules:
                        fw = "tensorflow"
                    row.update(kind="function", params=_params_of(obj), framework=fw)
            else:
                row["skip"] = f"a {type(obj).__name__}, not callable"
            _emit(row)


def _own_call(cls):
    """The ``__call__`` a library's class defines or inherits from another of the library's
    classes (not ``object``'s, not a builtin's), or None."""
    for k in cls.__mro__:
        if (getattr(k, "__module__", "") or "").split(".")[0] in ("builtins", "abc", "typing"):
            return None
        f = vars(k).get("__call__")
        if f is not None:
            return f if inspect.isfunction(f) else None
    return None


def _no_forward(cls) -> bool:
    """An nn.Module class that defines no forward of its own (geoopt's manifolds: their
    operators are methods, ``norm``, ``inner``, ``expmap``)."""
    import torch

    fwd = getattr(cls, "forward", None)  # geoopt's Manifold: ``forward = NotImplemented``
    return fwd is getattr(torch.nn.Module, "forward", None) or not callable(fwd)


def _public_methods(cls) -> List[tuple]:
    """(name, function) of the public instance methods of ``cls``, its own and those it inherits
    from the library's classes (not torch's: ``nn.Module.to`` is no operator), first definition
    in the MRO winning."""
    out: Dict[str, Any] = {}
    for k in cls.__mro__:
        if (getattr(k, "__module__", "") or "").split(".")[0] in ("torch", "builtins", "abc", "typing"):
            break
        for n, f in vars(k).items():
            if n not in out and not n.startswith("_"):
                out[n] = f
    return [(n, f) for n, f in out.items() if inspect.isfunction(f)]


def _evaluate(spec, variant, seeds, timeout: float, keep: bool = False, need_all: bool = False, fixed_dims=None):
    """Outcome of the gate's runner for ``variant`` on ``seeds`` draws: ``("ok", None)`` as soon as
    one runs (``need_all``: when every one does), else the last failure's (status, message)."""
    import numpy as np

    from ..search.inputs import draw
    from ..oracles.registry import build_runner, hooks

    try:
        runner = build_runner(spec, variant)
    except _Deadline:
        raise
    except BaseException as exc:
        from ..search.evaluation import first_words

        return "error", first_words(exc)
    search_spec = hooks(spec, variant)[0]
    last = ("invalid", "no input")
    for s in range(seeds):
        rng = np.random.default_rng(1000 + s)
        try:
            cand = draw(search_spec, rng, size_scale=0.5 if s else 0.25, fixed_dims=fixed_dims)
        except Exception as exc:
            return "error", f"{type(exc).__name__}: {exc}"
        _arm(timeout)
        try:
            _, ev = runner.evaluate(cand, keep_outputs=keep)
        except _Deadline as exc:
            return "timeout", _no_answer(exc, timeout)
        except SystemExit as exc:
            return "crash", f"the operator called sys.exit({exc.code})"
        except Exception as exc:
            from ..search.evaluation import first_words

            last = ("crash", first_words(exc))
            if need_all:
                return last
            continue
        finally:
            _disarm()
        if ev.status == "ok":
            m = ev.metrics
            if m is not None and (m.numel == 0 or m.shape_mismatch):
                last = ("invalid", "empty output" if m.numel == 0 else f"output shape {m.shape_mismatch}")
                if need_all:
                    return last
                continue
            if m is not None and m.unmeasured:
                # runs, but does not measure the variant (a loss that computes in float32 whatever
                # its input: every run of the row would be not-measured, and the gate's check an
                # error): the row leaves the dtype out and says why (MONAI's FocalLoss)
                return "not-measured", f"not measured: {m.unmeasured}"
            if ev.reference is not None and not _some_finite(ev.reference):
                last = ("invalid", "the float64 output is NaN/Inf everywhere (inputs outside the domain)")
                if need_all:
                    return last
                continue
            if not need_all:
                return "ok", None
            continue
        last = (ev.status, ev.error or ev.status)
        if need_all:
            return last
    return ("ok", None) if need_all else last


def _some_finite(outputs) -> bool:
    import numpy as np

    floats = [o.array for o in outputs if o.is_float]
    return not floats or any(np.isfinite(np.asarray(a, dtype=np.float64)).any() for a in floats if np.size(a))


def probe_defaults(framework: str) -> dict:
    """The defaults a probed row is built with (the config reader's, every device)."""
    from ..ops.catalog import builtin_defaults

    defaults = builtin_defaults(framework)
    defaults["devices"] = ["cpu", "cuda"]
    return defaults


def probe(req: dict) -> None:
    from ..ops.spec import OpSpec
    from ..plan import variants_for

    timeout = float(req.get("timeout", 10.0))
    for op in req["ops"]:
        result: Dict[str, Any] = {"op": op["name"], "tries": []}
        chosen: Optional[dict] = None
        for i, cand in enumerate(op["candidates"]):
            try:
                defaults = probe_defaults(cand.get("framework", "torch"))
                spec = OpSpec.from_dict(cand, defaults, origin="user")
            except Exception as exc:
                result["tries"].append([i, "error", f"{type(exc).__name__}: {exc}"])
                continue
            from ..plan import Variant

            # a shape the tests used needs one draw that runs (the search skips invalid ones); a
            # guessed shape must run on every draw
            t0 = time.process_time()
            status, why = _evaluate(spec, Variant(dtype="float32"), 3, timeout, keep=True,
                                    need_all=i >= op.get("recorded", 0))
            first = time.process_time() - t0  # with a first call's costs: at least one evaluation's
            result["tries"].append([i, status, why])
            if status == "ok":
                chosen = cand
                result["chosen"] = i
                break
            if status == "timeout" or (why or "").startswith("the operator called sys.exit"):
                break  # a hang or an exit is the operator's, not the shape's: no more candidates
        if chosen is not None:
            trivial = _computes_nothing(spec, timeout)
            if trivial:  # an identity or a predicate on Python facts: nothing to measure, gated through its callers
                result["trivial"] = trivial
                _emit(result)
                continue
        if chosen is not None and op.get("narrow") and i < op.get("recorded", 0) and (
                first > float(op["narrow"]) or _tops(spec)):  # ranged dims: measured at their tops
            narrowed = _narrowed(chosen, defaults, timeout, float(op["narrow"]))
            if narrowed is not None:
                chosen, result["narrowed"] = narrowed
                result["candidate"] = chosen
                spec = OpSpec.from_dict(chosen, defaults, origin="user")
        if chosen is not None and op.get("options"):
            # values the type hints allow (Literal[...], a bool's other value), each kept only if
            # the operator runs with it
            ok: Dict[str, list] = {}
            for pname, values in op["options"].items():
                for v in values:
                    trial = dict(chosen, params={**(chosen.get("params") or {}), pname: v if not isinstance(v, list)
                                                 else {"value": v}})
                    try:
                        tspec = OpSpec.from_dict(trial, defaults, origin="user")
                    except Exception:
                        continue
                    # keep: a value where the float64 output is NaN everywhere is outside the domain
                    if _evaluate(tspec, Variant(dtype="float32"), 2, timeout, keep=True, need_all=True)[0] == "ok":
                        ok.setdefault(pname, []).append(v)
            result["options"] = ok
        if chosen is not None and op.get("reach"):
            # sizes past the tests' (a position past 2048 in float16, a reduction of 4096 terms:
            # keras-hub's rotary embedding, tested on 4 positions): each dim that runs at the
            # reach gets it, aimed at by the search's size mutation, its draws staying the tests'
            reach: Dict[str, int] = {}
            narrowed_dims = (result.get("narrowed") or {}).get("sizes") or {}
            for d, rng_ in (chosen.get("dims") or {}).items():
                top = int(op["reach"])
                if d in narrowed_dims:  # too slow at the tests' sizes: not aimed past them
                    continue
                if not (isinstance(rng_, list) and len(rng_) == 2 and all(isinstance(x, int) for x in rng_)
                        and rng_[1] < top):
                    continue
                trial = dict(chosen, dims={**chosen["dims"], d: [rng_[0], rng_[1], top]})
                try:
                    tspec = OpSpec.from_dict(trial, defaults, origin="user")
                except Exception:
                    continue
                if _evaluate(tspec, Variant(dtype="float32"), 2, timeout, fixed_dims={d: top})[0] == "ok":
                    reach[d] = top
            if i < op.get("recorded", 0):
                # one size the tests never varied pins the row as much as no range does: each that
                # runs at the reach becomes a dim of its own, aimed at the same way (a size
                # narrowed for cost is not aimed past the tests')
                narrowed_to = {int(v[1]) for k, v in narrowed_dims.items() if k.split(" ")[0].isdigit()}
                widened = _literal_reach(chosen, defaults, timeout, int(op["reach"]), skip=narrowed_to)
                if widened is not None:
                    chosen, more = widened
                    reach.update(more)
                    result["candidate"] = chosen
                    spec = OpSpec.from_dict(chosen, defaults, origin="user")
            result["reach"] = reach
        if chosen is not None:
            variants = {}
            took = []
            for v in variants_for(spec, available_devices=("cpu",)):
                t0 = time.process_time()
                status, why = _evaluate(spec, v, 3, timeout)
                variants[v.key] = [status, why]
                if status == "ok":
                    took.append(time.process_time() - t0)
            result["variants"] = variants
            if took:  # CPU seconds of one evaluation (the quickest variant's: its first call's costs paid before)
                result["seconds"] = round(min(took), 4)
        _emit(result)


def _computes_nothing(spec, timeout: float) -> Optional[str]:
    """Why a row measures nothing, or None: on every one of a few draws the operator returns one
    of its own arguments unchanged (``identity``, ``default(v, d)``, ``nn.Identity``: the same
    object, its values untouched, so an in-place operator is not one) or a Python ``bool`` /
    ``None`` (``exists(v)``: a fact about its argument, not a value computed from it). Such helpers
    were half the rows init wrote for hyper-connections (32 rows, refresh 498-898 s); a change to
    one still reaches the operators that call it."""
    import numpy as np

    from ..oracles.registry import build_runner
    from ..plan import Variant
    from ..search.inputs import draw

    kinds = set()
    try:
        runner = build_runner(spec, Variant(dtype="float32"))
        for s in range(3):
            cand = runner.quantize(draw(spec, np.random.default_rng(2000 + s), size_scale=0.25 if s else 0.1))
            args, kwargs = runner.build_call(cand, "float32", low=True)
            flat = [x for a in args for x in (a if isinstance(a, list) else [a])]  # a pack's items
            named = [(t.name, a) for t, a in zip([t for t in spec.inputs if not t.keyword], flat)]
            named += [(k, v) for k, v in kwargs.items() if k in cand.arrays]
            _arm(timeout)
            try:
                out = runner.backend.call(runner.fn, args, kwargs, mode="input", dtype="float32", device="cpu")
            finally:
                _disarm()
            if out is None or isinstance(out, bool):
                kinds.add("a Python bool or None")
                continue
            same = next((n for n, a in named if out is a), None)
            if same is None:
                return None
            got = runner.backend.to_outputs(out)
            want = np.asarray(cand.arrays[same], dtype=np.float64)
            if len(got) != 1 or not np.array_equal(np.asarray(got[0].array, dtype=np.float64), want, equal_nan=True):
                return None  # written in place: a computation
            kinds.add(f"its argument {same} unchanged")
    except _Deadline:
        raise
    except Exception:
        return None  # what it does with other inputs is the probe's question, not this one's
    return ("computes nothing to measure: it returns " + " or ".join(sorted(kinds))
            + " (a change to it reaches the operators that call it)") if kinds else None


#: a size init does not narrow a row's sizes below (nor narrows from): rows, heads, small
#: channels and kernel sizes stay as the tests have them
NARROW_FLOOR = 16
#: at most this many trial evaluations to narrow one row (each at most the row's own cost)
NARROW_TRIES = 12


def _tops(spec) -> Dict[str, int]:
    """Each ranged dim of ``spec`` at the top of its drawn range (where a bound is a plain integer)."""
    return {name: int(hi) for name, (lo, hi) in spec.dims if _is_int(lo) and _is_int(hi) and hi > lo}


def _cpu_seconds(spec, timeout: float) -> Optional[float]:
    """CPU seconds of one float32 evaluation of ``spec`` (the first draw that runs) with its ranged
    dims at the top of their ranges, where the search's draws go (the probe's own draws stay
    small: hyper-connections' ``sinkhorn_knopps``, its C drawn in [1, 1024], cost 1 s an
    evaluation in refresh and was never narrowed), or None when none runs."""
    from ..plan import Variant

    t0 = time.process_time()
    if _evaluate(spec, Variant(dtype="float32"), 1, timeout, keep=True, fixed_dims=_tops(spec) or None)[0] != "ok":
        return None
    return time.process_time() - t0


def _is_int(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool)


def _size_groups(cand: dict) -> Dict[tuple, int]:
    """The sizes of a candidate spec that can be narrowed: ``("dim", name)`` for a dim's range
    (``[lo, hi]``: its top), ``("size", n)`` for the literal entries equal to ``n`` in the inputs'
    shapes (the tests' call at ``[2, 2048, 512]``: the entries of 2048 are narrowed together, so
    that ``q``, ``k``, ``v`` and a mask of one sequence stay of one length). Each maps to its size."""
    groups: Dict[tuple, int] = {}
    for d, r in (cand.get("dims") or {}).items():
        if isinstance(r, list) and len(r) == 2 and all(_is_int(x) for x in r) and r[1] > NARROW_FLOOR:
            groups[("dim", d)] = r[1]
    for t in cand.get("inputs") or ():
        for n in (t.get("shape") or ()) if isinstance(t, dict) else ():
            if _is_int(n) and n > NARROW_FLOOR:
                groups[("size", n)] = n
    return groups


def _most_places(cand: dict, n: int) -> int:
    """The most entries equal to ``n`` in one input's literal shape."""
    return max((sum(1 for x in t.get("shape") or () if _is_int(x) and x == n)
                for t in cand.get("inputs") or () if isinstance(t, dict)), default=0)


def _with_group(cand: dict, origin: dict, key: tuple, new: int) -> dict:
    """``cand`` with the sizes of group ``key`` made ``new``; ``origin``: the candidate as the
    tests had it (a literal entry belongs to a group by its size there, not by its size now)."""
    out = dict(cand)
    if key[0] == "dim":
        lo, _ = cand["dims"][key[1]]
        out["dims"] = {**cand["dims"], key[1]: [max(1, min(lo, new)), new]}
        return out
    inputs = []
    for t, t0 in zip(cand["inputs"], origin["inputs"]):
        if isinstance(t, dict) and t.get("shape"):
            shape, k = [], 0
            for n, n0 in zip(t["shape"], t0["shape"]):
                if _is_int(n0) and n0 == key[1]:
                    shape.append(new if len(key) == 2 or key[2] == k else n)
                    k += 1
                else:
                    shape.append(n)
            t = dict(t, shape=shape)
        inputs.append(t)
    out["inputs"] = inputs
    return out


def _narrowed(cand: dict, defaults: dict, timeout: float, target: float):
    """``(candidate, what was narrowed)`` for a row built from the tests' calls whose float32
    evaluation costs more than ``target`` CPU seconds: its largest sizes halved, one group at a
    time (largest first), each halving kept where the operator still runs, until an
    evaluation costs ``target`` or less, no size is above :data:`NARROW_FLOOR`, or
    :data:`NARROW_TRIES` trials are spent; None when the row is cheap enough as it is (or no
    halving runs). A size tied to something else (a layer built with ``dim=512`` takes inputs of
    512 features) does not run halved and stays as it is; so does a size whose halving does not
    cut the cost by a fifth (an operator slow whatever its sizes keeps the tests' sizes).

    Why: an operator the tests call at their own sizes can cost seconds an evaluation on a CPU
    runner (lucidrains' memory-efficient attention at a sequence of 2048: 2.9-5.2 s of CPU),
    while a run's default budget gives each variant seconds for the evaluations a pass needs;
    such a row was reported under-searched, an error, on every pull request. Precision defects
    of this kind (a max-shift, a mask, an accumulation order) show at smaller sizes of the same
    shape, which the search's inputs reach in a run's budget."""
    from ..ops.spec import OpSpec

    spec = OpSpec.from_dict(cand, defaults, origin="user")
    start = _cpu_seconds(spec, timeout)
    if start is None or start <= target:
        return None
    now = start
    origin = cand
    sizes = _size_groups(cand)
    fixed = set()
    moved: Dict[str, list] = {}
    tries = 0
    while now > target and tries < NARROW_TRIES:
        open_ = [(n, k) for k, n in sizes.items() if k not in fixed and n // 2 >= NARROW_FLOOR]
        if not open_:
            break
        n, key = max(open_, key=lambda x: x[0])
        trial = _with_group(cand, origin, key, n // 2)
        tries += 1
        try:
            t = _cpu_seconds(OpSpec.from_dict(trial, defaults, origin="user"), timeout)
        except _Deadline:
            raise
        except Exception:
            t = None
        if t is None or t > 0.8 * now:  # does not run, or costs as much (the cost is not this size's)
            fixed.add(key)
            if t is None and len(key) == 2 and key[0] == "size":
                # one size in two places of a tensor ([2, 128, 128]: a sequence of 128 and 128
                # features): its first places and its second places may be two things
                places = _most_places(origin, key[1])
                if places > 1:
                    sizes.update({("size", key[1], j): n for j in range(places)})
            continue
        cand, now, sizes[key] = trial, t, n // 2
        name = key[1] if key[0] == "dim" else str(key[1]) + ("" if len(key) == 2 else f" (place {key[2] + 1})")
        moved.setdefault(name, [n, n // 2])[1] = n // 2
    if not moved:
        return None
    return cand, {"sizes": moved, "seconds": [round(start, 4), round(now, 4)]}


#: at most this many trial evaluations to give a row's literal sizes a reach
LITERAL_TRIES = 6
#: a literal size grows by this factor at a step towards its reach, and stops growing where one
#: evaluation cost more than the probe's timeout over REACH_COST_DIVISOR of CPU time (a cubic
#: cost then stays within the timeout at the next step)
REACH_STEP = 4
REACH_COST_DIVISOR = 64


def _literal_sizes(cand: dict) -> Dict[int, int]:
    """The literal sizes in a candidate's input shapes: each size with the most places it takes
    in one input's shape."""
    out: Dict[int, int] = {}
    for t in cand.get("inputs") or ():
        if not isinstance(t, dict):
            continue
        shape = t.get("shape") or ()
        for n in shape:
            if _is_int(n) and n >= 1:
                out[n] = max(out.get(n, 0), sum(1 for x in shape if _is_int(x) and x == n))
    return out


def _free_name(cand: dict, base: str) -> str:
    taken = set(cand.get("dims") or {}) | set(cand.get("params") or {}) | {
        t.get("name") for t in cand.get("inputs") or () if isinstance(t, dict)}
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def _as_dim(cand: dict, n: int, name: str, place: Optional[int]) -> dict:
    """``cand`` with the literal entries equal to ``n`` (only the ``place``-th of each shape,
    where given) replaced by a new dim ``name`` of range ``[n, n]``."""
    inputs = []
    for t in cand.get("inputs") or ():
        if isinstance(t, dict) and t.get("shape"):
            shape, k = [], 0
            for x in t["shape"]:
                if _is_int(x) and x == n:
                    shape.append(name if place is None or place == k else x)
                    k += 1
                else:
                    shape.append(x)
            t = dict(t, shape=shape)
        inputs.append(t)
    return dict(cand, dims={**(cand.get("dims") or {}), name: [n, n]}, inputs=inputs)


def _literal_reach(cand: dict, defaults: dict, timeout: float, top: int, skip=frozenset()):
    """``(candidate, {dim: reach})`` where sizes the tests never varied (a literal entry of the
    inputs' shapes: every call at ``[2, 4, 1]``) run past them: each such size becomes a dim
    ``S<n>`` of range ``[n, n]`` (draws stay the tests'), which the search's size mutation aims
    past, up to its reach, as it does a dim's: ``top``, or the size where one evaluation began to
    cost (grown four times at a step). The entries of one size move together (``q``
    and ``k`` of one length); where they do not run so, each place in a shape is tried alone
    (``[4, 4]``: a count of four and four features). A size tied to something else (a layer
    built for 64 features, a 3-vector) does not run past itself and stays literal, and so do the
    sizes in ``skip`` (narrowed for cost). None when none runs.

    Why: a test calls an operator at one shape, and precision defects grow with sizes it never
    used: hyper-connections' ``sinkhorn_knopps``, tested only on ``[..., 4, 1]`` (a normalisation
    over one element gives 1 exactly), measured nothing of the float16 arithmetic its revert
    brought back."""
    from ..ops.spec import OpSpec
    from ..plan import Variant

    def reached(trial: dict, name: str, n: int) -> int:
        """The largest size of ``name`` up to ``top`` the row runs at, grown from ``n`` four times
        at a step while an evaluation costs little (0 when it does not run past ``n``)."""
        size, ran = n, 0
        while size < top:
            size = min(top, size * REACH_STEP)
            aimed = dict(trial, dims={**trial["dims"], name: list(trial["dims"][name]) + [size]})
            try:
                tspec = OpSpec.from_dict(aimed, defaults, origin="user")
            except Exception:
                return ran
            t0 = time.process_time()
            if _evaluate(tspec, Variant(dtype="float32"), 2, timeout, fixed_dims={name: size})[0] != "ok":
                return ran
            ran = size
            if time.process_time() - t0 > timeout / REACH_COST_DIVISOR:
                # the next step may cost REACH_STEP^3 as much (a matrix built from the size):
                # one native call the time limit cannot interrupt (geotorch's Stiefel makes an
                # n x n skew matrix of an [n, k] input and exponentiates it: at n = 4096 one
                # float64 call ran for minutes and init's probe with it)
                break
        return ran

    reach: Dict[str, int] = {}
    tries = 0

    def attempt(n: int, place: Optional[int]) -> bool:
        """Make size ``n`` (its ``place``-th entries only, where given) a dim, if it runs past ``n``."""
        nonlocal cand, tries
        tries += 1
        name = _free_name(cand, f"S{n}" if place is None else f"S{n}_{place + 1}")
        trial = _as_dim(cand, n, name, place)
        got = reached(trial, name, n)
        if got <= n:
            return False
        cand, reach[name] = trial, got
        return True

    for n, places in sorted(_literal_sizes(cand).items()):
        if n >= top or n in skip or tries >= LITERAL_TRIES or attempt(n, None):
            continue
        # the last place first: a place made a dim leaves the places before it where they were
        for j in reversed(range(places if places > 1 else 0)):
            if tries >= LITERAL_TRIES:
                break
            attempt(n, j)
    return (cand, reach) if reach else None


def check(req: dict) -> None:
    """One evaluation per row as refresh and run will read it: the config's text parsed by the
    gate's own reader, each named row run once (float32 where it has it)."""
    from pathlib import Path

    from ..config import parse_config
    from ..plan import Variant

    timeout = float(req.get("timeout", 10.0))
    cfg = parse_config(req["text"], Path(req["path"]), Path(req["root"]))
    specs = {s.name: s for s in cfg.ops}
    for name in req["ops"]:
        spec = specs.get(name)
        if spec is None:
            _emit({"op": name, "status": "error", "why": "not in the file as read back"})
            continue
        dtype = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
        status, why = _evaluate(spec, Variant(dtype=dtype), 3, timeout)
        _emit({"op": name, "status": status, "why": why})


def deadline_signals() -> Dict[int, Any]:
    """Make the CPU-time limit (SIGPROF) and its wall-clock backstop (SIGALRM) of
    :func:`_arm` raise :class:`_Deadline`; returns the handlers they had."""

    def on_alarm(signum, frame):
        raise _Deadline(signum)

    return {s: signal.signal(s, on_alarm) for s in (signal.SIGALRM, signal.SIGPROF)}


def main(argv: Optional[List[str]] = None) -> int:
    from ..backends.isolate import _die_with_parent, _limit_memory

    argv = list(sys.argv[1:] if argv is None else argv)
    with open(argv[0]) as fh:
        req = json.load(fh)
    _die_with_parent()
    _limit_memory(req.get("memory"))

    deadline_signals()
    if req.get("cwd"):
        os.chdir(req["cwd"])
    sys.path[:0] = [p for p in req.get("sys_path", []) if p not in sys.path]
    sys.stdout = sys.stderr  # the library's prints must not corrupt the answers
    import warnings

    warnings.simplefilter("ignore")
    if req["job"] == "classify":
        classify(req)
    elif req["job"] == "check":
        check(req)
    else:
        probe(req)
    _emit({"done": True})
    sys.stdout.flush()
    os._exit(0)  # no atexit / interpreter teardown of the library's threads


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main())
