"""nnabla's collectives besides ``all_reduce``: ``bcast``, ``reduce``, ``all_gather`` and
``reduce_scatter`` over a group, each a checked call (:mod:`.guarded_calls`) on the fused
buffer (:mod:`.fused`). The user-facing docstrings are the communicator's methods.
"""
import numpy as np

from .array_layout import dtype_of
from .fused import as_list, pack, unpack
from .guarded_calls import collective
from .rendezvous import AllGatherCall, BcastCall, ReduceCall, ReduceScatterCall


def bcast(comm, data, src, inplace, group):
    """The body of ``TorusCommunicator.bcast``."""
    arrays = as_list(data)
    grp = comm._group(group)
    if not 0 <= src < grp.size:
        raise ValueError(f"bcast source {src} is not a position in group {group!r} of "
                         f"{grp.size} ranks {grp.ranks}; use 0..{grp.size - 1}")
    root, be = src, comm.backend
    src = grp.ranks[root]  # the world rank that sends
    layout = comm.layouts.of(arrays)
    sig = BcastCall("bcast", layout.signature, root, bool(inplace))

    def body():
        if inplace:
            for a in arrays:
                be.bcast(grp, be.buffer_of(a), root, f"bcast from rank {src}")
            return
        for part in layout.parts(inplace=True):   # one buffer per dtype
            buf = comm.workspace.buffer(be, part.wire, part.n)
            if comm.rank == src:
                pack(be, part, buf)
            be.bcast(grp, buf, root, f"bcast from rank {src}")
            if comm.rank != src:
                unpack(be, buf, part, packed=False)
    collective(comm, grp, sig, f"bcast (group {group!r})", body)


def reduce(comm, data, dst, division, inplace, group):
    """The body of ``TorusCommunicator.reduce``."""
    arrays = as_list(data)
    grp = comm._group(group)
    if isinstance(dst, bool) or not isinstance(dst, (int, np.integer)) \
            or not 0 <= dst < grp.size:
        raise ValueError(f"reduce destination {dst!r} is not a position in group {group!r} "
                         f"of {grp.size} ranks {grp.ranks}; use 0..{grp.size - 1}")
    sum_buffer, algorithm = comm._buffer_sum(group, grp)
    be, dst = comm.backend, int(dst)
    layout = comm.layouts.of(arrays)
    sig = ReduceCall("reduce", layout.signature, dst, bool(division), bool(inplace), algorithm,
                     str(comm.grid) if group == "world" else None)

    def body():
        if grp.size == 1:
            return
        for part in layout.parts(inplace=True):   # one buffer per dtype
            n = part.n
            buf = comm.workspace.buffer(be, part.wire, be.padded_length(n, part.wire))
            pack(be, part, buf)
            sum_buffer(buf)
            if grp.rank == dst:
                if division:
                    be.scale(be.sub(buf, 0, n), 1.0 / grp.size)
                unpack(be, buf, part)
    collective(comm, grp, sig, f"reduce to {dst} ({algorithm}, group {group!r})", body,
               fold=True)


def all_gather(comm, ndarray, ndarray_list, group):
    """The body of ``TorusCommunicator.all_gather``."""
    grp = comm._group(group)
    outs = as_list(ndarray_list)
    be, n = comm.backend, ndarray.size
    # The list's shapes join the cross-rank check, so a wrong list fails on every rank.
    sig = AllGatherCall("all_gather", comm.layouts.of([ndarray]).signature,
                        tuple(tuple(o.shape) for o in outs))

    def body():
        if len(outs) != grp.size or any(tuple(o.shape) != tuple(ndarray.shape) for o in outs):
            raise ValueError(f"all_gather needs {grp.size} arrays of shape "
                             f"{tuple(ndarray.shape)} in ndarray_list, got "
                             f"{[tuple(o.shape) for o in outs]}")
        dtype = dtype_of(ndarray)
        buf = comm.workspace.buffer(be, dtype, n * grp.size)
        be.all_gather_into(grp, be.buffer_of(ndarray, write=False), buf,
                           f"all_gather ({group!r})")
        unpack(be, buf, comm.layouts.of(outs).whole(dtype), packed=False)
    collective(comm, grp, sig, f"all_gather (group {group!r})", body)


def reduce_scatter(comm, ndarray_list, ndarray, division, group):
    """The body of ``TorusCommunicator.reduce_scatter``."""
    grp = comm._group(group)
    ins = as_list(ndarray_list)
    be, n = comm.backend, ndarray.size
    layout = comm.layouts.of(ins)
    sig = ReduceScatterCall("reduce_scatter", layout.signature, tuple(ndarray.shape),
                            bool(division))

    def body():
        if len(ins) != grp.size or any(tuple(i.shape) != tuple(ndarray.shape) for i in ins):
            raise ValueError(f"reduce_scatter needs {grp.size} arrays of shape "
                             f"{tuple(ndarray.shape)} in ndarray_list, got "
                             f"{[tuple(i.shape) for i in ins]}")
        # The inputs' dtype: an output made with nn.NdArray(shape) has none until written.
        dtype = dtype_of(ins[0])
        buf = comm.workspace.buffer(be, dtype, n * grp.size)
        pack(be, layout.whole(dtype), buf)
        shard = be.reduce_scatter(grp, buf, f"reduce_scatter ({group!r})")
        if division:
            be.scale(shard, 1.0 / grp.size)
        be.copy(be.buffer_of(ndarray, write=True), shard)
    collective(comm, grp, sig, f"reduce_scatter (group {group!r})", body)
