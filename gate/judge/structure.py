"""Is an undeclared row really elementwise? Asked of the operator, decided here from its outputs.

A user row without ``kind:`` (or ``ulp_floor:``) is judged elementwise: each output element in
ulps of its own value (``ulp_floor: dtype``). That is right for the gradient of an operator
whose output element ``k`` depends on input element ``k`` only: the gradient element is one
product ``u_k f'(x_k)``. Where output elements depend on several inputs (attention, a
normalisation, a stencil), a gradient element is a *sum* over outputs, and one that is zero in
exact arithmetic (the shift of a softmax on tied scores) comes back from the float64 run as a
residue (5.6e-17) and from float32 as the rounding of the O(1) terms that cancelled (-3e-8):
per element, 1e24 "ulps", a false alarm on a benign refactor (``amax`` -> ``max`` in a hand
written attention failed its float16 gradient on 8 seeds of 8, its float32 one on 1 of 8).

So before a run judges such a row's gradients, the operator is asked: one input drawn from the
row, then the same input with one element of one float input replaced by another of its values,
for each float input. Both run in a worker (base's, where base has the operator: the PR's code
does not get to choose how it is judged) and only their float64 outputs come back. The verdict
is read here:

* some output element outside the one(s) the changed input element maps to (the same position;
  the positions it broadcasts to) changed: **coupled**, and the row's gradient variants are
  judged on the gradient's own scale (``ulp_floor: output`` with the residue rule of
  :func:`gate.oracles.precision.residue_magnitude`), as a declared composite row's are;
* only those changed: **elementwise**, as declared by default;
* nothing changed, the worker failed, or no float input has two elements: **unknown**, and the
  row stays as declared (never more lenient without evidence).

The forward variants keep the per-element judgement either way: a stencil's output element is
one computation of its own (kornia's sobel eps fix is judged there per element, and passes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import GateError
from ..ops.spec import OpSpec
from ..plan import Variant
from ..search.inputs import Candidate, draw

COUPLED, ELEMENTWISE, UNKNOWN = "coupled", "elementwise", "unknown"
#: positions probed per float input
POSITIONS = 2


@dataclass
class Probe:
    """One changed element: input ``name``'s flat position ``index`` (of an array of ``shape``)."""
    name: str
    index: int
    shape: Tuple[int, ...]


@dataclass
class Structure:
    result: str  # COUPLED | ELEMENTWISE | UNKNOWN
    evidence: str
    side: str = "base"
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"result": self.result, "evidence": self.evidence, "side": self.side, "seconds": round(self.seconds, 3)}


def needs_probe(spec: OpSpec) -> bool:
    """A user row judged per element by default (it declares neither ``kind`` nor ``ulp_floor``)."""
    return spec.origin == "user" and not spec.floor_declared and spec.ulp_floor == "dtype"


def probe_inputs(spec: OpSpec, seed: int = 0) -> Tuple[Optional[Candidate], List[Tuple[Probe, Candidate]]]:
    """A drawn input and, for each float input of two or more elements, the same input with the
    element at ``POSITIONS`` positions replaced by the value of that input farthest from it
    (a value of the row's own domain; far, so that the change survives rounding to the dtype)."""
    rng = np.random.default_rng([seed, 31])
    floats = [t.name for t in spec.inputs if t.kind == "float"]
    base = None
    for _ in range(4):  # a draw whose float inputs all have one element cannot tell
        base = draw(spec, rng, origin="structure probe")
        if any(base.arrays.get(n) is not None and np.size(base.arrays[n]) >= 2 for n in floats):
            break
    if base is None:
        return None, []
    probes = []
    for name in floats:
        a = base.arrays.get(name)
        if a is None or a.size < 2:
            continue
        flat = np.asarray(a, dtype=np.float64).reshape(-1)
        finite = np.isfinite(flat)
        for j in rng.choice(flat.size, size=min(POSITIONS, flat.size), replace=False):
            if not finite[j]:
                continue
            gap = np.where(finite, np.abs(flat - flat[j]), -1.0)
            k = int(np.argmax(gap))
            if gap[k] <= 0:
                continue
            changed = flat.copy()
            changed[j] = flat[k]
            probes.append((Probe(name, int(j), tuple(a.shape)),
                           base.derive("structure probe", **{name: changed.reshape(a.shape)})))
    return base, probes


