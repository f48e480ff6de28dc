"""Time MPI_Allreduce (mpi4py) per message size and check the sum; print one line per size.

Run across emulated hosts (see tools/emucluster)::

    python -m tools.emucluster exec --hosts 2 -- \\
        python tests/mpi/progs/emu_allreduce.py --sizes 16K,25M

Prints ``HOSTS <rank>:<hostname> ...`` then ``SIZE <bytes> time_ms <median> busbw_MBps <x>``
and ``PASSED emu_allreduce`` when every sum was exact.
"""
import argparse
import socket
import time

import numpy as np
from mpi4py import MPI

from tools.emucluster.shaping import parse_bytes
from tests.mpirun import passed_line


def timed_allreduce(comm, buf, out, iters):
    """Median seconds of ``iters`` Allreduce calls (each preceded by a barrier)."""
    times = []
    for _ in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(buf, out, op=MPI.SUM)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16K,1M", help="message sizes in bytes, k/m suffixes")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    names = comm.gather(socket.gethostname(), root=0)
    if rank == 0:
        print("HOSTS " + " ".join(f"{r}:{n}" for r, n in enumerate(names)), flush=True)
    ok = True
    for text in args.sizes.split(","):
        count = parse_bytes(text) // 4
        buf = np.full(count, rank + 1, dtype=np.float32)
        out = np.empty_like(buf)
        seconds = timed_allreduce(comm, buf, out, args.iters)
        ok &= bool(np.all(out == size * (size + 1) // 2))
        seconds = comm.allreduce(seconds, op=MPI.MAX)
        busbw = 4 * count / seconds * 2 * (size - 1) / size / 1e6
        if rank == 0:
            print(f"SIZE {4 * count} time_ms {seconds * 1e3:.2f} busbw_MBps {busbw:.1f}",
                  flush=True)
    ok = comm.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        print(passed_line("emu_allreduce") if ok else "WRONG SUM", flush=True)


if __name__ == "__main__":
    main()
