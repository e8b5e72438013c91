"""Fuzzing an exported model against eager (the runner of :mod:`gate.oracles.export_metrics`).

The model — one catalogue operator at one drawn shape and parameter set, or a graph — is
exported once through a deployment path from an example input, then the search engine draws
and mutates inputs of the same shapes (exports freeze shapes) and keeps the input where the
exported artifact differs most from eager. One :class:`Finding` per model × path, with variant
``float32/<device>/<path>/export`` (the path sits in the variant's ``mode`` slot).
"""
from __future__ import annotations

import math
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..backends import get_backend
from ..backends.base import Backend, Output
from ..backends.exporters import ExportCall, ExportPath, StageError, get_path
from ..ops.spec import OpSpec, arrange
from .export_metrics import EXPORT_DTYPE, Failure, classify, float64_rule, score
from ..plan import Variant
from ..search.engine import search
from ..search.finding import Crash, Finding
from ..search.inputs import Candidate, draw, inside_after_rounding, project
from ..search.mutate import MUTATORS
from .runner import CRASH, INVALID, OK, Evaluation, exception_signature



def negate(cand: Candidate, spec: OpSpec, rng: np.random.Generator) -> Optional[Candidate]:
    """Flip the sign of one input: a trace frozen on a sign-dependent branch shows at once."""
    names = [t.name for t in spec.inputs if t.kind == "float" and cand.arrays.get(t.name) is not None]
    if not names:
        return None
    name = names[int(rng.integers(len(names)))]
    dom = next(t.domain for t in spec.inputs if t.name == name)
    new = cand.copy(origin="negate")
    new.arrays[name] = project(-new.arrays[name], dom)
    return new


#: mutators of exported models' inputs: values only (shapes are frozen by the export)
EXPORT_MUTATOR_TABLE = {**{k: MUTATORS[k] for k in ("scale", "noise", "edge", "shift", "perturb_1e-4")},
                        "negate": negate}
EXPORT_MUTATORS = tuple(EXPORT_MUTATOR_TABLE)


@dataclass
class Exportable:
    """A model to export: ``model(*tensors)`` over native tensors in the order of
    ``spec.inputs`` (an op spec whose shapes and domains drive drawing and mutation), its
    float64 reference, and the operator's own function for paths that compile it."""

    name: str
    framework: str
    spec: OpSpec
    model: Callable[..., Any]
    reference: Callable[..., Any]
    fixed_params: Mapping[str, Any] = field(default_factory=dict)
    fixed_dims: Mapping[str, int] = field(default_factory=dict)
    function: Optional[Callable] = None
    bind: Optional[Callable] = None
    ulp_floor: str = "output"
    floor_ulp: float = 4.0


def op_exportable(spec: OpSpec, backend: Backend, rng: np.random.Generator) -> Tuple[Exportable, Candidate]:
    """A single-operator model of ``spec`` (parameters baked in, every tensor an input) at one
    drawn shape and parameter set, and the example input it is exported from."""
    fn = backend.resolve(spec.callable, spec.construct)
    ref = backend.resolve(spec.reference) if spec.reference else fn
    example = draw(spec, rng)
    params = dict(example.params)

    def make(f):
        def model(*tensors):
            kwargs = dict(params)
            args = arrange(zip(spec.inputs, tensors), kwargs)
            return f(*args, **kwargs)

        return model

    def bind(compiled, tensors):
        return make(compiled)(*tensors)

    thr = spec.threshold(EXPORT_DTYPE).ulp
    free = {p.name for p in spec.params if p.kind != "expr"}
    ex = Exportable(name=spec.name, framework=spec.framework, spec=spec, model=make(fn), reference=make(ref),
                    fixed_params={k: v for k, v in example.params.items() if k in free},
                    fixed_dims=dict(example.dims), function=fn, bind=bind, ulp_floor=spec.ulp_floor,
                    floor_ulp=thr if math.isfinite(thr) else 4.0)
    return ex, example


