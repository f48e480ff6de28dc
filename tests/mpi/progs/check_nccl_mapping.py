"""The NCCL backend's mapping, checked under mpirun against the fake (or real NCCL on GPUs).

    NNABLA_TORUS_BACKEND=fake-nccl NNABLA_TORUS_RANKS_PER_HOST=3 \\
        mpirun -np 6 python tests/mpi/progs/check_nccl_mapping.py --grids 3x2,2x3
    NNABLA_TORUS_BACKEND=nccl mpirun -np 4 python tests/mpi/progs/check_nccl_mapping.py \\
        --grids 2x2 --ext cudnn

Checks, with integer-valued data (sums exact; averages within 2**-22 relative):
1. buffer ops (fill, copy across float32/float16, scale, read, sqnorm, padded_length);
2. on every row and column of each grid, the primitives: reduce_scatter returns our chunk
   ``[q*c, (q+1)*c)`` cut at n (c = ceil(n/m)) holding the group's sum, all_gather completes
   it, all_reduce, bcast from the last position, all_gather_into; n = 0, 1, 17, 289, 100003
   and a padded length;
3. the communicator's all_reduce for torus2d on each grid, ring, hierarchical and native,
   division and inplace on and off, float32 (all ranks bitwise equal), float16 arrays and
   float16 on the wire; bcast, all_gather and reduce_scatter on the world.
Prints "PASSED nccl mapping rank r"; any failure aborts the job with the traceback.
"""
import argparse
import hashlib
import os

import numpy as np
from mpi4py import MPI

import nnabla as nn
from nnabla.ext_utils import get_extension_context
import nnabla_torus as C
from nnabla_torus.comm.topology import parse_grid
from check_fake_nccl import data, nd, run_or_abort

RANK, P = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
SHAPES = [(0,), (1,), (17,), (17, 17), (100003,)]


def rank_sum(shape, ranks, k=0, dtype=np.float32):
    return sum(data(shape, r, k) for r in ranks).astype(dtype)


def host(be, buf):
    """A numpy copy of backend buffer ``buf`` (through an NdArray, as a GPU needs)."""
    out = nd(np.zeros(buf.size, buf.dtype))
    be.copy(be.buffer_of(out), buf)
    return out.data


def same_on_all_ranks(array, what):
    digests = MPI.COMM_WORLD.allgather(hashlib.sha1(np.ascontiguousarray(array)).hexdigest())
    assert len(set(digests)) == 1, f"{what}: results differ across ranks"


def check_buffer_ops(be):
    a, h = be.empty(np.float32, 10), be.empty(np.float16, 10)
    a.fill(2.0)
    be.copy(h, a)
    be.scale(h, 0.5)
    be.copy(a, h)
    be.scale(be.sub(a, 2, 5), 3.0)
    be.sub(h, 8, 10).fill(4.0)
    assert np.array_equal(host(be, a), [1, 1, 3, 3, 3, 1, 1, 1, 1, 1])
    assert np.array_equal(host(be, h), [1] * 8 + [4, 4]) and host(be, h).dtype == np.float16
    assert (be.read(a, 3), be.read(h, 9), be.sqnorm(a), be.sqnorm(h)) == (3.0, 4.0, 34.0, 40.0)
    for n in (0, 1, 17, 100003):
        for dtype in (np.float32, np.float16):
            unit = P * 16 // np.dtype(dtype).itemsize   # P chunks of a multiple of 16 bytes
            assert (be.padded_length(n, dtype) % unit == 0
                    and n <= be.padded_length(n, dtype) < n + unit)


