"""Triton operators: compiled on a CUDA device, run by the Triton interpreter on CPU.

``TRITON_INTERPRET=1`` makes ``@triton.jit`` return an interpreted function (NumPy executes each
program of the grid in turn), so a Triton kernel runs on CPU tensors. Triton reads the variable
when a kernel is *decorated*, so :func:`activate` sets it before the operator library is imported,
and every process the gate starts (isolation workers, the base replay) inherits it.

Interpreter numerics are NumPy's, not the GPU's (no FMA contraction, other reduction orders,
``exp``/``sqrt`` from libm): a variant fuzzed this way is marked ``interpreter`` in the report;
the compiled path runs on a CUDA device (the GPU workflow). Autocast does not reach a Triton
kernel, so only ``input`` mode is planned for these operators.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..errors import SetupError

INTERPRETER = "interpreter"
COMPILED = "compiled"
MODE_ENV = "DL_GATE_TRITON"  # interpreter | compiled: overrides the choice by device
INTERPRETER_NOTE = ("fuzzed on CPU through the Triton interpreter (TRITON_INTERPRET=1): interpreter numerics "
                    "are NumPy's, not the GPU's; the compiled kernels are gated on a CUDA runner")


def choose_mode(cuda_available: bool, environ=None) -> str:
    """``compiled`` where a CUDA device is present, else ``interpreter``; ``DL_GATE_TRITON`` or an
    inherited ``TRITON_INTERPRET=1`` decide first."""
    environ = os.environ if environ is None else environ
    forced = (environ.get(MODE_ENV) or "").strip().lower()
    if forced:
        if forced not in (INTERPRETER, COMPILED):
            raise SetupError(f"{MODE_ENV}={forced!r}: use {INTERPRETER} or {COMPILED}")
        if forced == COMPILED and not cuda_available:
            raise SetupError(f"{MODE_ENV}=compiled, but there is no CUDA device (compiled Triton kernels need one)")
        return forced
    if (environ.get("TRITON_INTERPRET") or "").strip() in ("1", "true", "True"):
        return INTERPRETER
    return COMPILED if cuda_available else INTERPRETER


@dataclass
class TritonRun:
    """How this run executes Triton kernels, and which operators launch them."""

    mode: str
    version: str
    kernels: Dict[str, List[str]] = field(default_factory=dict)  # operator -> module:kernel

    @property
    def device(self) -> str:
        return "cpu" if self.mode == INTERPRETER else "cuda"

    def launches(self, op: str) -> bool:
        return bool(self.kernels.get(op))

    def adjust(self, spec):
        """The spec as this run fuzzes it: on the device the kernels run on, in input mode."""
        if not self.launches(spec.name):
            return spec
        return dataclasses.replace(spec, devices=(self.device,), modes=("input",))

    def mark(self, verdict) -> None:
        if self.launches(verdict.op):
            verdict.details["triton"] = {"mode": self.mode, "kernels": self.kernels[verdict.op]}

    def warnings(self, ops) -> List[str]:
        """One line per operator of ``ops`` that ran its Triton kernels in the interpreter."""
        if self.mode != INTERPRETER:
            return []
        return [f"{op}: Triton kernel{'s' if len(self.kernels[op]) > 1 else ''} {', '.join(self.kernels[op])} "
                f"{INTERPRETER_NOTE}" for op in ops if self.launches(op)]

    def to_dict(self) -> dict:
        return {"mode": self.mode, "version": self.version, "operators": dict(self.kernels)}


def activate(kernels: Dict[str, List[str]], cuda_available: Optional[bool] = None) -> Optional[TritonRun]:
    """Prepare this process (and its children) to run the operators in ``kernels`` (operator ->
    the Triton kernels it launches); ``None`` when no operator launches one. Call before the
    operator library is imported."""
    if not any(kernels.values()):
        return None
    if importlib.util.find_spec("triton") is None:
        ops = ", ".join(sorted(op for op, k in kernels.items() if k))
        raise SetupError(f"operators {ops} launch Triton kernels, but triton is not installed "
                         "(pip install 'dl-gate[triton]')")
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    mode = choose_mode(cuda_available)
    if mode == INTERPRETER:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    import triton

    return TritonRun(mode=mode, version=getattr(triton, "__version__", "?"),
                     kernels={op: list(k) for op, k in kernels.items() if k})


_DECORATOR = None


def tree_uses_triton(dirs) -> bool:
    """Whether a ``.py`` file under ``dirs`` (tracked or not) decorates a function with
    ``@triton.jit`` / ``@triton.autotune`` / ``@triton.heuristics`` or a ``jit`` imported from triton."""
    import re
    import subprocess
    from pathlib import Path

    global _DECORATOR
    if _DECORATOR is None:
        _DECORATOR = re.compile(rb"^\s*@\s*(?:triton\.)?(?:jit|autotune|heuristics)\b", re.M)
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            continue
        res = subprocess.run(["git", "-C", str(d), "grep", "-l", "-I", "--untracked", "-w", "-e", "triton", "--", "*.py"],
                             capture_output=True)
        if res.returncode not in (0, 1):
            continue  # not a git tree: nothing to scan cheaply
        for rel in res.stdout.decode(errors="replace").splitlines():
            try:
                data = (d / rel).read_bytes()
            except OSError:
                continue
            if _DECORATOR.search(data):
                return True
    return False


def prepare_tree(dirs) -> Optional[str]:
    """Before a command imports an operator library from ``dirs``: where it launches Triton
    kernels and no CUDA device is present (or ``DL_GATE_TRITON=interpreter``), switch the
    interpreter on. Returns the mode, or ``None`` when the library has no Triton kernel."""
    if importlib.util.find_spec("triton") is None or not tree_uses_triton(dirs):
        return None
    import torch

    mode = choose_mode(torch.cuda.is_available())
    if mode == INTERPRETER:
        os.environ["TRITON_INTERPRET"] = "1"
    return mode