def _reach(probe: Probe, out_shape: Tuple[int, ...]) -> Optional[np.ndarray]:
    """The output positions input element ``probe.index`` maps to elementwise: itself where the
    shapes agree, every position it is broadcast to; None where the input does not broadcast to
    the output (a reduction, a stencil, a reshape: every changed element is another's)."""
    idx = np.arange(int(np.prod(probe.shape)), dtype=np.int64).reshape(probe.shape)
    try:
        return (np.broadcast_to(idx, out_shape) == probe.index).reshape(-1)
    except ValueError:
        return None


def decide_structure(base_out: Optional[Sequence[np.ndarray]],
                     probed: Sequence[Tuple[Probe, Optional[Sequence[np.ndarray]]]]) -> Structure:
    """The verdict from the float64 outputs of the drawn input and of each changed one."""
    if base_out is None:
        return Structure(UNKNOWN, "the operator did not run on the drawn input")
    moved_any = False
    for probe, outs in probed:
        if outs is None or len(outs) != len(base_out):
            continue
        for o, (x, y) in enumerate(zip(base_out, outs)):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype.kind != "f" or y.dtype.kind != "f":
                continue
            if x.shape != y.shape:
                return Structure(COUPLED, f"changing {probe.name}[{probe.index}] changed the shape of output {o}")
            moved = ~((x == y) | (np.isnan(x) & np.isnan(y))).reshape(-1)
            if not moved.any():
                continue
            moved_any = True
            reach = _reach(probe, x.shape)
            others = moved if reach is None else moved & ~reach
            n = int(np.count_nonzero(others))
            if n and reach is None:
                return Structure(COUPLED, f"changing {probe.name}[{probe.index}] moved output {o}, of shape "
                                          f"{list(x.shape)}, which {probe.name}'s shape {list(probe.shape)} does not "
                                          "broadcast to")
            if n:
                return Structure(COUPLED, f"changing {probe.name}[{probe.index}] moved {n} other element(s) of "
                                          f"output {o} (of {x.size})")
    if not moved_any:
        return Structure(UNKNOWN, "no probed change moved an output")
    return Structure(ELEMENTWISE, "each probed change moved only its own output element(s)")


def probe_structure(spec: OpSpec, isolate=None, side: str = "base", seed: int = 0) -> Structure:
    """Run the probe inputs (the same for a row whatever the run's seed: a refresh and a run
    judge its gradients alike) through ``spec``'s float64 reference run (in a worker with
    ``isolate``) and decide; any failure is UNKNOWN (the row stays as declared)."""
    import time

    from .replay import replay

    t0 = time.perf_counter()
    base, probes = probe_inputs(spec, seed)
    if base is None or not probes:
        return Structure(UNKNOWN, "no float input with two elements was drawn", side)
    device = "cpu" if "cpu" in spec.devices else spec.devices[0]
    variant = Variant(spec.dtypes[0] if spec.dtypes else "float32", device)
    try:
        results = replay(spec, variant, [base] + [c for _, c in probes], isolate=isolate)
    except (GateError, OSError, RuntimeError) as exc:
        return Structure(UNKNOWN, f"the probe did not run ({str(exc).splitlines()[0][:120]})", side)

    def ref(r):
        return r.reference if r.status == "ok" and r.reference is not None else None

    found = decide_structure(ref(results[0]), [(p, ref(r)) for (p, _), r in zip(probes, results[1:])])
    found.side, found.seconds = side, time.perf_counter() - t0
    return found


def judged_for_grad(spec: OpSpec, found: Structure) -> OpSpec:
    """The row a gradient variant of ``spec`` is judged with, given what the probe found."""
    if found.result == COUPLED:
        return spec.replace(ulp_floor="output")
    return spec


def say_structure(name: str, found: Structure) -> Optional[str]:
    """The run's line about it (None where nothing changes)."""
    if found.result != COUPLED:
        return None
    return (f"{name}: not elementwise ({found.evidence}, on {found.side}): its gradient variants are judged on the "
            "gradient's own scale, as a composite row's; declare `kind:` in its row to skip this probe")


__all__ = ["COUPLED", "ELEMENTWISE", "UNKNOWN", "Structure", "decide_structure", "judged_for_grad", "needs_probe",
           "probe_inputs", "probe_structure", "say_structure"]
