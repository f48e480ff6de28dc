"""Train through nnabla's all_reduce_callback (the NCCL backend's default path: algorithm
``native``; run on the fake NCCL) while one rank stops (SIGSTOP: a hung rank) or dies
(SIGKILL). The job must end within NNABLA_TORUS_TIMEOUT (tests/mpi/test_gpu_fault.py).

``--at check``: the victim stops before a backward; its peers wait in nnabla's blocking MPI
check of their first gradient (ext multi_process_data_parallel_communicator.cu 1025-1030).
``--at nccl`` (the fake only): it stops after its last check, before it enqueues the last
pack; its peers wait in that pack's all-reduce (the fake's spin, as NCCL's kernels spin).
``--context cudnn``: on GPUs, real NCCL (make gpu-check: tools/gpu_check_cases.stop_case).
Output::

    START <unix time>              (rank 0, after the first step)
    STOP|KILL <rank> <unix time>   (the victim, just before the signal)
"""
import argparse
import os
import signal
import time

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import numpy as np
from nnabla.ext_utils import get_extension_context

import nnabla_torus as C
from nnabla_torus.comm.backends import synchronize
from nnabla_torus.overlap import BucketedAllReduce


def build(rank):
    """A conv and two affines of odd sizes; every rank its own input."""
    rng = np.random.RandomState(1)
    x = nn.Variable.from_numpy_array(
        np.random.RandomState(100 + rank).randn(3, 2, 5, 7).astype(np.float32))
    with nn.parameter_scope("conv"):
        h = F.relu(PF.convolution(x, 3, (3, 3), rng=rng))
    with nn.parameter_scope("mid"):
        h = F.tanh(PF.affine(h, 17, rng=rng))
    with nn.parameter_scope("head"):
        y = PF.affine(h, 5, rng=rng)
    return F.mean((y - 0.3) ** 2), nn.get_parameters()


def stop(rank, name):
    print(f"{name} {rank} {time.time():.3f}", flush=True)
    os.kill(os.getpid(), getattr(signal, "SIG" + name))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--victim", type=int, required=True)
    parser.add_argument("--at", choices=("check", "nccl"), default="check")
    parser.add_argument("--signal", choices=("STOP", "KILL"), default="STOP")
    parser.add_argument("--step", type=int, default=3, help="the step the victim stops at")
    parser.add_argument("--context", choices=("cpu", "cudnn"), default="cpu",
                        help="cpu: the fake NCCL; cudnn: GPUs, one a rank")
    args = parser.parse_args()
    comm = C.MultiProcessDataParallelCommunicator(get_extension_context(args.context))
    comm.init()
    nn.set_default_context(get_extension_context(args.context, device_id=str(comm.local_rank)))
    assert comm.algorithm == "native", comm.algorithm
    loss, params = build(comm.rank)
    reducer = BucketedAllReduce(comm, loss, params, bucket_mib=1e-4)   # several packs
    for step in range(args.step + 100):
        if comm.rank == args.victim and step == args.step:
            if args.at == "check":
                stop(comm.rank, args.signal)
            else:
                from nnabla_torus.testing.fake_all_reduce_callback import FakeAllReduceCallback
                last_pack = FakeAllReduceCallback.on_finish_backward
                FakeAllReduceCallback.on_finish_backward = (
                    lambda cb: (stop(comm.rank, args.signal), last_pack(cb)))
        for p in params.values():
            p.grad.zero()
        loss.forward()
        reducer.backward(loss)
        synchronize(comm)       # the loss read waits for the device: under the watchdog
        float(loss.d)
        if comm.rank == 0 and step == 0:
            print(f"START {time.time():.3f}", flush=True)
    print(f"rank {comm.rank}: ran past the victim's stop", flush=True)


if __name__ == "__main__":
    main()
