"""Communicator checks under mpirun: one launch runs a list of cases and prints one line per case.

    mpirun -np 4 python tests/mpi/progs/comm_cases.py correctness    # "OK <case>" lines, "PASSED"
    mpirun -np 4 python tests/mpi/progs/comm_cases.py bad-input      # "rank r: <case>: <error>"
    NNABLA_TORUS_TIMEOUT=3 mpirun -np 4 python tests/mpi/progs/comm_cases.py missing-rank

NNABLA_TORUS_BACKEND=fake-nccl (or nccl, on GPUs) runs the same cases on that backend;
SKIP_RESNET50=1 leaves out the 25.6 M-value ResNet-50 case (4 and 6 ranks).

Inputs are integer-valued so sums are exact: array k of rank r holds ``base * (r + 1) + r`` with
``base = (7 * index + 5 * k) % 13 - 6``, so every rank's share is visible in the sum and the
sum over p ranks is ``base * p(p+1)/2 + p(p-1)/2`` (|sum| <= 244 at p = 8: exact in float16 too).
Averages (``division=True``) are exact when p is a power of two and within one machine epsilon
of the dtype (relative) otherwise. Random float16 data (and float32 data sent as float16 with
``wire_fp16``) must satisfy |error| <= (p + 1) * 2**-11 * sum_r |x_r| element by element: each of
the p - 1 partial sums, the division and the cast to float16 round once by at most 2**-11.

A failing case prints its name and traceback and aborts the whole job (exit code 1).
"""
import os
import sys
import time
import traceback
from collections import namedtuple

import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla_torus as C
from nnabla_torus.comm.auto import table as auto
from nnabla_torus.comm.array_layout import dtype_of
from nnabla_torus.comm.collectives import REGISTRY
from nnabla_torus.comm.topology import Grid, default_grid, factor_pairs
from tests.mpirun import passed_line

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
BACKEND = os.environ.get("NNABLA_TORUS_BACKEND") or "mpi"
SIZES = [(0,), (1,), (17,), (17, 17), (100003,)]
MIXED = [(0,), (1,), (17,), (17, 17), (3, 0, 2), (100003,)]

Config = namedtuple("Config", "algorithm grid ranks_per_host wire_fp16")


# -- data ----------------------------------------------------------------------------------
def base(shape, k, dtype=np.float32):
    """``(7 * index + 5 * k) % 13 - 6`` over a C-order array of ``shape`` (period 13: tiled)."""
    period = (7 * np.arange(13) + 5 * k) % 13 - 6
    return np.resize(period.astype(dtype), int(np.prod(shape))).reshape(shape)


def values(shape, k, rank, dtype=np.float32):
    """Rank ``rank``'s integer-valued array number ``k``."""
    out = base(shape, k, dtype)
    out *= rank + 1
    out += rank
    return out


def expected_sum(shape, k, ranks, dtype=np.float64):
    """Sum of ``values(shape, k, r)`` over ``ranks`` (exact: integers below 2**11)."""
    out = base(shape, k, dtype)
    out *= sum(r + 1 for r in ranks)
    out += sum(ranks)
    return out


def ndarrays(shapes, rank, dtypes=np.float32):
    dtypes = dtypes if isinstance(dtypes, list) else [dtypes] * len(shapes)
    return [nn.NdArray.from_numpy_array(values(s, k, rank, d))
            for k, (s, d) in enumerate(zip(shapes, dtypes))]


def check_close(got, want, rtol, what):
    """``got == want`` exactly when rtol is 0, else within rtol (relative)."""
    if rtol == 0:
        bad = got != np.asarray(want).astype(got.dtype)   # exact values: no rounding in the cast
    else:
        want = np.asarray(want, dtype=np.float64)
        bad = np.abs(got.astype(np.float64) - want) > rtol * np.abs(want)
    if bad.any():
        want = np.broadcast_to(want, got.shape)
        i = np.flatnonzero(bad.reshape(-1))[0]
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} elements wrong, first at flat "
                             f"index {i}: got {got.reshape(-1)[i]!r}, "
                             f"want {want.reshape(-1)[i]!r}")


def division_rtol(dtype, p, division, wire_fp16=False):
    """0 (exact) unless an average by a p that is not a power of two rounds: float32 once
    (sum, then / p); float16 on the wire is pre-scaled as ncclAvg (communicator.prescaled), so
    each x_r / p and each partial sum rounds: up to (p + 1) * 2**-11 relative."""
    if not division or p & (p - 1) == 0:
        return 0.0
    if wire_fp16 or np.dtype(dtype) == np.float16:
        return (p + 1) * 2.0 ** -11
    return float(np.finfo(dtype).eps)


def check_reduced(arrays, shapes, ranks, division, what, wire_fp16=False, first_k=0):
    """Array i must hold the sum (``division``: mean) over ``ranks`` of array ``first_k + i``."""
    p = len(ranks)
    for k, (a, s) in enumerate(zip(arrays, shapes), start=first_k):
        rtol = division_rtol(a.dtype, p, division, wire_fp16)
        want = expected_sum(s, k, ranks, np.float64 if rtol else np.float32)  # float32: faster
        want /= p if division else 1
        got = a.data
        assert got.shape == s and got.dtype == a.dtype, (got.shape, s)
        check_close(got, want, rtol, f"{what} array {k} {s}")


def check_fp16_bound(got, inputs, division, what):
    """|got - exact| <= (p + 1) * 2**-11 * sum_r |x_r| (/p when averaged), elementwise."""
    p = len(inputs)
    exact = sum(x.astype(np.float64) for x in inputs)
    bound = (p + 1) * 2.0 ** -11 * sum(np.abs(x.astype(np.float64)) for x in inputs) + 2.0 ** -24
    if division:
        exact, bound = exact / p, bound / p
    err = np.abs(got.astype(np.float64) - exact)
    if not np.all(err <= bound):
        i = int(np.argmax(err - bound))
        raise AssertionError(f"{what}: error {err[i]:.3g} > bound {bound[i]:.3g} at {i}")
    if not np.isfinite(got).all():
        raise AssertionError(f"{what}: non-finite result")


