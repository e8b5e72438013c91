"""Evaluate a graph at low precision against its float64 counterpart, every intermediate
compared, and name the first diverging node.

Three passes over the nodes, all through the framework's backend and on the same values:

* **reference** — every node in float64 fed by float64 producers (the graph's exact value);
  it also decides validity: every fed input inside its consumer's declared value domain and
  every intermediate finite, or the input is invalid for this graph;
* **low** — every node at the dtype under test, fed by the low-precision producers (as a model
  runs in fp16);
* **local** — every node in float64 on the exact low-precision values it received: what the
  node alone would have produced, which splits a node's error into its own (low vs local) and
  the error it inherited and amplified (local vs reference).

Per node ``δ`` is the max error of its low output against the reference in ULPs of the dtype
under test (``inf`` where the low output is NaN/Inf and float64 is finite, intermediate
overflow included). Audee's change rate ``R = (δ − δ_in)/(δ_in + 1e-7)`` (``δ_in``: the largest
δ among the node's fed inputs, 0 for the graph input, whose values are exact) says how much a
node adds. A node *diverges* when ``δ`` exceeds its operator's ULP floor and ``R`` exceeds the
threshold (1: it more than doubled the error it received). The first diverging node is the first
diverging node, in topological order, among the ancestors of the outputs that diverged, with its
cause: ``non-finite`` (the node alone turns finite inputs into NaN/Inf, overflow), ``operator``
(its own error on the values it saw is above its floor), ``amplification`` (it computes its
inputs accurately but magnifies the error they carry) or ``domain`` (rounding pushed an input
onto or past the edge of its declared domain, e.g. ``erfinv`` fed an fp16 ``sin`` rounded to 1).
ULP figures use the ulp of each tensor's largest magnitude as their floor (``ULP_FLOOR``).
"""
from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..backends import get_backend
from ..backends.base import FLOAT_FORMATS, Output, flatten
from ..search.engine import search
from ..search.finding import Crash, Finding
from ..search.inputs import Candidate, draw, tensor_shape
from ..search.mutate import MUTATORS
from ..oracles.runner import CRASH, INVALID, OK, UNSUPPORTED, Evaluation, exception_signature, quantize_inputs
from ..ops import expr
from ..ops.spec import Domain, OpSpec, TensorSpec, arrange
from ..oracles.precision import Metrics, compare
from ..plan import Variant
from .model import INPUT, Graph, constant_name, node_ref, ref_index

#: ULP floor for operators whose catalogue row declares none for the dtype
DEFAULT_FLOOR_ULP = 4.0
#: Audee's change-rate threshold: a node diverges when it more than doubles its input error
R_THRESHOLD = 1.0
#: errors are in ULPs with the ulp of each tensor's largest magnitude as the floor: a graph's
#: tensors are judged at their own scale, so cancellation near zero does not explode the figure
ULP_FLOOR = "output"
#: value mutators that make sense on a graph's free tensors (no params or dims to change)
GRAPH_MUTATORS = ("perturb_1e-4", "scale", "noise", "edge", "shift")


def change_rate(delta: float, delta_in: float) -> float:
    """Audee's ``R = (δ − δ_in)/(δ_in + 1e-7)``; a NaN/Inf that was already in the inputs
    is not new (``R = 0``)."""
    if math.isinf(delta):
        return 0.0 if math.isinf(delta_in) else math.inf
    if math.isinf(delta_in):
        return 0.0
    return (delta - delta_in) / (delta_in + 1e-7)


def _domain_intersection(domains: Sequence[Domain]) -> Domain:
    los = [d.lo for d in domains if d.lo is not None]
    his = [d.hi for d in domains if d.hi is not None]
    first = domains[0]
    if len(domains) == 1:
        return first
    return Domain(lo=max(los) if los else None, hi=min(his) if his else None, scale=first.scale,
                  name="+".join(sorted({d.name for d in domains})))


