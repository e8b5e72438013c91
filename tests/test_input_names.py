"""Inputs named like the search's own arguments (``self``, ``origin``): torchfields' functions take
their field as ``self`` (``def linear_combination(self, ...)``), and the first run of a PR over
them stopped with an internal error, "Candidate.derive() got multiple values for argument
'self'", where the run's neighbour candidates were made. Every way the search makes a child
candidate must take any input name."""
from __future__ import annotations

import numpy as np

from gate.fuzz import fuzz_task
from gate.ops.catalog import builtin_defaults
from gate.ops.spec import OpSpec
from gate.plan import Budget, Task, Variant
from gate.search.inputs import accumulation_inputs, degenerate_inputs, draw, neighbours, structured_inputs
from gate.search.mutate import MUTATORS

ROW = {"name": "names.add", "callable": "torch:add", "dims": {"N": [2, 16]},
       "inputs": [{"name": "self", "shape": ["N"]}, {"name": "origin", "shape": ["N"]}]}


def _spec() -> OpSpec:
    return OpSpec.from_dict(ROW, builtin_defaults("torch"), origin="user")


def test_every_child_of_a_candidate_takes_inputs_named_self_and_origin():
    spec = _spec()
    rng = np.random.default_rng(0)
    cand = draw(spec, rng)
    kids = neighbours(spec, cand, "float32", rng) + degenerate_inputs(spec, cand) + structured_inputs(spec, cand) \
        + accumulation_inputs(spec, cand, "float32")
    for name, mutator in MUTATORS.items():
        for _ in range(4):
            kid = mutator(cand, spec, rng, dtype="float32") if _takes_dtype(mutator) else mutator(cand, spec, rng)
            if kid is not None:
                kids.append(kid)
    assert kids
    for kid in kids:
        assert set(kid.arrays) == {"self", "origin"}, kid.origin


def _takes_dtype(fn) -> bool:
    import inspect

    return "dtype" in inspect.signature(fn).parameters


def test_a_search_over_inputs_named_self_and_origin_runs():
    f = fuzz_task(Task(op=_spec(), variant=Variant("float16"), budget=Budget(evals=30), seed=0))
    assert f.evals >= 30 and "mutator_error" not in f.coverage, (f.evals, f.coverage.get("mutator_error"))
