"""Seeds: recorded calls bound to specs, OpInfo samples (cached), the seed store, Opera-style
prioritisation, and fuzz_task running stored seeds first."""
import json

import numpy as np
import pytest

import gate.search.seeds as seeds_mod
from gate.fuzz import fuzz_task
from gate.search.inputs import Candidate
from gate.search.seeds import (CallRecord, Opaque, SeedStore, TensorArg, candidate_from_call, opinfo_seeds,
                             parameter_names, prioritise)
from gate.ops.catalog import Catalog, load_builtin
from gate.plan import Budget, Task, Variant


@pytest.fixture(scope="module")
def catalog():
    return Catalog(load_builtin(("torch",)))


def T(*shape, values=None):
    return TensorArg(tuple(shape), "float32", values)


def test_parameter_names_from_signature_docstring_or_schema():
    import torch

    F = torch.nn.functional
    assert parameter_names(F.layer_norm)[:3] == ["input", "normalized_shape", "weight"]
    assert parameter_names(F.conv2d) == ["input", "weight", "bias", "stride", "padding", "dilation", "groups"]
    assert parameter_names(F.max_pool2d)[:2] == ["input", "kernel_size"]  # a (*args, **kwargs) wrapper
    assert parameter_names(torch.logsumexp)[:2] == ["input", "dim"]  # from the docstring's first line
    assert parameter_names(torch.log_softmax)[:2] == ["self", "dim"]  # no docstring: the ATen schema
    assert parameter_names(None) is None


def test_a_conv_call_binds_to_the_spec(catalog):
    import torch

    spec = catalog.get("torch.conv2d")
    x = np.arange(2 * 3 * 5 * 5, dtype=float).reshape(2, 3, 5, 5) / 10
    rec = CallRecord(op=spec.name, args=[T(2, 3, 5, 5, values=x), T(4, 3, 3, 3), T(4)],
                     kwargs={"stride": 2, "padding": 1, "groups": 1}, source="t::a", fn=torch.nn.functional.conv2d)
    cand, why = candidate_from_call(spec, rec)
    assert why == "" and cand is not None
    assert cand.dims == {"N": 2, "C": 3, "O": 4, "K": 3, "H": 5, "W": 5}
    # groups: not declared, so dropped (the oracle cannot know what an undeclared argument means);
    # dilation: declared, left out by the call, so the spec's default
    assert cand.params == {"stride": 2, "padding": 1, "dilation": 1}
    np.testing.assert_array_equal(cand.arrays["input"], x)
    assert cand.arrays["weight"].shape == (4, 3, 3, 3)  # regenerated from the domain (no values recorded)
    assert cand.origin == "seed:t::a"


@pytest.mark.parametrize("args,kwargs,reason", [
    ([T(3, 5, 5), T(4, 3, 3, 3), T(4)], {}, "rank 3"),
    ([T(2, 4, 5, 5), T(4, 2, 3, 3), T(4)], {"groups": 2}, "dim C is both"),
    ([T(2, 3, 5, 5), T(4, 3, 3, 3), None], {}, "not a tensor"),
    ([T(2, 3, 5, 5), T(4, 3, 3, 3), T(4)], {"padding": Opaque("Module")}, "cannot be replayed"),
    ([T(2, 3, 5, 5), T(4, 3, 3, 3), T(4)], {"stride": (2, 2)}, "stride=(2, 2) is not one of the declared choices"),
])
def test_calls_the_spec_cannot_express_are_skipped_with_a_reason(catalog, args, kwargs, reason):
    import torch

    rec = CallRecord(op="torch.conv2d", args=args, kwargs=kwargs, fn=torch.nn.functional.conv2d)
    cand, why = candidate_from_call(catalog.get("torch.conv2d"), rec)
    assert cand is None and reason in why


