"""A drop-in for nnabla's ``MultiProcessDataParallelCommunicator`` with a 2D-torus all-reduce.

Change one import line (``import nnabla_torus as C``, was ``import nnabla.communicators as C``)
and keep the rest of an nnabla data-parallel script; launch with ``mpirun -np 8 python
train.py``. Settings: :mod:`.settings`. This module is nnabla's API; the rooms behind it are
listed in docs/communicator.md#where-the-code-is; its groups (:mod:`.groups`) and the choice of
the algorithm a call runs (:mod:`.algorithm_choice`) are methods it takes from beside it.
Importing it (:mod:`.mpi_start`) installs :mod:`nnabla_torus.comm.failfast` (an error on one
rank ends the job), so errors between the import and ``init()`` are covered too, and stops
every process whose MPI world is not the one its launcher started
(:func:`.launcher_env.world_mismatch`).
"""
import collections
import functools
import time

import numpy as np

from .mpi_start import MPI  # first: starts MPI (quietly), installs failfast, checks the world
from . import backends, gpu_binding, grid_layouts, launcher_env, other_collectives, topology
from .algorithm_choice import AlgorithmChoice
from .array_reduce import reduce_arrays
from .sqnorms import SquaredNorms
from .array_layout import Layouts
from .fused import Workspace, as_list
from .groups import NamedGroups
from .guarded_calls import collective, guarded
from .job_log import log_once_per_job, logger, note  # noqa: F401  (scripts import it from here)
from .rendezvous import AllReduceCall, check_same_call
from .settings import DEFAULTS, CommSettings, differences  # noqa: F401  (train.py: DEFAULTS)
from .threads import OneCaller


def _setting(name, doc):
    """A property for ``self.settings.<name>``."""
    return property(lambda self: getattr(self.settings, name),
                    lambda self, value: setattr(self.settings, name, value), doc=doc)


