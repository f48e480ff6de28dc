"""Property suite: the same seeded random sequences of collectives and list mutations on every
backend, each result checked against numpy (issue 33).

    NNABLA_TORUS_BACKEND=fake-nccl python -m nnabla_torus.launching.mpirun_cmd -np 3 \\
        tests/mpi/progs/property_cases.py --seed 0 --sequences 8 --calls 40

prints ``PASSED property_cases`` after ``--sequences`` sequences (seeds ``--seed``,
``--seed`` + 1, ...) of ``--calls`` collectives each. Every rank draws the same sequence from
the seed; the values rank r writes before call t are small integers drawn from (seed, t, array,
r), so every rank can compute every rank's inputs and the expected result with numpy: sums are
exact in float16 too; averages are exact when the group size is a power of two, else within
``comm_cases.division_rtol``; integer averages are floor(sum / m).

A sequence starts with a pool of Variables (shapes with 0, 1, 17 and 17x17 elements; float32,
float16, int32, int64) and a list of their arrays, then mixes mutations of the list between the
calls: ``reshape_back`` (``reset_shape`` to another size and back with force: new storage, the
same shape), ``cast`` (another dtype), ``zero`` and ``fill`` (the array is then not written
before the next call), ``clear``, ``replace`` (a new Variable in the slot), ``reorder``,
``twice`` (the same array twice in the list), ``drop`` and ``algorithm`` (``set_algorithm``).
Calls: ``all_reduce`` (division, inplace), ``bcast``, ``reduce``, ``all_gather`` and
``reduce_scatter``, each on the world or a group (reversed world, lower half, upper half);
non-members skip the call and must keep their arrays.

On a failure the failing rank prints ``FAILED``, the seed, the operations up to the failing
call, the error and the command that replays the sequence, and the job aborts (exit code 1).
"""
import argparse
import os
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla_torus as C
from nnabla_torus.comm.array_layout import dtype_of
from tests.mpi.progs.comm_cases import (check_close, check_fp16_bound, device_context,
                                        division_rtol)
from tests.mpirun import passed_line

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
BACKEND = os.environ.get("NNABLA_TORUS_BACKEND") or "mpi"
SHAPES = [(0,), (1,), (17,), (3, 5), (17, 17), (2, 0, 3)]
DTYPES = ["float32", "float32", "float16", "int32", "int64", "uint8", "int8", "int16"]
# 8- and 16-bit integers take values over their whole range, so sums overflow and must wrap as
# numpy's do (Open MPI's vectorised MPI_SUM saturated them: 200 + 100 + 50 -> 255 as uint8)
NARROW = {np.dtype(t): np.iinfo(t) for t in (np.uint8, np.int8, np.int16)}
ALGORITHMS = ["torus2d", "ring", "native", "hierarchical"]
MUTATIONS = {"reshape_back": 6, "cast": 3, "zero": 3, "fill": 3, "clear": 2, "replace": 2,
             "reorder": 3, "twice": 2, "drop": 2, "algorithm": 1}   # relative weights
CALLS = {"all_reduce": 9, "bcast": 4, "reduce": 3, "all_gather": 2, "reduce_scatter": 2}
POOL = 6   # Variables per sequence


def groups(p):
    """{name: world ranks in group order}: the world, reversed, the lower and upper halves."""
    half = (p + 1) // 2
    out = {"world": list(range(p)), "rev": list(range(p))[::-1], "lo": list(range(half))}
    if half < p:
        out["hi"] = list(range(half, p))
    return out


GROUPS = groups(P)


# -- the sequence (the same on every rank) -------------------------------------------------
def pick(rng, weights):
    names = list(weights)
    w = np.array([weights[n] for n in names], dtype=float)
    return names[rng.choice(len(names), p=w / w.sum())]


def draw_pool(rng):
    return [(SHAPES[rng.integers(len(SHAPES))], DTYPES[rng.integers(len(DTYPES))])
            for _ in range(POOL)]


