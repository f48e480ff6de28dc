"""A fake of nnabla-ext-cuda's multi-process NCCL communicator: numpy on CPU, mpi4py between ranks.

``NNABLA_TORUS_BACKEND=fake-nccl`` runs the NCCL mapping (``backends/nccl.py``) end to end
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

What it cannot mimic: CUDA streams and asynchrony (every call completes before it returns),
device memory, NCCL's algorithms, protocols, timing and summation order (the fake sums in group
order, the same on every member); out-of-bounds reads and writes (where NCCL would run past a
buffer, the fake raises ValueError); nnabla's watchdog thread (peers missing for ``timeout``
seconds raise ``CollectiveTimeout``); ``all_reduce_callback`` (needs nnabla's C++ backward
hooks; raises NotImplementedError) and the deprecated ``allreduce``.

Example (under ``mpirun -np 2``)::

    ctx = get_extension_context("cpu", type_config="float")
    comm = FakeMultiProcessDataParallelCommunicator(ctx)
    comm.init()
    comm.all_reduce([x.data for x in xs], division=True)
"""
import socket

import numpy as np
from mpi4py import MPI

from ..rendezvous import wait_requests

TYPE_CONFIGS = {"float": np.float32, "half": np.float16}


def _nnabla_error(kind, message):
    """nnabla's NBLA_ERROR(error_code::kind, ...) reaches Python as RuntimeError."""
    return RuntimeError(f"{kind} error in FakeMultiProcessDataParallelCommunicator: {message}")


def _bytes(array):
    return [array.reshape(-1).view(np.uint8), MPI.BYTE]


