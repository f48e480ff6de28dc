"""The body of ``all_reduce`` on a list of NdArrays: fused per wire dtype (``inplace``: per dtype),
nnabla's zeroing rule, ``division``, and the squared norms the noise scale needs.

In the fused path everything rides in the one buffer: after the data, one slot with this
rank's squared norm (unless the wire is float16) and one flag slot per array (1 where this
rank wrote it since ``zero()``), so the zeroing rule and the noise scale cost no message.
"""
import numpy as np

from .fused import dtype_of, get, pack, prescaled, put, unpack, wire_groups


def reduce_arrays(comm, arrays, division, inplace, run, p, zeroing_rule=True):
    """Sum (``division``: average) ``arrays`` over the ``p`` ranks of ``run(buf)``."""
    if p == 1:  # nothing to exchange: the sum and the average are the input itself
        if comm.track_sqnorms:
            be = comm.backend
            local = sum(be.sqnorm(be.flat(a, write=False)) for a in arrays)
            comm.sqnorms.local_mean += local
            comm.sqnorms.global_ += local
        return
    # inplace=True (nnabla: each array reduced in its own storage) gives the same result
    # through the fused buffer, one exchange per dtype; each array keeps its own dtype.
    groups = _by_dtype(arrays) if inplace else wire_groups(arrays, comm.wire_fp16)
    for wire, same in groups:
        _fused(comm, wire, same, division, run, p, zeroing_rule)


def _by_dtype(arrays):
    """[(dtype, arrays)] in first-seen order."""
    groups = {}
    for a in arrays:
        groups.setdefault(dtype_of(a), []).append(a)
    return list(groups.items())


def _fused(comm, wire, same, division, run, p, zeroing_rule):
    """The arrays ``same`` (all sent as ``wire``) in one fused buffer."""
    be, track = comm.backend, comm.track_sqnorms
    n = sum(a.size for a in same)
    # A float16 slot would round the sqnorm to 11 bits and overflow above 65504.
    inline = track and np.dtype(wire) != np.float16
    # One slot per array after the data: 1 where this rank wrote it since zero(); the
    # all-reduced slot is 0 exactly when the array is zeroing on every rank.
    flags = len(same) if zeroing_rule else 0
    zeroing = [a.zeroing for a in same] if flags else []  # before packing casts them
    buf = comm.workspace.buffer(be, wire, be.padded_length(n + inline + flags, wire))
    flats = pack(be, same, buf)
    data = be.sub(buf, 0, n)
    before = division and prescaled(wire)
    if track:
        local = be.sqnorm(data)
        if inline:
            be.sub(buf, n, n + 1).fill(local)
    if flags:
        put(be, be.sub(buf, n + inline, n + inline + flags), np.logical_not(zeroing).astype(wire))
    if before:
        be.scale(data, 1.0 / p)
    run(buf)
    if track:
        total = be.read(buf, n) if inline else _sum_scalar(comm, local, run)
        comm.sqnorms.local_mean += total / p
        comm.sqnorms.global_ += be.sqnorm(data) / (1 if before else p ** 2)
    if division and not before:
        be.scale(data, 1.0 / p)
    unpack(be, buf, same, flats)
    if flags:
        modified = get(be, be.sub(buf, n + inline, n + inline + flags))
        for a, m in zip(same, modified):
            if not m:
                a.zero()   # all zeros and no rank wrote it: zeroing again, as in nnabla


def _sum_scalar(comm, value, run):
    """Sum one float over the ranks with ``run`` in a float32 buffer; returns the sum."""
    total = comm.workspace.buffer(comm.backend, np.float32, 1)
    total.fill(value)
    run(total)
    return comm.backend.read(total, 0)
