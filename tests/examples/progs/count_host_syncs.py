"""Count the host syncs of each optimizer step of examples/imagenet/train.py on the fake NCCL.

    NNABLA_TORUS_BACKEND=fake-nccl python -m nnabla_torus.launching.mpirun_cmd -np 2 \\
        tests/examples/progs/count_host_syncs.py --arch resnet50 --width 1 ... (train.py's flags)

Counted, per step (``run_step.take_step``): the fake device's host syncs (synchronize, event
waits, one per gradient of a solver's check_inf_or_nan_grad: fake_cuda.stream_log) and the
example's reads of device values (``step.host_read``: on a GPU a device-to-host copy waits for
the device). Rank 0 prints ``HOST_SYNCS step <k>: <total> (<what>: <count>, ...)`` per step.
"""
import collections
import os
import sys

from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                                "imagenet"))
import divergence  # noqa: E402
import run_step  # noqa: E402
import step  # noqa: E402
import train  # noqa: E402
from nnabla_torus.testing import fake_cuda  # noqa: E402


def counted_read(read):
    def host_read(ndarray, comm):
        start = len(fake_cuda.stream_log)
        value = read(ndarray, comm)
        # its guarded event wait, then the copy, which finds the work done: one wait
        fake_cuda.stream_log[start:] = [e for e in fake_cuda.stream_log[start:]
                                        if e[:2] != ("host-sync", "event")]
        fake_cuda.stream_log.append(("host-sync", "host_read", ()))
        return value
    return host_read


def counted_step(take_step):
    def take(run, plan, epoch):
        fake_cuda.stream_log.clear()
        loss = take_step(run, plan, epoch)
        syncs = collections.Counter(e[1] for e in fake_cuda.stream_log if e[0] == "host-sync")
        if MPI.COMM_WORLD.rank == 0:
            what = ", ".join(f"{k}: {n}" for k, n in sorted(syncs.items()))
            print(f"HOST_SYNCS step {run.progress.step}: {sum(syncs.values())} ({what})",
                  flush=True)
        return loss
    return take


if __name__ == "__main__":
    for module in (step, divergence):
        if hasattr(module, "host_read"):
            module.host_read = counted_read(module.host_read)
    train.take_step = run_step.take_step = counted_step(run_step.take_step)
    train.main(sys.argv[1:])
