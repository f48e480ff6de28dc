"""A fake of nnabla-ext-cuda's multi-process NCCL communicator: numpy on CPU, mpi4py between ranks.

``NNABLA_TORUS_BACKEND=fake-nccl`` runs the NCCL mapping (``comm/backends/nccl.py``) end to end
under mpirun on a machine without GPUs. This module is what the backend loads in place of
``nnabla_ext.cuda``: the communicator double here, the fake device (``set_device``,
``synchronize``, ``Event``, ``place``, ``stream_log``) from fake_cuda.py, its backward
callback from fake_all_reduce_callback.py. What it mimics of nnabla
``python/src/nnabla/communicator.pyx`` and nnabla-ext-cuda
``src/nbla/cuda/communicator/multi_process_data_parallel_communicator.cu`` (v1.39), and what it
cannot: docs/gpu.md ("The fake NCCL communicator").

Example (under ``mpirun -np 2``)::

    ctx = get_extension_context("cpu", type_config="float")
    comm = FakeMultiProcessDataParallelCommunicator(ctx)
    comm.init()
    comm.all_reduce([x.data for x in xs], division=True)
    synchronize()                                # the sums are in xs from here on
"""
import numbers
import socket

import numpy as np
from mpi4py import MPI

from ..comm.backends.mpi import raw
# The fake device, under the names nnabla_ext.cuda gives them (the backend loads this module
# as its extension) and those the tests use.
from .fake_cuda import (TYPE_CONFIGS, Event, check_device, complete,  # noqa: F401
                        current_device, device_of, enqueue, place, reset, set_device,
                        stream_kind, stream_log, synchronize)
from .fake_all_reduce_callback import FakeAllReduceCallback

def _nnabla_error(kind, message):
    """nnabla's NBLA_ERROR(error_code::kind, ...) reaches Python as RuntimeError."""
    return RuntimeError(f"{kind} error in FakeMultiProcessDataParallelCommunicator: {message}")


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
    # NCCL communicators this process created (ncclCommInitRank: one per init(), one per
    # new_group this rank is a member of; ext .cu 426, 510): each holds device memory
    nccl_created = 0

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
        FakeMultiProcessDataParallelCommunicator.nccl_created += 1
        self._initialized = True

    def add_context_and_parameters(self, ctx_param_dict):
        if type(ctx_param_dict) is not tuple or len(ctx_param_dict) != 2:
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
            FakeMultiProcessDataParallelCommunicator.nccl_created += 1
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
        arrays = data if type(data) is list else [data]
        for a in arrays:
            if not isinstance(a, nn.NdArray):
                raise TypeError(f"expected nnabla NdArray, got {type(a).__name__}")
        return arrays

    def _typed(self, ndarray):
        """``ndarray`` cast to T in place (as nnabla's ``cast(dtype, ctx_)``); a flat view."""
        if current_device() is not None:
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

    def _gather_sum(self, comm, flat, division, done, stream, op="all_reduce", reads=()):
        """Enqueue the sum of ``flat`` over ``comm``; ``done(total)`` runs at synchronize()."""
        parts = np.empty((comm.Get_size(), flat.size), self.dtype)
        request = comm.Iallgather(raw(np.ascontiguousarray(flat)), raw(parts))
        enqueue([request], lambda: done(self._sum(parts, division)), stream, op, reads)

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
                             stream_kind(inplace))

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
                             stream_kind(inplace), "reduce")

    def bcast(self, data, src, inplace=False, group="world"):
        """ncclBcast from group position ``src``."""
        comm, _, batches = self._rooted(group, src, data, inplace, "ncclBcast")
        for batch in batches:
            large, flats = self._pack(batch)
            enqueue([comm.Ibcast(raw(large), root=src)],
                     lambda large=large, flats=flats: self._unpack(large, flats),
                     stream_kind(inplace), "bcast")

    def all_gather(self, ndarray, ndarray_list, group="world"):
        """ncclAllGather: member i's ``ndarray`` lands at offset i * size of the list."""
        comm, _, m = self._member(group)
        large, flats = self._pack(self._arrays(list(ndarray_list)))
        send = np.ascontiguousarray(self._typed(ndarray), dtype=self.dtype)
        if large.size < m * send.size:
            raise ValueError(f"all_gather: ndarray_list holds {large.size} elements, fewer than "
                             f"{m} members x {send.size} (NCCL would write past it)")
        recv = large[:m * send.size]
        enqueue([comm.Iallgather(raw(send), raw(recv))], lambda: self._unpack(large, flats),
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
        enqueue([comm.Ialltoall(raw(send), raw(parts))],
                 lambda: self._unpack(self._sum(parts, division), [out]),
                 "legacy-default", "reduce_scatter")

    def all_reduce_callback(self, data, pack_size, division=False, group="world",
                            scale_grad=1, keep_dtype=False):
        """A Python stand-in for nnabla's C++ AllReduceCallback (ext .cu:953-1143)."""
        comm, _, _ = self._member(group)
        return FakeAllReduceCallback(self, comm, self._arrays(data), int(pack_size),
                                     bool(division), float(scale_grad))