def check_primitives(be, grid, big=100003):
    for ranks in (grid.row_of(RANK), grid.column_of(RANK)):
        grp = be.group(ranks)
        m, q = grp.size, ranks.index(RANK)
        assert (grp.ranks, grp.rank, grp.size) == (ranks, q, len(ranks))
        for n in (0, 1, 17, 289, big, be.padded_length(big)):
            what = f"grid {grid} group {ranks} n={n}"
            total = rank_sum((n,), ranks)
            mine = nd(data((n,), RANK))
            buf = be.buffer_of(mine)
            shard = be.reduce_scatter(grp, buf)
            c = -(-n // m)
            lo, hi = min(q * c, n), min((q + 1) * c, n)
            assert (shard.start, shard.size) == (lo, hi - lo), (what, shard.start, shard.size)
            assert np.array_equal(host(be, shard), total[lo:hi]), what
            be.all_gather(grp, buf)
            assert np.array_equal(mine.data, total), what
            be.all_reduce(grp, buf)
            assert np.array_equal(mine.data, m * total), what
            fresh = nd(data((n,), RANK))
            be.bcast(grp, be.buffer_of(fresh), m - 1)
            assert np.array_equal(fresh.data, data((n,), ranks[-1])), what
            out = be.empty(np.float32, m * n)
            be.all_gather_into(grp, be.buffer_of(nd(data((n,), RANK))), out)
            assert np.array_equal(host(be, out), np.concatenate([data((n,), r) for r in ranks]))


def check_all_reduce(comm, what):
    for division in (False, True):
        for inplace in (False, True):
            xs = [nd(data(s, RANK, k)) for k, s in enumerate(SHAPES)]
            comm.all_reduce(xs, division=division, inplace=inplace)
            for k, (x, s) in enumerate(zip(xs, SHAPES)):
                case = f"{what} division={division} inplace={inplace} shape {s}"
                want = rank_sum(s, range(P), k, np.float64) / (P if division else 1)
                got = x.data
                assert got.dtype == np.float32 and got.shape == s, case
                if division:
                    np.testing.assert_allclose(got, want, rtol=2 ** -22, atol=0, err_msg=case)
                else:
                    assert np.array_equal(got, want), case
                same_on_all_ranks(got, case)


def check_half(comm):
    shapes = [(17,), (17, 17), (100003,)]
    for inplace in (False, True):
        xs = [nd(data(s, RANK, k, np.float16)) for k, s in enumerate(shapes)]
        comm.all_reduce(xs, inplace=inplace)
        for k, (x, s) in enumerate(zip(xs, shapes)):
            assert x.dtype == np.float16 and np.array_equal(x.data, rank_sum(s, range(P), k))
    comm.wire_fp16 = True
    xs = [nd(data(s, RANK, k)) for k, s in enumerate(shapes)]
    comm.all_reduce(xs)
    comm.wire_fp16 = False
    for k, (x, s) in enumerate(zip(xs, shapes)):
        assert x.dtype == np.float32 and np.array_equal(x.data, rank_sum(s, range(P), k))


def check_world_collectives(comm):
    xs = [nd(data((17,), RANK)), nd(data((3, 3), RANK, 1))]
    comm.bcast(xs, src=P - 1)
    assert np.array_equal(xs[0].data, data((17,), P - 1))
    assert np.array_equal(xs[1].data, data((3, 3), P - 1, 1))
    outs = [nn.NdArray((5, 3)) for _ in range(P)]
    comm.all_gather(nd(data((5, 3), RANK)), outs)
    assert all(np.array_equal(o.data, data((5, 3), r)) for r, o in enumerate(outs))
    out = nn.NdArray((7,))
    comm.reduce_scatter([nd(data((7,), RANK, k)) for k in range(P)], out)
    assert np.array_equal(out.data, rank_sum((7,), range(P), RANK))


def main(args):
    # A default context the buffers do not have (float or half, device 0), as in a script that
    # set it before comm.init() told it the rank's GPU: the backend must not depend on it.
    nn.set_default_context(get_extension_context(args.ext, device_id="0",
                                                 type_config=args.default_type))
    grids = [parse_grid(g) for g in args.grids.split(",")]
    comm = C.MultiProcessDataParallelCommunicator(get_extension_context(args.ext),
                                                  algorithm="torus2d", grid=str(grids[0]))
    comm.init()
    be = comm.backend
    assert be.name == os.environ.get("NNABLA_TORUS_BACKEND"), be.name
    check_buffer_ops(be)
    for grid in grids:
        comm.set_algorithm("torus2d", grid)
        check_primitives(be, grid)
        check_all_reduce(comm, f"torus2d {grid}")
    for algorithm in ("ring", "hierarchical", "native"):
        comm.set_algorithm(algorithm)
        check_all_reduce(comm, algorithm)
    comm.set_algorithm("torus2d", grids[0])
    check_half(comm)
    check_world_collectives(comm)
    comm.barrier()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grids", required=True, help="comma list of XxY grids, e.g. 3x2,2x3")
    parser.add_argument("--ext", default="cpu", help="nnabla extension: cpu (fake) or cudnn")
    parser.add_argument("--default-type", default="float", choices=("float", "half"),
                        help="type_config of the default context while the checks run")
    args = parser.parse_args()
    run_or_abort(lambda: main(args), "nccl mapping")
