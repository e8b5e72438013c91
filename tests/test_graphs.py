"""Graph fuzzing: a planted composition defect found and localised, exact coverage on a
three-operator catalogue, shape solving, signatures, and a deterministic MCTS arm."""
from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest

pytest.importorskip("torch")

from gate.search.finding import Finding  # noqa: E402
from gate.search.inputs import draw  # noqa: E402
from gate.oracles.runner import VariantRunner  # noqa: E402
from gate.graphs.campaign import GraphCampaign  # noqa: E402
from gate.graphs.coverage import Coverage, CoverageSpace  # noqa: E402
from gate.graphs.evaluate import GraphRunner, change_rate, fuzz_graph, replay_graph  # noqa: E402
from gate.graphs.generate import C_UCT, GraphSpace, MCTSArm, _TNode  # noqa: E402
from gate.graphs.model import Graph, Node, signature  # noqa: E402
from gate.graphs.shapes import solve_dims  # noqa: E402
from gate.ops.catalog import load_builtin  # noqa: E402
from gate.ops.spec import OpSpec  # noqa: E402
from gate.plan import Variant  # noqa: E402

USER_OPS = textwrap.dedent('''
    import torch

    def scale300(x):
        """Looks harmless: a fixed gain."""
        return x * 300.0

    def sq_ratio(x):
        """x^2 / (1 + x^2): accurate in fp16 on its own inputs, overflows x*x past 255."""
        s = x * x
        return s / (1.0 + s)

    def softsign(x, gain: float = 1.0):
        return gain * x / (1.0 + torch.abs(x))

    def blend(x, y):
        return 0.5 * x + 0.5 * y
''')


