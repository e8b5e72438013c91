"""Changed Python symbols (and changed native ops) -> catalogue operators, by walking the
reference graph forward from each operator's entry point (its ``callable``: a function, a method,
a class such as an ``nn.Module`` / ``autograd.Function`` / Keras ``Layer``, or a re-export) and from
Python implementations of native ops (``@register_decomposition(aten.x)``,
``@torch.library.custom_op("ns::op")``). Only modules reachable from an entry are parsed."""
from __future__ import annotations

from collections import deque
from typing import Dict, Iterable, List, Optional, Set, Tuple

from ..changes.pyindex import PyIndex


def entry_node(index: PyIndex, callable_path: str) -> Optional[str]:
    """Graph node of a catalogue callable, or None when it is not defined in this repository."""
    top = callable_path.replace(":", ".").split(".")[0]
    if not (index.has_module(top) or any(m.startswith(top + ".") for m in index.path_of)):
        return None
    return index.entry(callable_path)


def reach(index: PyIndex, start: str, targets: Set[str], limit: int = 200000) -> Dict[str, List[str]]:
    """Breadth-first from ``start``: target node -> path (target ... start), shortest first."""
    parent: Dict[str, Optional[str]] = {start: None}
    found: Dict[str, List[str]] = {}
    queue = deque([start])
    while queue and len(parent) < limit:
        node = queue.popleft()
        if node in targets and node not in found:
            path = []
            cur: Optional[str] = node
            while cur is not None:
                path.append(cur)
                cur = parent[cur]
            found[node] = path
        for nxt in index.edges(node):
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return found


def display(node: str) -> str:
    """``pkg.mod:C.*`` -> ``pkg.mod:C`` (the class as a whole reads as the class)."""
    return node[:-2] if node.endswith(".*") else node


def native_targets(natives: Iterable[Tuple[str, str]]) -> Dict[str, Tuple[str, str]]:
    """(framework, op) -> graph node names that reference it from Python."""
    from .tfnames import tf_snake

    out: Dict[str, Tuple[str, str]] = {}
    for fw, op in natives:
        if fw == "torch":
            out[f"native:torch:{op}"] = (fw, op)
        else:
            out[f"native:tf:{tf_snake(op).lstrip('_')}"] = (fw, op)
    return out
