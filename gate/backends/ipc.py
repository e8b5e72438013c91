"""Messages between the gate and its isolated workers, large arrays through shared memory.

A candidate of a million float64 values is 8 MB; pickled into a pipe and back (the quantised
candidate returns with every evaluation) that cost 41-46 ms a round trip on the 2-core CI machine,
more than the operator and its float64 reference together. Here each side writes the array buffers of its message (pickle protocol 5's
out-of-band buffers) into an *arena* of its own and sends only the pickle and where the buffers
lie; the other side maps the span it needs and copies the buffers out: 8.5-12 ms for the same round
trip (``bench/isolation_cost.py --large``: evaluations per second in-process, isolated through
shared memory and isolated through the pipe, side by side).

The arena is an anonymous ``memfd`` (Linux): no name in ``/dev/shm`` to leak when a worker is
killed, freed with the last process that maps it; the receiver opens it through
``/proc/<sender pid>/fd/<fd>``. Its pages are reserved with ``posix_fallocate`` when it grows, so
a full tmpfs is an error here (the message then goes through the pipe), never a ``SIGBUS`` in the
middle of a copy. Where any of that is missing (not Linux, no ``/proc``), or for small messages,
messages go through the pipe as before; so does every message of a process started with
``DL_GATE_SHARED_MEMORY=0`` (the way back, and the control arm of the benchmark). Messages
alternate (request, reply), so an arena is not written again before the other side has copied
the previous message out.
"""
from __future__ import annotations

import mmap
import os
import pickle
from multiprocessing.connection import Connection
from typing import Any, List, Optional, Tuple

#: messages whose array buffers hold fewer bytes than this go through the pipe
MIN_SHARED_BYTES = 1 << 18
_TAG = "\0dl-gate-arena"


class SharedMemoryError(Exception):
    """A message's buffers could not be read from the sender's arena (the sender is gone, or
    mapping them failed under the worker's memory limit): not an end of file, not the
    operator's doing."""


class _Arena:
    """The sender's shared memory, as large as the largest message it has sent (grown, never
    doubled: its pages stay committed while the worker lives)."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self.map: Optional[mmap.mmap] = None
        self.size = 0
        self.disabled = (os.environ.get("DL_GATE_SHARED_MEMORY", "1") == "0" or not hasattr(os, "memfd_create")
                         or not os.path.isdir(f"/proc/{os.getpid()}/fd"))

    def ensure(self, n: int) -> bool:
        """Room for ``n`` bytes (False: no shared memory here; use the pipe)."""
        if self.disabled:
            return False
        if n <= self.size:
            return True
        size = -(-max(n, 1 << 20) // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = None
        try:
            fd = os.memfd_create("dl-gate-arena", getattr(os, "MFD_CLOEXEC", 0))
            os.posix_fallocate(fd, 0, size)  # reserved now: a full tmpfs fails here, not as SIGBUS later
            mapped = mmap.mmap(fd, size)
        except (OSError, ValueError, AttributeError):
            if fd is not None:
                os.close(fd)
            return False
        self.close()
        self.fd, self.map, self.size = fd, mapped, size
        return True

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.map, self.size = None, None, 0


def _read_peer(pid: int, fd: int, spans: List[Tuple[int, int]]) -> List[bytearray]:
    """Copies of the buffers at ``spans`` of process ``pid``'s arena ``fd``: mapped for this message
    only (no address space held between messages, none of a replaced arena kept alive)."""
    end = max((o + n for o, n in spans), default=0)
    try:
        with open(f"/proc/{pid}/fd/{fd}", "rb") as fh:
            with mmap.mmap(fh.fileno(), end, prot=mmap.PROT_READ) as mapped:
                view = memoryview(mapped)  # slicing the mmap itself would copy each buffer twice
                try:
                    return [bytearray(view[o:o + n]) for o, n in spans]
                finally:
                    view.release()
    except (OSError, ValueError) as exc:
        raise SharedMemoryError(f"could not read a message's {end} bytes from shared memory "
                                f"({type(exc).__name__}: {exc})") from None


class Sender:
    """The writing end of a pipe: ``send(obj)`` puts large array buffers in shared memory."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.arena = _Arena()
        self.shared = 0  # messages sent through the arena (for tests and benchmarks)

    def send(self, obj: Any) -> None:
        buffers: List[pickle.PickleBuffer] = []
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        total = sum(r.nbytes for r in raws)
        if not raws or total < MIN_SHARED_BYTES or not self.arena.ensure(total):
            self.conn.send(obj)  # every buffer in band, pickled as multiprocessing does
            return
        spans, offset, view = [], 0, memoryview(self.arena.map)
        for r in raws:
            view[offset:offset + r.nbytes] = r
            spans.append((offset, r.nbytes))
            offset += r.nbytes
        head = (_TAG, os.getpid(), self.arena.fd, spans, data)
        self.conn.send_bytes(pickle.dumps(head, protocol=5))
        self.shared += 1

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            self.arena.close()


class Receiver:
    """The reading end of a pipe: ``recv()`` copies large array buffers out of the sender's arena;
    raises :class:`SharedMemoryError` where it cannot (EOFError/OSError still mean the pipe)."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        return self.conn.poll(timeout)

    def recv(self) -> Any:
        obj = self.conn.recv()  # unpickled as multiprocessing does (the arena's head is a small tuple)
        if not (isinstance(obj, tuple) and len(obj) == 5 and obj[0] == _TAG):
            return obj
        _, pid, fd, spans, data = obj
        return pickle.loads(data, buffers=_read_peer(pid, fd, spans))

    def close(self) -> None:
        self.conn.close()


__all__ = ["MIN_SHARED_BYTES", "Receiver", "Sender", "SharedMemoryError"]
