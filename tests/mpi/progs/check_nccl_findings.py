"""Issue 10's findings 4 and 7 on the NCCL mapping, under mpirun against the fake.

    NNABLA_TORUS_BACKEND=fake-nccl NNABLA_TORUS_RANKS_PER_HOST=1 \\
        mpirun -np 2 python tests/mpi/progs/check_nccl_findings.py [device-and-half|hang|no-cuda]

4. One device number: with NNABLA_TORUS_RANKS_PER_HOST=1 (every rank its own "host" for the
   grid) on one machine, nnabla's NCCL communicator still uses GPU = earlier ranks with the
   same host name; ``comm.local_rank`` (what examples/imagenet/train.py uses) must say the same.
7. Resources: one nnabla communicator (float32) until the first float16 call, which creates the
   second on every rank together (results exact); ``close()`` frees them.
3. ``hang``: the last rank never joins a row reduce-scatter; the others' NCCL phase must end
   in our watchdog's abort (NNABLA_TORUS_TIMEOUT) naming the phase, not spin for ever.
Bad input, ``no-cuda``: the nccl backend with a CUDA context but no nnabla-ext-cuda: one
message on every rank ("NO-CUDA rank r: ...").
Prints "PASSED nccl findings rank r"; any failure aborts the job with the traceback.
"""
import sys
import time
import gc
import socket

import numpy as np
from mpi4py import MPI

from nnabla.ext_utils import get_extension_context
import nnabla_torus as C
from nnabla_torus.testing import fake_nccl
from check_fake_nccl import data, nd, run_or_abort

RANK, P = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
Fake = fake_nccl.FakeMultiProcessDataParallelCommunicator


def hang():
    comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
    comm.init()
    be = comm.backend
    buf = be.buffer_of(nd(data((64,), RANK)))
    if RANK == P - 1:
        time.sleep(60)  # never joins; the others' watchdog ends the job first
    be.reduce_scatter(be.world_group, buf, "reduce_scatter")
    print(f"RETURNED rank {RANK}", flush=True)


def no_cuda():
    import nnabla as nn
    ctx = nn.Context(["cudnn:float", "cuda:float", "cpu:float"], "CudaCachedArray", "0")
    comm = C.MultiProcessDataParallelCommunicator(ctx, backend="nccl")
    try:
        comm.init()
    except RuntimeError as e:
        print(f"NO-CUDA rank {RANK}: {e}", flush=True)


def default_algorithm():
    """Issue 19 finding 11: no algorithm asked for. Prints the one chosen and its grid."""
    comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
    comm.init()
    x = nd(data((17,), RANK))
    comm.all_reduce(x, inplace=True)
    assert np.array_equal(x.data, sum(data((17,), r) for r in range(P)))
    print(f"DEFAULT rank {RANK}: {comm.algorithm} {comm.grid}", flush=True)


def device_and_half():
    comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
    comm.init()
    hosts = MPI.COMM_WORLD.allgather(socket.gethostname().split(".")[0])
    nnabla_device = hosts[:RANK].count(hosts[RANK])
    assert comm.local_rank == nnabla_device, (comm.local_rank, nnabla_device)
    x = nd(data((17,), RANK))
    comm.all_reduce(x, inplace=True)
    assert np.array_equal(x.data, sum(data((17,), r) for r in range(P)))
    assert fake_nccl.device_of(x)[0] == nnabla_device, fake_nccl.device_of(x)

    assert Fake.live == 1, f"{Fake.live} nnabla communicators before any float16 call"
    h = nd(data((33,), RANK, dtype=np.float16))
    comm.all_reduce([h])
    assert h.dtype == np.float16 and np.array_equal(h.data, sum(data((33,), r) for r in range(P)))
    assert Fake.live == 2, f"{Fake.live} nnabla communicators after a float16 call"
    comm.all_reduce([nd(data((5,), RANK, dtype=np.float16))], inplace=True)
    assert Fake.live == 2
    comm.close()                      # issue 19 finding 14: the scripts call this at the end
    comm.close()                      # idempotent
    del comm
    gc.collect()
    assert Fake.live == 0, f"{Fake.live} nnabla communicators alive after close()"


if __name__ == "__main__":
    case = sys.argv[1] if len(sys.argv) > 1 else "device-and-half"
    run_or_abort({"device-and-half": device_and_half, "hang": hang, "no-cuda": no_cuda,
                  "default-algorithm": default_algorithm}[case],
                 "nccl findings")
