"""The fake NCCL communicator behaves as nnabla-ext-cuda's (argument forms, groups, results).

    mpirun -np 4 python tests/mpi/progs/check_fake_nccl.py  # "PASSED fake-nccl api rank r" per rank

Needs 4 ranks. Values are small integers, so sums are exact in float32 and float16; averages
over 4 ranks are exact, and over 3 ranks equal NCCL's ncclAvg (inputs times T(1/3), summed in
group order). Any failure aborts the job with the traceback.
"""
import sys
import traceback

import numpy as np
from mpi4py import MPI

import nnabla as nn
from nnabla.ext_utils import get_extension_context
from nnabla_torus.testing.fake_nccl import FakeMultiProcessDataParallelCommunicator, synchronize
from tests.mpirun import passed_line

RANK, P = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def data(shape, rank, k=0, dtype=np.float32):
    """Rank ``rank``'s k-th integer-valued array: (index + 3k) % 11 - 5, times rank + 1."""
    base = (np.arange(int(np.prod(shape))) + 3 * k) % 11 - 5
    return (base * (rank + 1)).reshape(shape).astype(dtype)


def nd(array):
    return nn.NdArray.from_numpy_array(np.array(array))


def raises(kind, fn, text=""):
    """Call ``fn``; it must raise ``kind`` with ``text`` in its message."""
    try:
        fn()
    except kind as e:
        assert text in str(e), (text, str(e))
        return
    raise AssertionError(f"expected {kind.__name__} ({text!r})")


def check_setup(comm):
    raises(RuntimeError, lambda: comm.rank, "init")
    comm.init()
    assert (comm.name, comm.size, comm.rank, comm.local_rank) == (
        "MultiProcessDataParallelCommunicatorNccl", P, RANK, RANK)
    raises(RuntimeError, comm.init, "already initialized")
    assert comm.list_groups() == {"world": list(range(P))}
    assert comm.new_group(("pair", np.array([1, 0]))) == "pair"  # every rank registers it
    assert comm.new_group(("trio", [0, 1, 2])) == "trio"
    assert comm.find_group("pair") == [1, 0] and comm.find_group("nosuch") == []
    raises(RuntimeError, lambda: comm.new_group(("pair", [0])), "already exists")
    raises(RuntimeError, lambda: comm.new_group(("big", [0, P])), "less than the size")
    raises(RuntimeError, lambda: comm.new_group(("neg", [-1, 0])), "greater than or equal")
    raises(TypeError, lambda: comm.all_reduce(nd([1.0]), group=0))


def check_all_reduce(comm):
    shapes = [(17,), (3, 5), (1,), (0,)]
    for division in (False, True):
        for inplace in (False, True):
            xs = [nd(data(s, RANK, k)) for k, s in enumerate(shapes)]
            comm.all_reduce(xs, division=division, inplace=inplace)
            synchronize()
            for k, (x, s) in enumerate(zip(xs, shapes)):
                want = sum(data(s, r, k) for r in range(P)) / (P if division else 1)
                assert x.dtype == np.float32 and np.array_equal(x.data, want), \
                    (division, inplace, k)
    x = nd(data((5,), RANK))
    comm.all_reduce(x)  # a single NdArray, not a list
    assert np.array_equal(x.data, data((5,), RANK)), "enqueued: no result before synchronize()"
    synchronize()
    assert np.array_equal(x.data, sum(data((5,), r) for r in range(P)))


def check_types_and_zeroing(comm, half):
    x = nd(data((6,), RANK, dtype=np.float16))
    comm.all_reduce([x])  # the float communicator casts the array in place
    synchronize()
    assert x.dtype == np.float32 and np.array_equal(x.data, sum(data((6,), r) for r in range(P)))
    y = nd(data((6,), RANK))
    half.all_reduce([y], inplace=True)
    synchronize()
    assert y.dtype == np.float16 and np.array_equal(y.data, sum(data((6,), r) for r in range(P)))
    skipped, mixed = nn.NdArray((4,)), nd(np.ones(4, np.float32))
    skipped.zero()
    if RANK == 0:
        mixed.zero()
    comm.all_reduce([skipped, mixed], inplace=True)
    synchronize()
    assert skipped.zeroing, "zeroing on every rank: nnabla skips it"
    assert np.array_equal(mixed.data, np.full(4, P - 1.0)), mixed.data