def draw_step(rng, listed):
    """Mutations (0-2) then one call, as tuples ``(name, arguments...)``."""
    ops = []
    for _ in range(rng.choice(3, p=[0.3, 0.4, 0.3])):
        before = len(ops)
        name = pick(rng, MUTATIONS)
        slot = int(rng.integers(POOL))
        if name == "reshape_back":
            ops.append((name, slot, (int(rng.integers(1, 40)),)))
        elif name == "cast":
            ops.append((name, slot, DTYPES[rng.integers(len(DTYPES))]))
        elif name in ("zero", "fill", "clear"):
            ops.append((name, slot))
        elif name == "replace":
            ops.append((name, slot, SHAPES[rng.integers(len(SHAPES))],
                        DTYPES[rng.integers(len(DTYPES))]))
        elif name == "reorder":
            ops.append((name, [int(i) for i in rng.permutation(len(listed))]))
        elif name == "twice":
            ops.append((name, int(rng.choice(listed)) if listed else slot))
        elif name == "drop" and len(listed) > 1:
            ops.append((name, int(rng.integers(len(listed)))))
        elif name == "algorithm":
            ops.append((name, ALGORITHMS[rng.integers(len(ALGORITHMS))]))
        apply_to_list(ops[before:], listed)
    name = pick(rng, CALLS)
    group = list(GROUPS)[rng.integers(len(GROUPS))]
    m = len(GROUPS[group])
    if name == "all_reduce":
        ops.append((name, group, bool(rng.integers(2)), bool(rng.integers(2))))
    elif name == "bcast":
        ops.append((name, group, int(rng.integers(m)), bool(rng.integers(2))))
    elif name == "reduce":
        ops.append((name, group, int(rng.integers(m)), bool(rng.integers(2)),
                    bool(rng.integers(2))))
    elif name == "all_gather":
        ops.append((name, group, int(rng.integers(POOL))))
    else:
        ops.append((name, group, SHAPES[rng.integers(len(SHAPES))],
                    DTYPES[rng.integers(len(DTYPES))], bool(rng.integers(2))))
    return ops


def apply_to_list(ops, listed):
    """The list operations of ``ops`` on ``listed`` (slot numbers), as the ranks apply them."""
    for op in ops:
        if op[0] == "reorder":
            listed[:] = [listed[i] for i in op[1]]
        elif op[0] == "twice":
            listed.append(op[1])
        elif op[0] == "drop":
            del listed[op[1]]


def sequence(seed, calls):
    """(pool, initial list, [step ops]) of sequence ``seed``: a prefix of a longer one."""
    rng = np.random.default_rng(seed)
    pool = draw_pool(rng)
    listed = [int(i) for i in rng.permutation(POOL)[:int(rng.integers(2, POOL + 1))]]
    initial = list(listed)
    steps = [draw_step(rng, listed) for _ in range(calls)]
    return pool, initial, steps


def describe(seed, pool, initial, steps):
    lines = [f"seed {seed}: pool {[(s, d) for s, d in pool]}, list {initial}"]
    for t, ops in enumerate(steps):
        lines.append(f"  call {t}: " + "; ".join(
            f"{op[0]}({', '.join(map(repr, op[1:]))})" for op in ops))
    return "\n".join(lines)


# -- running it ------------------------------------------------------------------------------
def rank_values(seed, t, key, rank, shape, dtype=None):
    """Rank ``rank``'s integers for array ``key`` before call ``t``: in [-8, 8], or over the
    whole range of an 8- or 16-bit integer ``dtype`` (NARROW)."""
    rng = np.random.default_rng([seed, t, key, rank])
    info = NARROW.get(np.dtype(dtype)) if dtype is not None else None
    if info is not None:
        return rng.integers(info.min, info.max + 1, size=shape, dtype=np.int64)
    return rng.integers(-8, 9, size=shape).astype(np.float64)


