"""The body of ``all_reduce`` on a list of NdArrays: fused per wire dtype (``inplace``: per dtype),
nnabla's zeroing rule, ``division``, and the squared norms the noise scale needs.

In the fused path everything rides in the one buffer: after the data, one slot with this
rank's squared norm (unless the wire is float16) and one flag slot per array (1 where this
rank wrote it since ``zero()``), so the zeroing rule and the noise scale cost no message. The
norms are returned, not kept: the caller adds them up (``sqnorms.SquaredNorms.add``).
"""
import numpy as np

from .fused import get, pack, prescaled, put, unpack
from .sqnorms import call_norms


def reduce_arrays(backend, workspace, layout, sum_buffer, p, *, division=False, inplace=False,
                  wire_fp16=False, sqnorms=False, zeroing_rule=True):
    """Sum (``division``: average) the arrays of ``layout`` (:class:`.array_layout.Layout`)
    over the ``p`` ranks that ``sum_buffer(buf)`` sums a buffer of ``backend`` over, through
    the fused buffers of ``workspace`` (:class:`.fused.Workspace`); ``wire_fp16``: float32
    parts travel as float16. Returns the call's noise-scale norms ``(local_mean, global_)``
    (:mod:`.sqnorms`) when ``sqnorms``, else ``(0.0, 0.0)``."""
    if p == 1:  # nothing to exchange: the sum and the average are the input itself
        if not sqnorms:
            return 0.0, 0.0
        local = sum(backend.sqnorm(backend.buffer_of(a, write=False)) for a in layout.arrays)
        return call_norms(local, local, 1, averaged=True)
    # inplace=True (nnabla: each array reduced in its own storage) gives the same result
    # through the fused buffer, one exchange per dtype; each array keeps its own dtype.
    local_mean, global_ = 0.0, 0.0
    for part in layout.parts(inplace, wire_fp16):
        norms = _fused(backend, workspace, part, sum_buffer, p, division, sqnorms, zeroing_rule)
        local_mean, global_ = local_mean + norms[0], global_ + norms[1]
    return local_mean, global_


def _fused(be, workspace, part, sum_buffer, p, division, track, zeroing_rule):
    """The arrays of ``part`` (all sent as ``part.wire``) in one fused buffer; returns their
    noise-scale norms ((0, 0) unless ``track``)."""
    wire, n = part.wire, part.n
    # A float16 slot would round the sqnorm to 11 bits and overflow above 65504.
    inline = track and wire != np.float16
    # One slot per array after the data: 1 where this rank wrote it since zero(); the
    # all-reduced slot is 0 exactly when the array is zeroing on every rank.
    flags = len(part.arrays) if zeroing_rule else 0
    zeroing = [a.zeroing for a in part.arrays] if flags else []  # before packing casts them
    buf = workspace.buffer(be, wire, be.padded_length(n + inline + flags, wire))
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
    sum_buffer(buf)
    norms = (0.0, 0.0)
    if track:
        total = be.read(buf, n) if inline else _sum_scalar(be, workspace, local, sum_buffer)
        norms = call_norms(total, be.sqnorm(data), p, averaged=before)
    if division and not before:
        be.scale(data, 1.0 / p)
    unpack(be, buf, part)
    if flags:
        modified = get(be, be.sub(buf, n + inline, n + inline + flags))
        for i in np.flatnonzero(modified == 0):
            part.arrays[i].zero()   # all zeros and no rank wrote it: zeroing again, as in nnabla
    return norms


def _sum_scalar(backend, workspace, value, sum_buffer):
    """Sum one float over the ranks with ``sum_buffer`` in a float32 buffer; returns the sum."""
    total = workspace.buffer(backend, np.float32, 1)
    total.fill(value)
    sum_buffer(total)
    return backend.read(total, 0)