class ExportRunner:
    """Runs candidates through eager and through the exported artifact (exported once)."""

    def __init__(self, ex: Exportable, path: ExportPath, backend: Backend, device: str = "cpu"):
        self.ex = ex
        self.path = path
        self.backend = backend
        self.device = device
        self.exported: Optional[Callable] = None
        self.notes: List[str] = []
        self.run_failures: Dict[str, Failure] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="dl-gate-export-")

    def close(self) -> None:
        self._tmp.cleanup()

    def quantize(self, cand: Candidate) -> Candidate:
        out = cand.copy()
        for t in self.ex.spec.inputs:
            a = out.arrays.get(t.name)
            if a is None or t.kind != "float":
                continue
            q = self.backend.quantize(np.asarray(a, dtype=np.float64), EXPORT_DTYPE)
            out.arrays[t.name] = inside_after_rounding(q, t.domain, EXPORT_DTYPE)
        return out

    def natives(self, cand: Candidate, dtype: str) -> List[Any]:
        return [self.backend.to_native(cand.arrays[t.name], dtype, self.device) for t in self.ex.spec.inputs]

    def eager(self, cand: Candidate, dtype: str = EXPORT_DTYPE) -> List[Output]:
        fn = self.ex.model if dtype != "float64" else self.ex.reference
        res = self.backend.call(fn, self.natives(cand, dtype), {}, mode="input", dtype=dtype, device=self.device)
        return self.backend.to_outputs(res)

    def export(self, example: Candidate) -> None:
        call = ExportCall(model=self.ex.model, example=self.natives(example, EXPORT_DTYPE), function=self.ex.function,
                          bind=self.ex.bind, label=self.ex.name)
        self.exported = self.path.export(call, self._tmp.name)
        self.notes = list(getattr(self.exported, "notes", []) or [])

    def run_exported(self, cand: Candidate) -> List[Output]:
        if self.exported is None:
            raise RuntimeError("export() first")
        return self.backend.to_outputs(self.exported(*self.natives(cand, EXPORT_DTYPE)))

    def evaluate(self, cand: Candidate, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        t0 = time.perf_counter()
        q = cand if quantized else self.quantize(cand)
        try:
            ref = self.eager(q)
        except Exception as exc:  # outside the operator's domain: eager fails too
            return q, Evaluation(INVALID, error=exception_signature(exc)[1], seconds=time.perf_counter() - t0)
        try:
            out = self.run_exported(q)
        except Exception as exc:
            f = classify(StageError("run", exc), self.path)
            sig = f"{f.group}: {f.error}"
            self.run_failures.setdefault(sig, f)
            return q, Evaluation(CRASH, error=f.error, signature=sig, seconds=time.perf_counter() - t0)
        m = score(out, ref, self.ex.ulp_floor)
        return q, Evaluation(OK, metrics=m, seconds=time.perf_counter() - t0)

    def against_float64(self, cand: Candidate) -> Dict[str, Any]:
        try:
            ref64 = self.eager(cand, "float64")
            eager = self.eager(cand)
            out = self.run_exported(cand)
        except Exception as exc:
            return {"float64": f"not comparable: {exception_signature(exc)[1]}"}
        return float64_rule(out, eager, ref64, self.ex.floor_ulp, self.ex.ulp_floor)


def export_finding(ex: Exportable, example: Candidate, path_name: str, *, seed: int = 0, evals: Optional[int] = 12,
                   seconds: Optional[float] = None, device: str = "cpu",
                   mutators: Sequence[str] = EXPORT_MUTATORS) -> Finding:
    """Export ``ex`` through ``path_name`` from ``example``, then search inputs of the same
    shapes for the largest exported-vs-eager difference."""
    path = get_path(path_name)
    backend = get_backend(ex.framework)
    variant = Variant(dtype=EXPORT_DTYPE, device=device, mode=path.name, oracle="export")
    finding = Finding(op=ex.name, framework=ex.framework, variant=variant, strategy="linf", seed=seed,
                      env={**backend.environment(device), "export_path": path.name})
    finding.extra = {"path": path.name}
    missing = path.missing()
    if missing:
        finding.status, finding.message = "unsupported", missing
        finding.extra["failure"] = {"kind": "unavailable", "stage": "setup", "error": missing}
        return finding
    t0 = time.perf_counter()
    runner = ExportRunner(ex, path, backend, device)
    try:
        q = runner.quantize(example)
        try:
            runner.eager(q)
        except Exception as exc:
            finding.status, finding.message = "no-valid-input", exception_signature(exc)[1]
            return finding
        try:
            runner.export(q)
        except Exception as exc:
            fail = classify(exc, path)
            finding.extra["failure"] = fail.to_dict()
            finding.evals = 1
            if fail.kind == "unsupported":
                finding.status, finding.message = "unsupported", f"{fail.group}: {fail.error}"
            else:
                finding.crashes = [Crash(f"{fail.group}: {fail.error}", fail.error, 1, q)]
                finding.message = f"{path.name} {fail.stage} failed where eager works: {fail.error}"
            return finding
        if runner.notes:
            finding.extra["notes"] = runner.notes
        rng = np.random.default_rng([seed, zlib.crc32(f"{ex.name}[{path.name}]".encode())])
        spec = ex.spec

        def fresh(r: np.random.Generator) -> Candidate:
            return draw(spec, r, fixed_params=ex.fixed_params, fixed_dims=ex.fixed_dims)

        bound = {n: (lambda m: (lambda c, r: m(c, spec, r)))(EXPORT_MUTATOR_TABLE[n]) for n in mutators}
        res = search(runner.evaluate, fresh, bound, rng, seconds=seconds, evals=evals, seeds=[q], n_seeds=4,
                     stop_on_inf=True)
        finding.evals = res.evals
        finding.invalid = res.invalid
        finding.metrics = res.best_eval.metrics if res.best_eval else None
        finding.best = res.best
        finding.trajectory = [[e, f] for e, f in res.trajectory]
        finding.crashes = [Crash(c.signature, c.message, c.count, c.candidate) for c in res.crashes.values()]
        if res.crashes:
            first = runner.run_failures[next(iter(res.crashes))]
            finding.extra["failure"] = first.to_dict()
            finding.message = f"{path.name} artifact fails to run where eager works: {first.error}"
        if res.best is not None:
            finding.extra.update(runner.against_float64(res.best))
            m = finding.metrics
            finding.extra["differs"] = bool(m is not None and (m.severity == math.inf or m.ulp > ex.floor_ulp))
        elif not res.crashes:
            finding.status, finding.message = "no-valid-input", res.invalid_example
        return finding
    finally:
        finding.seconds = time.perf_counter() - t0
        runner.close()


def export_op(spec: OpSpec, path_name: str, *, seed: int = 0, evals: Optional[int] = 12, seconds: Optional[float] = None,
              device: str = "cpu") -> Finding:
    """The export oracle on one catalogue operator and one deployment path."""
    backend = get_backend(spec.framework)
    backend.seed(seed)
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    ex, example = op_exportable(spec, backend, rng)
    return export_finding(ex, example, path_name, seed=seed, evals=evals, seconds=seconds, device=device)


def group_failures(findings: Sequence[Finding]) -> Dict[str, List[str]]:
    """Export failures where eager works (not the unsupported ones), grouped by path and
    converter function: ``"<path>: <module.function>"`` -> finding ids."""
    out: Dict[str, List[str]] = {}
    for f in findings:
        fail = (f.extra or {}).get("failure")
        if f.variant.oracle != "export" or not fail or fail.get("kind") != "failure":
            continue
        key = f"{f.variant.mode}: {fail.get('converter_function', '<native>')}"
        out.setdefault(key, []).append(f.id)
    return dict(sorted(out.items()))


__all__ = ["Exportable", "ExportRunner", "op_exportable", "export_finding", "export_op", "group_failures",
           "EXPORT_MUTATORS"]