def resnet50_shapes():
    """The 161 parameter shapes of ResNet-50: 53 conv W, 53 BN gamma + beta, affine W + b."""
    shapes = [(64, 3, 7, 7), (1, 64, 1, 1), (1, 64, 1, 1)]
    cin = 64
    for blocks, width in zip((3, 4, 6, 3), (64, 128, 256, 512)):
        for b in range(blocks):
            for cout, c, k in ((width, cin, 1), (width, width, 3), (4 * width, width, 1)):
                shapes += [(cout, c, k, k), (1, cout, 1, 1), (1, cout, 1, 1)]
            if b == 0:  # projection shortcut
                shapes += [(4 * width, cin, 1, 1), (1, 4 * width, 1, 1), (1, 4 * width, 1, 1)]
            cin = 4 * width
    return shapes + [(2048, 1000), (1000,)]


# -- communicators -------------------------------------------------------------------------
def device_context():
    """The GPU context of this rank for the real NCCL backend, else None (CPU arrays)."""
    if BACKEND != "nccl":
        return None
    from nnabla.ext_utils import get_extension_context
    local_rank = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    ctx = get_extension_context("cudnn", device_id=local_rank)
    nn.set_default_context(ctx)
    return ctx


def make_comm(config, **options):
    """A communicator for ``config``; NNABLA_TORUS_RANKS_PER_HOST emulates hosts during init."""
    if config.ranks_per_host:
        os.environ["NNABLA_TORUS_RANKS_PER_HOST"] = str(config.ranks_per_host)
    try:
        comm = C.MultiProcessDataParallelCommunicator(
            device_context(), algorithm=config.algorithm, grid=config.grid,
            wire_fp16=config.wire_fp16, **options)
        comm.init()
    finally:
        os.environ.pop("NNABLA_TORUS_RANKS_PER_HOST", None)
    return comm


