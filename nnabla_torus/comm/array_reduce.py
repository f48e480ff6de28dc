"""The body of ``all_reduce`` on a list of NdArrays: fused per wire dtype (``inplace``: per dtype),
nnabla's zeroing rule, ``division``, and the squared norms the noise scale needs.

In the fused path everything rides in the one buffer: after the data, one slot with this
rank's squared norm (unless the wire is float16) and one flag slot per array (1 where this
rank wrote it since ``zero()``), so the zeroing rule and the noise scale cost no message.
"""
import numpy as np

from .fused import get, pack, prescaled, put, unpack


def reduce_arrays(comm, layout, division, inplace, run, p, zeroing_rule=True):
    """Sum (``division``: average) the arrays of ``layout`` (:class:`.array_layout.Layout`)
    over the ``p`` ranks of ``run(buf)``."""
    if p == 1:  # nothing to exchange: the sum and the average are the input itself
        if comm.track_sqnorms:
            be = comm.backend
            local = sum(be.sqnorm(be.flat(a, write=False)) for a in layout.arrays)
            comm.sqnorms.local_mean += local
            comm.sqnorms.global_ += local
        return
    # inplace=True (nnabla: each array reduced in its own storage) gives the same result
    # through the fused buffer, one exchange per dtype; each array keeps its own dtype.
    for part in layout.parts(inplace, comm.wire_fp16):
        _fused(comm, part, division, run, p, zeroing_rule)


def _fused(comm, part, division, run, p, zeroing_rule):
    """The arrays of ``part`` (all sent as ``part.wire``) in one fused buffer."""
    be, track, wire, n = comm.backend, comm.track_sqnorms, part.wire, part.n
    # A float16 slot would round the sqnorm to 11 bits and overflow above 65504.
    inline = track and wire != np.float16
    # One slot per array after the data: 1 where this rank wrote it since zero(); the
    # all-reduced slot is 0 exactly when the array is zeroing on every rank.
    flags = len(part.arrays) if zeroing_rule else 0
    zeroing = [a.zeroing for a in part.arrays] if flags else []  # before packing casts them
    buf = comm.workspace.buffer(be, wire, be.padded_length(n + inline + flags, wire))
    pack(be, part, buf)
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
    unpack(be, buf, part)
    if flags:
        modified = get(be, be.sub(buf, n + inline, n + inline + flags))
        for i in np.flatnonzero(modified == 0):
            part.arrays[i].zero()   # all zeros and no rank wrote it: zeroing again, as in nnabla


def _sum_scalar(comm, value, run):
    """Sum one float over the ranks with ``run`` in a float32 buffer; returns the sum."""
    total = comm.workspace.buffer(comm.backend, np.float32, 1)
    total.fill(value)
    run(total)
    return comm.backend.read(total, 0)
