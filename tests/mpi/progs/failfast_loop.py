"""A plain user script: import nnabla_torus, init the communicator, all-reduce in a loop; one
rank leaves early. Prints ``LEAVE <rank> <unix time>`` just before, so the caller can time the
end of the job; ``DONE`` (rank 0) when the loop finished, which a leaving rank must prevent.

    mpirun -np 4 python tests/mpi/progs/failfast_loop.py --victim 3 --how raise

``--how``: raise (unhandled exception), thread (unhandled exception in another thread),
exit-message (``sys.exit("...")``), exit-code (``sys.exit(3)``), return (the loop ends early
on that rank, exit status 0), abort-job (``failfast.abort_job``).
"""
import argparse
import sys
import threading
import time

import nnabla as nn
import numpy as np

import nnabla_torus
from nnabla_torus.comm import failfast


def leave(how, rank):
    print(f"LEAVE {rank} {time.time():.3f}", flush=True)
    if how == "raise":
        raise RuntimeError(f"boom on rank {rank}")
    if how == "thread":
        worker = threading.Thread(target=lambda: 1 / 0, name="loader")
        worker.start()
        worker.join()
        time.sleep(60)       # the hook must end the job before this returns
    if how == "exit-message":
        sys.exit(f"failfast_loop.py: error: bad input on rank {rank}")
    if how == "exit-code":
        sys.exit(3)
    if how == "abort-job":
        failfast.abort_job(f"failfast_loop.py: error: bad input on rank {rank}", 2)
    assert how == "return", how


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--victim", type=int, required=True)
    parser.add_argument("--how", required=True, choices=("raise", "thread", "exit-message",
                                                         "exit-code", "return", "abort-job"))
    parser.add_argument("--at", type=int, default=3,
                        help="iteration at which the victim leaves (-1: before comm.init())")
    parser.add_argument("--iters", type=int, default=400)
    args = parser.parse_args()
    comm = nnabla_torus.MultiProcessDataParallelCommunicator()
    if comm.rank == args.victim and args.at < 0:    # after the import, before init()
        leave(args.how, comm.rank)
        return
    comm.init()
    grad = nn.NdArray.from_numpy_array(np.ones(1 << 16, np.float32))
    for i in range(args.iters):
        if comm.rank == args.victim and i == args.at:
            leave(args.how, comm.rank)
            return
        comm.all_reduce(grad, division=True)
    if comm.rank == 0:
        print("DONE", flush=True)


if __name__ == "__main__":
    main()
