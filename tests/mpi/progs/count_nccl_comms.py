"""Count the NCCL communicators a job makes on the fake NCCL (run under mpirun).

    NNABLA_TORUS_BACKEND=fake-nccl mpirun -np 8 python tests/mpi/progs/count_nccl_comms.py \\
        --at-init 8 --total 16 set:torus2d@2x4 set:native f32 f16

Steps: ``set:ALGORITHM[@GRID]`` (``comm.set_algorithm``, as the example's planner does), ``f32`` /
``f16`` (a world all-reduce of a float32 / float16 list). Checks the job's sums (over ranks) at
init() and at the end against ``--at-init`` and ``--total``, and that the backend's own record
(``nccl_made``, what ``init()`` logs) equals what the fake created (one per nnabla init() and
per new_group of a member: ncclCommInitRank, ext .cu 426, 510). Prints "COUNT ..." and
"PASSED count_nccl_comms" on rank 0.
"""
import argparse

import numpy as np
import nnabla as nn
from nnabla.ext_utils import get_extension_context

import nnabla_torus as C
from nnabla_torus.testing import fake_nccl
from tests.mpirun import passed_line

FAKE = fake_nccl.FakeMultiProcessDataParallelCommunicator


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--at-init", type=int, required=True)
    parser.add_argument("--total", type=int, required=True)
    parser.add_argument("steps", nargs="*")
    args = parser.parse_args()
    comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
    comm.init()
    world = comm.backend.world
    at_init = world.allreduce(FAKE.nccl_created)
    for step in args.steps:
        if step.startswith("set:"):
            algorithm, _, grid = step[4:].partition("@")
            comm.set_algorithm(algorithm, grid or None)
        else:
            dtype = {"f32": np.float32, "f16": np.float16}[step]
            xs = [nn.NdArray.from_numpy_array(np.full(17, comm.rank + 1, dtype)) for _ in range(2)]
            comm.all_reduce(xs, division=True)
            for x in xs:
                np.testing.assert_allclose(x.data, (comm.size + 1) / 2, rtol=1e-3)
    assert len(comm.backend.nccl_made) == FAKE.nccl_created, (comm.backend.nccl_made,
                                                              FAKE.nccl_created)
    total = world.allreduce(FAKE.nccl_created)
    if comm.rank == 0:
        print(f"COUNT {' '.join(args.steps)}: algorithm {comm.algorithm} {comm.grid}; NCCL "
              f"communicators over {comm.size} ranks: {at_init} at init, {total} in all")
        print(comm.backend.resources())
    assert (at_init, total) == (args.at_init, args.total), (at_init, total)
    comm.close()
    if comm.rank == 0:
        print(passed_line("count_nccl_comms"))


if __name__ == "__main__":
    main()
