"""Large arrays between the gate and its isolated workers go through shared memory
(gate/backends/ipc.py); everything else, and every message where shared memory is missing,
through the pipe as before."""
import os
from multiprocessing.connection import Connection

import numpy as np
import pytest

from gate.backends import ipc
from gate.backends.ipc import Receiver, Sender


def _echo_pair():
    """A forked child that sends back what it receives (through its own Sender)."""
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(p2c_w)
        os.close(c2p_r)
        rx, tx = Receiver(Connection(p2c_r, writable=False)), Sender(Connection(c2p_w, readable=False))
        while True:
            msg = rx.recv()
            if msg is None:
                os._exit(0)
            tx.send(("back", msg, tx.shared))
    os.close(p2c_r)
    os.close(c2p_w)
    return pid, Sender(Connection(p2c_w, readable=False)), Receiver(Connection(c2p_r, writable=False))


def test_large_arrays_go_through_shared_memory_and_come_back_equal():
    pid, tx, rx = _echo_pair()
    try:
        rng = np.random.default_rng(0)
        small = {"x": np.arange(10.0)}
        tx.send(small)
        kind, got, child_shared = rx.recv()
        assert kind == "back" and np.array_equal(got["x"], small["x"]) and tx.shared == 0 and child_shared == 0
        for n in (1 << 16, 1 << 20, 3 << 20):  # the arena grows past its first size
            msg = {"x": rng.standard_normal(n), "i": rng.integers(0, 9, n // 2), "meta": ("eval", n),
                   "nan": np.array([np.nan, -0.0, np.inf])}
            msg["x"][::7] = np.nan
            tx.send(msg)
            _, got, child_shared = rx.recv()
            np.testing.assert_array_equal(got["x"], msg["x"])
            np.testing.assert_array_equal(got["i"], msg["i"])
            assert got["meta"] == ("eval", n) and np.signbit(got["nan"][1])
            got["x"][0] = 1.0  # the copy is the receiver's own, writable
        tx.send("count")  # a small message: the pipe; the child reports its shared sends so far
        _, _, child_shared = rx.recv()
        assert tx.shared == 3 and child_shared == 3  # both directions used the arena
        assert tx.arena.size >= (3 << 20) * 8
    finally:
        tx.send(None)
        os.waitpid(pid, 0)
        tx.close()
        rx.close()


def test_without_shared_memory_messages_go_through_the_pipe(monkeypatch):
    monkeypatch.setattr(ipc._Arena, "ensure", lambda self, n: False)  # no memfd, no /proc, a full tmpfs
    pid, tx, rx = _echo_pair()
    try:
        big = np.random.default_rng(1).standard_normal(1 << 19)
        tx.send({"x": big})
        _, got, _ = rx.recv()
        np.testing.assert_array_equal(got["x"], big)
        assert tx.shared == 0
    finally:
        tx.send(None)
        os.waitpid(pid, 0)
        tx.close()
        rx.close()


def test_an_isolated_evaluation_of_a_large_candidate_uses_shared_memory():
    pytest.importorskip("torch")
    from gate.backends.isolate import IsolateOptions
    from gate.ops.catalog import load_catalog
    from gate.oracles.registry import build_runner
    from gate.plan import Variant
    from gate.search.inputs import draw

    spec = load_catalog(builtin=("torch",)).get("torch.softmax")
    spec = spec.replace(dims=tuple((n, (256, 256)) for n, _ in spec.dims))  # 65,536 float64 inputs: 512 KB
    v = Variant("float32", "cpu")
    local = build_runner(spec, v)
    isolated = build_runner(spec, v, isolate=IsolateOptions())
    try:
        cand = draw(spec, np.random.default_rng(2))
        q1, e1 = local.evaluate(cand)
        q2, e2 = isolated.evaluate(cand)
        for k in q1.arrays:
            np.testing.assert_array_equal(q1.arrays[k], q2.arrays[k])
        assert e1.metrics == e2.metrics
        assert isolated._active.tx.shared >= 1  # the candidate went out through the arena
    finally:
        isolated.close()


def test_a_message_whose_sender_is_gone_is_a_shared_memory_error_not_an_end_of_file():
    # the worker answered in full and exited: its arena went with it; the receiver must not take
    # that for a closed pipe (a worker treating it so would exit 0 and pass for a crash)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        Sender(Connection(w, readable=False)).send(("result", np.ones(1 << 16)))
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    rx = Receiver(Connection(r, writable=False))
    try:
        with pytest.raises(ipc.SharedMemoryError, match="shared memory"):
            rx.recv()
    finally:
        rx.close()
