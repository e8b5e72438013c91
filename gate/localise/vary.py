"""Which parameter value drives a finding: vary one thing at a time (Audee).

From the failing configuration (variant + the input's parameter values) every axis is varied
alone while everything else stays: dtype, mode, layout, device, and each declared parameter
(every choice; for ranges the bounds and the default). Each variation is asked on head and base
in one batch. An axis *drives* the finding when the finding holds for the failing value and not
for some other value of it ("approximate='tanh' only", "dtype=bfloat16 only"); an axis for which
it holds everywhere is not the cause.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, List, Optional, Sequence, Tuple

from ..search.inputs import Candidate, derived_params, tensor_shape
from ..ops.spec import OpSpec
from ..plan import Variant


VARIANT_AXES = ("dtype", "mode", "layout", "device")


@dataclass
class Variation:
    """One configuration: the failing one with one axis changed, asked on every input given
    (the minimal input and the input as found): it holds if it holds on any of them."""

    axis: str  # dtype | mode | layout | device | <parameter name>
    value: Any
    current: bool
    variant: Variant
    cands: List[Optional[Candidate]]
    results: List[Optional[bool]] = field(default_factory=list)
    head: str = ""
    base: str = ""

    @property
    def holds(self) -> Optional[bool]:
        if any(r is True for r in self.results):
            return True
        if self.results and all(r is False for r in self.results):
            return False
        return None

    def to_dict(self) -> dict:
        return {"axis": "(as found)" if self.current else self.axis, "value": show(self.axis, self.value),
                "current": self.current, "variant": self.variant.key, "holds": self.holds,
                "on": ["minimal", "found"][:len(self.results)], "results": self.results, "head": self.head, "base": self.base}


def show(axis: str, v: Any) -> str:
    """``bfloat16`` for variant axes, ``'tanh'`` (a Python literal) for parameters."""
    if axis in VARIANT_AXES:
        return str(v)
    return repr(v) if isinstance(v, str) else str(v)


def _valid_variant(spec: OpSpec, v: Variant) -> bool:
    if v.dtype not in spec.dtypes:
        return False
    if v.dtype == "float64" and spec.reference is None:
        return False
    if v.mode not in spec.modes or (v.mode == "operator" and v.dtype in ("float32", "float64")):
        return False
    if v.layout != "default" and (v.mode != "input" or v.layout not in {lay.name for lay in spec.layouts}):
        return False
    return True


def _param_values(p) -> List[Any]:
    if p.kind == "choice":
        return list(p.choices or ())
    if p.kind in ("int", "float"):
        vals = [p.lo, p.default, p.hi]
        if p.kind == "int":
            vals = [int(v) for v in vals if v is not None]
        out = []
        for v in vals:
            if v is not None and v not in out:
                out.append(v)
        return out
    return []


def with_param(spec: OpSpec, cand: Candidate, name: str, value: Any) -> Optional[Candidate]:
    """``cand`` with one parameter changed, or None when the change would need other tensor
    shapes (the parameter enters a shape expression)."""
    new = cand.copy(origin="vary")
    new.params[name] = value
    new.params = derived_params(spec, new.params, new.dims)
    old_env, new_env = {**cand.params, **cand.dims}, {**new.params, **new.dims}
    for t in spec.inputs:
        try:
            if tensor_shape(t, old_env) != tensor_shape(t, new_env):
                return None
        except Exception:
            return None
    return new


def variations(spec: OpSpec, variant: Variant, cands: Sequence[Candidate], devices: Sequence[str]) -> List[Variation]:
    """The failing configuration (first row) and every one-axis change of it, each with its
    version of every candidate in ``cands`` (None where a parameter cannot apply to one)."""
    first = cands[0]
    out: List[Variation] = [Variation("dtype", variant.dtype, True, variant, list(cands))]
    axes = [("dtype", variant.dtype, list(spec.dtypes)),
            ("mode", variant.mode, list(spec.modes)),
            ("layout", variant.layout, ["default"] + [lay.name for lay in spec.layouts]),
            ("device", variant.device, [d for d in spec.devices if d in devices])]
    for axis, cur, values in axes:
        for val in values:
            if val == cur:
                continue
            v = replace(variant, **{axis: val})
            if _valid_variant(spec, v):
                out.append(Variation(axis, val, False, v, list(cands)))
    for p in spec.params:
        cur = first.params.get(p.name)
        for val in _param_values(p):
            if val == cur and type(val) is type(cur):
                continue
            vc = [with_param(spec, c, p.name, val) for c in cands]
            if any(c is not None for c in vc):
                out.append(Variation(p.name, val, False, variant, vc))
    return out


def conclude(rows: Sequence[Variation], variant: Variant, params: dict,
             failed_in_run: Sequence[str] = ()) -> Tuple[str, str]:
    """(parameter, evidence): the driving values, and one line of what was tried.

    ``failed_in_run``: keys of the operator's variants that the run failed on their own inputs:
    such a variant holds whatever this input does there (a float16 row that failed is no
    evidence for "dtype=float32 only", even where the float32 finding's input passes at float16)."""
    failed = set(failed_in_run)

    def held(r: Variation) -> Optional[bool]:
        return True if (not r.current and r.axis in VARIANT_AXES and r.variant.key in failed) else r.holds

    current = next((r for r in rows if r.current), None)
    cur_holds = current.holds if current is not None else None
    axes: List[str] = []
    for r in rows:
        if not r.current and r.axis not in axes:
            axes.append(r.axis)
    mark = lambda h: "yes" if h else "no" if h is False else "?"  # noqa: E731

    def mark_row(r: Variation) -> str:
        if held(r) and not r.holds:
            return "yes (failed in this run)"
        return mark(r.holds)

    drivers, evidence, neutral = [], [], []
    for axis in axes:
        cur = getattr(variant, axis) if axis in VARIANT_AXES else params.get(axis)
        vals = [r for r in rows if r.axis == axis and not r.current]
        holds = [r for r in vals if held(r)]
        fails = [r for r in vals if held(r) is False]
        unknown = [r for r in vals if held(r) is None]
        evidence.append(f"{axis}: " + ", ".join([f"{show(axis, cur)} {mark(cur_holds)}"]
                                                + [f"{show(axis, r.value)} {mark_row(r)}" for r in vals]))
        if not cur_holds:
            continue
        if fails and not holds:
            drivers.append(f"{axis}={show(axis, cur)} only")
        elif fails:
            # a value in the set only because its variant failed in the run on its own inputs says
            # so (this finding's input did not fail there: "dtype in {float32, float16}" read as
            # if it had, beside a table whose float16 replay did not hold)
            members = [show(axis, cur)] + [show(axis, r.value) + (" (failed in this run)" if not r.holds else "")
                                           for r in holds]
            drivers.append(f"{axis} in {{{', '.join(members)}}} (not {', '.join(show(axis, r.value) for r in fails)})")
        elif holds and not unknown:
            neutral.append(axis)
    ev = "; ".join(evidence)
    if current is not None and cur_holds is False:
        return "undetermined: the finding does not hold again in its own configuration", ev
    if drivers:
        return "; ".join(drivers), ev
    if neutral:
        return f"no single parameter: it holds for every value tried of {', '.join(neutral)}", ev
    return "undetermined: nothing to vary, or base could not tell", ev


def describe(r, kind: str) -> Tuple[str, str]:
    """(head, base) one-line outcome of a Check for the variation table."""
    def one(x):
        if x is None:
            return "-"
        if x.status != "ok":
            return f"{x.status}: {(x.error or '')[:80]}"
        m = x.metrics
        s = f"{m.ulp:.3g} ulp"
        if m.nonfinite:
            s += f", {m.nonfinite} NaN/Inf"
        return s
    return one(r.head), one(r.base)
