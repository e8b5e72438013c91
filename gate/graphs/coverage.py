"""Operator-level coverage of graphs (after graph-based fuzzing of inference engines):

* **operator type** — operators used / graph-eligible operators;
* **in-degree** — (operator, number of its inputs the graph feeds) seen / possible, where an
  operator may be fed 1 … (number of inputs shaped like its primary input);
* **out-degree** — (operator, number of consumers, capped at ``max_out``) seen / possible,
  0 … ``max_out``;
* **edge** — (producer, consumer) operator pairs seen / pairs whose ranks are compatible (the
  consumer's primary input rank is one of the producer's output ranks, measured per parameter
  branch);
* **shape & parameter** — per operator, each parameter value class (see
  :func:`gate.graphs.shapes.param_classes`) and each size class (``1``, ``2..7``, ``>=8``) of
  each dimension of its primary input; feasible size classes come from the dim's declared range
  (bounds that are expressions are evaluated with the first parameter branch and the other
  dims at their lower / upper bounds).

The universe (:class:`CoverageSpace`) is fixed by the catalogue, so figures are exact and
comparable between runs and between the MCTS and random arms.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Set, Tuple

from ..ops import expr
from .model import Graph
from .shapes import DIM_CLASSES, GraphOp, dim_class

CRITERIA = ("operator_type", "in_degree", "out_degree", "edge", "shape_param")


def _bound(e, env) -> float:
    try:
        return float(expr.evaluate(e, env))
    except (ValueError, TypeError, ZeroDivisionError):
        return float("nan")


def feasible_dim_classes(op: GraphOp) -> List[Tuple[int, str]]:
    """(position, size class) pairs the operator's primary input can take."""
    spec = op.spec
    params = {c.param: (c.value if c.kind == "value" else c.lo) for c in op.branches[0].classes} if op.branches else {}
    env_lo: Dict[str, float] = dict(params)
    env_hi: Dict[str, float] = dict(params)
    ranges: Dict[str, Tuple[float, float]] = {}
    for name, (lo_e, hi_e) in spec.dims:
        lo, hi = _bound(lo_e, env_lo), _bound(hi_e, env_hi)
        lo2, hi2 = _bound(lo_e, env_hi), _bound(hi_e, env_lo)
        vals = [v for v in (lo, hi, lo2, hi2) if v == v]
        lo_v, hi_v = (min(vals), max(vals)) if vals else (1.0, float("inf"))
        ranges[name] = (lo_v, hi_v)
        env_lo[name], env_hi[name] = lo_v, hi_v
    out = []
    for i, e in enumerate(op.primary.shape):
        if isinstance(e, int):
            lo = hi = float(e)
        elif isinstance(e, str) and e in ranges:
            lo, hi = ranges[e]
        else:
            a, b = _bound(e, env_lo), _bound(e, env_hi)
            vals = [v for v in (a, b) if v == v]
            lo, hi = (min(vals), max(vals)) if vals else (1.0, float("inf"))
        for label, clo, chi in DIM_CLASSES:
            if lo <= chi and hi >= clo:
                out.append((i, label))
    return out


@dataclass
class CoverageSpace:
    """Every coverage item a graph over these operators can reach, per criterion."""

    items: Dict[str, Set[tuple]] = field(default_factory=lambda: {c: set() for c in CRITERIA})
    max_out: int = 2

    @classmethod
    def build(cls, ops: Mapping[str, GraphOp], out_ranks: Mapping[str, Set[int]], max_out: int = 2) -> "CoverageSpace":
        sp = cls(max_out=max_out)
        for name, op in ops.items():
            sp.items["operator_type"].add((name,))
            for d in range(1, len(op.feedable) + 1):
                sp.items["in_degree"].add((name, d))
            for d in range(0, max_out + 1):
                sp.items["out_degree"].add((name, d))
            for b in op.branches:
                for c in b.classes:
                    sp.items["shape_param"].add((name, "param", c.param, c.label))
            for i, label in feasible_dim_classes(op):
                sp.items["shape_param"].add((name, "dim", i, label))
        for a in ops:
            for b, opb in ops.items():
                if opb.rank in out_ranks.get(a, set()):
                    sp.items["edge"].add((a, b))
        return sp

    def totals(self) -> Dict[str, int]:
        return {c: len(v) for c, v in self.items.items()}


def graph_items(g: Graph, ops: Mapping[str, GraphOp], max_out: int = 2) -> Dict[str, Set[tuple]]:
    """The coverage items one graph exercises."""
    out: Dict[str, Set[tuple]] = {c: set() for c in CRITERIA}
    for i, n in enumerate(g.nodes):
        out["operator_type"].add((n.op,))
        out["in_degree"].add((n.op, len(n.feeds)))
        out["out_degree"].add((n.op, min(g.out_degree(i), max_out)))
        for p, label in n.branch:
            out["shape_param"].add((n.op, "param", p, label))
        op = ops.get(n.op)
        if op is not None:
            primary_src = dict(n.feeds).get(op.primary.name)
            if primary_src is not None:
                for k, size in enumerate(g.shape_of(primary_src)):
                    out["shape_param"].add((n.op, "dim", k, dim_class(int(size))))
    for a, b in g.edges():
        out["edge"].add((g.nodes[a].op, g.nodes[b].op))
    return out


@dataclass
class Coverage:
    """Items covered so far in a run, against a fixed :class:`CoverageSpace`."""

    space: CoverageSpace
    ops: Mapping[str, GraphOp]
    covered: Dict[str, Set[tuple]] = field(default_factory=lambda: {c: set() for c in CRITERIA})

    def new_items(self, g: Graph) -> Dict[str, int]:
        items = graph_items(g, self.ops, self.space.max_out)
        return {c: len((items[c] & self.space.items[c]) - self.covered[c]) for c in CRITERIA}

    def add(self, g: Graph) -> Dict[str, int]:
        """Count the graph's items; returns how many were new, per criterion."""
        items = graph_items(g, self.ops, self.space.max_out)
        new = {}
        for c in CRITERIA:
            fresh = (items[c] & self.space.items[c]) - self.covered[c]
            self.covered[c] |= fresh
            new[c] = len(fresh)
        return new

    def figures(self) -> Dict[str, dict]:
        out = {}
        for c in CRITERIA:
            total = len(self.space.items[c])
            k = len(self.covered[c])
            out[c] = {"covered": k, "total": total, "ratio": (k / total) if total else 0.0}
        return out

    def total_covered(self) -> int:
        return sum(len(v) for v in self.covered.values())


def format_figures(fig: Mapping[str, Mapping]) -> str:
    return "  ".join(f"{c.replace('_', '-')} {v['covered']}/{v['total']} ({100 * v['ratio']:.0f}%)" for c, v in fig.items())


__all__ = ["CoverageSpace", "Coverage", "graph_items", "feasible_dim_classes", "CRITERIA", "format_figures"]