def expected_grid(config):
    per_host = config.ranks_per_host or P        # all ranks of a launch share one real host
    if config.algorithm == "hierarchical" or config.algorithm == "auto" and per_host > 1:
        return Grid(per_host, P // per_host)   # auto: one torus row per host
    if config.algorithm not in REGISTRY or REGISTRY[config.algorithm].layout != "torus":
        return Grid(P, 1)                        # one group of every rank
    return Grid(*map(int, config.grid.split("x"))) if config.grid else default_grid(P, per_host)[0]


def configs(p):
    """Every algorithm; torus2d on every grid of p ranks; hosts of 2 and 4 ranks emulated."""
    out = [Config("torus2d", None, None, False)]
    out += [Config("torus2d", str(g), None, False) for g in factor_pairs(p)]
    out += [Config("ring", None, None, False), Config("native", None, None, False),
            Config("hierarchical", None, None, False), Config("torus2d", None, None, True),
            Config("auto", None, None, False)]
    for per_host in (2, 4):
        if p % per_host == 0 and p > per_host:
            out += [Config("hierarchical", None, per_host, False),
                    Config("torus2d", None, per_host, False)]
    if p % 2 == 0 and p > 2:
        out.append(Config("auto", None, 2, False))
    return out


def config_name(c):
    grid = f" grid={c.grid}" if c.grid else ""
    hosts = f" hosts-of-{c.ranks_per_host}" if c.ranks_per_host else ""
    return f"{c.algorithm}{grid}{hosts}{' wire_fp16' if c.wire_fp16 else ''}"


# -- correctness cases ---------------------------------------------------------------------
def case_layout(comm, config):
    assert comm.size == P and comm.rank == RANK and comm.backend.name == BACKEND, comm.name
    assert not comm._route.pipelined or config.ranks_per_host, "one host: nothing to overlap"
    assert comm.algorithm == config.algorithm, comm.algorithm
    assert comm.grid == expected_grid(config), (comm.grid, expected_grid(config))
    per_host = config.ranks_per_host or P
    # On the NCCL backends local_rank is nnabla's GPU: earlier ranks of this (one) machine.
    device = RANK if BACKEND in ("nccl", "fake-nccl") else RANK % per_host
    assert (comm.local_rank, comm.local_size) == (device, per_host)


def case_sizes(comm, config, division, inplace):
    """Every size alone (a single NdArray, not a list), then all of them in one list."""
    what = f"division={division} inplace={inplace}"
    for s in SIZES:
        [a] = ndarrays([s], RANK)
        comm.all_reduce(a, division=division, inplace=inplace)
        check_reduced([a], [s], range(P), division, f"{what} size {s}", config.wire_fp16)
    arrays = ndarrays(MIXED, RANK)
    comm.all_reduce(arrays, division=division, inplace=inplace)
    check_reduced(arrays, MIXED, range(P), division, f"{what} list", config.wire_fp16)
    comm.all_reduce([], division=division, inplace=inplace)


def case_fused_subset(comm, config):
    """The cheaper set for the other configurations: one fused list, one in-place list."""
    for division, inplace in ((False, False), (True, True)):
        arrays = ndarrays(MIXED, RANK)
        comm.all_reduce(arrays, division=division, inplace=inplace)
        check_reduced(arrays, MIXED, range(P), division, f"division={division} inplace={inplace}",
                      config.wire_fp16)
    [a] = ndarrays([(1,)], RANK)
    comm.all_reduce(a)
    check_reduced([a], [(1,)], range(P), False, "size 1")
    comm.all_reduce([])


def case_float16(comm, config, flags=((False, False), (True, True))):
    """float16 NdArrays: integer values exact; mixed float32/float16 lists; random within bound."""
    shapes = [(17,), (100003,), (17, 17), (0,)]
    dtypes = [np.float16, np.float32, np.float16, np.float16]
    for division, inplace in flags:
        arrays = ndarrays(shapes, RANK, dtypes)
        comm.all_reduce(arrays, division=division, inplace=inplace)
        for k, (a, s, d) in enumerate(zip(arrays, shapes, dtypes)):
            assert a.dtype == d
            check_reduced([a], [s], range(P), division, f"float16 array {k}", True, first_k=k)
    inputs = [np.random.RandomState(r).standard_normal(4099).astype(np.float16) for r in range(P)]
    for division in (False, True):
        a = nn.NdArray.from_numpy_array(inputs[RANK])
        comm.all_reduce(a, division=division)
        check_fp16_bound(a.data, inputs, division, f"random float16 division={division}")


def case_float16_mean(comm, config):
    """float16 averages near the top of the range, pre-scaled as NCCL's ncclAvg (nnabla's
    division=True, ext multi_process_data_parallel_communicator.cu ~790-792): every rank
    holds 40000, the sum (40000 p) overflows 65504 but the mean does not. And a mixed
    float16/float32 list (an FP16 bucket with cuDNN's float32 batch-norm gradients) is one
    collective, not one per dtype."""
    inputs = [np.full(17, 40000, np.float16) for _ in range(P)]
    for inplace in (False, True):
        a = nn.NdArray.from_numpy_array(inputs[RANK].copy())
        comm.all_reduce([a], division=True, inplace=inplace)
        check_fp16_bound(a.data, inputs, True, f"float16 mean of 40000s inplace={inplace}")
    arrays = ndarrays([(17,), (5,), (17, 17)], RANK, [np.float16, np.float32, np.float16])
    before = sum(comm.algorithm_counts.values())
    comm.all_reduce(arrays, division=True)
    calls = sum(comm.algorithm_counts.values()) - before
    assert calls == (1 if P > 1 else 0), f"{calls} collectives for one mixed fused list"
    assert [a.dtype for a in arrays] == [np.float16, np.float32, np.float16]
    check_reduced(arrays, [(17,), (5,), (17, 17)], range(P), True, "mixed list", True)


def case_pipelined(comm, config, division, inplace):
    """torus2d cut into pieces whose phases overlap (rows on one emulated host, columns across):
    24-byte pieces on sizes 17 and 17x17 (up to 49 pieces, none divisible by the grid),
    40000-byte pieces on every size and list."""
    assert comm._route.pipelined, "rows inside a host, columns across: the route must pipeline"
    be = comm.backend
    saved = be.pipeline_bytes
    try:
        be.pipeline_bytes = 24
        for s in [(17,), (17, 17)]:
            [a] = ndarrays([s], RANK)
            comm.all_reduce(a, division=division, inplace=inplace)
            check_reduced([a], [s], range(P), division, f"24-byte pieces size {s}")
        be.pipeline_bytes = 40000
        case_sizes(comm, config, division, inplace)
        case_float16(comm, config, [(division, inplace)])
    finally:
        be.pipeline_bytes = saved


def case_wire_fp16_random(comm, config):
    """float32 data with float16 on the wire: float32 results within the float16 bound."""
    inputs = [np.random.RandomState(r).standard_normal(100003).astype(np.float32) for r in range(P)]
    a = nn.NdArray.from_numpy_array(inputs[RANK])
    comm.all_reduce([a], division=True)
    assert a.dtype == np.float32
    check_fp16_bound(a.data, inputs, True, "wire_fp16 random float32")


def case_sqnorms(comm, config, dtype=np.float32):
    """pop_sqnorms() after a fused and an in-place call equals the numpy reference."""
    shapes_a, shapes_b = [(17,), (40, 50)], [(1,), (1000,)]
    comm.track_sqnorms = True
    try:
        comm.all_reduce(ndarrays(shapes_a, RANK, dtype), division=True)
        comm.all_reduce(ndarrays(shapes_b, RANK, dtype), division=False, inplace=True)
        local, global_ = comm.pop_sqnorms()
        assert comm.pop_sqnorms() == (0.0, 0.0)
    finally:
        comm.track_sqnorms = False
    every = [(s, k) for k, s in enumerate(shapes_a)] + [(s, k) for k, s in enumerate(shapes_b)]
    want_local = sum(np.sum(values(s, k, r, np.float64) ** 2)
                     for s, k in every for r in range(P)) / P
    want_global = sum(np.sum((expected_sum(s, k, range(P)) / P) ** 2) for s, k in every)
    # float16 on the wire: an average scales each input by 1/p in float16 before the sum
    # (as ncclAvg), which rounds even integers when p is not a power of two.
    rtol = 1e-5 if dtype == np.float32 and not config.wire_fp16 else 4e-3
    for name, got, want in (("local", local, want_local), ("global", global_, want_global)):
        if not abs(got - want) <= rtol * want:
            raise AssertionError(f"{name} sqnorm {got!r}, numpy says {want!r}")


def case_resnet50(comm, config):
    shapes = resnet50_shapes()
    assert len(shapes) == 161 and sum(int(np.prod(s)) for s in shapes) == 25557032
    arrays = ndarrays(shapes, RANK)
    comm.all_reduce(arrays, division=True)
    check_reduced(arrays, shapes, range(P), True, "ResNet-50 gradients", config.wire_fp16)


def case_lazily_zeroed(comm, config):
    """A gradient backward never reached (zero() pending, no storage) sums as zeros."""
    for inplace in (False, True):
        zeroed = nn.NdArray((7,))
        zeroed.zero()
        arrays = ndarrays([(17,)], RANK) + [zeroed]
        comm.all_reduce(arrays, division=True, inplace=inplace)
        check_reduced(arrays[:1], [(17,)], range(P), True,
                      f"inplace={inplace} next to a zeroed array")
        check_close(zeroed.data, np.zeros(7), 0, f"inplace={inplace} zeroed array")


def case_same_list_changed(comm, config):
    """One list all-reduced again and again (its layout and views are cached per list) while
    its arrays change between calls: each call must sum what the arrays hold then."""
    for inplace in (False, True):
        shapes = [(17,), (1,), (3, 5), (100003,), (2,)]
        arrays = ndarrays(shapes, RANK)
        comm.all_reduce(arrays, inplace=inplace)
        check_reduced(arrays, shapes, range(P), False, f"inplace={inplace} first call")

        def again(what, arrays=arrays, shapes=shapes):
            for k, (a, s) in enumerate(zip(arrays, shapes)):
                a.data = values(s, k, RANK, dtype_of(a))
            comm.all_reduce(arrays, inplace=inplace)
            check_reduced(arrays, shapes, range(P), False, f"inplace={inplace} {what}",
                          config.wire_fp16 or any(a.dtype == np.float16 for a in arrays))
        again("unchanged")
        arrays[2].cast(np.float16)                       # one array re-cast (new storage)
        again("one array cast to float16")
        assert arrays[2].dtype == np.float16, arrays[2].dtype
        arrays[2].cast(np.float32)
        arrays[1].zero()                                 # storage dropped, refilled by the write
        arrays[3].fill(5.0)
        arrays[4].clear()
        again("after zero(), fill() and clear()")
        arrays[0] = nn.NdArray((17,))                    # one array replaced by a new NdArray
        again("one array replaced")
        arrays.reverse()                                 # the same arrays reordered
        shapes.reverse()
        for k, (a, s) in enumerate(zip(arrays, shapes)):
            a.data = values(s, k, RANK)
        comm.all_reduce(arrays, inplace=inplace)
        check_reduced(arrays, shapes, range(P), False, f"inplace={inplace} reordered")
        v = nn.Variable((3, 4))                          # shapes changed in the same NdArray
        v.d = values((3, 4), 0, RANK)
        listed = [v.data, arrays[0]]
        comm.all_reduce(listed, inplace=inplace)
        check_reduced(listed[:1], [(3, 4)], range(P), False, f"inplace={inplace} (3, 4)")
        for shape in ((4, 3), (7,)):                     # same size, then another size
            v.reset_shape(shape, force=True)
            v.d = values(shape, 0, RANK)
            comm.all_reduce(listed, inplace=inplace)
            check_reduced(listed[:1], [shape], range(P), False, f"inplace={inplace} {shape}")


def case_storage_replaced(comm, config):
    """Issue 33 (1): an array of a list that was already reduced gets new storage of the same
    shape (``reset_shape`` to another size and back, with force) and is written: the next
    all_reduce and bcast of the same list must reach it, not its old storage (a cached view)."""
    shapes = [(17,), (3, 5), (4,)]
    for inplace in (False, True):
        variables = [nn.Variable(s) for s in shapes]
        for k, (v, s) in enumerate(zip(variables, shapes)):
            v.d = values(s, k, RANK)
        arrays = [v.data for v in variables]
        comm.all_reduce(arrays, inplace=inplace)
        comm.bcast(arrays, src=0, inplace=inplace)
        for v, s in zip(variables[1:], shapes[1:]):
            v.reset_shape((7,), force=True)          # another size: new storage
            v.reset_shape(s, force=True)             # back: the same shape, new storage again
        for k, (v, s) in enumerate(zip(variables, shapes)):
            v.d = values(s, k, RANK)
        comm.all_reduce(arrays, inplace=inplace)
        check_reduced(arrays, shapes, range(P), False, f"inplace={inplace} new storage")
        for v, s in zip(variables, shapes):
            v.reset_shape((7,), force=True)
            v.reset_shape(s, force=True)
            v.d = np.full(s, 100.0 + RANK, np.float32)
        comm.bcast(arrays, src=0, inplace=inplace)
        for a in arrays:
            check_close(a.data, np.full(a.shape, 100), 0, f"bcast inplace={inplace} new storage")


def case_integers(comm, config):
    """int32 and int64 sums are exact; averages are floor(sum / p), fused and in place."""
    shapes = [(17,), (17, 17), (100003,), (0,)]
    for dtype in (np.int32, np.int64):
        for division, inplace in ((False, False), (True, True), (True, False)):
            arrays = ndarrays(shapes, RANK, dtype)
            comm.all_reduce(arrays, division=division, inplace=inplace)
            for k, (a, s) in enumerate(zip(arrays, shapes)):
                want = expected_sum(s, k, range(P), np.int64)
                want = want // P if division else want
                assert a.dtype == dtype, a.dtype
                check_close(a.data, want, 0, f"{np.dtype(dtype).name} division={division} "
                                             f"inplace={inplace} array {k} {s}")


def case_shared_pieces(comm, config):
    """The shared-memory path in pieces of 4000 bytes (26 pieces of 100003 float32, halves
    alternating), after a window grown by a larger call; float16 and integers too. Twice:
    small pieces summed after one arrival, then every piece through two (threshold 0)."""
    from nnabla_torus.comm.backends import mpi_shared as mpi
    be = comm.backend
    assert comm._route.shared, "rows inside one host share memory"
    saved = be.shm_bytes, mpi.SHM_ONE_ARRIVAL_BYTES
    try:
        be.shm_bytes = 4000
        for mpi.SHM_ONE_ARRIVAL_BYTES in (saved[1], 0):
            case_sizes(comm, config, True, False)
            case_float16(comm, config, [(False, True)])
            case_integers(comm, config)
    finally:
        be.shm_bytes, mpi.SHM_ONE_ARRIVAL_BYTES = saved


def forced_table(comm, bound=1000):
    """auto's table replaced: native below ``bound`` bytes, torus2d from there on."""
    comm.auto_table = auto.Table([bound], ["native", "torus2d"], "test")


def case_auto_routes(comm, config):
    """Each call (one fused exchange, in place or not; mixed dtypes in one) goes to the
    algorithm its byte count selects; algorithm_counts says so; results are exact either way."""
    saved = comm.auto_table
    try:
        forced_table(comm)
        before = dict(comm.algorithm_counts)
        for shapes in ([(17,), (3, 0, 2)], [(100003,)]):   # in place: 68 B native, 400 kB torus2d
            arrays = ndarrays(shapes, RANK)
            comm.all_reduce(arrays, inplace=True)
            check_reduced(arrays, shapes, range(P), False, "auto in place")
        shapes = [(17,), (100003,), (3, 0, 2)]
        arrays = ndarrays(shapes, RANK, [np.float32, np.float16, np.float16])
        comm.all_reduce(arrays, division=True)   # fused: one mixed buffer of 200 kB + 68 B
        for k, (a, s) in enumerate(zip(arrays, shapes)):
            check_reduced([a], [s], range(P), True, f"auto fused array {k}", True, first_k=k)
        got = {k: comm.algorithm_counts[k] - before.get(k, 0) for k in comm.algorithm_counts}
        if P > 1:
            assert got.get("native") == 1 and got.get("torus2d") == 2, got
        if BACKEND == "mpi":
            case_integers(comm, config)
    finally:
        comm.auto_table = saved


def case_auto_same_choice(comm, config):
    """Ranks with different local clocks still get one table: the measurement takes the
    slowest rank's time and rank 0's table is broadcast. Each rank's clock here runs at its
    own random pace, so its local timings alone would rank the algorithms differently."""
    rng = np.random.RandomState(1000 + RANK)
    clock = [0.0]

    def skewed():
        clock[0] += rng.exponential(1.0) * (1 + RANK)
        return clock[0]
    fresh = C.MultiProcessDataParallelCommunicator(device_context(), algorithm="auto")
    fresh.auto_timer = skewed
    fresh.init()
    table = fresh.auto_table
    everyone = WORLD.allgather((table.bounds, table.names, table.source))
    assert all(t == everyone[0] for t in everyone), everyone
    sizes = [1 << k for k in range(2, 28)]
    choices = WORLD.allgather([table.choose(n) for n in sizes])
    assert all(c == choices[0] for c in choices), choices
    profiled = C.MultiProcessDataParallelCommunicator(device_context(), algorithm="auto",
                                                      auto_profile="cpu-2core")
    profiled.init()
    one = "one rank" if P == 1 else None   # one rank: nothing to route, native
    assert profiled.auto_table.source == (one or "profile cpu-2core"), profiled.auto_table.source
    everyone = WORLD.allgather(profiled.auto_table.describe())
    assert len(set(everyone)) == 1, everyone
    # A profile without software terms: measured instead, said once (rank 0).
    bare = auto_with_profile(lambda raw: raw.pop("software"))
    # measured, or the table this machine measured before (cached by ``fresh`` above)
    assert (bare.auto_table.source == one if one else bare.auto_table.source.startswith(
        ("measured at init", "cached in "))), bare.auto_table.source
    # A table that tools/calibrate.py saved for this job's shape is used as it is.
    saved = auto_with_profile(lambda raw: raw.update(auto_tables=[{
        "ranks": P, "ranks_per_host": P, "bounds": [12345], "algorithms": ["torus2d", "native"]}]))
    if P > 1:
        assert saved.auto_table.describe() == "torus2d < 12.0557 KiB <= native", \
            saved.auto_table.describe()
        assert saved.auto_table.source.endswith("measured by calibrate"), saved.auto_table.source


def auto_with_profile(edit):
    """An initialised auto communicator whose profile is cpu-2core changed by ``edit(raw)``
    (rank 0 writes the file)."""
    import tempfile
    import yaml
    from nnabla_torus.planning.machine_profile import load_profile, profile_to_dict
    path = None
    if RANK == 0:
        raw = profile_to_dict(load_profile("cpu-2core"))
        edit(raw)
        path = os.path.join(tempfile.mkdtemp(), "edited.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(raw, f)
    comm = C.MultiProcessDataParallelCommunicator(device_context(), algorithm="auto",
                                                  auto_profile=WORLD.bcast(path))
    comm.init()
    return comm


def case_bcast(comm, config):
    shapes, dtypes = [(17,), (17, 17), (0,), (5,)], [np.float32, np.float32, np.float32, np.float16]
    for src in sorted({0, P - 1}):
        for inplace in (False, True):
            arrays = ndarrays(shapes, RANK, dtypes)
            if RANK != src:           # receivers may pass new float32 arrays (no storage yet)
                arrays[:2] = [nn.NdArray(s) for s in shapes[:2]]
            comm.bcast(arrays, src=src, inplace=inplace)
            for k, (a, s, d) in enumerate(zip(arrays, shapes, dtypes)):
                check_close(a.data, values(s, k, src, d), 0, f"bcast src={src} inplace={inplace}")


def case_all_gather(comm, config):
    for shape in ((3, 5), (0,), (100003,)):
        [mine] = ndarrays([shape], RANK)
        outs = [nn.NdArray(shape) for _ in range(P)]
        comm.all_gather(mine, outs)
        for r, out in enumerate(outs):
            check_close(out.data, values(shape, 0, r), 0, f"all_gather {shape} from rank {r}")


def case_reduce_scatter(comm, config):
    for shape in ((4, 3), (0,), (1,), (1001,)):
        for division in (False, True):
            ins = ndarrays([shape] * P, RANK)        # ins[k] of rank r: values(shape, k, r)
            out = nn.NdArray(shape)
            comm.reduce_scatter(ins, out, division=division)
            want = expected_sum(shape, RANK, range(P)) / (P if division else 1)
            check_close(out.data, want, division_rtol(np.float32, P, division),
                        f"reduce_scatter {shape} division={division}")


def case_groups(comm, config):
    """new_group / list_groups / find_group, and collectives inside a group."""
    evens, odds = list(range(0, P, 2)), list(range(1, P, 2))
    assert comm.new_group(("evens", evens)) == "evens"
    groups = [("evens", evens)]
    if odds:
        comm.new_group(("odds", odds))
        groups.append(("odds", odds))
    listed = comm.list_groups()
    assert listed == dict([("world", list(range(P)))] + groups), listed
    assert comm.find_group("evens") == evens
    name, members = groups[RANK % 2]
    shapes = [(17,), (1,), (0,), (100003,)]
    for division, inplace in ((False, False), (True, True)):
        arrays = ndarrays(shapes, RANK)
        comm.all_reduce(arrays, division=division, inplace=inplace, group=name)
        check_reduced(arrays, shapes, members, division, f"group {name} all_reduce")
    arrays = ndarrays(shapes, RANK)
    comm.bcast(arrays, src=len(members) - 1, group=name)  # src: position in the group
    for k, (a, s) in enumerate(zip(arrays, shapes)):
        check_close(a.data, values(s, k, members[-1]), 0, f"group {name} bcast")
    [mine] = ndarrays([(6,)], RANK)
    outs = [nn.NdArray((6,)) for _ in members]
    comm.all_gather(mine, outs, group=name)
    for r, out in zip(members, outs):
        check_close(out.data, values((6,), 0, r), 0, f"group {name} all_gather")


def case_allreduce_numpy(comm, config):
    for dtype in (np.float32, np.float16):
        array = values((3, 7), 0, RANK, dtype)
        assert comm.allreduce_numpy(array) is array
        check_close(array, expected_sum((3, 7), 0, range(P)), 0, f"allreduce_numpy {dtype}")


class Spy:
    """Forward every attribute of ``comm``; record the names and the all_reduce arguments."""

    def __init__(self, comm):
        self._comm, self.names, self.calls = comm, [], []

    def __getattr__(self, name):
        self.names.append(name)
        attr = getattr(self._comm, name)
        if name != "all_reduce":
            return attr

        def all_reduce(*args, **kwargs):
            self.calls.append((len(args[0]), kwargs))
            return attr(*args, **kwargs)
        return all_reduce


def loss_scaling_step(comm, scale, batch=3):
    """One DynamicLossScalingUpdater step of a tiny MLP; the updater's comm sums gradients."""
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    from nnabla.experimental.mixed_precision_training import DynamicLossScalingUpdater

    nn.clear_parameters()
    rng = np.random.RandomState(0)                       # same initial parameters everywhere
    size = batch * (P if comm is None else 1)
    x, t = nn.Variable((size, 4)), nn.Variable((size, 2))
    with nn.parameter_scope("fc1"):
        h = F.tanh(PF.affine(x, 5, rng=rng))
    with nn.parameter_scope("fc2"):
        y = PF.affine(h, 2, rng=rng)
    loss = F.sum((y - t) ** 2)                           # a sum: rank losses add up exactly
    ranks = [RANK] if comm is not None else list(range(P))
    x.d = np.concatenate([np.random.RandomState(10 + r).randn(batch, 4) * (3 if r == 0 else 1)
                          for r in ranks])
    t.d = np.concatenate([np.random.RandomState(20 + r).randn(batch, 2) for r in ranks])
    params = nn.get_parameters()
    solver = S.Sgd(lr=0.01)
    solver.set_parameters(params)
    # nnabla's default data_feeder (lambda x: x) fails when called without an argument.
    updater = DynamicLossScalingUpdater(solver, loss, data_feeder=lambda: None, scale=scale,
                                        comm=comm, grads=[p.grad for p in params.values()])
    updater.update()
    return {k: p.d.copy() for k, p in params.items()}, updater.scale


def case_loss_scaling(comm, config):
    """Matches one process with the whole batch, also after an overflow halves the scale."""
    for scale in (8.0, 2.0 ** 127):       # 2**127 overflows rank 0's gradients: scale drops
        spy = Spy(comm)
        with np.errstate(over="ignore", invalid="ignore"):
            mine, scale_after = loss_scaling_step(spy, scale)
        assert set(spy.names) == {"all_reduce"}, spy.names
        assert spy.calls[0] == (4, dict(division=False, inplace=False)), spy.calls
        assert (len(spy.calls) > 1) == (scale > 1e30) and scale_after <= scale
        reference, reference_scale = loss_scaling_step(None, scale)
        if scale < 1e30:
            assert scale_after == reference_scale == scale
        for k in reference:
            np.testing.assert_allclose(mine[k], reference[k], rtol=1e-5, atol=1e-6, err_msg=k)
            everyone = WORLD.allgather(mine[k])
            assert all(np.array_equal(e, mine[k]) for e in everyone), f"{k} differs across ranks"
        assert WORLD.allgather(scale_after) == [scale_after] * P
    nn.clear_parameters()


def correctness_cases():
    """(name, callable) pairs; the first configuration gets the full size x flags matrix."""
    cases, configs_ = [], configs(P)
    comms = {}

    def on(config, fn, *args):
        def run():
            if config not in comms:
                comms[config] = make_comm(config)
            fn(comms[config], config, *args)
        return run

    tested = set()
    for i, config in enumerate(configs_):
        name = config_name(config)
        cases.append((f"{name}: layout", on(config, case_layout)))
        if BACKEND == "mpi" and config.algorithm == "torus2d" and config.ranks_per_host:
            cases += [(f"{name} pipelined: division={d} inplace={ip}",   # only MPI pipelines
                       on(config, case_pipelined, d, ip))
                      for d in (False, True) for ip in (False, True)]
        key = (config.algorithm, expected_grid(config), config.wire_fp16)
        if key in tested:             # e.g. the default grid named explicitly: layout only
            continue
        tested.add(key)
        if i == 0:
            cases += [(f"{name}: sizes division={d} inplace={ip}", on(config, case_sizes, d, ip))
                      for d in (False, True) for ip in (False, True)]
            cases.append((f"{name}: float16", on(config, case_float16)))
            cases.append((f"{name}: float16 mean", on(config, case_float16_mean)))
        else:
            cases.append((f"{name}: fused and in-place lists", on(config, case_fused_subset)))
            cases.append((f"{name}: float16", on(config, case_float16, [(True, False)])))
        cases.append((f"{name}: sqnorms", on(config, case_sqnorms)))
        if config.algorithm in ("torus2d", "hierarchical", "native") and not config.wire_fp16:
            cases.append((f"{name}: integers", on(config, case_integers)))
        if config.algorithm == "auto":
            cases.append((f"{name}: routes by size", on(config, case_auto_routes)))
        if BACKEND == "mpi" and P > 1 and config.algorithm == "hierarchical":
            cases.append((f"{name}: shared pieces", on(config, case_shared_pieces)))
        if config.wire_fp16:
            cases.append((f"{name}: random float32", on(config, case_wire_fp16_random)))
            cases.append((f"{name}: sqnorms of float16 data",
                          on(config, case_sqnorms, np.float16)))
    first = configs_[0]
    cases += [(f"{config_name(first)}: {fn.__name__[5:]}", on(first, fn)) for fn in (
        case_lazily_zeroed, case_same_list_changed, case_storage_replaced, case_bcast,
        case_all_gather, case_reduce_scatter, case_allreduce_numpy,
        case_loss_scaling, case_groups)]
    if BACKEND == "mpi":
        cases.append(("auto: same choice on every rank", on(first, case_auto_same_choice)))
    # ResNet-50's 25.6 M values cost seconds per rank on 2 cores: two rank counts only
    # (2x2: even chunks, 3x2: uneven chunks).
    if P in (4, 6) and os.environ.get("SKIP_RESNET50") != "1":
        cases.append((f"{config_name(first)}: ResNet-50 161 gradients", on(first, case_resnet50)))
    return cases


# -- bad input ------------------------------------------------------------------------------
def expect_error(name, fn):
    """Run ``fn``; print this rank's error (first line) or NO ERROR; never raise."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- every error type is reported to the test
        text = " | ".join(str(e).splitlines())
        print(f"rank {RANK}: {name}: {type(e).__name__}: {text}", flush=True)
    else:
        print(f"rank {RANK}: {name}: NO ERROR", flush=True)


def init_with_env(name, value):
    """Create and init a communicator with environment variable ``name`` set to ``value``."""
    os.environ[name] = value
    try:
        C.MultiProcessDataParallelCommunicator().init()
    finally:
        del os.environ[name]


def bad_input(comm):
    last = P - 1

    def shapes_differ():
        comm.all_reduce(ndarrays([(17 + (RANK == last),), (3,)], RANK))

    def dtypes_differ():
        comm.all_reduce(ndarrays([(17,)], RANK, np.float16 if RANK == last else np.float32))

    def list_lengths_differ():
        comm.all_reduce(ndarrays([(17,)] * (2 + (RANK == last)), RANK))

    def flags_differ():
        comm.all_reduce(ndarrays([(17,)], RANK), division=(RANK == last))

    def operations_differ():
        arrays = ndarrays([(17,)], RANK)
        comm.bcast(arrays) if RANK == last else comm.all_reduce(arrays)

    def algorithms_differ():                       # e.g. NNABLA_TORUS_ALGORITHM set on one host
        comm.set_algorithm("ring" if RANK == last else "torus2d")
        try:
            comm.all_reduce(ndarrays([(17,)], RANK))
        finally:
            comm.set_algorithm("torus2d")

    def wire_formats_differ():
        comm.wire_fp16 = RANK == last
        try:
            comm.all_reduce(ndarrays([(17,)], RANK))
        finally:
            comm.wire_fp16 = False

    def all_gather_list_differs():                 # one rank passes one output too many
        [mine] = ndarrays([(5,)], RANK)
        comm.all_gather(mine, [nn.NdArray((5,)) for _ in range(P + (RANK == last))])

    def all_gather_list_wrong_everywhere():
        [mine] = ndarrays([(5,)], RANK)
        comm.all_gather(mine, [nn.NdArray((4,)) for _ in range(P)])

    def reduce_scatter_list_differs():
        comm.reduce_scatter(ndarrays([(5,)] * (P + (RANK == last)), RANK), nn.NdArray((5,)))

    def grid_does_not_fit():
        C.MultiProcessDataParallelCommunicator(grid="3x3").init()

    def malformed_grid():
        C.MultiProcessDataParallelCommunicator(grid="2by2").init()

    def unknown_algorithm():
        C.MultiProcessDataParallelCommunicator(algorithm="tree").init()

    def unknown_algorithm_env():
        init_with_env("NNABLA_TORUS_ALGORITHM", "bogus")

    def hosts_do_not_divide():
        init_with_env("NNABLA_TORUS_RANKS_PER_HOST", str(P - 1))

    def pieces_differ():           # NNABLA_TORUS_PIPELINE_BYTES set on one host only
        piped = make_comm(Config("torus2d", None, 2, False))   # rows in a host: pipelined
        piped.backend.pipeline_bytes = 24 if RANK == last else 40000
        piped.all_reduce(ndarrays([(17, 17)], RANK))

    def negative_pieces():
        init_with_env("NNABLA_TORUS_PIPELINE_BYTES", "-1")

    def cached_list_reshaped_on_one_rank():   # a list seen before (layout cached): same size
        v = nn.Variable((3, 4))
        for k in range(3):
            if k == 2 and RANK == last:
                v.reset_shape((4, 3), force=False)
            v.d = values(v.shape, 0, RANK)
            comm.all_reduce([v.data])

    def shape_changes_after_agreement():   # calls 1-3 agree; on call 4 one rank sends more
        for k in range(6):
            comm.all_reduce(ndarrays([(17 + (RANK == last and k == 3),)], RANK))

    def auto_routes_differ():   # sizes differ: the last rank's call would go to torus2d
        forced_table(automatic)
        for k in range(4):
            automatic.all_reduce(ndarrays([(100003,) if RANK == last and k == 2 else (17,)], RANK),
                             inplace=True)

    # One shared row over the whole world: the check rides on the call's first arrival.
    def shared_row_first_call_differs():   # the segments grow at this call (arrival carries it)
        row.all_reduce(ndarrays([(17, 17) if RANK == last else (17,)], RANK))

    def shared_row_small_vs_large():       # one-arrival sum vs two arrivals and a larger window
        row.all_reduce(ndarrays([(17,)], RANK))
        row.all_reduce(ndarrays([(100003,) if RANK == last else (17,)], RANK), inplace=True)

    def shared_row_shapes_differ():        # both one-arrival sums: the data arrival carries it
        row.all_reduce(ndarrays([(18,) if RANK == last else (17,)], RANK))

    def shared_row_empty_vs_data():        # no arrival in the call: the check arrives at its end
        row.all_reduce(ndarrays([(0,) if RANK == last else (17,)], RANK), inplace=True)

    def not_a_member():            # group i holds rank i only; each rank calls its neighbour's
        comm.all_reduce(ndarrays([(17,)], RANK), group=f"only{(RANK + 1) % P}")

    def unknown_group():
        comm.all_reduce(ndarrays([(17,)], RANK), group="nosuch")

    def backends_differ():         # NNABLA_TORUS_BACKEND set on one host only
        C.MultiProcessDataParallelCommunicator(
            backend="fake-nccl" if RANK == last else "mpi").init()

    for r in range(P):
        comm.new_group((f"only{r}", [r]))
    automatic = make_comm(Config("auto", None, None, False), auto_profile="cpu-2core")
    row = make_comm(Config("torus2d", f"{P}x1", None, False))
    cases = [shape_changes_after_agreement, cached_list_reshaped_on_one_rank, auto_routes_differ,
             shapes_differ, dtypes_differ, list_lengths_differ, flags_differ, operations_differ,
             algorithms_differ, wire_formats_differ, pieces_differ, negative_pieces,
             shared_row_first_call_differs, shared_row_small_vs_large, shared_row_shapes_differ,
             shared_row_empty_vs_data,
             all_gather_list_differs, all_gather_list_wrong_everywhere,
             reduce_scatter_list_differs, grid_does_not_fit, malformed_grid, unknown_algorithm,
             unknown_algorithm_env, hosts_do_not_divide, not_a_member, unknown_group,
             backends_differ]
    for fn in cases:
        expect_error(fn.__name__, fn)
    for c in (comm, row):                            # still usable: no stale messages
        arrays = ndarrays(MIXED, RANK)
        c.all_reduce(arrays, division=True)
        check_reduced(arrays, MIXED, range(P), True, "all_reduce after the errors")
    print(f"rank {RANK}: still works", flush=True)


def missing_rank(comm, missing):
    """Every rank but ``missing`` all-reduces; the job must abort naming the missing rank."""
    arrays = ndarrays([(100003,)], RANK)
    if RANK == missing:
        time.sleep(60)                                  # the pytest timeout is far below this
    else:
        comm.all_reduce(arrays)
    print(f"rank {RANK}: all_reduce returned although rank {missing} never called it", flush=True)


def threads(comm, count):
    """``count`` threads per rank all-reduce: first one after another (each sum exact), then
    all at once, which must end the job with ConcurrentCall naming two threads, and no thread
    may see a wrong sum before that ("WRONG" lines)."""
    import threading

    def work(k, rounds, start):
        start.wait()
        for i in range(rounds):
            arrays = ndarrays([(17,), (5 + k,)], RANK + 100 * k)
            comm.all_reduce(arrays, inplace=bool(k % 2))
            for a, shape, j in zip(arrays, [(17,), (5 + k,)], range(2)):
                want = expected_sum(shape, j, [r + 100 * k for r in range(P)])
                if not np.array_equal(a.data, want):
                    print(f"rank {RANK}: WRONG sum in thread worker-{k}, call {i}", flush=True)

    def run(together, rounds):
        start = threading.Barrier(count if together else 1)
        workers = [threading.Thread(target=work, args=(k, rounds, start), name=f"worker-{k}")
                   for k in range(count)]
        for t in workers:
            t.start()
            if not together:
                t.join()
        for t in workers:
            t.join()

    run(False, 3)
    print(f"rank {RANK}: one after another OK", flush=True)
    comm.barrier()  # no rank starts the aborting phase before every rank has said OK
    run(True, 200)
    print(f"rank {RANK}: concurrent calls were not refused", flush=True)


def groups_differ(comm, case):
    """new_group with lists that differ across members: each rank prints its error (one case
    per launch: after a mismatch the job is meant to end, and lists sent to a member that gave
    up would meet its next new_group)."""
    last, ranks = P - 1, list(range(P))
    if case == "order":            # one rank lists the members in another order
        expect_error("group_orders_differ",
                     lambda: comm.new_group(("order", ranks[::-1] if RANK == last else ranks)))
    else:                          # rank 0 leaves the others out: it never sends to them
        expect_error("group_members_differ",
                     lambda: comm.new_group(("members", [0, 1] if RANK == 0 else ranks)))


def shm_refused():
    """The MPI library refuses shared windows (on every rank: the call is collective):
    every rank falls back to messages, rank 0 says why once, and sums stay exact."""
    from nnabla_torus.comm import host_sync

    def refuse(nbytes, comm):
        raise MPI.Exception(MPI.ERR_NO_MEM)
    host_sync.allocate_shared = refuse
    for config in (Config("torus2d", f"{P}x1", None, False),
                   Config("hierarchical", None, None, False)):
        comm = make_comm(config)
        assert not comm._route.shared and comm.backend.world_group.sync is None
        case_fused_subset(comm, config)
        case_integers(comm, config)


def main(suite):
    default = Config("torus2d", None, None, False)
    if suite == "correctness":
        cases = correctness_cases()
    elif suite == "bad-input":
        cases = [("bad input", lambda: bad_input(make_comm(default)))]
    elif suite == "groups-differ":
        cases = [("groups differ", lambda: groups_differ(make_comm(default), os.environ["CASE"]))]
    elif suite == "threads":
        cases = [("threads", lambda: threads(make_comm(default), int(os.environ["THREADS"])))]
    elif suite == "shm-refused":
        cases = [("shared window refused", shm_refused)]
    elif suite == "missing-rank":
        missing = int(os.environ.get("MISSING_RANK", P - 1))
        cases = [("missing rank", lambda: missing_rank(make_comm(default), missing))]
    else:
        raise SystemExit(f"unknown suite {suite!r}; use correctness, bad-input or missing-rank")
    run_cases(cases, f"comm_cases {suite} on {P} ranks")


def run_cases(cases, program):
    """Run (name, function) pairs in order: "OK <name>" per case on rank 0, then
    ``passed_line(program)``; a failing case prints its name and traceback and aborts the job."""
    world = MPI.COMM_WORLD
    name = "set-up"
    start = time.monotonic()
    try:
        for name, case in cases:
            case_start = time.monotonic()
            case()
            if RANK == 0:
                print(f"OK {name} ({time.monotonic() - case_start:.2f} s)", flush=True)
    except BaseException:
        print(f"FAILED on rank {RANK}: {name}", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        world.Abort(1)
    world.Barrier()
    if RANK == 0:
        print(f"{len(cases)} cases in {time.monotonic() - start:.1f} s", flush=True)
        print(passed_line(program), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "correctness")
