"""A module whose constructor draws from Python's ``random`` or NumPy's global generator is built
the same in every process: modelled on lucidrains/hyper-connections 072bc2f ("full precision for
mHC"), whose ``ManifoldConstrainedHyperConnections`` picks the residual stream it starts from with
``random.randrange(num_residual_streams)`` when no layer index is given. The fix added ``.float()``
upcasts and nothing else; head's worker and base's each built their own layer (another stream),
and the gate read "head's float64 output differs from base's by 3.49e+06 float32 ulp (the function
changed)", a false alarm, and "non-deterministic" in the mixed-precision variants.

Here: an upcast added around a mixing layer whose constructor draws its stream with
``random.randrange`` and its scale with ``np.random``. The PR (an upcast: the same function)
passes; a PR that changes the function is still a behaviour change."""
import random

import numpy as np
import pytest
import torch

from gate.backends.base import resolve_callable
from tests.test_gate_run import by_op, commit_pr, make_repo
from tests.test_verdict_bed import BED_HEADER, PASSED, PASSING, outcomes, run_gate

OPS = '''
import random

import numpy as np
import torch


class Mix(torch.nn.Module):
    def __init__(self, streams=4):
        super().__init__()
        self.streams = streams
        self.start = random.randrange(streams)  # the stream it starts from, when no layer index is given
        self.scale = float(np.random.uniform(0.5, 2.0))
        self.weight = torch.nn.Parameter(torch.randn(streams) * 0.1)

    def forward(self, x):
        w = torch.softmax(self.weight, dim=0)
        mixed = (x * w[:, None]).sum(0)
        return mixed + self.scale * x[self.start]
'''
BEFORE = "        mixed = (x * w[:, None]).sum(0)\n        return mixed + self.scale * x[self.start]\n"
UPCAST = ("        dtype = x.dtype\n        mixed = (x.float() * w.float()[:, None]).sum(0)\n"
          "        return (mixed + self.scale * x[self.start].float()).to(dtype)\n")
CHANGED = "        mixed = (x * w[:, None]).sum(0)\n        return mixed + self.scale * x[(self.start + 1) % self.streams]\n"

CONFIG = BED_HEADER + '''ops:
  - {name: lib.mix, callable: "lib.ops:Mix", construct: {streams: 4}, sources: [lib/ops.py],
     dims: {D: [1, 64]}, inputs: [{name: x, shape: [4, D]}]}
'''


def test_a_constructor_drawing_from_the_global_generators_builds_the_same_instance_whatever_their_state(tmp_path,
                                                                                                          monkeypatch):
    (tmp_path / "mixlib.py").write_text(OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    x = torch.randn(4, 8, dtype=torch.float64)
    outs = []
    for state in (1, 2, 3):  # head's and base's workers: each its own history of draws
        random.seed(state)
        np.random.seed(state)
        op = resolve_callable("mixlib:Mix", (("streams", 4),))
        outs.append(op.at("float64")(x))
        assert random.random() == random.Random(state).random()  # the caller's states are given back
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.slow
def test_an_upcast_of_a_randomly_built_module_passes_and_a_changed_function_does_not(tmp_path_factory, tmp_path):
    bed = make_repo(tmp_path_factory.mktemp("seeded"), OPS, config=CONFIG, package="lib")
    commit_pr(bed, "upcast", "main", BEFORE, UPCAST)
    code, report = run_gate(bed, tmp_path / "upcast", "main", "lib.mix", evals=20)
    assert code in PASSED, outcomes(report, "lib.mix")
    assert {v.outcome for v in by_op(report, "lib.mix")} <= set(PASSING), outcomes(report, "lib.mix")
    commit_pr(bed, "changed", "main", BEFORE, CHANGED)
    code, report = run_gate(bed, tmp_path / "changed", "main", "lib.mix", evals=20)
    assert code == 1 and "behaviour-change" in {v.outcome for v in by_op(report, "lib.mix")}, outcomes(report, "lib.mix")
