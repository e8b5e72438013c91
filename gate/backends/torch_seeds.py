"""Seeds from torch itself: the OpInfo database's sample calls, the ATen schema's argument names,
a torch call's arguments as plain data. :mod:`gate.search.seeds` turns them into candidates; it
never imports torch."""
from __future__ import annotations

import re
from typing import Any, Callable, List, Optional, Tuple


def torch_version() -> str:
    import torch

    return torch.__version__


def aten_argument_names(fn: Callable) -> Optional[List[str]]:
    """Argument names from the ATen schema of a torch builtin (only if torch is loaded)."""
    import sys

    torch = sys.modules.get("torch")
    name = getattr(fn, "__name__", None)
    if torch is None or not name or getattr(fn, "__module__", None) not in (None, "torch", "torch._C._VariableFunctions"):
        return None
    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
    except Exception:
        return None
    if not schemas:
        return None
    return [a.name for a in schemas[0].arguments]


def torch_value(v: Any, max_elems: int, tensor: Callable, opaque: Callable) -> Any:
    """A torch call argument as plain data: ``tensor(shape, dtype, float64/int64 values or
    None)`` for a tensor (values only up to ``max_elems`` elements), ``opaque(type name)`` for
    what cannot be described, numbers/strings/tuples as they are."""
    import torch

    if isinstance(v, torch.Tensor):
        t = v.detach()
        values = None
        if t.numel() <= max_elems and not t.is_complex():
            values = t.to("cpu", torch.float64 if t.is_floating_point() else torch.int64).numpy().copy()
        return tensor(tuple(t.shape), str(t.dtype).replace("torch.", ""), values)
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        inner = [torch_value(x, max_elems, tensor, opaque) for x in v]
        if any(isinstance(x, (tensor, opaque)) for x in inner):
            return opaque(f"sequence with tensors: {type(v).__name__}")
        return tuple(inner)
    if isinstance(v, torch.Size):
        return tuple(int(x) for x in v)
    return opaque(type(v).__name__)


def opinfo_samples(name: str, max_elems: int, tensor: Callable, opaque: Callable) -> Tuple[List[tuple], str]:
    """``(args, kwargs, fn)`` of each sample call of OpInfo entry ``name`` (``"nn.functional.conv2d"``,
    or with a variant test name ``"softmax[with_dtype]"``), arguments as :func:`torch_value`
    describes them, or a reason."""
    try:
        import torch
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception as exc:  # expecttest missing, internals moved...
        return [], f"OpInfo database not importable: {type(exc).__name__}: {exc}"
    m = re.fullmatch(r"(.+?)(?:\[(.*)\])?", name)
    base, variant = m.group(1), m.group(2) or ""
    entries = [o for o in op_db if o.name == base and o.variant_test_name == variant]
    if not entries:
        return [], f"no OpInfo entry {name!r}"
    out: List[tuple] = []
    for op in entries[:1]:
        dtype = torch.float32 if torch.float32 in op.supported_dtypes("cpu") else torch.float64
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
        except Exception as exc:
            return [], f"OpInfo {name}: sample_inputs failed: {exc}"
        for s in samples:
            args = [torch_value(s.input, max_elems, tensor, opaque)] + [torch_value(a, max_elems, tensor, opaque) for a in s.args]
            kwargs = {k: torch_value(v, max_elems, tensor, opaque) for k, v in s.kwargs.items()}
            out.append((args, kwargs, op.op))
    return out, ""
