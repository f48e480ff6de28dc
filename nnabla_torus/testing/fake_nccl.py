"""A fake of nnabla-ext-cuda's multi-process NCCL communicator: numpy on CPU, mpi4py between ranks.

``NNABLA_TORUS_BACKEND=fake-nccl`` runs the NCCL mapping (``comm/backends/nccl.py``) end to end
under mpirun on a machine without GPUs. Read from nnabla ``python/src/nnabla/communicator.pyx``
and nnabla-ext-cuda ``src/nbla/cuda/communicator/multi_process_data_parallel_communicator.cu``
(v1.39); what it mimics:

- the Python API and argument forms: ``name, size, rank, local_rank, init, barrier, abort,
  add_context_and_parameters, new_group, list_groups, find_group, all_reduce, reduce, bcast,
  all_gather, reduce_scatter``; ``data`` of type ``list`` is many arrays, anything else one
  NdArray; ``group`` is a str;
- one reduction type T per communicator, from the context's type_config (float: float32,
  half: float16); arrays are cast to T in place (a float16 array given to a float communicator
  becomes float32), so a narrowed array of another dtype raises, as in nnabla;
- groups: ``new_group`` registers the name on every caller and creates the communicator on
  the members only (collective over them); an existing name or ranks outside [0, size) raise;
  ``list_groups`` includes "world"; ``find_group`` of an unknown name is ``[]``; a collective
  on a group without the caller raises "self (rank=r) is not included in <group>." and, as in
  nnabla, leaves the unknown name registered with no ranks;
- ``bcast``'s ``src`` and ``reduce``'s ``dst`` are positions in the group (NCCL group ranks);
- ncclSum, and ncclAvg for ``division=True`` as NCCL does it for floating types: every input
  is multiplied by T(1/m) before the sum;
- ``reduce_scatter`` sends the concatenation of ``ndarray_list`` and member i receives the
  sum of chunk i (``ndarray.size`` elements); ``all_gather`` receives member i's ``ndarray``
  at offset i * ``ndarray.size`` of the concatenation of ``ndarray_list``; neither checks that
  the list holds m arrays;
- ``all_reduce`` skips arrays that are zeroing (``zero()`` not yet materialised) on every
  member; ``reduce`` with ``inplace=True`` uses the world whatever ``group`` is (as v1.39 does).

- host-side MPI (init, barrier, new_group, all_reduce's zeroing check) blocks as nnabla's
  does, and an MPI error becomes nnabla's RuntimeError "`MPI_...` failed by `...`";
- the device rules that a CPU run does not enforce by itself (``set_device``, ``place``):
  each array placed on a fake device is tagged with it (by address); ``F.identity``,
  ``F.mul_scalar``, ``F.pow_scalar`` and ``F.sum`` behave as their CUDA kernels: they run on
  the current context's device and cast their ``outputs`` to the context's type T first, so a
  narrowed view of another dtype raises nnabla's own "cast of child-arrays is not permitted",
  a whole array is silently converted (as on a GPU), and a narrowed view on another device
  raises; the communicator refuses narrowed arrays of another device likewise;
- asynchronous completion: every collective is enqueued and returns; results land only at
  ``synchronize(device_id)`` (nnabla_ext.cuda's ``cudaDeviceSynchronize``) or an ``Event``'s
  ``synchronize()``, and a collective a peer never joins spins there for ever, as NCCL kernels
  do (nothing here times out).

- streams, as a record only: ``stream_log`` lists the stream kind each collective is enqueued
  on (legacy default, blocking, non-blocking) and every host sync, for tests of overlap.

What it cannot mimic: CUDA stream semantics (a GPU's later kernels on the default stream see
results without a host synchronisation; here only ``synchronize`` delivers them), device memory,
NCCL's algorithms, protocols, timing and summation order (the fake sums in group order, the
same on every member); out-of-bounds reads and writes (where NCCL would run past a buffer, the
fake raises ValueError); the C++ type of ``all_reduce_callback``'s result (the fake's is a
Python object, which nnabla's backward runs only through
``nnabla_torus.comm.backward_callback.install()``) and the deprecated ``allreduce``.

Example (under ``mpirun -np 2``)::

    ctx = get_extension_context("cpu", type_config="float")
    comm = FakeMultiProcessDataParallelCommunicator(ctx)
    comm.init()
    comm.all_reduce([x.data for x in xs], division=True)
    synchronize()                                # the sums are in xs from here on
"""
import numbers
import socket
import time

