"""Ping-pong between rank 0 and the last rank: the inter-host latency for the cost model.

Run with one rank per emulated host (other ranks only join the barriers)::

    python -m tools.emucluster exec --hosts 2 --rate 1gbit -- python tests/mpi/progs/emu_pingpong.py

Prints per message size the median and minimum half round trip in microseconds; pass the
median at a small size to ``tools/emucluster_model_check.py --inter-latency-us``.
"""
import time

import numpy as np
from mpi4py import MPI

SIZES = (8, 4096, 65536)   # bytes
ROUNDS, SKIP = 300, 50     # round trips per size; the first SKIP are warm-up


def half_round_trips(world, peer, nbytes):
    """Seconds of each half round trip of ``nbytes`` between rank 0 and ``peer``."""
    buf = np.zeros(nbytes, np.uint8)
    times = []
    for _ in range(ROUNDS):
        world.Barrier()
        start = time.perf_counter()
        if world.rank == 0:
            world.Send(buf, peer)
            world.Recv(buf, peer)
        elif world.rank == peer:
            world.Recv(buf, 0)
            world.Send(buf, 0)
        times.append((time.perf_counter() - start) / 2)
    return np.asarray(times[SKIP:])


def main():
    world = MPI.COMM_WORLD
    peer = world.size - 1
    for nbytes in SIZES:
        times = half_round_trips(world, peer, nbytes)
        if world.rank == 0:
            print(f"pingpong {nbytes} B: median half round trip {np.median(times) * 1e6:.1f} us, "
                  f"min {times.min() * 1e6:.1f} us", flush=True)


if __name__ == "__main__":
    main()