def _inside(arr: np.ndarray, dom: Domain) -> bool:
    a = np.asarray(arr)
    if a.size == 0:
        return True
    if dom.values and not np.isin(a, dom.values).all():
        return False
    if dom.lo is not None and not np.all(a > dom.lo):
        return False
    if dom.hi is not None and not np.all(a < dom.hi):
        return False
    return True


@dataclass
class NodeReport:
    node: int
    op: str
    delta: float  # ULP error vs the float64 graph
    delta_in: float
    rate: float  # Audee's R
    local: Optional[float]  # the node's own error on the values it received (None: domain)
    nonfinite: int
    floor: float
    diverged: bool
    cause: Optional[str] = None

    def to_dict(self) -> dict:
        return {
            "node": self.node, "op": self.op, "delta": self.delta, "delta_in": self.delta_in, "R": self.rate,
            "local": self.local, "nonfinite": self.nonfinite, "floor": self.floor, "diverged": self.diverged,
            "cause": self.cause,
        }


@dataclass
class GraphAnalysis:
    nodes: List[NodeReport] = field(default_factory=list)
    diverged_outputs: List[int] = field(default_factory=list)
    first_diverging: Optional[NodeReport] = None
    invalid: Optional[str] = None

    @property
    def amplification(self) -> List[dict]:
        """Nodes whose error grew from error they inherited (δ_in > 0), with the factor."""
        out = []
        for r in self.nodes:
            if r.delta_in > 0 and math.isfinite(r.delta_in) and r.delta > r.delta_in:
                out.append({"node": r.node, "op": r.op, "factor": r.delta / r.delta_in, "R": r.rate})
        return out

    def to_dict(self) -> dict:
        fd = self.first_diverging
        return {
            "nodes": [r.to_dict() for r in self.nodes],
            "diverged_outputs": list(self.diverged_outputs),
            "first_diverging": fd.to_dict() if fd else None,
            "amplification": self.amplification,
            "invalid": self.invalid,
        }


