"""Seeds from existing tests (Opera): operator calls that human-written tests make, turned into
candidates of the operator's spec and run before anything is generated.

Two sources:

* **harvested** calls of a project's own test suite (``dl-gate harvest -- pytest ...``, see
  :mod:`gate.search.harvest`), stored beside the baselines::

      <baselines>/seeds/index.json            {"version": 1, "ops": {op: [{"file", "source",
                                                "shapes", "dtypes", "params"}]}}
      <baselines>/seeds/<op>/<digest>.npz     one candidate (Candidate.save: arrays + dims/params)

* **OpInfo** sample inputs of PyTorch's own test database
  (``torch.testing._internal.common_methods_invocations.op_db``) for catalogue rows that name
  their entry with an ``opinfo:`` key. The database is slow to import and needs ``expecttest``:
  converted seeds are cached on disk per torch version and spec
  (``$DL_GATE_CACHE`` or ``~/.cache/dl-gate``/opinfo/...).

A recorded call becomes a candidate by binding its arguments to names (the callable's signature,
else the ``name(args) -> ...`` first line of its docstring, as torch builtins have), mapping
positional tensors to the spec's positional inputs and everything else by name, solving the
spec's dims from the tensor shapes, and checking derived parameters. Calls the spec cannot
express (another rank, a tensor where a value is expected, an unserialisable argument) are
skipped with a reason. Values are replayed as recorded; tensors recorded without values (too
large) are regenerated from the spec's value domain.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import HARNESS_VERSION
from ..ops import expr
from ..ops.spec import OpSpec
from .coverage import classify, dim_envelope
from .inputs import Candidate, derived_params, draw_values, tensor_shape

INDEX = "index.json"


@dataclass
class TensorArg:
    """A tensor argument as recorded: shape, dtype and (when small enough) its values."""

    shape: Tuple[int, ...]
    dtype: str
    values: Optional[np.ndarray] = None
    #: ``"module:Class"`` of a library's tensor subclass the tests passed (None: a plain tensor)
    cls: Optional[str] = None


class TensorSeq(list):
    """A list or tuple argument whose items are all tensors, as recorded (``quat_composition([q0,
    q1])``): the values of an input pack (:attr:`gate.ops.spec.TensorSpec.pack`)."""


class Opaque:
    """An argument that cannot be replayed (a dtype object, a module, a callable...)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"<{self.text}>"


@dataclass
class CallRecord:
    """One recorded call of an operator."""

    op: str
    args: List[Any]
    kwargs: Dict[str, Any]
    source: str = ""  # the test that made it, or "opinfo:<name>"
    fn: Optional[Callable] = field(default=None, repr=False)  # the callable actually called
    #: ``call``, or ``init``: a class operator's construction (its constructor's arguments)
    kind: str = "call"
    #: a construction's id (``init``), or the construction of the instance called (``call``)
    ctor: Optional[str] = None


# ---------------------------------------------------------------------------------------
# binding a call to the spec
# ---------------------------------------------------------------------------------------
_DOC_START = re.compile(r"\s*[\w.]+\(")


def parameter_names(fn: Optional[Callable]) -> Optional[List[str]]:
    """Names of ``fn``'s parameters in order (``None`` if neither its signature nor its
    docstring's first line tells)."""
    if fn is None:
        return None
    try:
        params = list(inspect.signature(fn).parameters.values())
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return [p.name for p in params]
    except (TypeError, ValueError):
        pass
    inner = _doc_arguments(getattr(fn, "__doc__", None) or "")
    if inner is None:
        return _aten_names(fn)
    names, depth, cur = [], 0, ""
    for ch in inner + ",":
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            part = cur.split("=")[0].split(":")[0].strip()
            if part and part not in ("*", "/") and not part.startswith("*"):
                names.append(part)
            cur = ""
        else:
            cur += ch
    return names


