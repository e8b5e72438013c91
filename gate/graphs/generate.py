"""Graph generators: the action space, a random arm (the control) and an MCTS arm.

A graph grows one node at a time; adding a node is three decisions, each a level of the MCTS
tree: the **operator** (or *stop*, once the graph has ``min_nodes``), its **parameter branch**,
and its **sources** — which existing tensors (the graph input or an earlier node with spare
out-degree) feed its primary input and any further graph-feedable inputs. A source choice is
offered only where :func:`gate.graphs.shapes.solve_dims` finds dims making every edge valid, so
every generated graph is shape-correct; value domains are checked when the graph runs.

The chosen source makes the structure: the last node (a chain), an earlier node (fan-out), or
a second graph-fed input such as ``atan2(n1, x)`` (a residual join).

* :class:`RandomArm` draws every decision uniformly (stop with probability ``p_stop``).
* :class:`MCTSArm` keeps a search tree over the decisions and picks children by UCT,
  ``v/n + c·sqrt(ln N / n)`` with ``c = 1/√2``; each iteration selects, expands one untried
  decision, completes the graph with the random policy, evaluates it and backs up the reward
  (new coverage and error growth, both in [0, 1]).

Both arms are deterministic for a seed: all randomness comes from one seeded generator.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..ops.spec import OpSpec
from ..search.inputs import draw_dims, tensor_shape
from .model import INPUT, Graph, Node, node_ref
from .shapes import GraphOp, ShapeProbe, graph_op, node_params, solve_dims

C_UCT = 1.0 / math.sqrt(2.0)
STOP = "<stop>"


@dataclass
class GraphSpace:
    """The operators a graph may use and the rules that keep every edge valid."""

    framework: str
    ops: Dict[str, GraphOp]
    probe: ShapeProbe
    max_nodes: int = 4
    min_nodes: int = 2
    max_out: int = 2
    max_options: int = 12
    ineligible: Dict[str, str] = field(default_factory=dict)
    out_ranks: Dict[str, Set[int]] = field(default_factory=dict)

    @classmethod
    def build(cls, specs: Iterable[OpSpec], framework: str, *, dtypes: Sequence[str] = ("float16",),
              device: str = "cpu", max_nodes: int = 4, min_nodes: int = 2, max_out: int = 2) -> "GraphSpace":
        """Eligible operators of ``framework``: a positional float input, the dtypes, and a
        float output measured for at least one parameter branch."""
        probe = ShapeProbe(device)
        ops: Dict[str, GraphOp] = {}
        ineligible: Dict[str, str] = {}
        out_ranks: Dict[str, Set[int]] = {}
        rng = np.random.default_rng(0)
        for spec in sorted((s for s in specs if s.framework == framework), key=lambda s: s.name):
            op, why = graph_op(spec, dtypes)
            if op is None:
                ineligible[spec.name] = why
                continue
            ranks: Set[int] = set()
            ok_branches = []
            for b in op.branches:
                params = b.draw(rng)
                dims = draw_dims(spec, params, rng)
                if dims is None:
                    continue
                shape = probe(spec, node_params(op, b, dims, params), dims)
                if shape is not None:
                    ranks.add(len(shape))
                    ok_branches.append(b)
            if not ok_branches:
                ineligible[spec.name] = probe.errors.get(spec.name, "no parameter branch runs")
                continue
            ops[spec.name] = GraphOp(spec=op.spec, primary=op.primary, feedable=op.feedable,
                                     branches=tuple(ok_branches))
            out_ranks[spec.name] = ranks
        if not ops:
            raise ValueError(f"no {framework} operator can be a graph node")
        return cls(framework=framework, ops=ops, probe=probe, max_nodes=max_nodes, min_nodes=min_nodes,
                   max_out=max_out, ineligible=ineligible, out_ranks=out_ranks)

    @property
    def specs(self) -> Dict[str, OpSpec]:
        return {n: op.spec for n, op in self.ops.items()}

    # -- decisions ------------------------------------------------------------------------
    def sources(self, g: Graph) -> List[str]:
        """Tensors that may feed one more consumer."""
        refs = [INPUT] + [node_ref(i) for i in range(len(g.nodes))]
        return [r for r in refs if self._out_degree(g, r) < self.max_out]

    @staticmethod
    def _out_degree(g: Graph, ref: str) -> int:
        return sum(1 for n in g.nodes for s in n.sources if s == ref)

    def op_choices(self, g: Graph) -> List[str]:
        if len(g.nodes) >= self.max_nodes:
            return []
        if not g.nodes:
            return list(self.ops)
        ranks = {len(g.shape_of(r)) for r in self.sources(g)}
        return [n for n, op in self.ops.items() if op.rank in ranks]

    def options(self, g: Graph, op_name: str, branch: int, rng: np.random.Generator) -> List[Graph]:
        """Graphs with one more node: ``op_name`` under parameter branch ``branch``, fed from
        every source placement whose shapes solve (at most ``max_options``)."""
        op = self.ops[op_name]
        spec = op.spec
        br = op.branches[branch]
        drawn = br.draw(rng)
        branch_items = tuple((c.param, c.label) for c in br.classes)
        out: List[Graph] = []
        if not g.nodes:
            dims = draw_dims(spec, drawn, rng)
            if dims is None:
                return []
            params = node_params(op, br, dims, drawn)
            shape = tensor_shape(op.primary, {**params, **dims})
            base = Graph(self.framework, shape, ())
            for feeds in self._extra_feeds(base, op, shape, INPUT, rng):
                out_shape = self.probe(spec, params, dims)
                if out_shape is None:
                    return []
                out.append(base.add(Node(spec.name, params, dims, feeds, out_shape, branch_items)))
            return out[: self.max_options]
        placements = [r for r in self.sources(g) if len(g.shape_of(r)) == op.rank]
        rng.shuffle(placements)
        for src in placements:
            target = g.shape_of(src)
            dims = solve_dims(spec, op.primary.shape, target, drawn, rng)
            if dims is None:
                continue
            params = node_params(op, br, dims, drawn)
            try:
                if tensor_shape(op.primary, {**params, **dims}) != tuple(target):
                    continue
            except ValueError:
                continue
            out_shape = self.probe(spec, params, dims)
            if out_shape is None:
                continue
            for feeds in self._extra_feeds(g, op, tuple(target), src, rng):
                out.append(g.add(Node(spec.name, params, dims, feeds, out_shape, branch_items)))
            if len(out) >= self.max_options:
                break
        return out[: self.max_options]

    def _extra_feeds(self, g: Graph, op: GraphOp, shape: Tuple[int, ...], primary_src: str,
                     rng: np.random.Generator) -> List[Tuple[Tuple[str, str], ...]]:
        """Feed lists: the primary source, then each further feedable input either a node
        constant or a graph tensor of the same shape with spare out-degree."""
        combos: List[List[Tuple[str, str]]] = [[(op.primary.name, primary_src)]]
        for t in op.feedable[1:]:
            nxt = []
            for c in combos:
                used = [s for _, s in c]
                nxt.append(list(c))  # a node constant
                for r in [INPUT] + [node_ref(i) for i in range(len(g.nodes))]:
                    if g.shape_of(r) != shape:
                        continue
                    if self._out_degree(g, r) + used.count(r) >= self.max_out:
                        continue
                    nxt.append(c + [(t.name, r)])
            combos = nxt
        order = {t.name: k for k, t in enumerate(op.spec.inputs)}
        out = [tuple(sorted(c, key=lambda f: order[f[0]])) for c in combos]
        if len(out) > self.max_options:
            idx = rng.choice(len(out), size=self.max_options, replace=False)
            out = [out[0]] + [out[int(i)] for i in sorted(idx) if int(i) != 0][: self.max_options - 1]
        return out

    # -- the random policy ----------------------------------------------------------------
    def complete(self, g: Graph, rng: np.random.Generator, *, p_stop: float = 0.3, op: Optional[str] = None,
                 branch: Optional[int] = None) -> Graph:
        """Finish a graph with uniformly random decisions (a pending ``op`` / ``branch``
        decided by the caller is honoured first)."""
        while len(g.nodes) < self.max_nodes:
            if op is None:
                if len(g.nodes) >= self.min_nodes and rng.random() < p_stop:
                    break
                choices = self.op_choices(g)
                if not choices:
                    break
                nxt = None
                for _ in range(8):
                    name = choices[int(rng.integers(len(choices)))]
                    b = int(rng.integers(len(self.ops[name].branches)))
                    opts = self.options(g, name, b, rng)
                    if opts:
                        nxt = opts[int(rng.integers(len(opts)))]
                        break
                if nxt is None:
                    break
                g = nxt
            else:
                b = branch if branch is not None else int(rng.integers(len(self.ops[op].branches)))
                opts = self.options(g, op, b, rng)
                op, branch = None, None
                if not opts:
                    break
                g = opts[int(rng.integers(len(opts)))]
        return g


# ---------------------------------------------------------------------------------------
# arms
# ---------------------------------------------------------------------------------------
Evaluate = Callable[[Graph], float]  # graph -> reward in [0, 1]


class RandomArm:
    """The control arm: every graph drawn from scratch by the random policy."""

    name = "random"

    def __init__(self, space: GraphSpace, seed: int = 0, p_stop: float = 0.3):
        self.space = space
        self.rng = np.random.default_rng([seed, 0x6A])
        self.p_stop = p_stop

    def step(self, evaluate: Evaluate) -> Optional[Graph]:
        g = self.space.complete(Graph(self.space.framework, ()), self.rng, p_stop=self.p_stop)
        if len(g.nodes) < self.space.min_nodes:
            return None
        evaluate(g)
        return g


class _TNode:
    __slots__ = ("state", "op", "branch", "parent", "children", "untried", "n", "w", "terminal", "label")

    def __init__(self, state: Graph, parent: Optional["_TNode"], op: Optional[str] = None,
                 branch: Optional[int] = None, terminal: bool = False, label: str = ""):
        self.state = state
        self.op = op
        self.branch = branch
        self.parent = parent
        self.children: List[_TNode] = []
        self.untried: Optional[list] = None
        self.n = 0
        self.w = 0.0
        self.terminal = terminal
        self.label = label

    @property
    def level(self) -> str:
        if self.op is None:
            return "op"
        return "branch" if self.branch is None else "source"


class MCTSArm:
    """Monte-Carlo tree search over the graph decisions with UCT (c = 1/√2)."""

    name = "mcts"

    def __init__(self, space: GraphSpace, seed: int = 0, c: float = C_UCT, p_stop: float = 0.3):
        self.space = space
        self.rng = np.random.default_rng([seed, 0x3C75])
        self.c = c
        self.p_stop = p_stop
        self.root = _TNode(Graph(space.framework, ()), None)

    def uct(self, parent: _TNode, child: _TNode) -> float:
        return child.w / child.n + self.c * math.sqrt(math.log(max(parent.n, 1)) / child.n)

    def _actions(self, node: _TNode) -> list:
        sp = self.space
        g = node.state
        if node.level == "op":
            acts: list = list(sp.op_choices(g))
            if len(g.nodes) >= sp.min_nodes:
                acts.append(STOP)
        elif node.level == "branch":
            acts = list(range(len(sp.ops[node.op].branches)))
        else:
            acts = sp.options(g, node.op, node.branch, self.rng)
        order = self.rng.permutation(len(acts))
        return [acts[int(i)] for i in order]

    def _child(self, node: _TNode, action) -> _TNode:
        if node.level == "op":
            if action == STOP:
                return _TNode(node.state, node, terminal=True, label=STOP)
            return _TNode(node.state, node, op=action, label=action)
        if node.level == "branch":
            return _TNode(node.state, node, op=node.op, branch=action,
                          label=self.space.ops[node.op].branches[action].label)
        g: Graph = action
        return _TNode(g, node, terminal=len(g.nodes) >= self.space.max_nodes, label=g.signature)

    def _prune(self, node: _TNode) -> None:
        """Remove a dead end, and parents left with nothing to try."""
        while node.parent is not None:
            parent = node.parent
            if node in parent.children:
                parent.children.remove(node)
            if parent.children or parent.untried or parent is self.root:
                return
            node = parent

    def select(self) -> Optional[_TNode]:
        for _ in range(10_000):
            node = self.root
            while True:
                if node.terminal:
                    return node
                if node.untried is None:
                    node.untried = self._actions(node)
                if node.untried:
                    child = self._child(node, node.untried.pop())
                    node.children.append(child)
                    return child
                if not node.children:
                    if node is self.root:
                        return None
                    self._prune(node)
                    break
                unvisited = [ch for ch in node.children if ch.n == 0]
                node = unvisited[0] if unvisited else max(node.children, key=lambda ch: self.uct(node, ch))
        return None

    def step(self, evaluate: Evaluate) -> Optional[Graph]:
        leaf = self.select()
        if leaf is None:
            return None
        if leaf.terminal:
            g = leaf.state
        else:
            g = self.space.complete(leaf.state, self.rng, p_stop=self.p_stop, op=leaf.op, branch=leaf.branch)
        reward = 0.0
        out = None
        if len(g.nodes) >= self.space.min_nodes:
            reward = float(evaluate(g))
            out = g
        node: Optional[_TNode] = leaf
        while node is not None:
            node.n += 1
            node.w += reward
            node = node.parent
        return out

    def tree_size(self) -> int:
        k, stack = 0, [self.root]
        while stack:
            n = stack.pop()
            k += 1
            stack.extend(n.children)
        return k


ARMS = {"mcts": MCTSArm, "random": RandomArm}


def make_arm(name: str, space: GraphSpace, seed: int = 0):
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r} (use {', '.join(ARMS)})")
    return ARMS[name](space, seed=seed)


__all__ = ["GraphSpace", "RandomArm", "MCTSArm", "ARMS", "make_arm", "C_UCT", "STOP"]
