"""A stand-in training script that fails on purpose, for nnabla-torus-run's restart tests.

    failing_fake.py DIR --fail kill|stop|error|disk|busy|none [--at 6] [--steps 10] [--every 4]
                    [--fail-launches 1] [--api mpi4py|communicator] [--resume 1]

Each step is an all-reduce; rank 0 prints ``step N: ...`` and, every ``--every`` steps, writes
DIR/ckpt (the step) and announces it as train.py does (``CHECKPOINT_PREFIX``). With
``--resume 1`` it starts from DIR/ckpt (printing train.py's ``resumed from PATH: step N`` line).
At step ``--at`` of the first ``--fail-launches`` launches (counted in DIR/launches) the last
rank fails: ``kill`` SIGKILLs itself, ``stop`` SIGSTOPs itself (``--api communicator``: the
communicator's timeout ends the job), ``error`` prints train.py's error line and aborts,
``disk`` raises the OSError of a full disk (ENOSPC) writing DIR/model.nnp (failfast names it
and ends the job, as in train.py); ``busy`` starts a ``State`` in DIR/run, whose lock the test
gave a live process, and leaves RunFolderBusy unhandled, as a user's script may. The end:
``FINISHED <size> <steps>`` on rank 0.
"""
import argparse
import errno
import json
import os
import signal
import socket
import sys
import time

import numpy as np

from emu_fault import make_allreduce      # this script's folder is on sys.path
from nnabla_torus.comm import failfast
from nnabla_torus.launching.elastic_protocol import CHECKPOINT_PREFIX


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--fail", choices=("kill", "stop", "error", "disk", "busy", "none"),
                        default="none")
    parser.add_argument("--at", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--fail-launches", type=int, default=1)
    parser.add_argument("--api", choices=("mpi4py", "communicator"), default="mpi4py")
    parser.add_argument("--resume", type=int, default=0)
    args = parser.parse_args()
    if args.fail == "disk":
        failfast.install()
    if args.fail == "busy":
        import nnabla_torus
        from nnabla_torus.training import State
        comm = nnabla_torus.MultiProcessDataParallelCommunicator()
        comm.init()
        State(comm, os.path.join(args.dir, "run"), {}).start(resume=False)
    allreduce, rank, size = make_allreduce(args.api)
    counter, ckpt = os.path.join(args.dir, "launches"), os.path.join(args.dir, "ckpt")
    launch = int(open(counter).read()) if os.path.exists(counter) else 0
    step = int(open(ckpt).read()) if args.resume and os.path.exists(ckpt) else 0
    array = np.ones(4, np.float32)
    allreduce(array)                                  # every rank has read the counter
    if rank == 0:
        with open(counter, "w") as f:
            f.write(str(launch + 1))
        if args.resume:
            print(f"resumed from {ckpt}: step {step}, epoch 0.000", flush=True)
    failing = args.fail != "none" and launch < args.fail_launches and rank == size - 1
    while step < args.steps:
        if failing and step == args.at:
            if args.fail == "error":
                print(f"rank {rank} on host {socket.gethostname()}: train.py: error: "
                      f"image 7 of the list cannot be decoded", file=sys.stderr, flush=True)
                from mpi4py import MPI
                MPI.COMM_WORLD.Abort(1)
            if args.fail == "disk":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                              os.path.join(args.dir, "model.nnp"))
            os.kill(os.getpid(), signal.SIGKILL if args.fail == "kill" else signal.SIGSTOP)
        allreduce(array)
        step += 1
        if rank == 0:
            print(f"step {step}: loss 1.0, global batch {8 * size}", flush=True)
            if step % args.every == 0:
                with open(ckpt, "w") as f:
                    f.write(str(step))
                print(CHECKPOINT_PREFIX + json.dumps({"step": step, "path": ckpt,
                                                      "seconds": 0.001}), flush=True)
        time.sleep(0.05)
    if rank == 0:
        print(f"FINISHED {size} {step}", flush=True)


if __name__ == "__main__":
    main()