import numpy as np
from mpi4py import MPI

TYPE_CONFIGS = {"float": np.float32, "half": np.float16}
CUDA_LIKE = ("identity", "mul_scalar", "pow_scalar", "sum")  # nnabla functions the rules wrap
_device = [None]  # this process's fake GPU (set_device), None before
_places = {}  # address -> (bytes, device) of arrays placed on a fake device
_pending = []  # enqueued collectives: (requests, finish), completed by synchronize()
# Stream model: the CUDA stream each collective is enqueued on, and the host syncs, in order
# (lines in ext multi_process_data_parallel_communicator.cu: see NCCLBackend.overlaps_backward).
# ("legacy-default", op): reduce_scatter / all_gather, and all_reduce / reduce / bcast unless
# in place on a list (stream 0 or nullptr); ("blocking", op): those in place on a list (streams
# that wait for stream 0, see _stream); ("non-blocking", op): all_reduce_callback's
# packs (cudaStreamNonBlocking, ordered by events); ("host-sync", what): synchronize() and
# Event.synchronize(). Tests read and clear it.
stream_log = []


# -- the fake device -------------------------------------------------------------------------
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
        return function(*args, **kwargs)
    run.fake_cuda, run.original = True, function
    return run


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
    stream_log.append(("host-sync", "synchronize"))
    _complete()


def _complete():
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
        stream_log.append(("host-sync", "event"))
        _complete()


def _stream(data, inplace):
    """The stream nnabla enqueues all_reduce / reduce / bcast on: an in-place list round-robins
    over streams from plain cudaStreamCreate (ext .cu 434, 747), anything else passes nullptr,
    the legacy default stream (754, 774, 874)."""
    return "blocking" if inplace and isinstance(data, list) else "legacy-default"


def _enqueue(requests, finish, stream, op):
    stream_log.append((stream, op))
    _pending.append((requests, finish))


def _nnabla_error(kind, message):
    """nnabla's NBLA_ERROR(error_code::kind, ...) reaches Python as RuntimeError."""
    return RuntimeError(f"{kind} error in FakeMultiProcessDataParallelCommunicator: {message}")


def _bytes(array):
    return [array.reshape(-1).view(np.uint8), MPI.BYTE]


def _host_mpi(call, text):
    """A blocking MPI call as nnabla makes it: an MPI error becomes nnabla's RuntimeError."""
    try:
        return call()
    except MPI.Exception as e:
        raise _nnabla_error("runtime", f"`{text}` failed by `{e.Get_error_string()}`.") from e