class FakeMultiProcessDataParallelCommunicator:
    """nnabla-ext-cuda's ``MultiProcessDataParallelCommunicatorNccl`` on CPU (see module doc)."""
    name = "MultiProcessDataParallelCommunicatorNccl"

    def __init__(self, ctx, timeout=300.0):
        config = ctx.backend[0].split(":")[-1] if ctx.backend else ""
        if config not in TYPE_CONFIGS:
            raise _nnabla_error("value", f"Any of {list(ctx.backend)} could not be found "
                                         f"(the communicator exists for float and half)")
        self.ctx = ctx
        self.dtype = np.dtype(TYPE_CONFIGS[config])
        self.timeout = float(timeout)
        self._initialized = False
        self._groups, self._comms, self._params = {}, {}, []

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
        hosts = self._world.allgather(host)
        self._local_rank = hosts[:self._world.Get_rank()].count(host)
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
        self._wait(self._world.Ibarrier(), "barrier", self._groups["world"])

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
            comm = self._world.Create_group(self._world.Get_group().Incl(ranks))
            self._wait(comm.Ibarrier(), f"new_group {name}", ranks)  # ncclCommInitRank
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
        ndarray.cast(self.dtype, self.ctx)
        return ndarray.data.reshape(-1)

    def _pack(self, arrays):
        flats = [self._typed(a) for a in arrays]
        return np.concatenate(flats) if flats else np.empty(0, self.dtype)

    @staticmethod
    def _unpack(large, arrays):
        offset = 0
        for a in arrays:
            flat = a.data.reshape(-1)
            flat[...] = large[offset:offset + flat.size]
            offset += flat.size

    def _wait(self, request, what, peers):
        wait_requests([request], self.timeout, f"fake nccl {what}", peers, MPI.COMM_WORLD.rank)

    def _sum(self, parts, division):
        """Sum the rows of ``parts`` in order, in T; ncclAvg pre-multiplies by T(1/m)."""
        if division:
            parts = parts * self.dtype.type(1.0 / len(parts))
        total = parts[0].copy()
        for part in parts[1:]:
            total += part
        return total

    def _gather_sum(self, comm, flat, division, what, peers):
        parts = np.empty((comm.Get_size(), flat.size), self.dtype)
        self._wait(comm.Iallgather(_bytes(np.ascontiguousarray(flat)), _bytes(parts)), what, peers)
        return self._sum(parts, division)

    def _all_zeroing(self, arrays, comm, peers):
        """Per array: zeroing on every member of ``comm`` (nnabla's mpi_check_all)."""
        if not arrays:
            return []
        flags = np.array([a.zeroing for a in arrays], dtype=np.int32)
        result = np.empty_like(flags)
        self._wait(comm.Iallreduce(flags, result, op=MPI.LAND), "zeroing check", peers)
        return result.astype(bool).tolist()

    # -- collectives ------------------------------------------------------------------------
    def all_reduce(self, data, division=False, inplace=False, group="world"):
        """ncclAllReduce of each array (``inplace``) or of one packed copy of them all."""
        comm, _, _ = self._member(group)
        peers = self._groups[group]
        arrays = self._arrays(data)
        zeroing = self._all_zeroing(arrays, comm, peers)
        live = [a for a, z in zip(arrays, zeroing) if not z]
        if inplace:
            for a in live:
                flat = self._typed(a)
                flat[...] = self._gather_sum(comm, flat, division, "all_reduce", peers)
        elif live:
            large = self._pack(live)
            self._unpack(self._gather_sum(comm, large, division, "all_reduce", peers), live)

    def _rooted(self, group, root, data, inplace, op):
        """Member and root checks; (comm, position, peers, batches of arrays NCCL moves)."""
        comm, me, m = self._member(group)
        if not 0 <= root < m:
            raise _nnabla_error("target_specific", f"{op}: invalid root {root} for a group of "
                                                   f"{m} (ncclInvalidArgument)")
        arrays = self._arrays(data)
        batches = [[a] for a in arrays] if inplace else [arrays]
        return comm, me, self._groups[group], batches

    def reduce(self, data, dst, division=False, inplace=False, group="world"):
        """ncclReduce to group position ``dst``; other members' arrays are left as they were."""
        self._member(group)
        if inplace:
            group = "world"  # nnabla-ext-cuda v1.39 drops `group` on this path
        comm, me, peers, batches = self._rooted(group, dst, data, inplace, "ncclReduce")
        for batch in batches:
            total = self._gather_sum(comm, self._pack(batch), division, "reduce", peers)
            if me == dst:
                self._unpack(total, batch)

    def bcast(self, data, src, inplace=False, group="world"):
        """ncclBcast from group position ``src``."""
        comm, _, peers, batches = self._rooted(group, src, data, inplace, "ncclBcast")
        for batch in batches:
            large = self._pack(batch)
            self._wait(comm.Ibcast(_bytes(large), root=src), "bcast", peers)
            self._unpack(large, batch)

    def all_gather(self, ndarray, ndarray_list, group="world"):
        """ncclAllGather: member i's ``ndarray`` lands at offset i * size of the list."""
        comm, _, m = self._member(group)
        arrays = self._arrays(list(ndarray_list))
        large = self._pack(arrays)
        send = np.ascontiguousarray(ndarray.get_data("r").reshape(-1), dtype=self.dtype)
        if large.size < m * send.size:
            raise ValueError(f"all_gather: ndarray_list holds {large.size} elements, fewer than "
                             f"{m} members x {send.size} (NCCL would write past it)")
        recv = large[:m * send.size]
        self._wait(comm.Iallgather(_bytes(send), _bytes(recv)), "all_gather", self._groups[group])
        self._unpack(large, arrays)

    def reduce_scatter(self, ndarray_list, ndarray, division=False, group="world"):
        """ncclReduceScatter: member i receives the sum of chunk i of the packed list."""
        comm, _, m = self._member(group)
        arrays = self._arrays(list(ndarray_list))
        large = self._pack(arrays)
        count = ndarray.size
        if large.size < m * count:
            raise ValueError(f"reduce_scatter: ndarray_list holds {large.size} elements, fewer "
                             f"than {m} members x {count} (NCCL would read past it)")
        parts = np.empty((m, count), self.dtype)
        send = np.ascontiguousarray(large[:m * count])
        self._wait(comm.Ialltoall(_bytes(send), _bytes(parts)), "reduce_scatter",
                   self._groups[group])
        self._typed(ndarray)[...] = self._sum(parts, division)

    def all_reduce_callback(self, data, pack_size, division=False, group="world",
                            scale_grad=1, keep_dtype=False):
        raise NotImplementedError("the fake NCCL communicator has no all_reduce_callback: it "
                                  "needs nnabla's C++ backward hooks; all-reduce after backward")
