"""All-reduce benchmark in the spirit of nccl-tests: every algorithm side by side, checked.

    mpirun -np 4 python tools/allreduce_bench.py
    mpirun -np 8 python tools/allreduce_bench.py --sizes 102228128 --grids 2x4,4x2 --json r.json

Per size the algorithms run interleaved, through the communicator as a user calls it; a call's
time is the slowest rank's, the table shows the median (algbw, busbw, ratio to native) and every
sum is checked exactly. ``--check-cost`` adds what the cross-rank argument check costs per call,
``--arrays N`` what each array of a list adds. The columns, with the figures they gave:
docs/measurements/allreduce-one-host.md#all-reduce-on-one-host; ``auto`` and the memory bound:
``EPILOG`` (--help).
"""
import argparse
import collections
import json
import os
import platform
import sys
import time

import numpy as np

import nnabla as nn

import nnabla_torus
from nnabla_torus.files import atomic_open
from nnabla_torus.comm.backends import synchronize
# MPI started by the communicator's module (fail-fast, Open MPI's osc/ucx notices off), as
# examples/imagenet/train.py does: importing mpi4py.MPI first prints a notice per rank
from nnabla_torus.comm.communicator import MPI
from nnabla_torus.comm.collectives import ALGORITHMS, AUTO, REGISTRY
from nnabla_torus.knobs import add_knob, check_output_flag, number, parse_bool
from nnabla_torus.comm.topology import parse_grid