class GraphRunner:
    """Runs a :class:`Graph` on candidates of its free tensors (the graph input ``x`` and the
    node constants) at ``dtype`` against float64."""

    def __init__(self, graph: Graph, specs: Mapping[str, OpSpec], dtype: str, device: str = "cpu",
                 r_threshold: float = R_THRESHOLD):
        if not graph.nodes:
            raise ValueError("empty graph")
        self.graph = graph
        self.dtype = dtype
        self.device = device
        self.r_threshold = r_threshold
        self.specs = [specs[n.op] for n in graph.nodes]
        self.backend = get_backend(graph.framework)
        self.fns = [self.backend.resolve(s.callable, s.construct) for s in self.specs]
        self.ref_fns = [self.backend.resolve(s.reference) if s.reference else f for s, f in zip(self.specs, self.fns)]
        self.spec = self._free_tensors()

    # -- the graph's free tensors as an op spec the fuzzer's draw / mutators understand -------
    def _free_tensors(self) -> OpSpec:
        g = self.graph
        x_domains: List[Domain] = []
        consts: List[TensorSpec] = []
        for i, (node, spec) in enumerate(zip(g.nodes, self.specs)):
            env = {**node.params, **node.dims}
            fed = dict(node.feeds)
            for t in spec.inputs:
                if t.name in fed:
                    if fed[t.name] == INPUT:
                        x_domains.append(t.domain)
                    continue
                shape = tensor_shape(t, env)
                hi = int(expr.evaluate(t.index_hi, env)) if t.kind == "index" and t.index_hi is not None else None
                consts.append(TensorSpec(name=constant_name(i, t.name), shape=shape, domain=t.domain, kind=t.kind,
                                         index_hi=hi))
        x = TensorSpec(name=INPUT, shape=tuple(g.input_shape), domain=_domain_intersection(x_domains or [Domain()]))
        return OpSpec(name=g.signature, framework=g.framework, callable="<graph>", inputs=(x, *consts),
                      dtypes=(self.dtype,), kind="graph", ulp_floor="output")

    def floor(self, i: int) -> float:
        f = self.specs[i].threshold(self.dtype).ulp
        return f if math.isfinite(f) else DEFAULT_FLOOR_ULP

    def quantize(self, cand: Candidate) -> Candidate:
        return quantize_inputs(self.spec, self.backend, cand, self.dtype)

    def model(self, reference: bool = False):
        """The graph as one framework-native function of its free tensors (in
        ``self.spec.inputs`` order) returning its outputs: what an exporter traces."""
        names = [t.name for t in self.spec.inputs]
        fns = self.ref_fns if reference else self.fns
        graph, specs = self.graph, self.specs

        def model(*tensors):
            given = dict(zip(names, tensors))
            values = {INPUT: given[INPUT]}
            for i, (node, spec) in enumerate(zip(graph.nodes, specs)):
                fed = dict(node.feeds)
                kwargs = dict(node.params)
                args = arrange(((t, values[fed[t.name]] if t.name in fed else given[constant_name(i, t.name)])
                                for t in spec.inputs), kwargs)
                values[node_ref(i)] = flatten(fns[i](*args, **kwargs))[0]
            outs = [values[node_ref(j)] for j in graph.sinks]
            return outs[0] if len(outs) == 1 else tuple(outs)

        return model

    # -- passes -------------------------------------------------------------------------------
    def _call(self, i: int, values: Mapping[str, Output], cand: Candidate, *, low: bool, fn) -> Output:
        node, spec = self.graph.nodes[i], self.specs[i]
        fed = dict(node.feeds)
        placed: list = []
        kwargs: Dict[str, Any] = dict(node.params)
        for t in spec.inputs:
            if t.name in fed:
                src = values[fed[t.name]]
                dt = src.dtype if (low and src.dtype in FLOAT_FORMATS) else ("float64" if not low else self.dtype)
                native = self.backend.to_native(src.array, dt, self.device)
            else:
                native = self.backend.to_native(cand.arrays[constant_name(i, t.name)],
                                                self.dtype if low else "float64", self.device)
            placed.append((t, native))
        args = arrange(placed, kwargs)
        dtype = self.dtype if low else "float64"
        result = self.backend.call(fn, args, kwargs, mode="input", dtype=dtype, device=self.device)
        outs = self.backend.to_outputs(flatten(result)[:1])
        if not outs or not outs[0].is_float:
            raise TypeError(f"node n{i} ({spec.name}) returned no float tensor")
        return outs[0]

    def reference(self, cand: Candidate) -> Tuple[Optional[List[Output]], Optional[str]]:
        """The float64 graph, or why this input is outside the graph's domain."""
        values: Dict[str, Output] = {INPUT: Output(cand.arrays[INPUT], "float64")}
        outs: List[Output] = []
        for i, (node, spec) in enumerate(zip(self.graph.nodes, self.specs)):
            for slot, src in node.feeds:
                t = next(t for t in spec.inputs if t.name == slot)
                if src != INPUT and not _inside(values[src].array, t.domain):
                    return None, f"n{i} ({spec.name}): input {slot} outside its domain {t.domain.name}"
            try:
                out = self._call(i, values, cand, low=False, fn=self.ref_fns[i])
            except Exception as exc:
                return None, f"n{i} ({spec.name}): {exception_signature(exc)[1]}"
            if not np.all(np.isfinite(out.array)):
                return None, f"n{i} ({spec.name}): float64 result not finite"
            values[node_ref(i)] = out
            outs.append(out)
        return outs, None

    def low(self, cand: Candidate) -> List[Output]:
        values: Dict[str, Output] = {INPUT: Output(cand.arrays[INPUT], self.dtype)}
        outs: List[Output] = []
        for i in range(len(self.graph.nodes)):
            try:
                out = self._call(i, values, cand, low=True, fn=self.fns[i])
            except Exception as exc:
                raise NodeError(i, self.specs[i].name, exc) from exc
            values[node_ref(i)] = out
            outs.append(out)
        return outs

    def local(self, cand: Candidate, low: Sequence[Output]) -> List[Optional[Output]]:
        """Each node in float64 on the exact low-precision values it received."""
        values: Dict[str, Output] = {INPUT: Output(cand.arrays[INPUT], "float64")}
        for i, o in enumerate(low):
            values[node_ref(i)] = Output(o.array, "float64")
        outs: List[Optional[Output]] = []
        for i in range(len(self.graph.nodes)):
            try:
                out = self._call(i, values, cand, low=False, fn=self.ref_fns[i])
            except Exception:
                out = None
            outs.append(out)
        return outs

    def _off_domain(self, i: int, low: Sequence[Output]) -> bool:
        """Did rounding push a fed input of node ``i`` out of its declared domain?"""
        spec = self.specs[i]
        for slot, src in self.graph.nodes[i].feeds:
            k = ref_index(src)
            if k is None:
                continue
            t = next(t for t in spec.inputs if t.name == slot)
            if not _inside(low[k].array[np.isfinite(low[k].array)], t.domain):
                return True
        return False

    # -- scoring ------------------------------------------------------------------------------
    def delta(self, i: int, low: Output, ref: Output) -> Tuple[float, int]:
        """Node error in ULPs of the dtype under test; inf for new NaN/Inf."""
        a, b = np.asarray(low.array), np.asarray(ref.array)
        if a.shape != b.shape:
            return math.inf, int(b.size)
        new_nf = int(np.count_nonzero(np.isfinite(b) & ~np.isfinite(a)))
        if new_nf:
            return math.inf, new_nf
        m = compare([low], [ref], self.dtype, ULP_FLOOR)
        return float(m.ulp), 0

    def output_metrics(self, low: Sequence[Output], ref: Sequence[Output]) -> Metrics:
        """The precision oracle on the graph's outputs (its sinks)."""
        ms = []
        for j in self.graph.sinks:
            ms.append(compare([low[j]], [ref[j]], self.dtype, ULP_FLOOR))
        worst = max(ms, key=lambda m: (m.severity, m.abs))
        return Metrics(**{**worst.__dict__, "nonfinite": sum(m.nonfinite for m in ms),
                          "numel": sum(m.numel for m in ms), "l1": sum(m.l1 for m in ms)})

    def evaluate(self, cand: Candidate, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        """One input: the search engine's view (a status and the outputs' metrics)."""
        t0 = time.perf_counter()
        q = cand if quantized else self.quantize(cand)
        ref, why = self.reference(q)
        if ref is None:
            return q, Evaluation(INVALID, error=why, seconds=time.perf_counter() - t0)
        try:
            low = self.low(q)
        except NodeError as exc:
            sig, short = exception_signature(exc.exc)
            status = UNSUPPORTED if self.backend.is_unsupported(exc.exc) else CRASH
            return q, Evaluation(status, error=f"{exc.where}: {short}", signature=f"{exc.where}: {sig}",
                                 seconds=time.perf_counter() - t0)
        m = self.output_metrics(low, ref)
        return q, Evaluation(OK, metrics=m, seconds=time.perf_counter() - t0)

    def analyse(self, cand: Candidate, quantized: bool = True) -> GraphAnalysis:
        """Every intermediate compared: per-node δ, R and cause; the first diverging node."""
        q = cand if quantized else self.quantize(cand)
        ref, why = self.reference(q)
        if ref is None:
            return GraphAnalysis(invalid=why)
        try:
            low = self.low(q)
        except NodeError as exc:
            return GraphAnalysis(invalid=f"{exc.where}: {exception_signature(exc.exc)[1]}")
        loc = self.local(q, low)
        g = self.graph
        reports: List[NodeReport] = []
        for i, node in enumerate(g.nodes):
            d, nf = self.delta(i, low[i], ref[i])
            ins = [0.0 if ref_index(s) is None else reports[ref_index(s)].delta for s in node.sources]
            d_in = max(ins) if ins else 0.0
            rate = change_rate(d, d_in)
            local = None if loc[i] is None else self.delta(i, low[i], loc[i])[0]
            off_domain = self._off_domain(i, low)
            floor = self.floor(i)
            diverged = d > floor and rate > self.r_threshold
            cause = None
            if diverged:
                if local is None or off_domain:
                    cause = "domain"
                elif math.isinf(local):
                    cause = "non-finite"
                elif local > floor:
                    cause = "operator"
                else:
                    cause = "amplification"
            reports.append(NodeReport(i, node.op, d, d_in, rate, local, nf, floor, diverged, cause))
        out = GraphAnalysis(nodes=reports)
        out.diverged_outputs = [j for j in g.sinks if reports[j].delta > reports[j].floor]
        suspects = sorted({k for j in out.diverged_outputs for k in g.ancestors(j)})
        for k in suspects:
            if reports[k].diverged:
                out.first_diverging = reports[k]
                break
        if out.first_diverging is None and out.diverged_outputs:
            # error grew gradually (no single node more than doubled it): the first node whose
            # error is above its floor
            for k in suspects:
                if reports[k].delta > reports[k].floor:
                    r = reports[k]
                    r.cause = "gradual"
                    out.first_diverging = r
                    break
        return out


class NodeError(Exception):
    def __init__(self, i: int, op: str, exc: BaseException):
        super().__init__(f"n{i} ({op}): {exc}")
        self.where = f"n{i} ({op})"
        self.exc = exc


def fuzz_graph(graph: Graph, specs: Mapping[str, OpSpec], dtype: str, *, seed: int = 0, evals: Optional[int] = None,
               seconds: Optional[float] = None, device: str = "cpu", strategy: str = "linf",
               mutators: Sequence[str] = GRAPH_MUTATORS, n_seeds: int = 2, salt: int = 0) -> Finding:
    """Search the graph's inputs for its largest output error at ``dtype``; the worst input
    is analysed node by node. One :class:`Finding` whose ``op`` is the graph's signature."""
    runner = GraphRunner(graph, specs, dtype, device)
    runner.backend.seed(seed)
    sig = graph.signature
    rng = np.random.default_rng([seed, zlib.crc32(f"{sig}[{dtype}]".encode()), salt])
    bound = {n: (lambda m: (lambda c, r: m(c, runner.spec, r)))(MUTATORS[n]) for n in mutators}
    res = search(runner.evaluate, lambda r: draw(runner.spec, r), bound, rng, seconds=seconds,
                 evals=evals if evals is not None or seconds is not None else 4, guidance=strategy, n_seeds=n_seeds,
                 stop_on_inf=True)  # one graph's NaN is its finding: the campaign moves on to the next graph
    status, message = "ok", None
    if res.unsupported and res.best_eval is None:
        status, message = "unsupported", res.unsupported
    elif res.best_eval is None and not res.crashes:
        status, message = "no-valid-input", res.invalid_example
    analysis = runner.analyse(res.best) if res.best is not None else GraphAnalysis()
    finding = Finding(
        op=sig,
        framework=graph.framework,
        variant=Variant(dtype=dtype, device=device, mode="input", oracle="graph"),
        strategy=strategy,
        seed=seed,
        evals=res.evals,
        seconds=res.seconds,
        status=status,
        metrics=res.best_eval.metrics if res.best_eval else None,
        best=res.best,
        crashes=[Crash(c.signature, c.message, c.count, c.candidate) for c in res.crashes.values()],
        invalid=res.invalid,
        message=message,
        trajectory=[[e, f] for e, f in res.trajectory],
        env=runner.backend.environment(device),
    )
    finding.extra = {"graph": graph.to_dict(), **analysis.to_dict()}
    return finding


def replay_graph(graph: Mapping[str, Any], specs: Mapping[str, OpSpec], dtype: str, candidates: Sequence[Candidate],
                 device: str = "cpu") -> List[Evaluation]:
    """Re-run a graph row (``Finding.extra["graph"]``) on stored inputs (``Finding.best``), e.g.
    on the base and the head of a PR: one :class:`Evaluation` per candidate."""
    runner = GraphRunner(Graph.from_dict(graph), specs, dtype, device)
    return [runner.evaluate(c, quantized=True)[1] for c in candidates]


__all__ = ["replay_graph", "GraphRunner", "GraphAnalysis", "NodeReport", "fuzz_graph", "change_rate", "GRAPH_MUTATORS",
           "DEFAULT_FLOOR_ULP", "R_THRESHOLD"]