class FakeMultiProcessDataParallelCommunicator:
    """nnabla-ext-cuda's ``MultiProcessDataParallelCommunicatorNccl`` on CPU (see module doc)."""
    name = "MultiProcessDataParallelCommunicatorNccl"
    live = 0  # communicators alive in this process (each would hold NCCL communicators)

    def __init__(self, ctx):
        config = ctx.backend[0].split(":")[-1] if ctx.backend else ""
        if config not in TYPE_CONFIGS:
            raise _nnabla_error("value", f"Any of {list(ctx.backend)} could not be found "
                                         f"(the communicator exists for float and half)")
        self.ctx = ctx
        self.dtype = np.dtype(TYPE_CONFIGS[config])
        self._initialized = False
        self._groups, self._comms, self._params = {}, {}, []
        FakeMultiProcessDataParallelCommunicator.live += 1

    def __del__(self):
        FakeMultiProcessDataParallelCommunicator.live -= 1

    # -- set-up -----------------------------------------------------------------------------
    def _ready(self):
        if not self._initialized:
            raise _nnabla_error("value", "call init() first (nnabla leaves the communicator "
                                         "undefined before init)")

    @property
    def size(self):
        self._ready()
        return self._world.Get_size()

    @property
    def rank(self):
        self._ready()
        return self._world.Get_rank()

    @property
    def local_rank(self):
        self._ready()
        return self._local_rank

    def init(self):
        """Create the world group; local_rank = earlier ranks on this host (nnabla's rule)."""
        if self._initialized:
            raise _nnabla_error("value", "Communicator was already initialized.")
        self._world = MPI.COMM_WORLD.Dup()
        host = socket.gethostname().split(".")[0]
        hosts = _host_mpi(lambda: self._world.allgather(host), "MPI_Allgather(host_hashs)")
        self._local_rank = hosts[:self._world.Get_rank()].count(host)
        self.ctx.device_id = str(self._local_rank)  # as nnabla's ctx_.device_id = local_rank
        set_device(self._local_rank)  # and its cuda_set_device(device_id_)
        self._groups["world"] = list(range(self._world.Get_size()))
        self._comms["world"] = self._world
        self._initialized = True

    def add_context_and_parameters(self, ctx_param_dict):
        if type(ctx_param_dict) != tuple or len(ctx_param_dict) != 2:
            raise Exception("ctx_param_dict must be tuple of two elements")
        self._params.append(ctx_param_dict)

    def clear_context_parameters(self):
        self._params = []

    def barrier(self):
        _host_mpi(self._world.Barrier, "MPI_Barrier(MPI_COMM_WORLD)")

    def abort(self):
        self._world.Abort(-1)

    # -- groups -----------------------------------------------------------------------------
    def new_group(self, name_ranks):
        """Register ``(name, ranks)``; members create its communicator together. Returns name."""
        self._ready()
        name, ranks = name_ranks[0], [int(r) for r in name_ranks[1]]
        if name in self._groups:
            raise _nnabla_error("value", f"group_name = {name} already exists")
        if not ranks:
            raise ValueError(f"group {name!r} has no ranks (nnabla reads past an empty list)")
        if max(ranks) >= self.size:
            raise _nnabla_error("value", "Max value of the specified ranks should be less "
                                         f"than the size ({self.size}) of the communicator.")
        if min(ranks) < 0:
            raise _nnabla_error("value", "Min value of the specified ranks is greater than or "
                                         "equal to 0.")
        self._groups[name] = ranks
        if self.rank in ranks:
            comm = _host_mpi(lambda: self._world.Create_group(self._world.Get_group().Incl(ranks)),
                             "MPI_Comm_create_group")
            _host_mpi(comm.Barrier, "MPI_Barrier(group)")  # ncclCommInitRank
            self._comms[name] = comm
        return name

    def list_groups(self):
        return {name: list(ranks) for name, ranks in self._groups.items()}

    def find_group(self, group):
        return list(self._groups.get(group, []))

    def _member(self, group):
        """(communicator, our position, size) of ``group``; raise if we are not in it."""
        self._ready()
        if not isinstance(group, str):
            raise TypeError(f"expected str for group, got {type(group).__name__}")
        ranks = self._groups.setdefault(group, [])  # nnabla's groups_[group] inserts it
        if self.rank not in ranks:
            raise _nnabla_error("value", f"self (rank={self.rank}) is not included in {group}.")
        return self._comms[group], ranks.index(self.rank), len(ranks)

    # -- data -------------------------------------------------------------------------------
    @staticmethod
    def _arrays(data):
        import nnabla as nn
        arrays = data if type(data) == list else [data]
        for a in arrays:
            if not isinstance(a, nn.NdArray):
                raise TypeError(f"expected nnabla NdArray, got {type(a).__name__}")
        return arrays

    def _typed(self, ndarray):
        """``ndarray`` cast to T in place (as nnabla's ``cast(dtype, ctx_)``); a flat view."""
        if _device[0] is not None:
            check_device(ndarray, int(self.ctx.device_id), "MultiProcessDataParallelCommunicator")
        ndarray.cast(self.dtype, self.ctx)
        return ndarray.data.reshape(-1)

    def _pack(self, arrays):
        """(one packed copy of ``arrays`` in T, their flat views)."""
        flats = [self._typed(a) for a in arrays]
        return (np.concatenate(flats) if flats else np.empty(0, self.dtype)), flats

    @staticmethod
    def _unpack(large, flats):
        """Write ``large`` into ``flats``: numpy views of the arrays' memory, taken at enqueue,
        so that no (narrowed) NdArray is held until synchronize(), as a kernel holds none."""
        offset = 0
        for flat in flats:
            flat[...] = large[offset:offset + flat.size]
            offset += flat.size

    def _sum(self, parts, division):
        """Sum the rows of ``parts`` in order, in T; ncclAvg pre-multiplies by T(1/m)."""
        if division:
            parts = parts * self.dtype.type(1.0 / len(parts))
        total = parts[0].copy()
        for part in parts[1:]:
            total += part
        return total

    def _gather_sum(self, comm, flat, division, done, stream, op="all_reduce"):
        """Enqueue the sum of ``flat`` over ``comm``; ``done(total)`` runs at synchronize()."""
        parts = np.empty((comm.Get_size(), flat.size), self.dtype)
        request = comm.Iallgather(_bytes(np.ascontiguousarray(flat)), _bytes(parts))
        _enqueue([request], lambda: done(self._sum(parts, division)), stream, op)

    def _all_zeroing(self, arrays, comm):
        """Per array: zeroing on every member of ``comm`` (nnabla's mpi_check_all, blocking)."""
        if not arrays:
            return []
        flags = np.array([a.zeroing for a in arrays], dtype=np.int32)
        result = np.empty_like(flags)
        _host_mpi(lambda: comm.Allreduce(flags, result, op=MPI.LAND),
                  "MPI_Allreduce(&condition, &result, 1, MPI_C_BOOL, MPI_LAND, comm)")
        return result.astype(bool).tolist()

    # -- collectives (enqueued; results land at synchronize()) -------------------------------
    def all_reduce(self, data, division=False, inplace=False, group="world"):
        """ncclAllReduce of each array (``inplace``) or of one packed copy of them all."""
        comm, _, _ = self._member(group)
        arrays = self._arrays(data)
        zeroing = self._all_zeroing(arrays, comm)
        live = [a for a, z in zip(arrays, zeroing) if not z]
        batches = [[a] for a in live] if inplace else [live] if live else []
        for batch in batches:
            large, flats = self._pack(batch)
            self._gather_sum(comm, large, division, lambda total, f=flats: self._unpack(total, f),
                             _stream(data, inplace))

    def _rooted(self, group, root, data, inplace, op):
        """Member and root checks; (comm, position, batches of arrays NCCL moves)."""
        comm, me, m = self._member(group)
        if not isinstance(root, numbers.Real):  # Cython's `int src` converts numbers only
            raise TypeError(f"an integer is required (got {type(root).__name__})")
        root = int(root)
        if not 0 <= root < m:
            raise _nnabla_error("target_specific", f"{op}: invalid root {root} for a group of "
                                                   f"{m} (ncclInvalidArgument)")
        arrays = self._arrays(data)
        batches = [[a] for a in arrays] if inplace else [arrays]
        return comm, me, batches

    def reduce(self, data, dst, division=False, inplace=False, group="world"):
        """ncclReduce to group position ``dst``; other members' arrays are left as they were."""
        self._member(group)
        if inplace:
            group = "world"  # nnabla-ext-cuda v1.39 drops `group` on this path
        comm, me, batches = self._rooted(group, dst, data, inplace, "ncclReduce")
        for batch in batches:
            large, flats = self._pack(batch)
            flats = flats if me == dst else []
            self._gather_sum(comm, large, division, lambda total, f=flats: self._unpack(total, f),
                             _stream(data, inplace), "reduce")

    def bcast(self, data, src, inplace=False, group="world"):
        """ncclBcast from group position ``src``."""
        comm, _, batches = self._rooted(group, src, data, inplace, "ncclBcast")
        for batch in batches:
            large, flats = self._pack(batch)
            _enqueue([comm.Ibcast(_bytes(large), root=src)],
                     lambda large=large, flats=flats: self._unpack(large, flats),
                     _stream(data, inplace), "bcast")

    def all_gather(self, ndarray, ndarray_list, group="world"):
        """ncclAllGather: member i's ``ndarray`` lands at offset i * size of the list."""
        comm, _, m = self._member(group)
        large, flats = self._pack(self._arrays(list(ndarray_list)))
        send = np.ascontiguousarray(self._typed(ndarray), dtype=self.dtype)
        if large.size < m * send.size:
            raise ValueError(f"all_gather: ndarray_list holds {large.size} elements, fewer than "
                             f"{m} members x {send.size} (NCCL would write past it)")
        recv = large[:m * send.size]
        _enqueue([comm.Iallgather(_bytes(send), _bytes(recv))], lambda: self._unpack(large, flats),
                 "legacy-default", "all_gather")

    def reduce_scatter(self, ndarray_list, ndarray, division=False, group="world"):
        """ncclReduceScatter: member i receives the sum of chunk i of the packed list."""
        comm, _, m = self._member(group)
        large, _ = self._pack(self._arrays(list(ndarray_list)))
        count = ndarray.size
        if large.size < m * count:
            raise ValueError(f"reduce_scatter: ndarray_list holds {large.size} elements, fewer "
                             f"than {m} members x {count} (NCCL would read past it)")
        out = self._typed(ndarray)
        parts = np.empty((m, count), self.dtype)
        send = np.ascontiguousarray(large[:m * count])
        _enqueue([comm.Ialltoall(_bytes(send), _bytes(parts))],
                 lambda: self._unpack(self._sum(parts, division), [out]),
                 "legacy-default", "reduce_scatter")

    def all_reduce_callback(self, data, pack_size, division=False, group="world",
                            scale_grad=1, keep_dtype=False):
        """A Python stand-in for nnabla's C++ AllReduceCallback (ext .cu:953-1143)."""
        comm, _, _ = self._member(group)
        return FakeAllReduceCallback(self, comm, self._arrays(data), int(pack_size),
                                     bool(division), float(scale_grad))