def _signature_defaults(fn: Optional[Callable]) -> Dict[str, Any]:
    """``fn``'s keyword defaults that are plain values (empty when it has no signature)."""
    try:
        params = inspect.signature(fn).parameters.values() if fn is not None else []
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params
            if p.default is not inspect.Parameter.empty and isinstance(p.default, (bool, int, float, str, tuple, list))}


def _doc_arguments(doc: str) -> Optional[str]:
    """The argument list of a ``name(args) -> T`` first paragraph of a docstring (torch
    builtins document their signature that way), or ``None``."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = _DOC_START.match(para)
    if not m:
        return None
    depth, i = 1, m.end()
    while i < len(para) and depth:
        depth += {"(": 1, ")": -1}.get(para[i], 0)
        i += 1
    if depth:
        return None
    rest = para[i:].lstrip()
    if rest and not rest.startswith(("->", ":")):
        return None
    return para[m.end():i - 1]


def _aten_names(fn: Callable) -> Optional[List[str]]:
    """Argument names from the ATen schema of a torch builtin (only if torch is loaded)."""
    from ..backends.torch_seeds import aten_argument_names

    return aten_argument_names(fn)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


class _Reject(Exception):
    """Why a recorded call cannot become a candidate of the spec."""


def candidate_from_call(spec: OpSpec, rec: CallRecord, rng: Optional[np.random.Generator] = None
                        ) -> Tuple[Optional[Candidate], str]:
    """The candidate of ``spec`` that replays ``rec``, or ``(None, reason)``: the call's tensors
    bound to the spec's inputs, its other arguments to the declared parameters, the dims read
    from the shapes, the derived parameters checked, the arrays taken (or drawn where the
    recording kept no values)."""
    rng = rng or np.random.default_rng(0)
    try:
        tensors, bound = _bind_tensors(spec, rec)
        params = _call_params(spec, rec, bound)
        dims = _dims_from_shapes(spec, tensors, params)
        full = _derived(spec, params, dims)
        arrays = _call_arrays(spec, tensors, {**full, **dims}, rng)
    except _Reject as why:
        return None, str(why)
    return Candidate(dims=dims, params=full, arrays=arrays, origin=f"seed:{rec.source}" if rec.source else "seed"), ""


def _bind_tensors(spec: OpSpec, rec: CallRecord) -> Tuple[Dict[str, "TensorArg"], Dict[str, Any]]:
    """(input name -> the call's tensor, the call's other arguments by name). An input pack
    takes one list argument: its items, one to one."""
    positional = _slots([t for t in spec.inputs if not t.keyword])
    keyword = _slots([t for t in spec.inputs if t.keyword])
    names = parameter_names(rec.fn)
    bound: Dict[str, Any] = {}
    tensors: Dict[str, TensorArg] = {}
    args = list(rec.args)
    if names is not None:
        if len(args) > len(names):
            raise _Reject(f"{len(args)} positional arguments for {len(names)} parameters")
        for i, slot in enumerate(positional):
            if i >= len(names):
                raise _Reject(f"no parameter for input {_slot_name(slot)}")
            _fill(tensors, slot, args[i] if i < len(args) else rec.kwargs.get(names[i]))
        for i in range(len(positional), len(args)):
            bound[names[i]] = args[i]
        for k, v in rec.kwargs.items():
            if k in names[: len(positional)]:
                continue
            bound[k] = v
    else:
        if positional and isinstance(positional[-1], list) and positional[-1][0].pack.startswith("*"):
            # the function's *args: the positional arguments after the named ones, as one pack
            named = len(positional) - 1
            args = args[:named] + [TensorSeq(args[named:])] if len(args) > named else args
        if len(args) != len(positional):
            raise _Reject("positional arguments other than the spec's inputs and no signature to name them")
        for slot, a in zip(positional, args):
            _fill(tensors, slot, a)
        bound.update(rec.kwargs)
    for slot in keyword:
        _fill(tensors, slot, bound.pop(_slot_name(slot), None))
    return tensors, bound


def _slots(inputs: Sequence) -> List[Any]:
    """The arguments ``inputs`` fill, in order: an input, or a pack's list of inputs."""
    out: List[Any] = []
    for t in inputs:
        if t.pack and out and isinstance(out[-1], list) and out[-1][0].pack == t.pack:
            out[-1].append(t)
        else:
            out.append([t] if t.pack else t)
    return out