EPILOG = """``auto`` routes each call by size (see nnabla_torus/comm/auto/table.py); the ``chose``
column says which algorithm it ran at that size (from ``comm.algorithm_counts``).

Memory bound (one host): summing p buffers of n bytes needs at least (p-1) n-byte adds and
(p-1) n-byte copies (each byte but one rank's is added once; the sum reaches the p-1 others), spread
over the cores::

    bound(p, n) = (p - 1) * (t_add(n) + t_copy(n)) / min(p, cores)

t_add(n) is numpy's ``np.add(a, b, out=c)`` on n-byte arrays, t_copy(n) ``np.copyto`` of n
bytes, both measured here by rank 0 alone (the fastest of 5: a bound, so the least disturbed
run) while the others sleep; ``%bound`` = bound / time (100 % is as fast as this machine's
memory allows).
"""
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'4K' -> 4096, '128M' -> 134217728, '102228128' -> 102228128 (bytes)."""
    text = text.strip().upper().rstrip("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    number = text[:-1] if unit else text
    try:
        return int(float(number) * UNITS[unit])
    except (ValueError, OverflowError):
        raise ValueError(f"size {text!r} is not a number with K/M/G suffix") from None


def parse_list(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_knob(p, "--sizes", "NNABLA_TORUS_BENCH_SIZES", "4K,64K,1M,16M,128M",
             "message sizes in bytes, comma list with K/M/G suffixes")
    add_knob(p, "--algorithms", "NNABLA_TORUS_BENCH_ALGORITHMS",
             "auto,torus2d,ring,hierarchical,native",
             "algorithms to compare (native is always run: it is the reference)")
    add_knob(p, "--grids", "NNABLA_TORUS_BENCH_GRIDS", "",
             "torus2d grids XxY, comma list (empty: the communicator's default grid)")
    add_knob(p, "--dtype", "NNABLA_TORUS_BENCH_DTYPE", "float32", "element type",
             choices=("float32", "float16"))
    add_knob(p, "--iters", "NNABLA_TORUS_BENCH_ITERS", 10, "timed calls per round",
             type=number(int, low=1))
    add_knob(p, "--rounds", "NNABLA_TORUS_BENCH_ROUNDS", 1,
             "rounds over all algorithms per size (interleaving evens out machine noise)",
             type=number(int, low=1))
    add_knob(p, "--warmup", "NNABLA_TORUS_BENCH_WARMUP", 2, "untimed calls first",
             type=number(int, low=0))
    add_knob(p, "--arrays", "NNABLA_TORUS_BENCH_ARRAYS", 1,
             "split each size over this many arrays, all-reduced as one list "
             "(per-array(us) column)",
             type=number(int, low=1))
    add_knob(p, "--inplace", "NNABLA_TORUS_BENCH_INPLACE", True,
             "all_reduce(..., inplace=) of the calls: 1 each array in its storage, 0 fused",
             type=parse_bool)
    add_knob(p, "--check-cost", "NNABLA_TORUS_BENCH_CHECK_COST", False,
             "also time every algorithm with the argument check off (check(us) column)",
             type=parse_bool)
    add_knob(p, "--json", "NNABLA_TORUS_BENCH_JSON", "", "write the records to this JSON file")
    return p


def parse_args(argv=None):
    """Parse and check every flag (on every rank alike, before any all-reduce); sizes in bytes."""
    parser = build_parser()
    args = parser.parse_args(argv)
    itemsize = np.dtype(args.dtype).itemsize
    try:
        args.sizes = [parse_size(s) for s in parse_list(args.sizes)] or [0]
        for size in args.sizes:
            if size < itemsize * args.arrays:
                each = f" in each of --arrays {args.arrays}" if args.arrays > 1 else ""
                raise ValueError(f"size {size} must be >= {itemsize * args.arrays} bytes "
                                 f"(one {args.dtype}{each})")
    except ValueError as e:
        parser.error(f"--sizes: {e}")
    known = list(ALGORITHMS) + [AUTO]
    unknown = [a for a in parse_list(args.algorithms) if a not in known]
    if unknown:
        parser.error(f"--algorithms: unknown {unknown}; choose from {', '.join(known)}")
    try:
        for grid in parse_list(args.grids):
            parse_grid(grid)
    except ValueError as e:
        parser.error(f"--grids: {e}")
    check_output_flag(parser, "--json", args.json)       # before the run, not after
    return args


def variants(comm, algorithms, grids):
    """(algorithm, grid) pairs to run; torus2d (each that takes a grid) once per requested
    grid."""
    out = []
    for name in dict.fromkeys(algorithms + ["native"]):
        if name != AUTO and REGISTRY[name].takes_grid and grids:
            out += [(name, g) for g in grids]
        else:
            out.append((name, None))
    return out


def time_calls(comm, nds, sources, count, world, inplace=True):
    """Per-call times (s, slowest rank) of ``count`` all-reduces of the list ``nds`` (one array:
    the array itself), each reset to its ``sources`` entry before each call, untimed.

    The reset is a copy on the communicator's device (``backend.copy``), finished before the
    clock starts: writing ``nd.data`` would move the array's head to the host (nnabla
    ``python/src/nnabla/_nd_array.pyx`` ``data``, ~332-350: "may implicitly invoke a data
    transfer"), and the all-reduce's cast back to the GPU would time a host-to-device copy
    (~5-10 ms of PCIe for ResNet-50's 102 MB) instead of the collective."""
    be = comm.backend
    times = []
    data = nds if len(nds) > 1 else nds[0]
    for _ in range(count):
        for nd, source in zip(nds, sources):
            be.copy(be.buffer_of(nd), be.buffer_of(source, write=False))
        synchronize(comm)   # the copy is device work too: done before the clock starts
        world.Barrier()
        start = time.perf_counter()
        comm.all_reduce(data, inplace=inplace)
        synchronize(comm)  # NCCL calls return before their kernels end
        times.append(world.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return times


def memory_bound(nbytes, ranks, world, repeats=5):
    """bound(ranks, nbytes) in seconds (module docstring), the same on every rank: rank 0
    times numpy's add and copy while the other ranks sleep (they would share its cores)."""
    bound = None
    if world.Get_rank() == 0:
        count = max(nbytes // 4, 1)
        a, b, c = (np.ones(count, np.float32) for _ in range(3))

        def fastest(f):
            f()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                f()
                times.append(time.perf_counter() - start)
            return min(times)
        t_add = fastest(lambda: np.add(a, b, out=c))
        t_copy = fastest(lambda: np.copyto(c, a))
        cores = len(os.sched_getaffinity(0))
        bound = (ranks - 1) * (t_add + t_copy) / min(ranks, cores)
    done = world.Ibarrier()
    while not done.Test():
        time.sleep(1e-3)
    return world.bcast(bound, root=0)


def print_header(comm, args, dtype, hosts):
    """nccl-tests' ``#`` header: version, parameters, rank -> host map, auto's table, columns."""
    print(f"# nnabla_torus {nnabla_torus.__version__} allreduce_bench: {comm.size} ranks, "
          f"dtype {dtype.name}, iters {args.iters} x rounds {args.rounds}, warmup {args.warmup}, "
          f"arrays {args.arrays}, inplace {int(args.inplace)}")
    print(f"# {MPI.Get_library_version().splitlines()[0].strip()}")
    print("# rank -> host: " + " ".join(f"{r}:{h}" for r, h in enumerate(hosts)))
    if comm.auto_table is not None:
        print(f"# auto ({comm.auto_table.source}): {comm.auto_table.describe()}")
    print(f"# {'size(B)':>11} {'count':>10} {'type':>7} {'algorithm':>12} {'grid':>5} "
          f"{'time(us)':>11} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'ratio':>6} "
          f"{'bound(us)':>10} {'%bound':>6} {'chose':>12} {'#wrong':>6}"
          + (f" {'check(us)':>9}" if args.check_cost else "")
          + (f" {'per-array(us)':>13}" if args.arrays > 1 else ""))


Measured = collections.namedtuple("Measured", [   # each a dict keyed by run
    "times",       # seconds of every timed call
    "unchecked",   # the same with the result check off (--check-cost)
    "wrong",       # wrong elements, summed over the ranks
    "chose",       # Counter of the algorithms the calls ran (auto's choices)
    "single",      # the same bytes in one array (--arrays N > 1)
])


def split_arrays(values, parts):
    """NdArrays holding ``values`` (1-D numpy) split into ``parts`` near-equal pieces (moved to
    the communicator's device on first use)."""
    return [nn.NdArray.from_numpy_array(piece.copy()) for piece in np.array_split(values, parts)]


def measure_size(comm, args, runs, values, expected, world):
    """Time every run on one size (``values``: this rank's input, 1-D), ``args.rounds``
    interleaved rounds; check the results."""
    nds, sources = split_arrays(values, args.arrays), split_arrays(values, args.arrays)
    one, one_source = split_arrays(values, 1), split_arrays(values, 1)
    times = {run: [] for run in runs}
    unchecked = {run: [] for run in runs}   # --check-cost: the same calls, check off
    single = {run: [] for run in runs}      # --arrays N: the same bytes in one array
    wrong = {}
    chose = {run: collections.Counter() for run in runs}

    def timed(arrays, originals, counts=None):   # warm-up calls, then the timed ones
        time_calls(comm, arrays, originals, args.warmup, world, args.inplace)
        before = collections.Counter(comm.algorithm_counts)
        result = time_calls(comm, arrays, originals, args.iters, world, args.inplace)
        if counts is not None:
            counts += comm.algorithm_counts - before
        return result
    for _ in range(args.rounds):
        for run in runs:
            comm.set_algorithm(*run)
            times[run] += timed(nds, sources, chose[run])
            bad = int(np.count_nonzero(np.concatenate([nd.data for nd in nds]) != expected))
            wrong[run] = world.allreduce(bad, op=MPI.SUM) + wrong.get(run, 0)
            if args.check_cost:
                checking, comm.check = comm.check, False
                unchecked[run] += timed(nds, sources)
                comm.check = checking
            if args.arrays > 1:
                single[run] += timed(one, one_source)
    return Measured(times, unchecked, wrong, chose, single)


def size_record(comm, args, run, nbytes, dtype, measured, native, bound):
    """The JSON record of one run on one size (the communicator set to that run)."""
    p = comm.size
    t = float(np.median(measured.times[run]))
    algbw = nbytes / t / 1e9 if t > 0 else 0.0
    rec = dict(algorithm=run[0], grid=str(comm.grid) if run[0] != "native" else "-",
               pipelined=comm.pipelined, ranks=p, bytes=nbytes, dtype=dtype.name, time_us=t * 1e6,
               algbw_GBps=algbw, busbw_GBps=algbw * 2 * (p - 1) / p,
               ratio_to_native=t / native if native > 0 else float("nan"),
               bound_us=bound * 1e6 if bound else None,
               fraction_of_bound=bound / t if bound and t > 0 else None,
               chose=dict(measured.chose[run]), correct=measured.wrong[run] == 0,
               wrong=measured.wrong[run], ranks_per_host=comm.hosts.ranks_per_host or p,
               check_us=(t - float(np.median(measured.unchecked[run]))) * 1e6
               if args.check_cost else None, arrays=args.arrays, inplace=args.inplace,
               per_array_us=(t - float(np.median(measured.single[run]))) * 1e6 / args.arrays
               if args.arrays > 1 else None)
    if run[0] == "auto":   # the table tools/calibrate.py saves in a profile
        rec.update(auto_bounds=comm.auto_table.bounds, auto_algorithms=comm.auto_table.names)
    return rec


def print_row(rec, count, check_cost):
    """One fixed-width row of the table (nccl-tests' columns, then ours)."""
    picked = "+".join(sorted(rec["chose"])) if rec["algorithm"] == "auto" else "-"
    print(f"  {rec['bytes']:>11} {count:>10} {rec['dtype']:>7} {rec['algorithm']:>12} "
          f"{rec['grid']:>5} {rec['time_us']:>11.1f} {rec['algbw_GBps']:>11.3f} "
          f"{rec['busbw_GBps']:>11.3f} {rec['ratio_to_native']:>6.2f} "
          f"{rec['bound_us'] or 0:>10.1f} "
          f"{100 * (rec['fraction_of_bound'] or 0):>5.0f}% {picked:>12} "
          f"{rec['wrong']:>6}"
          + (f" {rec['check_us']:>9.1f}" if check_cost else "")
          + (f" {rec['per_array_us']:>13.2f}" if rec["arrays"] > 1 else ""), flush=True)


def main(argv=None):
    args = parse_args(argv)
    world = MPI.COMM_WORLD
    comm = nnabla_torus.MultiProcessDataParallelCommunicator()
    comm.init()
    p, rank = comm.size, comm.rank
    dtype = np.dtype(args.dtype)
    runs = variants(comm, parse_list(args.algorithms), parse_list(args.grids))
    hosts = world.allgather(platform.node())
    if rank == 0:
        print_header(comm, args, dtype, hosts)
    records = []
    for nbytes in args.sizes:
        count = max(nbytes // dtype.itemsize, 0)
        source = ((np.arange(count) % 7) + rank % 5).astype(dtype)
        expected = sum(((np.arange(count) % 7) + r % 5) for r in range(p)).astype(dtype)
        bound = memory_bound(nbytes, p, world) if len(set(hosts)) == 1 else None
        measured = measure_size(comm, args, runs, source, expected, world)
        native = float(np.median(measured.times[("native", None)]))
        for run in runs:
            comm.set_algorithm(*run)
            records.append(size_record(comm, args, run, nbytes, dtype, measured, native, bound))
            if rank == 0:
                print_row(records[-1], count, args.check_cost)
    comm.close()
    all_ok = all(r["correct"] for r in records)
    if rank == 0:
        print(f"# Out of bounds values : {sum(r['wrong'] for r in records)} "
              f"{'OK' if all_ok else 'FAILED'}")
        if args.json:
            with atomic_open(args.json, "w") as f:
                json.dump(records, f, indent=1)
            print(f"# wrote {len(records)} records to {args.json}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