class FakeAllReduceCallback:
    """nnabla-ext-cuda's AllReduceCallback on the fake: after each function's backward, every
    input gradient in the set that is not zeroing on every rank of the world is cast to T,
    multiplied by ``scale_grad`` into the pack and, when the pack holds ``pack_size`` elements
    or backward ends, summed (``division``: ncclAvg) and unpacked (keep_dtype is moot: arrays
    are T). As in nnabla, a gradient is packed at each use. A Python object: nnabla's backward
    runs it only through ``nnabla_torus.comm.backward_callback.install()``; on_finish_backward
    completes the enqueued sums (a GPU's default stream would wait for them)."""

    def __init__(self, parent, comm, arrays, pack_size, division, scale_grad):
        self.parent, self.comm, self.arrays = parent, comm, arrays
        self.pack_size, self.division, self.scale_grad = pack_size, division, scale_grad
        self._flats, self._parts = [], []

    def on_finish_function_backward(self, func):
        for var in func.inputs:
            grad = var.grad
            if not any(grad == a for a in self.arrays):
                continue
            if self.parent._all_zeroing([grad], self.parent._world)[0]:
                continue
            flat = self.parent._typed(grad)
            self._flats.append(flat)
            self._parts.append(flat * self.parent.dtype.type(self.scale_grad))
            if sum(f.size for f in self._flats) >= self.pack_size:
                self._all_reduce()

    def on_finish_backward(self):
        self._all_reduce()
        # Not a host sync: stream 0 waits for the unpack stream's event (ext .cu 1101-1113);
        # the fake has no later kernels to order, so it completes the sums here.
        _complete()

    def _all_reduce(self):
        if self._flats:
            flats = self._flats
            self.parent._gather_sum(self.comm, np.concatenate(self._parts), self.division,
                                    lambda total: self.parent._unpack(total, flats),
                                    "non-blocking", "all_reduce_callback")
        self._flats, self._parts = [], []
