"""Integer averages and per-rank settings, under mpirun (tests/mpi/test_failfast_mpi.py runs it).

``ints``: all_reduce(division=True) of int32/int64/uint8 arrays (negative values too) for every
algorithm, fused and in place, and reduce_scatter(division=True), against numpy's
``sum // p``; prints ``PASSED init_cases ints on P ranks`` on rank 0.
``settings``: for each setting, the last rank passes a different value to the communicator;
every rank prints ``rank R: <case>: <error>`` (``NO ERROR`` if init passed).
"""
import os
import sys

import nnabla as nn
import numpy as np
from mpi4py import MPI

import nnabla_torus as C
from tests.mpirun import passed_line

RANK, P = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
DTYPES = (np.int32, np.int64, np.uint8)
SIZES = (0, 1, 17, 1001)


def values(n, rank, dtype):
    """Rank ``rank``'s input: small enough for uint8 sums, negative for signed types."""
    v = (np.arange(n) * 7 + rank * 3) % 11
    return (v - 5 * (np.dtype(dtype).kind == "i")).astype(dtype)


def expected(n, dtype):
    total = sum(values(n, r, dtype).astype(np.int64) for r in range(P))
    return (total // P).astype(dtype)


def ints():
    for algorithm in ("torus2d", "ring", "native", "hierarchical"):
        comm = C.MultiProcessDataParallelCommunicator(algorithm=algorithm)
        comm.init()
        for dtype in DTYPES:
            for inplace in (False, True):
                arrays = [nn.NdArray.from_numpy_array(values(n, RANK, dtype)) for n in SIZES]
                comm.all_reduce(arrays, division=True, inplace=inplace)
                for n, a in zip(SIZES, arrays):
                    assert a.data.dtype == dtype, (algorithm, dtype, a.data.dtype)
                    assert np.array_equal(a.data, expected(n, dtype)), (
                        algorithm, dtype, inplace, n, a.data[:8], expected(n, dtype)[:8])
        out = nn.NdArray((5,))
        ins = [nn.NdArray.from_numpy_array(values(5, RANK, np.int32) + i) for i in range(P)]
        comm.reduce_scatter(ins, out, division=True)
        want = (sum(values(5, r, np.int32).astype(np.int64) + RANK for r in range(P)) // P)
        assert np.array_equal(out.data, want), (out.data, want)
    if RANK == 0:
        print(passed_line(f"init_cases ints on {P} ranks"), flush=True)


def init_with(env=None, **kwargs):
    for name, value in (env or {}).items():
        os.environ[name] = value
    try:
        C.MultiProcessDataParallelCommunicator(**kwargs).init()
    finally:
        for name in env or {}:
            del os.environ[name]


def settings():
    last = RANK == P - 1
    cases = {
        "algorithm": lambda: init_with(algorithm="ring" if last else "torus2d"),
        "grid": lambda: init_with(grid=f"1x{P}" if last else f"{P}x1"),
        "wire_fp16": lambda: init_with(wire_fp16=last),
        "timeout": lambda: init_with(timeout=30 if last else 60),
        "check": lambda: init_with(check=not last),
        "segment_bytes": lambda: init_with({"NNABLA_TORUS_SEGMENT_BYTES": "4096"} if last else {}),
        "pipeline_bytes": lambda: init_with({"NNABLA_TORUS_PIPELINE_BYTES": "0"} if last else {}),
        "same": lambda: init_with(),
    }
    for name, case in cases.items():
        try:
            case()
        except ValueError as e:
            print(f"rank {RANK}: {name}: {' | '.join(str(e).splitlines())}", flush=True)
        else:
            print(f"rank {RANK}: {name}: NO ERROR", flush=True)


if __name__ == "__main__":
    {"ints": ints, "settings": settings}[sys.argv[1]]()
    MPI.COMM_WORLD.Barrier()