def _slot_name(slot: Any) -> str:
    return slot[0].pack if isinstance(slot, list) else slot.name


def _fill(tensors: Dict[str, "TensorArg"], slot: Any, val: Any) -> None:
    """The call's value ``val`` of one argument into ``tensors`` (a pack: item by item)."""
    if isinstance(slot, list):
        if not isinstance(val, TensorSeq) or len(val) != len(slot) or not all(isinstance(x, TensorArg) for x in val):
            raise _Reject(f"argument {slot[0].pack} is not a list of {len(slot)} tensors in this call")
        tensors.update({t.name: v for t, v in zip(slot, val)})
        return
    if not isinstance(val, TensorArg):
        raise _Reject(f"input {slot.name} missing or not a tensor")
    tensors[slot.name] = val


def _call_params(spec: OpSpec, rec: CallRecord, bound: Dict[str, Any]) -> Dict[str, Any]:
    """The call's arguments as the spec's declared parameters."""
    params: Dict[str, Any] = {}
    for k, v in bound.items():
        if isinstance(v, TensorArg):
            raise _Reject(f"tensor argument {k} is not an input of the spec")
        if isinstance(v, Opaque):
            raise _Reject(f"argument {k}={v!r} cannot be replayed")
        params[k] = tuple(v) if isinstance(v, list) else v
    # parameters as the spec declares them: an argument the spec does not declare is dropped
    # (its meaning is unknown to the oracle: dropout_p=0.5 makes the output random), a declared
    # one outside its declared space rejects the call (kernel_size=(2, 2) where ints are
    # declared), a declared one the call leaves out takes the spec's default (rms_norm's eps
    # would otherwise default per dtype: 1.2e-7 at half, 2.2e-16 in the float64 reference)
    declared = {p.name: p for p in spec.params}
    dropped = sorted(k for k in params if k not in declared)
    for k in dropped:
        del params[k]
    fn_defaults = _signature_defaults(rec.fn)
    for p in declared.values():
        if p.kind == "expr":
            continue
        if p.name not in params:
            # the value the call really used (the function's own default) when the signature
            # says it; a None default is computed at run time (often per dtype): the spec's
            value = fn_defaults.get(p.name)
            if value is None:
                value = p.default
            if value is not None:
                params[p.name] = tuple(value) if isinstance(value, list) else value
            continue
        v = params[p.name]
        if p.kind == "choice" and p.choices is not None and not any(_same(v, c) for c in p.choices):
            raise _Reject(f"{p.name}={v!r} is not one of the declared choices {list(p.choices)}")
        if p.kind in ("int", "float") and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                               and p.lo <= v <= p.hi):
            raise _Reject(f"{p.name}={v!r} is outside the declared range [{p.lo}, {p.hi}]")
    return params


def _dims_from_shapes(spec: OpSpec, tensors: Dict[str, "TensorArg"], params: Dict[str, Any]) -> Dict[str, int]:
    # dims from shapes
    dims: Dict[str, int] = {}
    pending: List[Tuple[Any, int, str]] = []
    dim_names = {n for n, _ in spec.dims}
    for t in spec.inputs:
        shape = tuple(tensors[t.name].shape)
        if len(shape) != len(t.shape):
            raise _Reject(f"input {t.name} has rank {len(shape)}, the spec {len(t.shape)}")
        for e, n in zip(t.shape, shape):
            if isinstance(e, int):
                if e != n:
                    raise _Reject(f"input {t.name}: size {n} where the spec fixes {e}")
            elif isinstance(e, str) and e in dim_names:
                if dims.setdefault(e, int(n)) != int(n):
                    raise _Reject(f"dim {e} is both {dims[e]} and {n}")
            else:
                pending.append((e, int(n), t.name))
    exprs = {p.name: p.expr for p in spec.params if p.kind == "expr"}
    for pname, e in exprs.items():
        if isinstance(e, str) and e in dim_names and e not in dims and isinstance(params.get(pname), int):
            dims[e] = int(params[pname])
    env_dims = dim_envelope(spec)
    for e, n, tname in pending:
        unknown = [x for x in expr.names(e) if x in dim_names and x not in dims]
        if len(unknown) == 1:
            lo, hi = env_dims[unknown[0]]
            top = int(min(hi if math.isfinite(hi) else n, max(n, lo))) + 1
            for v in range(int(lo), max(top, int(lo) + 1)):
                try:
                    if int(expr.evaluate(e, {**params, **dims, unknown[0]: v})) == n:
                        dims[unknown[0]] = v
                        break
                except Exception:
                    break
    for name, (lo_e, _) in spec.dims:
        if name not in dims:
            try:
                dims[name] = int(expr.evaluate(lo_e, {**params, **dims}))
            except Exception:
                raise _Reject(f"cannot tell dim {name} from the call")
    return dims


