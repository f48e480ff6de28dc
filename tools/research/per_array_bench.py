"""Python cost per array of ``all_reduce`` on a list, in one process, without an exchange.

    python tools/research/per_array_bench.py --arrays 10000
    python tools/research/per_array_bench.py --arrays 161,1000,10000 --inplace 1

Separates the per-array Python work (the list's layout and signature, nnabla's ``data_ptr``
check, pack, unpack, the zeroing flags) from scheduling noise: ``tools/allreduce_bench.py``
times the same under mpirun, where the ranks share the cores. Each call runs what a world
``all_reduce`` of p = 2 ranks runs on the MPI backend, with the exchange replaced by nothing
(``run(buf)`` returns at once, so the "sum" is this rank's input): the communicator's layout
lookup and argument signature, then ``array_reduce.reduce_arrays``. Arrays are one-element
float32, each reset before every call through nnabla (``get_data("w")``, untimed), as backward
writes gradients between steps. The time is the fastest of ``--repeats`` calls.
"""
import argparse
import sys
import time

import numpy as np

import nnabla as nn

import nnabla_torus
from nnabla_torus.comm.array_reduce import reduce_arrays
from nnabla_torus.knobs import BadValue, add_knob, number, parse_bool


def list_lengths(text):
    """``"1,161"`` -> [1, 161]; each an integer >= 1 (BadValue names the first bad one)."""
    one = number(int, low=1, hint="list lengths, e.g. 1,161,1000")
    lengths = [one(part.strip()) for part in str(text).split(",") if part.strip()]
    if not lengths:
        raise BadValue(f"expected list lengths, e.g. 1,161,1000, got {text!r}")
    return lengths


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_knob(p, "--arrays", "NNABLA_TORUS_PER_ARRAY_ARRAYS", "1,161,1000,10000",
             "list lengths to time, comma list", type=list_lengths)
    add_knob(p, "--inplace", "NNABLA_TORUS_PER_ARRAY_INPLACE", False,
             "all_reduce(..., inplace=) of the calls", type=parse_bool)
    add_knob(p, "--repeats", "NNABLA_TORUS_PER_ARRAY_REPEATS", 20, "timed calls per length",
             type=number(int, low=1))
    return p


def time_list(comm, count, inplace, repeats):
    """The fastest time (s) of one call on ``count`` one-element arrays."""
    arrays = [nn.NdArray.from_numpy_array(np.full(1, k, np.float32)) for k in range(count)]

    def call():
        layout = comm.layouts.of(arrays)
        signature = layout.signature   # what the argument check hashes
        reduce_arrays(comm.backend, comm.workspace, layout, lambda buf: None, 2,
                      inplace=inplace)
        return signature
    call()   # the first call builds the layout and the views
    best = float("inf")
    for _ in range(repeats):
        for a in arrays:
            a.get_data("w")
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    wrong = sum(float(a.data[0]) != k for k, a in enumerate(arrays))
    if wrong:
        raise RuntimeError(f"{wrong} of {count} arrays changed: the no-op exchange must keep them")
    return best


def parse_args(argv=None):
    """Parse and check every flag before the communicator starts."""
    return build_parser().parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    comm = nnabla_torus.MultiProcessDataParallelCommunicator(algorithm="ring")
    comm.init()
    print(f"# per_array_bench: one process, inplace {int(args.inplace)}, "
          f"fastest of {args.repeats}")
    print(f"# {'arrays':>8} {'time(us)':>10} {'per-array(us)':>13}")
    for count in args.arrays:
        t = time_list(comm, count, args.inplace, args.repeats)
        print(f"  {count:>8} {t * 1e6:>10.1f} {t * 1e6 / count:>13.2f}", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