class Run:
    """One sequence on this rank: the pool of Variables, the list, and what each rank wrote."""

    def __init__(self, comm, seed, pool, initial):
        self.comm, self.seed = comm, seed
        self.vars = [self.new_var(s, d) for s, d in pool]
        self.listed = list(initial)
        self.marks = {}   # slot -> "zero" | "fill": not written before the next call

    @staticmethod
    def new_var(shape, dtype):
        v = nn.Variable(shape)
        v.data.cast(np.dtype(dtype))
        return v

    def mutate(self, op):
        name, args = op[0], op[1:]
        if name == "reshape_back":
            slot, via = args
            v = self.vars[slot]
            shape = v.shape
            v.reset_shape(via if via != shape else (via[0] + 1,), force=True)
            v.reset_shape(shape, force=True)
        elif name == "cast":
            self.vars[args[0]].data.cast(np.dtype(args[1]))
        elif name in ("zero", "fill"):
            self.marks[args[0]] = name
        elif name == "clear":
            self.vars[args[0]].data.clear()
        elif name == "replace":
            self.vars[args[0]] = self.new_var(*args[1:])
        elif name == "algorithm":
            self.comm.set_algorithm(args[0])
        apply_to_list([op], self.listed)

    def inputs(self, t, slots):
        """Write each slot's values for call ``t`` (or zero / fill it); {slot: [values of each
        rank]} as float64."""
        out = {}
        for slot in dict.fromkeys(slots):
            a = self.vars[slot].data
            every = [rank_values(self.seed, t, slot, r, a.shape, dtype_of(a)) for r in range(P)]
            mark = self.marks.get(slot)
            if mark == "zero":
                a.zero()
                every = [np.zeros(a.shape) for _ in range(P)]
            elif mark == "fill":
                low = 0 if dtype_of(a).kind == "u" else -2     # no negative unsigned fill
                every = [np.full(a.shape, float(r % 5 + low)) for r in range(P)]
                a.fill(every[RANK].flat[0] if a.size else 0)
            else:
                a.data[...] = every[RANK]
            out[slot] = every
        self.marks = {}
        return out

    def call(self, t, op):
        name, group = op[0], op[1]
        members = GROUPS[group]
        member = RANK in members
        if name == "all_gather":
            return self.all_gather(t, op, members)
        if name == "reduce_scatter":
            return self.reduce_scatter(t, op, members)
        arrays = [self.vars[s].data for s in self.listed]
        every = self.inputs(t, self.listed)
        dtypes = {s: dtype_of(self.vars[s].data) for s in self.listed}
        if member:
            if name == "all_reduce":
                self.comm.all_reduce(arrays, division=op[2], inplace=op[3], group=group)
            elif name == "bcast":
                self.comm.bcast(arrays, src=op[2], inplace=op[3], group=group)
            else:
                self.comm.reduce(arrays, op[2], division=op[3], inplace=op[4], group=group)
        half_wire = name == "all_reduce" and not op[3] and any(
            d == np.float16 for d in dtypes.values())   # float32 travels as float16 with it
        for slot, values in every.items():
            a = self.vars[slot].data
            what = f"{name} slot {slot} {a.shape} {dtypes[slot].name} (rank {RANK})"
            assert dtype_of(a) == dtypes[slot], f"{what}: dtype became {dtype_of(a)}"
            keeps = not member or (name == "reduce" and members.index(RANK) != op[2])
            if keeps:
                check_close(a.data, values[RANK], 0, what + " unchanged")
            elif name == "bcast":
                check_close(a.data, values[members[op[2]]], 0, what)
            else:
                division = op[2] if name == "all_reduce" else op[3]
                self.check_sum(a, [values[r] for r in members], division, what,
                               half_wire and dtypes[slot] == np.float32)

    @staticmethod
    def check_sum(a, inputs, division, what, wire_fp16=False):
        m = len(inputs)
        total = np.sum(inputs, axis=0) if inputs[0].size else inputs[0]
        dtype = dtype_of(a)
        if np.issubdtype(dtype, np.integer):       # the sum wraps in the dtype, as numpy's
            wrapped = np.asarray(total).astype(np.int64).astype(dtype)
            want, rtol = (np.floor_divide(wrapped, m) if division else wrapped), 0
        else:
            want = total / m if division else total
            rtol = division_rtol(dtype, m, division, wire_fp16)
            if rtol and (wire_fp16 or dtype == np.float16):   # partial sums of x_r / m round
                return check_fp16_bound(a.data, inputs, division, what)
        check_close(a.data, want, rtol, what)

    def all_gather(self, t, op, members):
        slot = op[2]
        every = self.inputs(t, [slot])[slot]
        mine = self.vars[slot].data
        dtype = dtype_of(mine)
        outs = [nn.NdArray(mine.shape) for _ in members]
        for o in outs:
            o.cast(dtype)
        if RANK in members:
            self.comm.all_gather(mine, outs, group=op[1])
            for i, (o, r) in enumerate(zip(outs, members)):
                check_close(o.data, every[r], 0, f"all_gather slot {slot} out {i} (rank {RANK})")

    def reduce_scatter(self, t, op, members):
        group, shape, dtype, division = op[1:]
        m = len(members)
        ins = {r: [rank_values(self.seed, t, 1000 + k, r, shape, dtype) for k in range(m)]
               for r in members}
        if RANK not in members:
            return
        arrays = [nn.NdArray.from_numpy_array(x.astype(dtype)) for x in ins[RANK]]
        out = nn.NdArray(shape)
        out.cast(np.dtype(dtype))
        self.comm.reduce_scatter(arrays, out, division=division, group=group)
        me = members.index(RANK)
        self.check_sum(out, [ins[r][me] for r in members], division,
                       f"reduce_scatter {shape} {dtype} (rank {RANK})")