def test_derived_parameters_are_checked_and_unknown_dims_solved(catalog):
    import torch

    F = torch.nn.functional
    ln = catalog.get("torch.layer_norm")
    ok = CallRecord(op=ln.name, args=[T(3, 6), (6,), T(6), T(6)], kwargs={"eps": 1e-5}, fn=F.layer_norm)
    cand, _ = candidate_from_call(ln, ok)
    assert cand.dims == {"N": 3, "D": 6} and cand.params["normalized_shape"] == (6,)
    bad = CallRecord(op=ln.name, args=[T(3, 6), (3, 6), T(3, 6), T(3, 6)], kwargs={}, fn=F.layer_norm)
    cand, why = candidate_from_call(ln, bad)
    assert cand is None
    gn = catalog.get("torch.group_norm")  # input [N, G*Cg, L]: G from num_groups, Cg solved from the shape
    rec = CallRecord(op=gn.name, args=[T(2, 6, 5), 3], kwargs={"weight": T(6), "bias": T(6)}, fn=F.group_norm)
    cand, why = candidate_from_call(gn, rec)
    assert why == "" and cand.dims == {"N": 2, "G": 3, "Cg": 2, "L": 5} and cand.params["num_groups"] == 3


def test_prioritise_puts_novel_value_classes_first(catalog):
    spec = catalog.get("torch.softmax")
    rng = np.random.default_rng(0)

    def seed(n, d, scale, dim=-1):
        return Candidate(dims={"N": n, "D": d}, params={"dim": dim}, arrays={"input": rng.standard_normal((n, d)) * scale})

    dup1, dup2 = seed(4, 16, 1.0), seed(4, 16, 1.0)
    novel = seed(1, 8, 1e5, dim=0)
    order = prioritise(spec, [dup1, dup2, novel], "float32")
    assert {id(order[0]), id(order[1])} == {id(dup1), id(novel)} and order[2] is dup2  # the repeat goes last
    assert len(prioritise(spec, [dup1, dup2, novel], "float32", limit=2)) == 2


def test_seed_store_round_trip_and_dedup(tmp_path, catalog):
    store = SeedStore(tmp_path / "seeds", opinfo=False)
    spec = catalog.get("torch.tanh")
    c = Candidate(dims={"N": 2, "D": 3}, params={}, arrays={"x": np.linspace(-1, 1, 6).reshape(2, 3)})
    assert store.add(spec.name, c, source="tests/t.py::test_a")
    assert store.add(spec.name, c.copy(), source="tests/t.py::test_b") is None  # same content
    got = store.load(spec)
    assert len(got) == 1 and store.last_sources["harvested"] == 1
    np.testing.assert_array_equal(got[0].arrays["x"], c.arrays["x"])
    idx = json.loads((tmp_path / "seeds" / "index.json").read_text())
    assert idx["ops"]["torch.tanh"][0]["source"] == "tests/t.py::test_a"


def test_seeds_stored_in_a_batch_write_the_index_once_with_what_single_adds_write(tmp_path, monkeypatch):
    # geoopt: 13,859 recorded calls, each add re-read and rewrote the whole index (minutes of JSON)
    cands = [Candidate(dims={"N": 2}, params={"p": k % 3}, arrays={"x": np.full(2, float(k))}) for k in range(40)]
    one = SeedStore(tmp_path / "one", opinfo=False)
    for k, c in enumerate(cands):
        one.add(f"lib.op{k % 4}", c, source=f"t{k}")
    batched = SeedStore(tmp_path / "batched", opinfo=False)
    writes = []
    real = SeedStore._write_index
    monkeypatch.setattr(SeedStore, "_write_index", lambda self, idx: (writes.append(1), real(self, idx)))
    with batched.batch():
        for k, c in enumerate(cands + cands[:5]):  # a call seen twice is stored once
            batched.add(f"lib.op{k % 4}", c, source=f"t{k}")
        assert not (tmp_path / "batched" / seeds_mod.INDEX).exists()  # not yet written
    assert writes == [1]
    assert json.loads((tmp_path / "batched" / seeds_mod.INDEX).read_text()) == one.index()
    assert SeedStore(tmp_path / "batched", opinfo=False).index() == one.index()


