"""A tiny, safe arithmetic evaluator for shape and parameter expressions in specs.

Specs are data (YAML), so shapes like ``[N, C, "H+2*p"]`` or a dim range ``["k", 16]`` must be
evaluated without ``eval``. Supported: integer/float literals, names, ``+ - * // / % **``,
unary minus, ``min()``, ``max()``, tuples and lists.
"""
from __future__ import annotations

import ast
import functools
import operator
from typing import Any, Mapping

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCS = {"min": min, "max": max, "int": int}


def evaluate(expr: Any, env: Mapping[str, Any]) -> Any:
    """Evaluate ``expr`` (a number, a name, or an arithmetic string) in ``env``."""
    if isinstance(expr, (int, float, bool)) or expr is None:
        return expr
    if isinstance(expr, (list, tuple)):
        return type(expr)(evaluate(e, env) for e in expr)
    if not isinstance(expr, str):
        raise ValueError(f"cannot evaluate {expr!r}")
    if expr in env:  # a bare name (most shapes are ``[N, D]``), as _eval would find it
        return env[expr]
    return _eval(_parse(expr), env, expr)


@functools.lru_cache(maxsize=4096)
def _parse(expr: str) -> ast.AST:
    """The expression's tree, parsed once (a search evaluates the same few shapes thousands of
    times; the trees are only read)."""
    return ast.parse(expr, mode="eval").body


def _eval(node: ast.AST, env: Mapping[str, Any], src: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ValueError(f"unknown name {node.id!r} in expression {src!r}")
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        return _BIN[type(node.op)](_eval(node.left, env, src), _eval(node.right, env, src))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env, src)
    if isinstance(node, (ast.Tuple, ast.List)):
        vals = [_eval(e, env, src) for e in node.elts]
        return tuple(vals) if isinstance(node, ast.Tuple) else vals
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        return _FUNCS[node.func.id](*(_eval(a, env, src) for a in node.args))
    raise ValueError(f"unsupported expression {src!r}")


def names(expr: Any) -> set[str]:
    """Names an expression refers to (for ordering and validation)."""
    if isinstance(expr, (list, tuple)):
        out: set[str] = set()
        for e in expr:
            out |= names(e)
        return out
    if not isinstance(expr, str):
        return set()
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _FUNCS}
