"""The fake GPU of the fake NCCL communicator: device placement, the CUDA kernels' rules for
a few nnabla functions, enqueued work completed only by a host sync, and a record of streams.

It stands in for ``nnabla_ext.cuda`` (``set_device``, ``synchronize``, ``Event``) in a CPU
run; what it mimics and what it cannot: docs/gpu.md ("The fake NCCL communicator").
"""
import time

import numpy as np
from mpi4py import MPI

TYPE_CONFIGS = {"float": np.float32, "half": np.float16}
CUDA_LIKE = ("identity", "mul_scalar", "pow_scalar", "sum")  # nnabla functions the rules wrap
_device = [None]  # this process's fake GPU (set_device), None before
_places = {}  # address -> (bytes, device) of arrays placed on a fake device
_pending = []  # enqueued collectives: (requests, finish), completed by synchronize()
# Stream model: the CUDA stream each collective and kernel is enqueued on, and the host syncs,
# in order, as (stream, op, reads): ``reads`` the host addresses of the arrays it reads (lines
# in ext multi_process_data_parallel_communicator.cu: see NCCLBackend.overlaps_backward).
# ("legacy-default", op): reduce_scatter / all_gather, and all_reduce / reduce / bcast unless
# in place on a list (stream 0 or nullptr); ("blocking", op): those in place on a list (streams
# that wait for stream 0, see stream_kind); ("non-blocking", op): all_reduce_callback's
# packs (cudaStreamNonBlocking, ordered by events), reads = the gradients packed;
# ("legacy-default", "F.<name>"): the CUDA_LIKE functions, kernels on the compute stream, reads
# = their NdArray inputs; ("host-sync", what): synchronize() and Event.synchronize(). Tests
# read and clear it.
stream_log = []


def _extent(ndarray):
    """(address, bytes) of ``ndarray``'s host memory, None when it holds no data yet."""
    try:
        data = ndarray.data if ndarray.size else None
    except RuntimeError:
        return None
    return None if data is None else (data.__array_interface__["data"][0], data.nbytes)


def place(ndarray, device):
    """Tag ``ndarray`` (a whole array) as living on fake GPU ``device``."""
    extent = _extent(ndarray)
    if extent:
        _places[extent[0]] = (extent[1], int(device))


def device_of(ndarray):
    """(device or None for host memory, whether ``ndarray`` is a narrowed part of it)."""
    extent = _extent(ndarray)
    if extent is None:
        return None, False
    address, nbytes = extent
    for start, (size, device) in _places.items():
        if start <= address and address + nbytes <= start + size:
            return device, (start, size) != (address, nbytes)
    return None, False


def check_device(ndarray, device, what):
    """Refuse a narrowed ``ndarray`` of another device (nnabla cannot cast a child array across
    devices); a whole array moves to ``device``, as nnabla's cast moves it."""
    where, narrowed = device_of(ndarray)
    if where is None or where == device:
        return
    if narrowed:
        raise RuntimeError(f"runtime error in {what} (fake device rule): cast of child-arrays is "
                           f"not permitted (a narrowed array on fake GPU {where} used on fake "
                           f"GPU {device})")
    place(ndarray, device)


def _like_cuda(name, function):
    """``function`` with the CUDA kernel's rules: device of the context, outputs cast to T."""
    def run(*args, **kwargs):
        import nnabla as nn
        ctx = nn.get_current_context()
        dtype = TYPE_CONFIGS.get(ctx.backend[0].split(":")[-1], np.float32)
        if not ctx.array_class:  # nnabla's bare default context names no array class
            ctx = nn.Context(list(ctx.backend), "CpuCachedArray", ctx.device_id)
        device = int(ctx.device_id or 0)
        for a in list(args) + list(kwargs.get("outputs") or []):
            if isinstance(a, nn.NdArray):
                check_device(a, device, f"F.{name}")
        for out in kwargs.get("outputs") or []:
            out.cast(dtype, ctx)  # raises nnabla's own error for a narrowed view of another dtype
        reads = [_extent(a) for a in args if isinstance(a, nn.NdArray)]
        stream_log.append(("legacy-default", f"F.{name}", tuple(e[0] for e in reads if e)))
        return function(*args, **kwargs)
    run.fake_cuda, run.original = True, function
    return run


def current_device():
    """This process's fake GPU (``set_device``), None before."""
    return _device[0]


def set_device(device_id):
    """Make this process's fake GPU ``device_id`` and give nnabla's functions the CUDA rules."""
    import nnabla.functions as F
    _device[0] = int(device_id)
    for name in CUDA_LIKE:
        function = getattr(F, name)
        if not getattr(function, "fake_cuda", False):
            setattr(F, name, _like_cuda(name, function))


def reset():
    """Give nnabla's functions back, forget placements and enqueued work (tests)."""
    import nnabla.functions as F
    for name in CUDA_LIKE:
        function = getattr(F, name)
        setattr(F, name, getattr(function, "original", function))
    _device[0] = None
    _places.clear()
    _pending.clear()


def synchronize(device_id="0"):
    """Complete every enqueued collective (cudaDeviceSynchronize); spins while a peer is missing."""
    stream_log.append(("host-sync", "synchronize", ()))
    complete()


def complete():
    """Finish the enqueued collectives in order, waiting for their peers."""
    while _pending:
        requests, finish = _pending.pop(0)
        try:
            while not MPI.Request.Testall(requests):
                time.sleep(1e-4)
        except MPI.Exception:  # a dead peer: NCCL's kernels would spin, so does the fake
            while True:
                time.sleep(1.0)
        finish()


class Event:
    """``nnabla_ext.cuda.init.Event`` on the fake GPU: ``record()`` then ``synchronize()`` waits
    for the work enqueued so far (here: all of it), with the GIL released as nnabla's does."""

    def __init__(self, device_id):
        self.device_id = int(device_id)

    def record(self):
        pass

    def synchronize(self):
        stream_log.append(("host-sync", "event", ()))
        complete()


def stream_kind(data, inplace):
    """The stream nnabla enqueues all_reduce / reduce / bcast on: an in-place list round-robins
    over streams from plain cudaStreamCreate (ext .cu 434, 747), anything else passes nullptr,
    the legacy default stream (754, 774, 874)."""
    return "blocking" if inplace and isinstance(data, list) else "legacy-default"


def enqueue(requests, finish, stream, op, reads=()):
    """Record ``op`` on ``stream`` (reading the arrays at host addresses ``reads``);
    ``finish()`` runs once ``requests`` complete, at a host sync."""
    stream_log.append((stream, op, tuple(reads)))
    _pending.append((requests, finish))