def test_fuzz_task_runs_stored_seeds_first(tmp_path, catalog):
    spec = catalog.get("torch.tanh")
    store = SeedStore(tmp_path, opinfo=False)
    seed = Candidate(dims={"N": 3, "D": 7}, params={}, arrays={"x": np.full((3, 7), 0.125)}, origin="seed:mine")
    store.add(spec.name, seed)
    seen = []
    task = Task(op=spec, variant=Variant("float32"), budget=Budget(evals=20), seed=0)
    f = fuzz_task(task, seed_store=store, on_best=lambda q, ev, fit: seen.append(q))
    assert seen[0].origin == "seed:mine" and seen[0].arrays["x"].shape == (3, 7)
    assert f.coverage["seeds"] == {"given": 0, "harvested": 1, "used": 1}


def test_opinfo_samples_become_cached_seeds(tmp_path, catalog, monkeypatch):
    pytest.importorskip("expecttest", reason="OpInfo needs expecttest (pip install expecttest)")
    spec = catalog.get("torch.gelu")
    assert spec.opinfo == "nn.functional.gelu"
    cands, note = opinfo_seeds(spec, cache_dir=tmp_path)
    assert cands and "samples fit the spec" in note
    assert {c.params["approximate"] for c in cands} == {"none", "tanh"}
    assert all(c.origin == "seed:opinfo:nn.functional.gelu" for c in cands)

    def boom(*a, **k):
        raise AssertionError("the database must not be read again")

    monkeypatch.setattr(seeds_mod, "opinfo_records", boom)
    again, _ = opinfo_seeds(spec, cache_dir=tmp_path)
    assert len(again) == len(cands)
    for a, b in zip(cands, again):
        np.testing.assert_array_equal(a.arrays["input"], b.arrays["input"])
    store = SeedStore(None, cache_dir=tmp_path)
    assert len(store.load(spec)) == len(cands) and store.last_sources["opinfo"] == len(cands)


def test_a_missing_opinfo_entry_is_a_note_not_an_error(tmp_path, catalog, monkeypatch):
    spec = catalog.get("torch.tanh").replace(opinfo="no.such.op")
    monkeypatch.setattr(seeds_mod, "opinfo_records", lambda name: ([], f"no OpInfo entry {name!r}"))
    cands, note = opinfo_seeds(spec, cache_dir=tmp_path)
    assert cands == [] and "no OpInfo entry" in note
    assert not list(tmp_path.rglob("index.json"))  # nothing cached: it may appear later


def test_a_candidate_reads_back_bit_for_bit_compressed_where_kept_stored_where_it_only_travels(tmp_path):
    """The ``.npz`` that only carries an input to a worker (replay, localisation) is written
    without zlib; what is kept (the corpus, the report's inputs) is compressed; both read back the
    same bits: NaN payloads, -0, subnormals, integers and the parameters' own encodings."""
    import io
    import math
    import zipfile

    from gate.ops.spec import ImportRef

    x = np.array([np.nan, -0.0, 1e-45, -np.inf, 3.5, np.finfo(np.float32).max], dtype=np.float32)
    x.view(np.uint32)[0] = 0x7FC00123  # a NaN with a payload
    h = np.array([6e-8, -0.0, np.nan], dtype=np.float16)
    cand = Candidate(dims={"N": 6}, params={"dim": -1, "eps": float("inf"), "shape": (2, 3), "fn": ImportRef("torch:exp")},
                     arrays={"x": x, "h": h, "idx": np.array([0, 5, -1], dtype=np.int64)}, origin="search")
    kept, sent = cand.to_bytes(), cand.to_bytes(compress=False)
    kinds = {how: {i.compress_type for i in zipfile.ZipFile(io.BytesIO(b)).infolist()} for how, b in (("kept", kept), ("sent", sent))}
    assert kinds == {"kept": {zipfile.ZIP_DEFLATED}, "sent": {zipfile.ZIP_STORED}}
    cand.save(tmp_path / "sent.npz", compress=False)
    for back in (Candidate.load(kept), Candidate.load(sent), Candidate.load(str(tmp_path / "sent.npz"))):
        assert back.dims == cand.dims and back.origin == "search"
        assert back.params["dim"] == -1 and math.isinf(back.params["eps"]) and back.params["shape"] == (2, 3)
        assert str(back.params["fn"]) == "torch:exp"
        for name, a in cand.arrays.items():
            assert back.arrays[name].dtype == a.dtype and back.arrays[name].tobytes() == a.tobytes(), name
