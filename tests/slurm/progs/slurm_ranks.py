"""Under srun: the communicator's world is Slurm's step (rank = SLURM_PROCID, local rank =
SLURM_LOCALID, size = SLURM_STEP_NUM_TASKS) and an all-reduce of exact integers sums them.
Ends with "PASSED slurm_ranks rank <r>" on every rank."""
import os

import numpy as np

import nnabla as nn
import nnabla_torus as C
from tests.mpirun import passed_line


def main():
    comm = C.MultiProcessDataParallelCommunicator()
    comm.init()
    slurm = {name: int(os.environ[name]) for name in
             ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS")}
    seen = {"SLURM_PROCID": comm.rank, "SLURM_LOCALID": comm.local_rank,
            "SLURM_STEP_NUM_TASKS": comm.size}
    if seen != slurm:
        raise SystemExit(f"rank {comm.rank}: communicator {seen} but Slurm says {slurm}")
    p = comm.size
    grads = [nn.NdArray.from_numpy_array(np.full(shape, comm.rank + 1, np.float32))
             for shape in [(17,), (17, 17), (3, 5, 7)]]
    comm.all_reduce(grads, division=False, inplace=False)
    for g in grads:
        np.testing.assert_array_equal(g.data, np.full(g.shape, p * (p + 1) / 2, np.float32))
    for g in grads:
        g.data[...] = comm.rank + 1
    comm.all_reduce(grads, division=True, inplace=True)
    for g in grads:
        np.testing.assert_array_equal(g.data, np.full(g.shape, (p + 1) / 2, np.float32))
    print(f"slurm rank {comm.rank}/{p} local {comm.local_rank} ({comm.algorithm})", flush=True)
    print(passed_line(f"slurm_ranks rank {comm.rank}"), flush=True)


if __name__ == "__main__":
    main()