class TorusCommunicator(NamedGroups, AlgorithmChoice):
    """nnabla's multi-process data-parallel communicator API over torus/ring/native all-reduce."""

    def __init__(self, ctx=None, algorithm=None, grid=None, backend=None, timeout=None,
                 wire_fp16=None, check=None, auto_profile=None, bind_gpu_numa=None):
        self.ctx = ctx
        self.settings = CommSettings.resolve(ctx, algorithm, grid, backend, timeout, wire_fp16,
                                             check, auto_profile, bind_gpu_numa,
                                             backend_names=backends.names())
        self.algorithm = self.settings.algorithm   # the one running (set_algorithm changes it)
        self.auto_table = None   # auto.Table, fixed by the first set_algorithm("auto")
        self.auto_timer = time.perf_counter  # the clock of auto's measurement (tests skew it)
        self._checking = ""      # the checked call in progress (its name for a check arrival)
        self.algorithm_counts = collections.Counter()  # world all-reduce calls per algorithm
        self.track_sqnorms = False
        self.sqnorms = SquaredNorms()
        self.backend = None
        self._routes = {}
        self._groups = {}
        self.workspace = Workspace()
        self.layouts = Layouts()   # per-list signature, fused parts and views (array_layout)
        self._host_names = []  # MPI.Get_processor_name() of every rank, for error messages
        # Rank 0: init()'s lines about the job's placement (the ranks' GPU binding, the MPI
        # transport), also logged at INFO; a script whose log shows warnings only prints them.
        self.init_notes = []
        self._one_caller = OneCaller()  # collectives from one thread at a time
        self._context_params = []  # (ctx, {name: Variable}) from add_context_and_parameters
        from . import backward_callback, sync_bn
        sync_bn.install(TorusCommunicator)  # F/PF.sync_batch_normalization accept us from now on
        backward_callback.install()  # backward(communicator_callbacks=) takes Python callbacks

    # Settings a script may read or change after construction (before init(), which compares
    # them across ranks); the others are in ``self.settings``.
    timeout = _setting("timeout", "seconds a collective waits for its peers")
    wire_fp16 = _setting("wire_fp16", "fused float32 all-reduces travel as float16")
    check = _setting("check", "every call's arguments are compared across ranks first")
    auto_profile = _setting("auto_profile", "the profile giving auto's size ranges ('': measure)")

    # -- set-up -----------------------------------------------------------------------------
    def init(self):
        """Check that all ranks agree on the settings, create the backend, find hosts, and
        build the groups of the chosen algorithm. Library log lines appear once per job."""
        if self.backend is not None:
            return
        log_once_per_job(self.rank)
        guarded(self, "init", self._agree)
        self._group_control = MPI.COMM_WORLD.Dup()   # new_group's list check (members only)
        s = self.settings
        self.backend = backends.make_backend(s.backend, self.ctx, s.timeout, **(
            s.mpi_knobs() if s.backend == "mpi" else {}))
        names = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
        self._host_names = names
        self._bind_near_gpu()
        transport = launcher_env.fault_tolerance_note(MPI, names)
        if transport and self.rank == 0:
            self._init_note(transport)
        if s.ranks_per_host:
            if self.size % s.ranks_per_host:
                raise ValueError(f"NNABLA_TORUS_RANKS_PER_HOST={s.ranks_per_host} does not "
                                 f"divide the world size {self.size}")
            names = [f"host{r // s.ranks_per_host}" for r in range(self.size)]
        self.hosts = topology.HostLayout.from_names(names)
        self._groups["world"] = list(range(self.size))
        # the argument check meets in shared memory
        grid_layouts.share_memory(self.backend, self.hosts, self.backend.world_group)
        if not s.algorithm_asked:
            self.algorithm = grid_layouts.default_algorithm(s.backend, self.hosts, s.grid)
        self.set_algorithm(self.algorithm, s.grid)
        if hasattr(self.backend, "resources"):   # NCCL: what device memory its communicators take
            note(self.backend.resources())

    def _bind_near_gpu(self):
        """On the NCCL backend, bind each rank to its share of its GPU's NUMA node's CPUs
        (:mod:`gpu_binding`); rank 0 logs the job's one line. Other backends have no GPU."""
        if self.settings.backend != "nccl":
            logger.debug("%s backend: no GPU, ranks not bound near one", self.settings.backend)
            return
        device, phrase = self.backend.device_id, "not bound (NNABLA_TORUS_BIND_GPU_NUMA=0)"
        if self.settings.bind_gpu_numa:   # the bus ids of the GPUs of this host's ranks
            bus_ids = [gpu_binding.cuda_bus_id(d) for d in range(self.backend.local_ranks)]
            phrase = gpu_binding.bind_near_gpu(device, bus_ids)
        said = MPI.COMM_WORLD.gather((self._host_names[self.rank], device, phrase), root=0)
        if self.rank == 0:
            self._init_note(gpu_binding.binding_line(said))

    def _init_note(self, line):
        """Log ``line`` once (INFO) and keep it in ``init_notes``."""
        self.init_notes.append(line)
        note(line)

    def _agree(self):
        """ValueError on every rank unless all ranks have the same settings (non-blocking, under
        the timeout: a rank that never arrives is named instead of hanging the others)."""
        def describe(calls):
            return ("init: ranks were given different settings (set the same NNABLA_TORUS_* "
                    "variables, e.g. mpirun -x NAME=value, and keyword arguments on every "
                    "rank):\n" + "\n".join(differences(calls)))
        check_same_call(MPI.COMM_WORLD, list(range(self.size)), self.settings.agreement(),
                        self.timeout, "init", describe)

    # -- nnabla's properties ----------------------------------------------------------------
    def _ready(self):
        if self.backend is None:
            raise RuntimeError("call comm.init() before using the communicator")
        return self.backend

    @property
    def name(self):
        return f"TorusCommunicator({self.settings.backend}, {self.algorithm})"

    @property
    def size(self):
        return MPI.COMM_WORLD.Get_size()

    @property
    def rank(self):
        return MPI.COMM_WORLD.Get_rank()

    @property
    def local_rank(self):
        """This rank's GPU: on the NCCL backend nnabla's choice (earlier ranks with the same
        short host name), whatever NNABLA_TORUS_RANKS_PER_HOST says; else its host position."""
        be = self._ready()
        device = getattr(be, "device_id", None)
        return self.hosts.local_rank(self.rank) if device is None else device

    @property
    def local_size(self):
        self._ready()
        return len(self.hosts.host_of(self.rank))

    @property
    def pipelined(self):
        """True when world all-reduces overlap row and column phases on pieces of the buffer
        (torus2d with rows inside a host and columns across hosts, MPI backend)."""
        self._ready()
        return self._route.pipelined

    def add_context_and_parameters(self, ctx_param_dict):
        """Register ``(ctx, {name: Variable})``; the deprecated ``allreduce()`` reduces the
        gradients of the first registered dict (nnabla v1.39.0 communicator.pyx:86-106,
        src/nbla/communicator.cpp:27-38)."""
        if type(ctx_param_dict) is not tuple or len(ctx_param_dict) != 2:
            raise TypeError(f"add_context_and_parameters needs a tuple (ctx, {{name: Variable}}), "
                            f"got {type(ctx_param_dict).__name__}")
        self._context_params.append(ctx_param_dict)

    def clear_context_parameters(self):
        """Forget every ``add_context_and_parameters`` (nnabla communicator.cpp:68-73)."""
        self._context_params = []

    # -- collectives ------------------------------------------------------------------------
    def all_reduce(self, data, division=False, inplace=False, group="world"):
        """Sum (``division``: average) NdArray(s) over ``group``, in place.

        ``inplace=False`` packs all arrays into one fused buffer and reduces it once (fast);
        ``inplace=True`` reduces each array in its own storage.

        As nnabla's, an array ``zero()``-ed and not written since on every member is left
        untouched and still zeroing (docs/communicator.md#the-zeroing-rule).
        """
        self._all_reduce_call("all_reduce", as_list(data), division, inplace, group)

    def allreduce(self, division=False, inplace=False):
        """Deprecated in nnabla: all-reduce the gradients of the parameters of the first
        ``add_context_and_parameters`` over the world (nnabla communicator.pyx:177-192). As
        nnabla's (ext .cu:629-709) it has no zeroing rule: every gradient is summed."""
        if not self._context_params:
            raise RuntimeError(f"rank {self.rank}: allreduce() reduces the parameters given to "
                               f"add_context_and_parameters((ctx, params)); none were added")
        grads = [v.grad for v in self._context_params[0][1].values()]
        self._all_reduce_call("allreduce", grads, division, inplace, "world", zeroing_rule=False)

    def _all_reduce_call(self, op, arrays, division, inplace, group, zeroing_rule=True):
        grp = self._group(group)
        sum_buffer, algorithm = self._buffer_sum(group, grp)
        what = f"{op} ({algorithm}, group {group!r})"
        # The algorithm, grid, wire format and pieces are part of the call: ranks that differ
        # in them would exchange mismatched messages.
        pieces = self.backend.pipeline_bytes if group == "world" and self.pipelined else None
        layout = self.layouts.of(arrays)
        sig = AllReduceCall(op, layout.signature, bool(division), bool(inplace),
                            self.track_sqnorms, algorithm,
                            str(self.grid) if group == "world" else None, self.wire_fp16, pieces)
        norms = collective(self, grp, sig, what, functools.partial(
            reduce_arrays, self.backend, self.workspace, layout, sum_buffer, grp.size,
            division=division, inplace=inplace, wire_fp16=self.wire_fp16,
            sqnorms=self.track_sqnorms, zeroing_rule=zeroing_rule), fold=True)
        self.sqnorms.add(*norms)

    def pop_sqnorms(self):
        """``(local_mean_sqnorm, global_sqnorm)`` summed over calls since the last pop.

        local_mean_sqnorm = (1/p) sum_i |x_i|^2 and global_sqnorm = |(1/p) sum_i x_i|^2, where
        x_i is rank i's input, whatever ``division`` was. Feed them to the noise-scale estimator.
        With norms on the device (nnabla's callback on NCCL) this is a world collective (a
        4-byte all-reduce), checked and guarded like every other: a rank that never pops is
        named instead of leaving the others waiting in NCCL.
        """
        if self.sqnorms.device is None:
            return self.sqnorms.pop()
        return collective(self, self._group("world"), ("pop_sqnorms",),
                          "pop_sqnorms (noise-scale norms, all_reduce)", self.sqnorms.pop)

    def allreduce_numpy(self, array):
        """Sum a numpy array over the world in place (metrics, counters); returns it."""
        import nnabla as nn
        nd = nn.NdArray.from_numpy_array(np.ascontiguousarray(array))
        self.all_reduce(nd, inplace=True)
        array[...] = nd.data
        return array

    def bcast(self, data, src=0, inplace=False, group="world"):
        """Copy NdArray(s) of member ``src`` to every member of ``group``.

        As in nnabla, ``src`` is a position in the group (the world rank for "world").
        """
        other_collectives.bcast(self, data, src, inplace, group)

    def reduce(self, data, dst, division=False, inplace=False, group="world"):
        """Sum (``division``: average) NdArray(s) over ``group`` into member ``dst`` only.

        As nnabla's (communicator.pyx:254-313; ext .cu:564-627): ``dst`` is a position in the
        group (the world rank for "world"), the other members' arrays are left as they were,
        and there is no zeroing rule. Here the sum runs with the group's all-reduce algorithm
        on a fused copy (every member receives it, only ``dst`` keeps it), so ``inplace``
        changes nothing but is accepted; nnabla v1.39's in-place reduce ignores ``group``,
        this one honours it.
        """
        other_collectives.reduce(self, data, dst, division, inplace, group)

    def all_reduce_callback(self, data, pack_size, division=False, group="world",
                            scale_grad=1, keep_dtype=False):
        """A callback for ``loss.backward(communicator_callbacks=...)`` that all-reduces the
        gradients ``data`` (NdArray or list) in packs of ``pack_size`` elements while backward
        runs, each gradient first multiplied by ``scale_grad`` (nnabla communicator.pyx:471-536;
        ext .cu:953-1118).

        NCCL backend: nnabla's own C++ callback; others: a Python one, which the backward
        that creating a communicator installs runs (:mod:`.backward_callback`).
        """
        from . import backward_callback
        return backward_callback.make_callback(self, data, pack_size, division, group,
                                               scale_grad, keep_dtype)

    def native_communicator(self, group="world"):
        """(nnabla's own C++ communicator, its name for ``group``) on the NCCL backend, for
        nnabla's kernels that take a communicator (sync_batch_normalization); None on other
        backends. Its type follows the context's type_config (half or float)."""
        if self._ready() and self.settings.backend != "nccl":
            return None
        grp = self._group(group)
        return self.backend.nnabla_communicator(self._half(), grp), grp.name

    def _half(self):
        """Whether the user's context asks for half precision (nnabla's communicator type T)."""
        return self.ctx is not None and any(b.endswith(":half") for b in self.ctx.backend)

    def all_gather(self, ndarray, ndarray_list, group="world"):
        """``ndarray_list[i]`` receives member i's ``ndarray`` (group order)."""
        other_collectives.all_gather(self, ndarray, ndarray_list, group)

    def reduce_scatter(self, ndarray_list, ndarray, division=False, group="world"):
        """``ndarray`` receives the sum over members of their ``ndarray_list[my position]``."""
        other_collectives.reduce_scatter(self, ndarray_list, ndarray, division, group)

    def close(self):
        """Free the backend's resources now (on NCCL: nnabla's communicators, their NCCL
        communicators and CUDA streams), on every rank; idempotent. Call it before the script
        ends:
        nnabla's destructor destroys its streams under NBLA_CUDA_FORCE_ASSERT (ext
        ``multi_process_data_parallel_communicator.cu`` ~355-366), which can abort a process
        whose interpreter is already unloading the CUDA runtime."""
        if self.backend is not None:
            close = getattr(self.backend, "close", None)
            if close is not None:
                close()
            self.backend = None

    def barrier(self):
        guarded(self, "barrier", self._ready().barrier)

    def abort(self):
        self._ready().abort(1)


def MultiProcessDataParallelCommunicator(ctx=None, **options):
    """nnabla's factory name, returning a TorusCommunicator (see the module docstring)."""
    return TorusCommunicator(ctx, **options)


def DataParallelCommunicator(ctx=None, **options):
    """nnabla's one-process, several-GPU communicator (deprecated there) has no counterpart:
    raise, naming the one-process-per-device launch that does the same."""
    raise NotImplementedError(
        "nnabla_torus has no DataParallelCommunicator (one process driving several devices); "
        "run one process per device instead: mpirun -np <devices> python script.py with "
        "C.MultiProcessCommunicator(ctx)")


# nnabla exports the same factory under these names too (nnabla v1.39.0
# python/src/nnabla/communicator.pyx:667-671); nnabla-examples use the first two.
MultiProcessDataParalellCommunicator = MultiProcessDataParallelCommunicator
MultiProcessCommunicator = MultiProcessDataParallelCommunicator
Comm = MultiProcessDataParallelCommunicator
Dist = MultiProcessDataParallelCommunicator
