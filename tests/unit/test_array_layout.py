"""array_layout: a list's layout is reused while its arrays keep their dtypes and shapes, rebuilt
when they change, and the host views follow the storage nnabla gives each array (no MPI)."""
import pickle

import numpy as np
import pytest

import nnabla as nn
from mpi4py import MPI
from nnabla_ext.cpu import context

from nnabla_torus.comm.array_layout import KEPT_LISTS, Layouts, Signature, wire_dtypes

F16, F32, I32 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.int32)


def arrays_of(shapes, dtype=np.float32):
    return [nn.NdArray.from_numpy_array(np.arange(int(np.prod(s)), dtype=dtype).reshape(s) + k)
            for k, s in enumerate(shapes)]


def pack_numpy(part, cpu):
    """What fused.pack copies: the host views one after another."""
    return np.concatenate(part.host_views(cpu)) if part.arrays else np.zeros(0)


def test_the_same_list_reuses_its_layout_until_a_dtype_or_shape_changes():
    layouts, arrays = Layouts(), arrays_of([(3,), (2, 5), (1,)])
    first = layouts.of(arrays)
    assert layouts.of(list(arrays)) is first          # another list object, the same arrays
    assert first.signature == (("float32", (3,)), ("float32", (2, 5)), ("float32", (1,)))
    arrays[1].cast(np.float16)
    recast = layouts.of(arrays)
    assert recast is not first and recast.signature[1] == ("float16", (2, 5))
    v = nn.Variable((2, 6))
    listed = [v.data, arrays[0]]
    before = layouts.of(listed)
    v.reset_shape((3, 4), force=False)                # same size: the signature must change
    after = layouts.of(listed)
    assert after is not before and after.signature[0] == ("float32", (3, 4))
    assert layouts.of(arrays[::-1]) is not recast     # reordered: another list


def test_only_the_last_lists_are_kept():
    layouts = Layouts()
    lists = [arrays_of([(k + 1,)]) for k in range(KEPT_LISTS + 1)]
    entries = [layouts.of(a) for a in lists]
    assert layouts.of(lists[-1]) is entries[-1]
    assert layouts.of(lists[0]) is not entries[0]     # the oldest was dropped


def test_signature_repr_and_pickle_are_those_of_the_tuple():
    sig = Signature([("float32", (1,)), ("int32", (2, 3))])
    plain = (("float32", (1,)), ("int32", (2, 3)))
    assert repr(sig) == repr(plain) and repr(("op", sig)) == repr(("op", plain))
    assert pickle.loads(pickle.dumps(sig)) == plain
    assert repr(Signature([("float16", (0,))])) == repr((("float16", (0,)),))


@pytest.mark.parametrize("dtypes, fp16, want", [
    ([F32, F32], False, [F32, F32]),
    ([F32, F32], True, [F16, F16]),
    ([F16, F32, I32], False, [F16, F16, I32]),       # mixed float list: one float16 buffer
    ([I32, F16], True, [I32, F16]),
])
def test_wire_dtypes(dtypes, fp16, want):
    assert wire_dtypes(dtypes, fp16) == want


def test_parts_group_by_wire_dtype_with_offsets():
    arrays = arrays_of([(3,), (0,), (2, 2)]) + arrays_of([(5,)], np.int32)
    layout = Layouts().of(arrays)
    fused = layout.parts(inplace=False)
    assert [p.wire for p in fused] == [F32, I32]
    assert fused[0].offsets == [0, 3, 3, 7] and fused[0].n == 7 and fused[1].n == 5
    assert [p.wire for p in layout.parts(inplace=False, wire_fp16=True)] == [F16, I32]
    assert layout.whole(F32).n == 12


def test_host_views_follow_zero_fill_clear_and_casts():
    cpu = context()
    arrays = arrays_of([(3,), (4,), (2,), (5,)])
    part = Layouts().of(arrays).parts(inplace=True)[0]
    want = [a.data.reshape(-1).copy() for a in arrays]
    np.testing.assert_array_equal(pack_numpy(part, cpu), np.concatenate(want))
    arrays[0].zero()
    arrays[1].fill(7.0)
    arrays[2].cast(np.float16)
    arrays[2].cast(np.float32)        # new float32 storage, the old one dropped
    arrays[3].clear()
    arrays[3].data = np.full(5, 9, np.float32)
    got = pack_numpy(part, cpu)
    np.testing.assert_array_equal(got, np.concatenate([np.zeros(3), np.full(4, 7.0),
                                                       want[2], np.full(5, 9)]))
    for f, value in zip(part.flats, (1, 2, 3, 4)):    # writes through the views reach nnabla
        f[...] = value
    assert [float(a.data.reshape(-1)[0]) for a in arrays] == [1, 2, 3, 4]
    assert not arrays[0].zeroing


def test_slices_follow_the_buffer():
    part = Layouts().of(arrays_of([(2,), (3,)])).parts(inplace=True)[0]
    a, b = np.arange(5.0), np.arange(5.0) + 10
    assert [s.tolist() for s in part.slices(a)] == [[0, 1], [2, 3, 4]]
    assert part.slices(a) is part.slices(a)
    assert [s.tolist() for s in part.slices(b)] == [[10, 11], [12, 13, 14]]


@pytest.mark.parametrize("division", [False, True])
def test_reduce_arrays_needs_no_communicator_and_returns_the_noise_scale_norms(division):
    """array_reduce takes a backend, a workspace and a summing function: three ranks with the
    same input, summed by tripling the fused buffer, give 3x (x when averaged), a zero()-ed
    array still zeroing, and the norms (|x|^2, |x|^2) for the caller to add."""
    from nnabla_torus.comm.array_reduce import reduce_arrays
    from nnabla_torus.comm.backends.mpi import MPIBackend
    from nnabla_torus.comm.fused import Workspace
    arrays = arrays_of([(7,), (3,), (2,)])
    arrays[2].zero()
    layout, inputs = Layouts().of(arrays), [a.data.copy() for a in arrays[:2]]
    backend = MPIBackend(MPI.COMM_SELF, timeout=60)
    norms = reduce_arrays(backend, Workspace(), layout, lambda buf: np.multiply(buf, 3, out=buf),
                          3, division=division, sqnorms=True)
    for array, x in zip(arrays, inputs):
        assert array.data.tolist() == (x if division else 3 * x).tolist()
    assert arrays[2].zeroing
    sqnorm = float(sum((x.astype(np.float64) ** 2).sum() for x in inputs))
    assert norms == (sqnorm, sqnorm)