@pytest.fixture()
def userops(tmp_path, monkeypatch):
    (tmp_path / "dlgate_graph_userops.py").write_text(USER_OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def user_spec(name, fn, *, inputs=None, params=None, dims=None, domain=None) -> OpSpec:
    row = {
        "name": name, "framework": "torch", "callable": f"dlgate_graph_userops.{fn}", "kind": "elementwise",
        "inputs": inputs or [{"name": "x", "shape": ["N", "D"], **({"domain": domain} if domain else {})}],
        "dims": dims or {"N": [1, 8], "D": [1, 32]},
    }
    if params:
        row["params"] = params
    defaults = {"thresholds_by_kind": {"elementwise": {"float16": {"ulp": 2}, "float32": {"ulp": 4}}}}
    return OpSpec.from_dict(row, defaults, origin="user")


def planted_catalog():
    return [
        user_spec("user.scale300", "scale300", domain={"name": "real", "scale": 1.0}),
        user_spec("user.sq_ratio", "sq_ratio", domain={"name": "real", "scale": 2.0}),
        user_spec("user.softsign", "softsign", params={"gain": {"choices": [1.0, 0.5]}}),
    ]


# -- the planted graph-only defect ------------------------------------------------------------
def test_each_planted_op_is_fine_alone_in_fp16(userops):
    for spec in planted_catalog()[:2]:
        runner = VariantRunner(spec, Variant(dtype="float16"))
        rng = np.random.default_rng(0)
        worst = 0.0
        for _ in range(40):
            _, ev = runner.evaluate(draw(spec, rng))
            assert ev.status == "ok", ev.error
            assert ev.metrics.nonfinite == 0
            worst = max(worst, ev.metrics.ulp)
        assert worst <= 2.0, f"{spec.name} alone: {worst} ulp"


def test_composition_overflows_in_fp16_and_first_diverging_node_is_named(userops):
    specs = {s.name: s for s in planted_catalog()}
    space = GraphSpace.build(specs.values(), "torch", dtypes=("float16",))
    rng = np.random.default_rng(1)
    g = space.options(Graph("torch", ()), "user.scale300", 0, rng)[0]
    chain = [o for o in space.options(g, "user.sq_ratio", 0, rng) if o.nodes[1].sources == ["n0"]][0]
    assert chain.signature == "graph:user.scale300>user.sq_ratio"

    f = fuzz_graph(chain, specs, "float16", seed=0, evals=4)
    assert f.variant == Variant(dtype="float16", device="cpu", mode="input", oracle="graph")
    assert f.op == "graph:user.scale300>user.sq_ratio"
    assert f.metrics.nonfinite > 0  # NaN at the output where float64 is finite
    fd = f.extra["first_diverging"]
    assert (fd["node"], fd["op"], fd["cause"]) == (1, "user.sq_ratio", "non-finite")
    assert math.isinf(fd["R"])
    first = f.extra["nodes"][0]
    assert first["op"] == "user.scale300" and not first["diverged"] and first["delta"] <= 0.5
    # the same graph in float32 is fine: the defect is the fp16 composition
    f32 = fuzz_graph(chain, specs, "float32", seed=0, evals=4)
    assert f32.metrics.nonfinite == 0 and f32.extra["first_diverging"] is None
    # the row survives JSON and replays from what it stores
    back = Finding.from_dict(f.to_dict())
    assert back.extra["first_diverging"]["op"] == "user.sq_ratio" and math.isinf(back.extra["first_diverging"]["R"])
    (ev,) = replay_graph(back.extra["graph"], specs, "float16", [back.best])
    assert ev.status == "ok" and ev.metrics.nonfinite == f.metrics.nonfinite


@pytest.mark.parametrize("arm", ["mcts", "random"])
def test_campaign_finds_the_planted_defect(userops, arm):
    space = GraphSpace.build(planted_catalog(), "torch", dtypes=("float16",), max_nodes=3)
    res = GraphCampaign(space, arm=arm, dtypes=("float16",), seed=0, evals_per_graph=2).run(graphs=40)
    assert ("user.sq_ratio", "non-finite", "float16") in res.failures
    row = next(f for f in res.findings if f.op == "graph:user.scale300>user.sq_ratio")
    assert row.extra["first_diverging"]["op"] == "user.sq_ratio"
    assert row.coverage["run"] == res.coverage


def test_amplification_is_reported_as_such(userops):
    """exp of an fp16-rounded input: exp itself is accurate, the inherited error grows."""
    specs = {s.name: s for s in load_builtin(("torch",)) if s.name in ("torch.sin", "torch.exp")}
    g = Graph("torch", (4, 16), (
        Node("torch.sin", {}, {"N": 4, "D": 16}, (("input", "x"),), (4, 16)),
        Node("torch.exp", {}, {"N": 4, "D": 16}, (("input", "n0"),), (4, 16)),
    ))
    runner = GraphRunner(g, specs, "float16")
    cand = draw(runner.spec, np.random.default_rng(0))
    cand.arrays["x"] = np.linspace(1.2, 1.5, 64).reshape(4, 16) * 7.0  # sin near its extremes, exp(±1)
    an = runner.analyse(cand, quantized=False)
    assert an.invalid is None
    n1 = an.nodes[1]
    assert n1.local is not None and n1.local <= 1.0  # exp is accurate on what it received
    assert n1.delta_in > 0
    assert n1.rate == pytest.approx(change_rate(n1.delta, n1.delta_in))


def test_change_rate():
    assert change_rate(3.0, 1.0) == pytest.approx(2.0 / (1.0 + 1e-7))
    assert change_rate(math.inf, 1.0) == math.inf
    assert change_rate(math.inf, math.inf) == 0.0
    assert change_rate(1.0, 0.0) == pytest.approx(1e7)


# -- coverage, exact on a three-operator catalogue -------------------------------------------
def small_catalog():
    return [
        user_spec("user.a", "softsign", params={"gain": {"choices": [1.0, 2.0]}},
                  dims={"N": [1, 4], "D": [2, 16]}),
        user_spec("user.b", "scale300", dims={"N": [1, 4], "D": [2, 16]}),
        user_spec("user.c", "blend", inputs=[{"name": "x", "shape": ["N", "D"]}, {"name": "y", "shape": ["N", "D"]}],
                  dims={"N": [1, 4], "D": [2, 16]}),
    ]


def test_coverage_figures_are_exact_on_a_small_catalogue(userops):
    space = GraphSpace.build(small_catalog(), "torch", dtypes=("float16",), max_out=2)
    cov = Coverage(CoverageSpace.build(space.ops, space.out_ranks, space.max_out), space.ops)
    # universe: 3 types; in-degree a{1} b{1} c{1,2}; out-degree 3x{0,1,2}; 3x3 rank-2 edges;
    # shape/param: a has gain 1.0/2.0, every op has N in {1, 2..7} and D in {2..7, >=8}
    assert cov.space.totals() == {"operator_type": 3, "in_degree": 4, "out_degree": 9, "edge": 9, "shape_param": 14}
    n = lambda op, feeds, shape, branch=(), params=None: Node(op, params or {}, {"N": shape[0], "D": shape[1]},  # noqa: E731
                                                             feeds, shape, branch)
    # g1: x[1,8] -> a(gain=2.0) -> b ; g2: x[3,4] -> b, c(n0, x) (a residual join)
    g1 = Graph("torch", (1, 8), (n("user.a", (("x", "x"),), (1, 8), (("gain", "2.0"),), {"gain": 2.0}),
                                 n("user.b", (("x", "n0"),), (1, 8))))
    g2 = Graph("torch", (3, 4), (n("user.b", (("x", "x"),), (3, 4)),
                                 n("user.c", (("x", "n0"), ("y", "x")), (3, 4))))
    assert cov.add(g1) == {"operator_type": 2, "in_degree": 2, "out_degree": 2, "edge": 1, "shape_param": 5}
    # g2 adds b's N and D in 2..7 (g1 had 1 and >=8) and c's N and D in 2..7
    assert cov.add(g2) == {"operator_type": 1, "in_degree": 1, "out_degree": 2, "edge": 1, "shape_param": 4}
    assert cov.add(g2) == {"operator_type": 0, "in_degree": 0, "out_degree": 0, "edge": 0, "shape_param": 0}
    fig = cov.figures()
    assert {k: (v["covered"], v["total"]) for k, v in fig.items()} == {
        "operator_type": (3, 3), "in_degree": (3, 4), "out_degree": (4, 9), "edge": (2, 9), "shape_param": (9, 14)}
    assert fig["edge"]["ratio"] == pytest.approx(2 / 9)


# -- shapes and signatures ---------------------------------------------------------------------
def test_solve_dims_satisfies_expressions_and_ranges():
    specs = {s.name: s for s in load_builtin(("torch",))}
    gn = specs["torch.group_norm"]
    dims = solve_dims(gn, gn.inputs[0].shape, (2, 6, 5), {"eps": 1e-5}, np.random.default_rng(0))
    assert dims["N"] == 2 and dims["L"] == 5 and dims["G"] * dims["Cg"] == 6
    assert solve_dims(gn, gn.inputs[0].shape, (2, 17, 5), {"eps": 1e-5}, np.random.default_rng(0)) is None  # 17 > 4*4
    mp = specs["torch.max_pool2d"]
    assert solve_dims(mp, mp.inputs[0].shape, (1, 2, 2, 9), {"kernel_size": 3, "stride": 1, "padding": 0},
                      np.random.default_rng(0)) is None  # H must be >= kernel_size
    assert solve_dims(mp, mp.inputs[0].shape, (1, 2, 3, 9), {"kernel_size": 3, "stride": 1, "padding": 0},
                      np.random.default_rng(0)) == {"N": 1, "C": 2, "H": 3, "W": 9}


def test_every_generated_edge_is_shape_valid():
    specs = [s for s in load_builtin(("torch",)) if s.name in (
        "torch.conv2d", "torch.max_pool2d", "torch.group_norm", "torch.linear", "torch.softmax", "torch.sum",
        "torch.atan2", "torch.layer_norm")]
    space = GraphSpace.build(specs, "torch", dtypes=("float16",))
    rng = np.random.default_rng(3)
    for _ in range(25):
        g = space.complete(Graph("torch", ()), rng, p_stop=0.0)
        assert len(g.nodes) >= 1
        runner = GraphRunner(g, space.specs, "float32")
        ref, why = runner.reference(runner.quantize(draw(runner.spec, rng)))
        if ref is None:
            assert "shape" not in why and "size" not in why, why
            continue
        for node, out in zip(g.nodes, ref):
            assert tuple(out.array.shape) == node.out_shape


def test_signature_is_canonical_and_round_trips():
    a = Node("torch.exp", {}, {}, (("input", "x"),), (2, 3))
    b = Node("torch.tanh", {}, {}, (("x", "x"),), (2, 3))
    join1 = Node("torch.atan2", {}, {}, (("input", "n0"), ("other", "n1")), (2, 3))
    g1 = Graph("torch", (2, 3), (a, b, join1))
    g2 = Graph("torch", (2, 3), (b, a, Node("torch.atan2", {}, {}, (("input", "n1"), ("other", "n0")), (2, 3))))
    assert signature(g1) == signature(g2)
    assert signature(g1) == "graph:torch.exp(input=x);torch.tanh(x=x);torch.atan2(input=0,other=1)"
    chain = Graph("torch", (2, 3), (a, Node("torch.softmax", {"dim": -1}, {}, (("input", "n0"),), (2, 3))))
    assert chain.signature == "graph:torch.exp>torch.softmax"
    assert Graph.from_dict(g1.to_dict()) == g1


# -- MCTS -------------------------------------------------------------------------------------
def test_uct_formula():
    arm = MCTSArm.__new__(MCTSArm)
    arm.c = C_UCT
    parent, child = _TNode(Graph("torch", ()), None), _TNode(Graph("torch", ()), None)
    parent.n, child.n, child.w = 20, 4, 3.0
    assert C_UCT == pytest.approx(1 / math.sqrt(2))
    assert arm.uct(parent, child) == pytest.approx(3.0 / 4 + (1 / math.sqrt(2)) * math.sqrt(math.log(20) / 4))


def test_mcts_is_deterministic_under_a_seed(userops):
    def run(seed):
        space = GraphSpace.build(planted_catalog() + small_catalog(), "torch", dtypes=("float16",))
        res = GraphCampaign(space, arm="mcts", dtypes=("float16",), seed=seed, evals_per_graph=2).run(graphs=15)
        return res.history, res.coverage, [(f.op, f.evals, f.metrics.ulp if f.metrics else None) for f in res.findings]

    first, again = run(7), run(7)
    assert len(first[0]) == 15
    assert first == again
    assert run(8)[0] != first[0]
