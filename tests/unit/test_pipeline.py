"""The MPI backend's pipelining parts on one process: pieces of a buffer, and run_lanes."""
import numpy as np
import pytest
from mpi4py import MPI

from nnabla_torus.comm.backends.mpi import MPIBackend
from nnabla_torus.comm.errors import CollectiveTimeout


@pytest.fixture(scope="module")
def backend():
    return MPIBackend(MPI.COMM_SELF, timeout=0.3)


@pytest.mark.parametrize("count, piece_bytes, pieces", [
    (100, 64, 7),        # 400 bytes: ceil(400 / 64) pieces of 14 or 15 elements
    (100, 400, 1),       # a buffer no larger than a piece stays whole
    (100, 0, 1),         # 0: no pieces
    (3, 4, 3),           # never more pieces than elements
    (0, 4, 1),
])
def test_pieces_cover_the_buffer_in_order(backend, count, piece_bytes, pieces):
    backend.pipeline_bytes = piece_bytes
    buf = np.arange(count, dtype=np.float32)
    got = backend.pieces(buf)
    assert len(got) == pieces
    assert np.array_equal(np.concatenate(got), buf)
    assert all(np.shares_memory(p, buf) for p in got if p.size)
    sizes = [p.size for p in got]
    assert max(sizes) - min(sizes) <= 1


def test_lanes_wait_for_each_other(backend):
    events, done = [], []

    def producer():
        for k in range(3):
            events.append(f"make {k}")
            done.append(k)
            yield [], "make", []           # no requests: ready at once

    def consumer():
        for k in range(3):
            if len(done) <= k:
                yield (lambda k=k: len(done) > k), "", []
            events.append(f"use {k}")

    backend.run_lanes([consumer(), producer()])
    for k in range(3):
        assert events.index(f"make {k}") < events.index(f"use {k}")
    assert len(events) == 6


def test_a_stuck_lane_times_out_naming_its_peers(backend):
    never = np.zeros(1, np.float32)
    request = MPI.COMM_SELF.Irecv(never, source=0, tag=99)   # nobody sends it

    def stuck():
        yield [request], "column all_reduce step 1/3", [5]

    with pytest.raises(CollectiveTimeout, match=r"column all_reduce step 1/3 .*rank\(s\) \[5\]"):
        backend.run_lanes([stuck()])
    request.Cancel()
    request.Wait()
