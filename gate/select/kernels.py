"""Triton kernels in the operator library, and which operators launch them.

A kernel is a function decorated with ``@triton.jit`` (or ``@triton.autotune`` /
``@triton.heuristics`` stacked on it, or a bare ``@jit`` imported from ``triton``). A Python
wrapper launches it with ``kernel[grid](...)``: the subscripted name is an ordinary reference in
the call graph of :mod:`gate.changes.pyindex`, so a changed kernel reaches every wrapper that
launches it, and an operator launches Triton kernels when its entry point reaches one.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional

from ..changes.pyindex import PyIndex
from ..changes.pysrc import PyModule, attr_chain
from .python import display, entry_node, reach

TRITON_DECORATORS = ("jit", "autotune", "heuristics")


def _is_triton_decorator(mod: PyModule, dec: ast.expr) -> bool:
    node = dec.func if isinstance(dec, ast.Call) else dec
    chain = attr_chain(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
    if not chain or chain[-1] not in TRITON_DECORATORS:
        return False
    head = chain[0]
    b = mod.imports.get(head)
    if b is None:
        return False
    target = b.module if b.attr is None else f"{b.module}.{b.attr}"
    return target.split(".")[0] == "triton"


def triton_kernels(index: PyIndex) -> Dict[str, str]:
    """Graph node -> ``module:kernel`` of every Triton kernel at the index's revision."""
    out: Dict[str, str] = {}
    for path in index.git.grep_files(index.rev, ["triton"], ["*.py"], word=True):
        m = index.module_at(path)
        if m is None or m.error:
            continue
        for qual, d in m.defs.items():
            if d.kind == "function" and any(_is_triton_decorator(m, dec) for dec in d.node.decorator_list):
                out[f"{m.name}:{qual}"] = f"{m.name}:{qual}"
    return out


def launched_kernels(index: PyIndex, callable_path: str, kernels: Optional[Dict[str, str]] = None) -> List[str]:
    """The Triton kernels the operator ``callable_path`` can launch (``module:kernel``), nearest first."""
    kernels = triton_kernels(index) if kernels is None else kernels
    if not kernels:
        return []
    node = entry_node(index, callable_path)
    if node is None:
        return []
    found = reach(index, node, set(kernels))
    return [display(k) for k in sorted(found, key=lambda k: (len(found[k]), k))]


def operator_kernels(repo, rev: str, catalog, config) -> Dict[str, List[str]]:
    """User operator -> the Triton kernels it launches at ``rev`` (operators launching none are left out)."""
    from pathlib import Path

    from ..changes.git import Git
    from . import python_roots

    git = Git(Path(repo))
    if not git.grep_files(rev, ["triton"], ["*.py"], word=True):
        return {}
    index = PyIndex(git, rev, python_roots(git.root, config))
    kernels = triton_kernels(index)
    out: Dict[str, List[str]] = {}
    for spec in catalog:
        if spec.origin == "user":
            found = launched_kernels(index, spec.callable, kernels)
            if found:
                out[spec.name] = found
    return out
