"""All-reduce in a loop while a fault happens; print timestamps so the caller can time the exit.

Faults: ``--victim R --kill-at I`` makes rank R SIGKILL itself at iteration I (the others are
then inside the all-reduce); without ``--victim`` the loop just runs for ``--seconds`` so that a
link can be cut from outside (``python -m tools.emucluster link --host 1 down``).
``--api communicator`` uses nnabla_torus (NNABLA_TORUS_TIMEOUT bounds the wait),
``--api mpi4py`` plain ``MPI_Allreduce`` (Open MPI on its own). Output, one line each::

    START <unix time>          (rank 0, after the first all-reduce)
    KILL <rank> <unix time>    (the victim, just before dying)
    DONE                       (rank 0, only when no fault stopped the loop)
"""
import argparse
import os
import signal
import sys
import time

import numpy as np

from tools.emucluster.shaping import parse_bytes


def make_allreduce(api):
    """A function summing a float32 numpy array in place over all ranks; also (rank, size)."""
    if api == "mpi4py":
        from mpi4py import MPI
        comm = MPI.COMM_WORLD

        def allreduce(array):
            comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        return allreduce, comm.Get_rank(), comm.Get_size()
    import nnabla as nn
    import nnabla_torus
    comm = nnabla_torus.MultiProcessDataParallelCommunicator()
    comm.init()

    def allreduce(array):
        nd = nn.NdArray.from_numpy_array(array)
        comm.all_reduce(nd, inplace=True)
        array[...] = nd.data
    return allreduce, comm.rank, comm.size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", choices=("mpi4py", "communicator"), default="communicator")
    parser.add_argument("--size", default="1M", help="message bytes (k/m suffixes)")
    parser.add_argument("--victim", type=int, default=None, help="rank that kills itself")
    parser.add_argument("--kill-at", type=int, default=3, help="iteration at which it dies")
    parser.add_argument("--seconds", type=float, default=20.0, help="loop length without a victim")
    args = parser.parse_args()
    allreduce, rank, size = make_allreduce(args.api)
    array = np.ones(parse_bytes(args.size) // 4, dtype=np.float32)
    start, iteration, more = time.time(), 0, True
    while more:
        if rank == args.victim and iteration == args.kill_at:
            print(f"KILL {rank} {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        array[...] = 1
        # The last element votes: the loop goes on only while every rank is within --seconds
        # (ranks deciding alone would leave some waiting in an all-reduce the others skip).
        array[-1] = args.victim is not None or time.time() - start < args.seconds
        allreduce(array)
        if array[0] != size:
            sys.exit(f"rank {rank}: wrong sum {array[0]} != {size}")
        more = array[-1] == size
        if rank == 0 and iteration == 0:
            print(f"START {time.time():.3f}", flush=True)
        iteration += 1
    if rank == 0:
        print(f"DONE {iteration} iterations", flush=True)


if __name__ == "__main__":
    main()
