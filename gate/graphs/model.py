"""A multi-operator graph as data.

A :class:`Graph` is a list of :class:`Node` rows in topological order. Each node names a
catalogue operator, carries its concrete parameter values and solved dims, and says which of its
tensor inputs are fed by the graph (``feeds``: input name -> source) — the graph input ``x`` or an
earlier node ``n<i>``. Every other tensor input of a node is a node-owned constant (a weight, a
second operand) named ``n<i>.<input>`` and drawn from the spec's value domain, like a model's
parameters. Graphs are immutable, serialise to plain dicts and have a canonical structural
signature (:func:`signature`) that names the graph's baseline row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ..search.inputs import _jsonify, _unjsonify

INPUT = "x"  # the graph's input tensor


def node_ref(i: int) -> str:
    return f"n{i}"


def ref_index(ref: str) -> Optional[int]:
    """Node index of a source reference, ``None`` for the graph input."""
    return None if ref == INPUT else int(ref[1:])


@dataclass(frozen=True)
class Node:
    op: str
    params: Mapping[str, Any]
    dims: Mapping[str, int]
    feeds: Tuple[Tuple[str, str], ...]  # ((input name, source ref), ...) in the spec's input order
    out_shape: Tuple[int, ...] = ()
    branch: Tuple[Tuple[str, str], ...] = ()  # (parameter, value class) chosen for the node

    @property
    def sources(self) -> List[str]:
        return [s for _, s in self.feeds]

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "params": _jsonify(self.params),
            "dims": dict(self.dims),
            "feeds": [list(f) for f in self.feeds],
            "out_shape": list(self.out_shape),
            "branch": [list(b) for b in self.branch],
        }

    @classmethod
    def from_dict(cls, raw: Mapping) -> "Node":
        return cls(
            op=raw["op"],
            params=_unjsonify(raw.get("params") or {}),
            dims={k: int(v) for k, v in (raw.get("dims") or {}).items()},
            feeds=tuple((str(a), str(b)) for a, b in raw.get("feeds") or []),
            out_shape=tuple(int(s) for s in raw.get("out_shape") or ()),
            branch=tuple((str(a), str(b)) for a, b in raw.get("branch") or []),
        )


@dataclass(frozen=True)
class Graph:
    framework: str
    input_shape: Tuple[int, ...]
    nodes: Tuple[Node, ...] = ()

    # -- structure --------------------------------------------------------------------------
    def out_degree(self, i: int) -> int:
        ref = node_ref(i)
        return sum(1 for n in self.nodes for s in n.sources if s == ref)

    def in_degree(self, i: int) -> int:
        return len(self.nodes[i].feeds)

    @property
    def sinks(self) -> List[int]:
        """Nodes nothing consumes: the graph's outputs."""
        return [i for i in range(len(self.nodes)) if self.out_degree(i) == 0]

    def ancestors(self, i: int) -> List[int]:
        """``i`` and every node it depends on, in topological order."""
        seen = set()
        stack = [i]
        while stack:
            j = stack.pop()
            if j in seen:
                continue
            seen.add(j)
            for s in self.nodes[j].sources:
                k = ref_index(s)
                if k is not None:
                    stack.append(k)
        return sorted(seen)

    def edges(self) -> List[Tuple[int, int]]:
        """Node-to-node edges (producer, consumer), one per fed input."""
        out = []
        for j, n in enumerate(self.nodes):
            for s in n.sources:
                k = ref_index(s)
                if k is not None:
                    out.append((k, j))
        return out

    def shape_of(self, ref: str) -> Tuple[int, ...]:
        k = ref_index(ref)
        return tuple(self.input_shape) if k is None else tuple(self.nodes[k].out_shape)

    def add(self, node: Node) -> "Graph":
        return Graph(self.framework, self.input_shape, self.nodes + (node,))

    @property
    def signature(self) -> str:
        return signature(self)

    def to_dict(self) -> dict:
        return {
            "framework": self.framework,
            "input_shape": list(self.input_shape),
            "nodes": [n.to_dict() for n in self.nodes],
            "signature": self.signature,
        }

    @classmethod
    def from_dict(cls, raw: Mapping) -> "Graph":
        return cls(
            framework=raw["framework"],
            input_shape=tuple(int(s) for s in raw["input_shape"]),
            nodes=tuple(Node.from_dict(n) for n in raw.get("nodes") or []),
        )


def constant_name(i: int, tensor: str) -> str:
    return f"{node_ref(i)}.{tensor}"


# ---------------------------------------------------------------------------------------
# canonical signature
# ---------------------------------------------------------------------------------------
def _is_chain(g: Graph) -> bool:
    """Every node fed exactly once, node i by node i-1 (node 0 by the input), through its
    first fed slot: a straight pipeline."""
    for i, n in enumerate(g.nodes):
        if len(n.feeds) != 1:
            return False
        if n.sources[0] != (INPUT if i == 0 else node_ref(i - 1)):
            return False
    return True


def _render(g: Graph, order: Sequence[int]) -> str:
    pos = {old: new for new, old in enumerate(order)}
    parts = []
    for old in order:
        n = g.nodes[old]
        srcs = []
        for slot, s in n.feeds:
            k = ref_index(s)
            srcs.append(f"{slot}={'x' if k is None else pos[k]}")
        parts.append(f"{n.op}({','.join(srcs)})")
    return ";".join(parts)


def _topological_orders(g: Graph, limit: int = 5040):
    n = len(g.nodes)
    deps = [{ref_index(s) for s in node.sources} - {None} for node in g.nodes]
    out: List[List[int]] = []

    def rec(done: List[int], rest: set):
        if len(out) >= limit:
            return
        if not rest:
            out.append(list(done))
            return
        for j in sorted(rest):
            if deps[j] <= set(done):
                done.append(j)
                rec(done, rest - {j})
                done.pop()

    rec([], set(range(n)))
    return out


def signature(g: Graph) -> str:
    """A name for the graph's structure, stable across runs: operators and edges, not
    parameter values or shapes. A straight chain reads ``graph:torch.exp>torch.softmax``;
    anything else lists nodes in the lexicographically smallest topological order with the
    slot each fed input uses: ``graph:torch.exp(input=x);torch.atan2(input=0,other=x)``."""
    if not g.nodes:
        return "graph:"
    if _is_chain(g):  # a single feed is always the node's primary input
        return "graph:" + ">".join(n.op for n in g.nodes)
    best = min(_render(g, order) for order in _topological_orders(g))
    return "graph:" + best


__all__ = ["Graph", "Node", "INPUT", "node_ref", "ref_index", "constant_name", "signature"]