def check_scatter_gather(comm):
    ins = [nd(data((3, 4), RANK, k)) for k in range(P)]
    for division in (False, True):
        out = nn.NdArray((3, 4))
        comm.reduce_scatter(ins, out, division=division)
        synchronize()
        want = sum(data((3, 4), r, RANK) for r in range(P)) / (P if division else 1)
        assert np.array_equal(out.data, want), division
    outs = [nn.NdArray((2, 3)) for _ in range(P)]
    comm.all_gather(nd(data((2, 3), RANK)), outs)
    synchronize()
    for r, o in enumerate(outs):
        assert np.array_equal(o.data, data((2, 3), r)), r
    raises(ValueError, lambda: comm.reduce_scatter(ins[:-1], nn.NdArray((3, 4))), "read past")
    raises(ValueError, lambda: comm.all_gather(nd(data((2, 3), RANK)), outs[:-1]), "write past")


def check_groups(comm):
    pair, trio = [1, 0], [0, 1, 2]
    if RANK in pair:
        for inplace in (False, True):
            xs = [nd(data((7,), RANK)), nd(data((2, 2), RANK, 1))]
            comm.bcast(xs, 0, inplace=inplace, group="pair")  # src: position 0 = world rank 1
            synchronize()
            assert np.array_equal(xs[0].data, data((7,), 1)), inplace
            assert np.array_equal(xs[1].data, data((2, 2), 1, 1)), inplace
        raises(RuntimeError, lambda: comm.bcast(nd([1.0]), 2, group="pair"), "invalid root")
    else:
        raises(RuntimeError, lambda: comm.all_reduce(nd([1.0]), group="pair"),
               f"self (rank={RANK}) is not included in pair.")
    if RANK in trio:
        inputs = [np.arange(1, 40, dtype=np.float32) + r * r for r in trio]
        x = nd(inputs[RANK])
        comm.all_reduce(x, division=True, group="trio")
        synchronize()
        third = np.float32(1.0 / 3)
        want = inputs[0] * third + inputs[1] * third + inputs[2] * third  # ncclAvg
        assert not np.array_equal(want, sum(inputs) / np.float32(3)), "inputs must tell apart"
        assert np.array_equal(x.data, want), (x.data, want)
    raises(RuntimeError, lambda: comm.all_reduce(nd([1.0]), group="nosuch"), "not included")
    assert comm.list_groups()["nosuch"] == []  # nnabla's groups_[name] registers it


def check_reduce(comm):
    for inplace in (False, True):
        x = nd(data((9,), RANK))
        comm.reduce(x, 2, inplace=inplace)
        synchronize()
        want = sum(data((9,), r) for r in range(P)) if RANK == 2 else data((9,), RANK)
        assert np.array_equal(x.data, want), inplace


def check_callback(comm):
    """all_reduce_callback: nnabla's packing (cast to T, times scale_grad, packs of pack_size,
    zeroing skipped), run by backward through nnabla_torus.comm.backward_callback; sums land by the
    end of backward."""
    import nnabla.functions as F
    from nnabla_torus.comm import backward_callback
    assert backward_callback.install()
    x = nn.Variable.from_numpy_array(data((3, 4), RANK))
    ws = [nn.Variable.from_numpy_array(np.ones((3, 4), np.float32), need_grad=True)
          for _ in range(3)]
    unused = nn.Variable((5,), need_grad=True)
    loss = F.sum(x * ws[0]) + F.sum(x * ws[1]) + F.sum(x * ws[2] * 2)
    loss.forward()
    for w in ws + [unused]:
        w.grad.zero()
    callback = comm.all_reduce_callback([w.grad for w in ws + [unused]], 5, scale_grad=0.5)
    loss.backward(communicator_callbacks=callback)
    total = sum(data((3, 4), r) for r in range(P)) * 0.5
    for w, factor in zip(ws, (1, 1, 2)):
        assert np.array_equal(w.g, total * factor), (w.g, total * factor)
    assert unused.grad.zeroing, "a gradient zero()-ed on every rank stays zeroing"


def run_or_abort(body, label):
    """Run ``body()``; print "PASSED <label> rank r", or the traceback and abort the whole job."""
    try:
        body()
    except BaseException:
        print(f"FAILED on rank {RANK}", flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    print(passed_line(f"{label} rank {RANK}"), flush=True)


def main():
    comm = FakeMultiProcessDataParallelCommunicator(get_extension_context("cpu"))
    half = FakeMultiProcessDataParallelCommunicator(
        get_extension_context("cpu", type_config="half"))
    check_setup(comm)
    half.init()
    check_all_reduce(comm)
    check_types_and_zeroing(comm, half)
    check_scatter_gather(comm)
    check_groups(comm)
    check_reduce(comm)
    check_callback(comm)
    comm.barrier()


if __name__ == "__main__":
    if P != 4:
        raise SystemExit("run with mpirun -np 4")
    run_or_abort(main, "fake-nccl api")