def _derived(spec: OpSpec, params: Dict[str, Any], dims: Dict[str, int]) -> Dict[str, Any]:
    """The spec's parameters, derived ones included (a recorded derived value must agree)."""
    exprs = {p.name: p.expr for p in spec.params if p.kind == "expr"}
    recorded_derived = {k: params.pop(k) for k in list(params) if k in exprs}
    try:
        full = derived_params(spec, params, dims)
    except Exception as exc:
        raise _Reject(f"derived parameters: {exc}")
    for k, v in recorded_derived.items():
        if not _same(full.get(k), v):
            raise _Reject(f"{k}={v!r} is not what the spec derives ({full.get(k)!r})")
    return full


def _call_arrays(spec: OpSpec, tensors: Dict[str, "TensorArg"], env: Dict[str, Any],
                 rng: np.random.Generator) -> Dict[str, np.ndarray]:
    arrays: Dict[str, np.ndarray] = {}
    for t in spec.inputs:
        ta = tensors[t.name]
        try:
            want = tensor_shape(t, env)
        except Exception as exc:
            raise _Reject(f"input {t.name}: {exc}")
        if want != tuple(ta.shape):
            raise _Reject(f"input {t.name}: shape {tuple(ta.shape)} does not fit the spec's {want}")
        if ta.values is not None:
            arr = np.asarray(ta.values)
            arrays[t.name] = (arr.astype(np.int64) if t.kind == "index" else arr.astype(bool) if t.kind == "bool"
                              else arr.astype(np.float64))
        elif t.kind == "index":
            hi = int(expr.evaluate(t.index_hi, env)) if t.index_hi is not None else 2
            arrays[t.name] = rng.integers(0, max(hi, 1), size=want).astype(np.int64)
        elif t.kind == "bool":
            arrays[t.name] = rng.random(want) < 0.5
        else:
            arrays[t.name] = draw_values(t.domain, want, rng)
    return arrays


# ---------------------------------------------------------------------------------------
# prioritising seeds (Opera: novelty of value classes first)
# ---------------------------------------------------------------------------------------
def prioritise(spec: OpSpec, seeds: Sequence[Candidate], dtype: str = "float32", limit: Optional[int] = None
               ) -> List[Candidate]:
    """Greedy order by additional coverage: each next seed adds the most uncovered single
    classes (then pairs); duplicates of covered classes go last. Stable for ties."""
    sets = []
    for c in seeds:
        classes, _ = classify(spec, c, dtype)
        singles = {(k, v) for k, vs in classes.items() for v in vs}
        items = sorted(singles)
        pairs = {(a, b) for i, a in enumerate(items) for b in items[i + 1:] if a[0] != b[0]}
        sets.append((singles, pairs))
    left = list(range(len(seeds)))
    seen_s: set = set()
    seen_p: set = set()
    order: List[int] = []
    while left:
        best = max(left, key=lambda i: (len(sets[i][0] - seen_s), len(sets[i][1] - seen_p), -i))
        order.append(best)
        left.remove(best)
        seen_s |= sets[best][0]
        seen_p |= sets[best][1]
    out = [seeds[i] for i in order]
    return out[:limit] if limit is not None else out