def run_sequence(comm, seed, calls, command):
    pool, initial, steps = sequence(seed, calls)
    comm.set_algorithm(ALGORITHMS[0])
    run = Run(comm, seed, pool, initial)
    for t, ops in enumerate(steps):
        try:
            for op in ops[:-1]:
                run.mutate(op)
            run.call(t, ops[-1])
        except Exception:  # noqa: BLE001  (reported with the sequence, then the job aborts)
            print(f"FAILED on rank {RANK} ({BACKEND}, {P} ranks) at call {t} of\n"
                  f"{describe(seed, pool, initial, steps[:t + 1])}\n{traceback.format_exc()}"
                  f"replay: {command(seed, t + 1)}", flush=True)
            sys.stderr.flush()
            WORLD.Abort(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="first sequence's seed (default: 0)")
    parser.add_argument("--sequences", type=int, default=8, help="sequences (default: 8)")
    parser.add_argument("--calls", type=int, default=40, help="calls per sequence (default: 40)")
    parser.add_argument("--dtypes", default=",".join(dict.fromkeys(DTYPES)),
                        help="dtypes the sequences draw from (default: %(default)s)")
    args = parser.parse_args()
    DTYPES[:] = [d for d in DTYPES if d in args.dtypes.split(",")]
    comm = C.MultiProcessDataParallelCommunicator(device_context())
    comm.init()
    for name, ranks in GROUPS.items():
        if name != "world":
            comm.new_group((name, ranks))
    # The NCCL backend creates its float16 communicator at the first float16 call, which must
    # involve every rank (docs/gpu.md); a sequence may start with a group call.
    comm.all_reduce(nn.NdArray.from_numpy_array(np.zeros(1, np.float16)))

    def command(seed, calls):
        return (f"NNABLA_TORUS_BACKEND={BACKEND} python -m nnabla_torus.launching.mpirun_cmd "
                f"-np {P} tests/mpi/progs/property_cases.py --seed {seed} --sequences 1 "
                f"--calls {calls} --dtypes {args.dtypes}")
    start = time.monotonic()
    for seed in range(args.seed, args.seed + args.sequences):
        run_sequence(comm, seed, args.calls, command)
    WORLD.Barrier()
    comm.close()
    if RANK == 0:
        print(f"{args.sequences} sequences x {args.calls} calls on {BACKEND}, {P} ranks in "
              f"{time.monotonic() - start:.1f} s", flush=True)
        print(passed_line("property_cases"), flush=True)


if __name__ == "__main__":
    main()