# ---------------------------------------------------------------------------------------
# OpInfo
# ---------------------------------------------------------------------------------------
#: version of the rules that turn a sample call into a seed (bumped when they change, so cached
#: seeds made under older rules are not reused)
SEED_RULES = 3


def cache_root() -> Path:
    return Path(os.environ.get("DL_GATE_CACHE") or Path.home() / ".cache" / "dl-gate")


def spec_digest(spec: OpSpec) -> str:
    return hashlib.sha1(json.dumps(spec.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:12]


def opinfo_records(name: str, max_elems: int = 1 << 16) -> Tuple[List[CallRecord], str]:
    """Sample calls of OpInfo entry ``name`` (``"nn.functional.conv2d"``, or with a variant test
    name ``"softmax[with_dtype]"``), or a reason; the torch side is
    :func:`gate.backends.torch_seeds.opinfo_samples`."""
    from ..backends.torch_seeds import opinfo_samples

    samples, why = opinfo_samples(name, max_elems, tensor=TensorArg, opaque=Opaque)
    return [CallRecord(op=name, args=args, kwargs=kwargs, source=f"opinfo:{name}", fn=fn)
            for args, kwargs, fn in samples], why


def opinfo_seeds(spec: OpSpec, cache_dir: Optional[Path] = None) -> Tuple[List[Candidate], str]:
    """Seeds of ``spec`` from its OpInfo samples (cached on disk), and a note on what happened."""
    if spec.framework != "torch" or not getattr(spec, "opinfo", None):
        return [], "no opinfo key"
    from ..backends.torch_seeds import torch_version

    try:
        version = torch_version()
    except Exception as exc:  # pragma: no cover - torch ops without torch
        return [], f"torch not importable: {exc}"
    root = (cache_dir or cache_root()) / "opinfo" / f"torch-{version}-h{HARNESS_VERSION}-s{SEED_RULES}" / \
        f"{_safe(spec.name)}-{spec_digest(spec)}"
    index = root / INDEX
    if index.exists():
        meta = json.loads(index.read_text())
        return [Candidate.load(root / f) for f in meta.get("files", [])], meta.get("note", "cached")
    records, why = opinfo_records(spec.opinfo)
    cands: List[Candidate] = []
    skipped: Dict[str, int] = {}
    for r in records:
        cand, reason = candidate_from_call(spec, r)
        if cand is None:
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            cands.append(cand)
    note = why or f"{len(cands)} of {len(records)} samples fit the spec"
    if why and not records:
        return [], note  # not cached: the database may become importable later
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for i, c in enumerate(cands):
        f = f"sample{i:03d}.npz"
        c.save(root / f)
        files.append(f)
    index.write_text(json.dumps({"op": spec.name, "opinfo": spec.opinfo, "files": files, "note": note,
                                 "skipped": skipped}, indent=1))
    return cands, note


# ---------------------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------------------
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


#: the most calls recorded from the library's tests that every verdict of an operator is made on
TESTS_CALLS = 8


class SeedStore:
    """Seeds for each operator: harvested ones under ``root`` (``<baselines>/seeds``) and, for
    torch rows with an ``opinfo`` key, OpInfo samples."""

    def __init__(self, root: Optional[os.PathLike] = None, *, opinfo: bool = True, cache_dir: Optional[Path] = None):
        self.root = Path(root) if root is not None else None
        self.opinfo = opinfo
        self.cache_dir = cache_dir
        self.last_sources: Dict[str, Any] = {}

    # -- reading ------------------------------------------------------------------------
    def harvested(self, spec: OpSpec) -> List[Candidate]:
        if self.root is None:
            return []
        d = self.root / _safe(spec.name)
        if not d.is_dir():
            return []
        out = []
        for f in sorted(d.glob("*.npz")):
            try:
                out.append(Candidate.load(f))
            except Exception:
                continue  # a damaged file is not a reason to stop fuzzing
        return out

    def load(self, spec: OpSpec) -> List[Candidate]:
        harvested = self.harvested(spec)
        info: Dict[str, Any] = {"harvested": len(harvested)}
        opinfo: List[Candidate] = []
        if self.opinfo and spec.framework == "torch" and getattr(spec, "opinfo", None):
            opinfo, note = opinfo_seeds(spec, self.cache_dir)
            info["opinfo"] = len(opinfo)
            info["opinfo_note"] = note
        self.last_sources = info
        return harvested + opinfo

    def tests_calls(self, spec: OpSpec, have: Sequence[Candidate], dtype: str) -> List[Candidate]:
        """Up to :data:`TESTS_CALLS` of the calls the library's own tests made (harvested seeds,
        most novel first), not already in ``have``: the gate replays them on head and base
        whatever the search ranked them, so that a regression on the inputs the tests use is
        judged on identical inputs. geoopt's revert of 71c7f63 (SPD.norm's gradient NaN at a
        zero tangent vector, the input of its test_spd_norm): the search's ten worst inputs were
        random non-SPD matrices, NaN on both sides, and the tests' zero vector, NaN on head only,
        was never compared with base."""
        seeds = self.harvested(spec)
        if not seeds:
            return []
        seen = {content_key(c) for c in have}
        fresh = [c for c in seeds if content_key(c) not in seen]
        return prioritise(spec, fresh, dtype, limit=TESTS_CALLS) if fresh else []

    # -- writing ------------------------------------------------------------------------
    _pending: Optional[dict] = None

    def index(self) -> dict:
        if self._pending is not None:
            return self._pending
        if self.root is None or not (self.root / INDEX).exists():
            return {"version": 1, "ops": {}}
        return json.loads((self.root / INDEX).read_text())

    @contextlib.contextmanager
    def batch(self):
        """Seeds added inside write the index once, at the end: each :meth:`add` read and
        rewrote the whole index, so storing n calls parsed O(n^2) bytes of JSON (geoopt's
        13,859 recorded calls held init for minutes after its tests had finished)."""
        if self._pending is not None:  # nested: the outer batch writes
            yield self
            return
        self._pending = self.index()
        try:
            yield self
        finally:
            idx, self._pending = self._pending, None
            if self.root is not None and idx.get("ops"):
                self.root.mkdir(parents=True, exist_ok=True)
                self._write_index(idx)

    def _write_index(self, idx: dict) -> None:
        (self.root / INDEX).write_text(json.dumps(idx, indent=1, sort_keys=True))

    def add(self, op: str, cand: Candidate, source: str = "") -> Optional[str]:
        """Store ``cand`` for ``op`` (content-addressed: a call seen twice is stored once);
        returns the file name, ``None`` if it was already there."""
        if self.root is None:
            raise ValueError("seed store has no directory")
        data = cand.to_bytes()
        digest = hashlib.sha1(content_key(cand)).hexdigest()[:16]
        d = self.root / _safe(op)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{digest}.npz"
        if path.exists():
            return None
        path.write_bytes(data)
        idx = self.index()
        idx.setdefault("ops", {}).setdefault(op, []).append({
            "file": f"{_safe(op)}/{path.name}",
            "source": source,
            "shapes": {k: list(v.shape) for k, v in cand.arrays.items()},
            "params": {k: repr(v) for k, v in cand.params.items()},
        })
        if self._pending is None:
            self._write_index(idx)
        return path.name


def content_key(cand: Candidate) -> bytes:
    h = hashlib.sha1()
    h.update(json.dumps({"dims": cand.dims, "params": repr(sorted(cand.params.items()))}, sort_keys=True).encode())
    for k in sorted(cand.arrays):
        a = np.ascontiguousarray(cand.arrays[k])
        h.update(k.encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.digest()


__all__ = ["SeedStore", "CallRecord", "TensorArg", "TensorSeq", "Opaque", "candidate_from_call", "prioritise", "opinfo_seeds",
           "opinfo_records", "parameter_names"]
