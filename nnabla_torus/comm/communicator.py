"""A drop-in for nnabla's ``MultiProcessDataParallelCommunicator`` with a 2D-torus all-reduce.

Change one import line and keep the rest of an nnabla data-parallel script::

    import nnabla_torus as C            # was: import nnabla.communicators as C
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    ...
    loss.backward(clear_buffer=True)
    comm.all_reduce([p.grad for p in nn.get_parameters().values()], division=True)
    solver.update()

Launch with ``mpirun -np 8 python train.py``. Knobs: keyword arguments, else NNABLA_TORUS_*
environment variables (read below and in ``backends/mpi.py:settings``); their meanings and
defaults are the README's "Knobs" table, which tests/unit/test_docs.py checks against these
reads. How each algorithm runs: docs/communicator.md.

Every value is checked when the communicator is made (a ValueError names the knob, the value
and the allowed range), and ``init()`` compares the settings of all ranks (a ValueError on
every rank names what each rank set) before anything that would hang if they differed.
Importing this module installs :mod:`nnabla_torus.comm.failfast` (an error on one rank ends the
job), so errors between the import and ``init()`` are covered too.
"""
import collections
import logging
import os
import sys
import time

import numpy as np

# Open MPI 5's one-sided UCX component prints an error line for every window it declines
# (no UCX network here); our windows are all shared memory (osc/sm). Read at MPI start, so
# this only helps when the communicator is imported first; mpirun --mca osc ^ucx always does.
os.environ.setdefault("OMPI_MCA_osc", "^ucx")
from mpi4py import MPI  # noqa: E402  (starts MPI)

from . import auto, failfast, topology
from .threads import OneCaller
from .backends import synchronize
from .collectives import AUTO, Plan, get_algorithm
from ..knobs import TIMEOUT_MAX_S, env_value, knob_value, number
from .rendezvous import (CallMismatch, CollectiveTimeout, RankGone, RankLost, call_hash,
                         check_group_lists, check_same_call, lost_ranks, raise_mismatch,
                         rank_lost)

logger = logging.getLogger("nnabla_torus")
failfast.install()  # MPI has started (mpi4py.MPI): from here on, one rank's error ends the job
_notes_said = set()  # notes are logged once per process

DEFAULTS = dict(algorithm="torus2d", timeout=300.0)  # timeout in seconds
BACKENDS = ("mpi", "nccl", "fake-nccl")
LOST_GRACE_S = 5.0  # seconds a rank that saw a peer die waits for mpirun to end the job


def _is_cuda(ctx):
    return ctx is not None and any("cuda" in b for b in getattr(ctx, "backend", []))


def make_backend(name, ctx, timeout, **knobs):
    """The backend called ``name`` (mpi | nccl | fake-nccl); ``knobs`` go to the MPI backend."""
    if name == "mpi":
        from .backends.mpi import MPIBackend
        return MPIBackend(timeout=timeout, **knobs)
    if name in ("nccl", "fake-nccl"):
        from .backends.nccl import NCCLBackend
        return NCCLBackend(ctx, timeout=timeout, fake=(name == "fake-nccl"))
    raise ValueError(f"unknown backend {name!r}; choose mpi, nccl or fake-nccl "
                     f"(NNABLA_TORUS_BACKEND or backend=)")


class OnRankZero(logging.Filter):
    """Let log records through on rank 0 only (one copy per job), unless a record says it
    differs per rank: ``logger.warning(text, extra={"every_rank": True})``."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def filter(self, record):
        return self.rank == 0 or getattr(record, "every_rank", False)


def log_once_per_job(rank, names=("nnabla_torus", "nnabla_torus.planning.controller")):
    """Add an ``OnRankZero`` filter to the loggers ``names`` (once); ``init()`` does this for
    the library's loggers, a script may pass its own logger's name."""
    for name in names:
        log = logging.getLogger(name)
        if not any(isinstance(f, OnRankZero) for f in log.filters):
            log.addFilter(OnRankZero(rank))


def _differences(calls):
    """The settings that differ across ranks, one line each: value on rank(s) [...].

    ``calls``: one sequence of (name, value) pairs per rank; a name a rank does not have (one
    rank with another backend has other backend knobs) is shown as "unset" there."""
    settings = [dict(call) for call in calls]
    names = list(dict.fromkeys(name for call in calls for name, _ in call))
    lines = []
    for name in names:
        by_value = {}
        for rank, setting in enumerate(settings):
            value = repr(setting[name]) if name in setting else "unset"
            by_value.setdefault(value, []).append(rank)
        if len(by_value) > 1:
            lines.append(f"  {name}: " + "; ".join(f"{value} on rank(s) {ranks}"
                                                   for value, ranks in by_value.items()))
    return lines


class TorusCommunicator:
    """nnabla's multi-process data-parallel communicator API over torus/ring/native all-reduce."""

    def __init__(self, ctx=None, algorithm=None, grid=None, backend=None, timeout=None,
                 wire_fp16=None, check=None, auto_profile=None):
        self.ctx = ctx
        self._default_algorithm = not (algorithm or env_value("NNABLA_TORUS_ALGORITHM"))
        self.algorithm = algorithm or env_value("NNABLA_TORUS_ALGORITHM", DEFAULTS["algorithm"])
        get_algorithm(self.algorithm, allow_auto=True)  # fail early on a typo
        self.auto_profile = auto_profile or env_value("NNABLA_TORUS_AUTO_PROFILE", "")
        if self.auto_profile:
            from ..planning.machine_profile import load_profile
            self._profile = load_profile(self.auto_profile)  # a bad name fails here
        self.auto_table = None   # auto.Table, fixed by the first set_algorithm("auto")
        self.auto_timer = time.perf_counter  # the clock of auto's measurement (tests skew it)
        self._checking = ""      # the checked call in progress (its name for a check arrival)
        self.algorithm_counts = collections.Counter()  # world all-reduce calls per algorithm
        self._grid_request = grid or env_value("NNABLA_TORUS_GRID")
        if isinstance(self._grid_request, str):
            self._grid_request = topology.parse_grid(self._grid_request)
        self._backend_name = backend or env_value(
            "NNABLA_TORUS_BACKEND", "nccl" if _is_cuda(ctx) else "mpi")
        if self._backend_name not in BACKENDS:
            raise ValueError(f"unknown backend {self._backend_name!r}; choose one of "
                             f"{', '.join(BACKENDS)} (NNABLA_TORUS_BACKEND or backend=)")
        self.timeout = knob_value(timeout, "timeout", "NNABLA_TORUS_TIMEOUT", DEFAULTS["timeout"],
                                  number(float, low=0, strict=True, high=TIMEOUT_MAX_S,
                                         hint="seconds, e.g. 300; 86400 for a day"))
        self.wire_fp16 = bool(wire_fp16 if wire_fp16 is not None else env_value(
            "NNABLA_TORUS_WIRE_FP16", False, bool))
        self.check = bool(check if check is not None else env_value("NNABLA_TORUS_CHECK", True, bool))
        self._per_host = env_value("NNABLA_TORUS_RANKS_PER_HOST", None, number(
            int, low=1, hint="ranks per host; unset it to group ranks by host name"))
        self._backend_knobs = {}
        if self._backend_name == "mpi":
            from .backends.mpi import settings
            self._backend_knobs = settings()
        self.track_sqnorms = False
        self._sqnorms = [0.0, 0.0]
        self.backend = None
        self._plans = {}
        self._groups = {}
        self._workspace = {}
        self._host_names = []  # MPI.Get_processor_name() of every rank, for error messages
        self._one_caller = OneCaller()  # collectives from one thread at a time
        self._context_params = []  # (ctx, {name: Variable}) from add_context_and_parameters
        from . import backward_callback, sync_bn
        sync_bn.install()  # F/PF.sync_batch_normalization accept this communicator from now on
        backward_callback.install()  # backward(communicator_callbacks=) takes Python callbacks

    # -- set-up -----------------------------------------------------------------------------
    def init(self):
        """Check that all ranks agree on the settings, create the backend, find hosts, and
        build the groups of the chosen algorithm. Library log lines appear once per job."""
        if self.backend is not None:
            return
        log_once_per_job(self.rank)
        self._guarded("init", self._agree)
        self._group_control = MPI.COMM_WORLD.Dup()   # new_group's list check (members only)
        self.backend = make_backend(self._backend_name, self.ctx, self.timeout,
                                    **self._backend_knobs)
        names = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
        self._host_names = names
        per_host = self._per_host
        if per_host:
            if self.size % per_host:
                raise ValueError(f"NNABLA_TORUS_RANKS_PER_HOST={per_host} does not divide the "
                                 f"world size {self.size}")
            names = [f"host{r // per_host}" for r in range(self.size)]
        self.hosts = topology.HostLayout.from_names(names)
        self._groups["world"] = list(range(self.size))
        self._share(self.backend.world_group)  # the argument check meets in shared memory
        if self._default_algorithm:
            self.algorithm = default_algorithm(self._backend_name, self.hosts, self._grid_request)
        self.set_algorithm(self.algorithm, self._grid_request)

    def _share(self, group):
        """Map shared memory for ``group`` when its ranks run on one host (collective over its
        members; the MPI backend only). True when the group now shares memory."""
        share = getattr(self.backend, "share", None)
        return bool(share and not self.hosts.spans_hosts(group.ranks) and share(group))

    def _agree(self):
        """ValueError on every rank unless all ranks have the same settings (non-blocking, under
        the timeout: a rank that never arrives is named instead of hanging the others)."""
        settings = dict(backend=self._backend_name, algorithm=self.algorithm,
                        grid=str(self._grid_request) if self._grid_request else None,
                        timeout=self.timeout, wire_fp16=self.wire_fp16, check=self.check,
                        ranks_per_host=self._per_host, auto_profile=self.auto_profile)
        settings.update((k, v) for k, v in self._backend_knobs.items()
                        if k in ("segment_bytes", "pipeline_bytes", "shm", "shm_bytes"))

        def describe(calls):
            return ("init: ranks were given different settings (set the same NNABLA_TORUS_* "
                    "variables, e.g. mpirun -x NAME=value, and keyword arguments on every "
                    "rank):\n" + "\n".join(_differences(calls)))
        check_same_call(MPI.COMM_WORLD, list(range(self.size)), tuple(settings.items()),
                        self.timeout, "init", describe)

    def set_algorithm(self, algorithm, grid=None):
        """Switch the world all-reduce to ``algorithm`` (and ``grid``); collective on all ranks.

        ``auto``: the plans of its candidates, and (first time) the table of size ranges."""
        get_algorithm(algorithm, allow_auto=True)
        if algorithm == AUTO:
            grid = grid or self._grid_request or self._host_rows()
            self._auto_plans = {name: self._plan_for(name, grid) for name in self._candidates()}
            self.algorithm, self.grid = AUTO, self._grid_for("torus2d", grid)
            self._plan = self._auto_plans["torus2d"]
            if self.auto_table is None:
                self.auto_table = self._auto_table()
            return
        self.algorithm, self.grid = algorithm, self._grid_for(algorithm, grid or self._grid_request)
        self._plan = self._plan_for(algorithm, grid)

    def _plan_for(self, algorithm, grid=None):
        grid = self._grid_for(algorithm, grid or self._grid_request)
        key = (algorithm, str(grid))
        if key not in self._plans:
            self._plans[key] = self._make_plan(algorithm, grid)
        return self._plans[key]

    def _host_rows(self):
        """auto's torus grid: one row per host (the row phase all in shared memory) when hosts
        hold the same number of consecutive ranks, else None (the default grid)."""
        per_host = self.hosts.ranks_per_host if self.hosts.is_blocked() else 0
        return topology.Grid(per_host, self.size // per_host) if per_host > 1 else None

    def _candidates(self):
        """auto's algorithms: the library's, the torus, and hierarchical on several hosts."""
        several = len(self.hosts.hosts) > 1 and self.hosts.ranks_per_host
        return ["native", "torus2d"] + (["hierarchical"] if several else [])

    def _auto_table(self):
        """auto's size ranges, computed on rank 0 (profile, else measured) and broadcast:
        identical on every rank by construction."""
        candidates = self._candidates()
        source = self.auto_profile
        per_host = self.hosts.ranks_per_host or self.size
        saved = (self._profile.extra or {}).get("auto_tables", {}).get((self.size, per_host)) \
            if source else None
        if saved and set(saved[1]) <= set(candidates):   # measured by tools/calibrate.py
            table = auto.Table(*saved, f"profile {source}, measured by calibrate")
            self._note(f"auto ({table.source}, {self.size} ranks): {table.describe()}")
            return table
        if source and auto.missing_terms(self._profile, candidates):
            self._note(f"auto: profile {source!r} has no software term for "
                       f"{auto.missing_terms(self._profile, candidates)}; measuring the size "
                       f"ranges instead")
            source = ""
        if self.size == 1:   # nothing is exchanged: nothing to measure
            return auto.Table([], ["native"], "one rank")
        if source:
            times = auto.predicted_times(self._profile, candidates, self.size, per_host,
                                         self.grid.x) if self.rank == 0 else None
            name = f"profile {source}"
        else:
            times = self._measure_auto(candidates)
            name = "measured at init"
        table = auto.table_from_times(auto.SIZES, times, name) \
            if self.rank == 0 else None
        table = MPI.COMM_WORLD.bcast(table, root=0)
        self._note(f"auto ({name}, {self.size} ranks): {table.describe()}")
        return table

    def _measure_auto(self, candidates):
        """Time the candidates at auto.SIZES on scratch buffers (collective), each call with
        its argument check as a user's call has it (folded into shared arrivals or not)."""
        world = MPI.COMM_WORLD

        def run(name, nbytes):
            buf = self._buffer(np.float32, nbytes // 4)
            buf.fill(1.0)
            self._collective(self.backend.world_group, ("auto measurement", name, nbytes),
                             f"auto measurement ({name})",
                             lambda: self._exchange(name, self._auto_plans[name], buf), fold=True)
            synchronize(self)   # NCCL calls return before their kernels end

        return auto.measure(run, candidates, timer=self.auto_timer,
                            slowest=lambda t: world.allreduce(t, op=MPI.MAX))

    @staticmethod
    def _note(text):
        if text not in _notes_said:
            _notes_said.add(text)
            logger.warning(text)

    def _grid_for(self, algorithm, request):
        if algorithm == "hierarchical":
            per_host = self.hosts.ranks_per_host
            if not per_host:
                counts = [len(h) for h in self.hosts.hosts]
                raise ValueError(f"hierarchical all-reduce needs the same number of ranks on "
                                 f"every host; hosts hold {counts} ranks. Use torus2d with a grid.")
            return topology.Grid(per_host, len(self.hosts.hosts))
        if algorithm != "torus2d":
            return topology.Grid(self.size, 1)
        if request:
            grid = request if isinstance(request, topology.Grid) else topology.parse_grid(request)
            topology.check_grid(grid, self.size)
            return grid
        # Rows of X = ranks per host stay inside a host only when hosts hold consecutive ranks.
        per_host = self.hosts.ranks_per_host if self.hosts.is_blocked() else 0
        grid, note = topology.default_grid(self.size, per_host)
        if per_host == 0 and len(self.hosts.hosts) > 1:
            note = (f"ranks are not placed host by host ({self.hosts.hosts}): the default grid "
                    f"{grid} ignores hosts; launch with --map-by slot or set NNABLA_TORUS_GRID")
        if note and note not in _notes_said:
            _notes_said.add(note)
            logger.warning(note)
        return grid

    def _make_plan(self, algorithm, grid):
        be, rank = self.backend, self.rank
        world = be.world_group
        if algorithm == "hierarchical":
            host = self.hosts.host_of(rank)
            local = host.index(rank)
            column = [h[local] for h in self.hosts.hosts]
            row = be.group(host)
            return Plan(world, row, be.group(column), shared=self._share(row))
        if algorithm == "torus2d":
            row, column = grid.row_of(rank), grid.column_of(rank)
            # Overlapping pays when rows and columns use different links (in-host, inter-host);
            # only backends with run_lanes (MPI) can overlap.
            pipelined = (hasattr(be, "run_lanes") and len(row) > 1 and len(column) > 1
                         and self.hosts.spans_hosts(column) and not self.hosts.spans_hosts(row))
            row, column = be.group(row), be.group(column)
            # Pipelined plans overlap the row with the column over messages; else the row
            # goes through shared memory when its ranks share a host.
            return Plan(world, row, column, pipelined,
                        shared=not pipelined and self._share(row))
        return Plan(world, world, None)

    # -- nnabla's properties ----------------------------------------------------------------
    def _ready(self):
        if self.backend is None:
            raise RuntimeError("call comm.init() before using the communicator")
        return self.backend

    @property
    def name(self):
        return f"TorusCommunicator({self._backend_name}, {self.algorithm})"

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
        return self._plan.pipelined

    def add_context_and_parameters(self, ctx_param_dict):
        """Register ``(ctx, {name: Variable})``; the deprecated ``allreduce()`` reduces the
        gradients of the first registered dict (nnabla v1.39.0 communicator.pyx:86-106,
        src/nbla/communicator.cpp:27-38)."""
        if type(ctx_param_dict) != tuple or len(ctx_param_dict) != 2:
            raise TypeError(f"add_context_and_parameters needs a tuple (ctx, {{name: Variable}}), "
                            f"got {type(ctx_param_dict).__name__}")
        self._context_params.append(ctx_param_dict)

    def clear_context_parameters(self):
        """Forget every ``add_context_and_parameters`` (nnabla communicator.cpp:68-73)."""
        self._context_params = []

    # -- groups -----------------------------------------------------------------------------
    def new_group(self, name_ranks):
        """Register group ``(name, ranks)``; members create its communicator. Returns ``name``."""
        name, ranks = name_ranks
        ranks = [int(r) for r in ranks]
        if name in self._groups:
            raise ValueError(f"group {name!r} exists already with ranks {self._groups[name]}")
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise ValueError(f"group {name!r}: ranks {ranks} must be distinct and in [0, {self.size})")
        if self.rank in ranks:
            be = self._ready()

            def create():   # members agree on the list first: a mismatch would block in MPI
                check_group_lists(self._group_control, name, ranks, self.timeout,
                                  getattr(be, "spin", 2e-4), getattr(be, "poll_sleep", 5e-5))
                be.group(ranks)
            self._guarded(f"new_group {name!r}", create)
        self._groups[name] = ranks
        return name

    def list_groups(self):
        return {name: list(ranks) for name, ranks in self._groups.items()}

    def find_group(self, group):
        """The ranks of ``group``, or ``[]`` for an unknown name (as nnabla)."""
        return list(self._groups.get(group, []))

    def _group(self, group):
        """The backend group for ``group``, raising ValueError if this rank is not a member."""
        be = self._ready()
        if group not in self._groups:
            raise ValueError(f"unknown group {group!r}; known: {sorted(self._groups)}")
        ranks = self._groups[group]
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not a member of group {group!r} "
                             f"(ranks {ranks}); only members may call its collectives")
        return be.world_group if group == "world" else be.group(ranks)

    # -- helpers ----------------------------------------------------------------------------
    def _collective(self, group, signature, what, body, fold=False):
        """Check the call across ``group``, then run ``body`` (see ``_guarded``).

        ``fold``: when the group shares one host's memory (``group.sync``), the check is not a
        synchronisation of its own but rides on the call's first shared arrival
        (``Group.check_value``): ``body`` must start every exchange with ``_exchange``.
        """
        def checked():
            sync = getattr(group, "sync", None)
            if not self.check or not (fold and sync is not None):
                if self.check:
                    check_same_call(group.control, group.ranks, signature, self.timeout, what,
                                    sync=sync)
                return body()
            group.check_value = call_hash(signature) or 1
            self._checking = what   # names the call if _exchange's own check arrival waits
            try:
                result = body()
                self.backend.check_arrival(group, what)   # a call with nothing to exchange
            except CallMismatch:
                raise_mismatch(group.control, group.ranks, signature, what)
            finally:
                group.check_value = 0   # never carried into a later call
            return result
        return self._guarded(what, checked)

    def _exchange(self, name, plan, buf):
        """Run algorithm ``name`` on ``buf`` with ``plan``. A pending argument check (see
        ``_collective``) goes first, unless the algorithm's first synchronisation is the
        group's own shared arrival (a shared row over the whole group), which carries it."""
        if getattr(plan.world, "check_value", 0) and not (plan.shared and plan.row is plan.world):
            self.backend.check_arrival(plan.world, self._checking)
        get_algorithm(name)(self.backend, plan, buf)

    def _abort(self, code):
        if self.backend is not None:
            self.backend.abort(code)
        MPI.COMM_WORLD.Abort(code)

    def _guarded(self, what, body):
        """Run ``body``; abort the job if a peer is missing (CollectiveTimeout), has left its
        script (RankGone) or is dead (RankLost, also from an MPI error the death caused).
        ConcurrentCall when another thread is inside a collective (:mod:`.threads`)."""
        try:
            with self._one_caller.enter(what, self.rank):
                result = body()
        except (CollectiveTimeout, RankGone) as e:
            gone = getattr(e, "gone", [])
            names = self._host_names
            where = "".join(f" (rank {r} ran on {names[r]})" for r in gone if r < len(names))
            print(f"nnabla_torus: {e}{where}; aborting the job", file=sys.stderr, flush=True)
            self._abort(70)
            raise
        except RankLost as e:
            self._end_for_lost(e)
            raise
        except MPI.Exception as e:  # a blocking library call failed: was it a dead peer?
            lost = rank_lost(e, self.rank, what)
            if lost is None:
                raise
            self._end_for_lost(lost)
            raise lost from e
        # Open MPI's hierarchical all-reduce can return normally with a partial sum when a
        # peer died; a dead rank known now means the result cannot be trusted.
        lost = lost_ranks()
        if lost:
            self._end_for_lost(RankLost(self.rank, lost, what))
        return result

    def _end_for_lost(self, error):
        """Say which rank(s) died and where, let mpirun end the job, abort it if it does not.

        mpirun ends every process once it hears of the death (about 1 s) and names the dead
        rank; aborting at once would make mpirun name this survivor instead, and the peers of
        this survivor name it as lost. After LOST_GRACE_S (at most the timeout) abort anyway.
        """
        names = self._host_names
        where = ", ".join(f"rank {r} ran on {names[r]}" for r in error.lost if r < len(names))
        print(f"nnabla_torus: {error}; aborting"
              + (f" ({where}; mpirun reports how it ended)" if where else ""),
              file=sys.stderr, flush=True)
        time.sleep(min(LOST_GRACE_S, self.timeout))
        self._abort(70)

    def _buffer(self, dtype, count):
        """The fused workspace of ``dtype`` (allocated once, grown when a call needs more)."""
        dtype = np.dtype(dtype)
        buf = self._workspace.get(dtype)
        if buf is None or len(buf) < count:
            buf = self.backend.empty(dtype, max(count, 1))
            self._workspace[dtype] = buf
        return self.backend.sub(buf, 0, count)

    def _pack(self, arrays, buf):
        be, offset = self.backend, 0
        for a in arrays:
            be.copy(be.sub(buf, offset, offset + a.size), be.flat(a, write=False))
            offset += a.size

    def _unpack(self, buf, arrays):
        be, offset = self.backend, 0
        for a in arrays:
            be.copy(be.flat(a, write=True), be.sub(buf, offset, offset + a.size))
            offset += a.size

    @staticmethod
    def _as_list(data):
        arrays = list(data) if isinstance(data, (list, tuple)) else [data]
        for a in arrays:
            if not hasattr(a, "get_data"):
                raise TypeError(f"expected nnabla NdArray(s), got {type(a).__name__}")
        return arrays

    @staticmethod
    def _dtype(ndarray):
        """The NdArray's dtype; float32 (what nnabla allocates on the first write) when it has no
        storage yet: ``nn.NdArray(shape)``, or the gradient of a parameter backward never reached."""
        try:
            return np.dtype(ndarray.dtype)
        except RuntimeError:  # nnabla: "Array is not initialized"
            return np.dtype(np.float32)

    @classmethod
    def _signature(cls, arrays):
        return tuple((cls._dtype(a).name, tuple(a.shape)) for a in arrays)

    # -- collectives ------------------------------------------------------------------------
    def all_reduce(self, data, division=False, inplace=False, group="world"):
        """Sum (``division``: average) NdArray(s) over ``group``, in place.

        ``inplace=False`` packs all arrays into one fused buffer and reduces it once (fast);
        ``inplace=True`` reduces each array in its own storage.

        Zeroing rule (nnabla-ext-cuda v1.39.0 multi_process_data_parallel_communicator.cu:
        711-758): an array that is ``zero()``-ed and not written since on every member is left
        untouched and still marked zeroing (``NdArray.zeroing``), so nnabla's solvers skip its
        update and weight decay (nnabla src/nbla/solver.cpp); any other array is summed. The
        cross-rank decision costs no message of its own in the fused path (one slot per array
        rides in the fused buffer); ``inplace=True`` all-reduces one flag per array first.
        """
        self._all_reduce_call("all_reduce", self._as_list(data), division, inplace, group)

    def allreduce(self, division=False, inplace=False):
        """Deprecated in nnabla: all-reduce the gradients of the parameters of the first
        ``add_context_and_parameters`` over the world (nnabla communicator.pyx:177-192). As
        nnabla's (ext .cu:629-709) it has no zeroing rule: every gradient is summed."""
        if not self._context_params:
            raise RuntimeError(f"rank {self.rank}: allreduce() reduces the parameters given to "
                               f"add_context_and_parameters((ctx, params)); none were added")
        grads = [v.grad for v in self._context_params[0][1].values()]
        self._all_reduce_call("allreduce", grads, division, inplace, "world", zeroing_rule=False)

    def _runner(self, group, grp):
        """(run(buf), algorithm name) for a sum over ``group``: the world algorithm, else a ring."""
        if group == "world":
            return (self._run_auto if self.algorithm == AUTO else self._run_world), self.algorithm

        def run(buf):
            self._exchange("ring", Plan(grp, grp, None), buf)
        return run, "ring"

    def _all_reduce_call(self, op, arrays, division, inplace, group, zeroing_rule=True):
        grp = self._group(group)
        run, algorithm = self._runner(group, grp)
        what = f"{op} ({algorithm}, group {group!r})"
        # The algorithm, grid, wire format and pieces are part of the call: ranks that differ
        # in them would exchange mismatched messages.
        pieces = self.backend.pipeline_bytes if group == "world" and self.pipelined else None
        sig = (op, self._signature(arrays), bool(division), bool(inplace),
               self.track_sqnorms, algorithm,
               str(self.grid) if group == "world" else None, self.wire_fp16, pieces)
        self._collective(grp, sig, what, lambda: self._all_reduce(
            arrays, division, inplace, run, grp.size, zeroing_rule), fold=True)

    def _run_world(self, buf):
        self.algorithm_counts[self.algorithm] += 1
        self._exchange(self.algorithm, self._plan, buf)

    def _run_auto(self, buf):
        """One world all-reduce routed by its byte count (the same choice on every rank)."""
        name = self.auto_table.choose(buf.size * np.dtype(buf.dtype).itemsize)  # any backend
        self.algorithm_counts[name] += 1
        self._exchange(name, self._auto_plans[name], buf)

    def _modified_anywhere(self, arrays, run):
        """Per array: whether some rank wrote it since ``zero()`` (one flag all-reduce)."""
        import nnabla as nn
        flags = nn.NdArray.from_numpy_array(
            np.array([not a.zeroing for a in arrays], dtype=np.float32))
        run(self.backend.flat(flags))
        return (flags.get_data("r") > 0).tolist()

    def _all_reduce(self, arrays, division, inplace, run, p, zeroing_rule=True):
        be = self.backend
        track = self.track_sqnorms
        if p == 1:  # nothing to exchange: the sum and the average are the input itself
            if track:
                local = sum(be.sqnorm(be.flat(a, write=False)) for a in arrays)
                self._sqnorms[0] += local
                self._sqnorms[1] += local
            return
        if inplace:
            local = sum(be.sqnorm(be.flat(a, write=False)) for a in arrays) if track else 0.0
            if zeroing_rule and arrays:
                modified = self._modified_anywhere(arrays, run)
                arrays = [a for a, m in zip(arrays, modified) if m]
            for a in arrays:
                view = be.flat(a)
                before = division and prescaled(view.dtype)
                if before:
                    be.scale(view, 1.0 / p)
                run(view)
                if track:
                    self._sqnorms[1] += be.sqnorm(view) / (1 if before else p ** 2)
                if division and not before:
                    be.scale(view, 1.0 / p)   # integers: floor(sum / p), scale_numpy
            if track:
                self._sqnorms[0] += self._sum_scalar(local, run) / p
            return
        for wire, same in self._wire_groups(arrays):
            n = sum(a.size for a in same)
            # A float16 slot would round the sqnorm to 11 bits and overflow above 65504.
            inline = track and np.dtype(wire) != np.float16
            # One slot per array after the data: 1 where this rank wrote it since zero(); the
            # all-reduced slot is 0 exactly when the array is zeroing on every rank.
            flags = len(same) if zeroing_rule else 0
            zeroing = [a.zeroing for a in same] if flags else []  # before packing casts them
            buf = self._buffer(wire, be.padded_length(n + inline + flags, wire))
            self._pack(same, buf)
            data = be.sub(buf, 0, n)
            before = division and prescaled(wire)
            if track:
                local = be.sqnorm(data)
                if inline:
                    be.sub(buf, n, n + 1).fill(local)
            if flags:
                self._put(be.sub(buf, n + inline, n + inline + flags),
                          np.logical_not(zeroing).astype(wire))
            if before:
                be.scale(data, 1.0 / p)
            run(buf)
            if track:
                total = be.read(buf, n) if inline else self._sum_scalar(local, run)
                self._sqnorms[0] += total / p
                self._sqnorms[1] += be.sqnorm(data) / (1 if before else p ** 2)
            if division and not before:
                be.scale(data, 1.0 / p)
            self._unpack(buf, same)
            if flags:
                modified = self._get(be.sub(buf, n + inline, n + inline + flags))
                for a, m in zip(same, modified):
                    if not m:
                        a.zero()   # all zeros and no rank wrote it: zeroing again, as in nnabla

    def _put(self, dst, values):
        """Write numpy ``values`` into backend buffer ``dst`` (same dtype)."""
        import nnabla as nn
        self.backend.copy(dst, self.backend.flat(nn.NdArray.from_numpy_array(values), write=False))

    def _get(self, src):
        """A numpy copy of backend buffer ``src``."""
        import nnabla as nn
        out = nn.NdArray((src.size,))
        out.cast(np.dtype(src.dtype))
        self.backend.copy(self.backend.flat(out), src)
        return out.get_data("r").copy()

    def _wire_groups(self, arrays):
        """[(wire dtype, arrays)]: one fused buffer per wire dtype, in first-seen order.

        A list of float16 and float32 arrays goes in ONE float16 buffer (one collective), as
        nnabla's half communicator casts every array to half (``ndarray->cast(dtype, ctx_)`` in
        ext ``src/nbla/cuda/communicator/multi_process_data_parallel_communicator.cu``
        ~780-783): in FP16 training cuDNN leaves the batch-norm gradients float32 (``DRV_BN_T``
        in ext ``src/nbla/cuda/cudnn/function/generic/batch_normalization.cu`` ~411-421), and
        a bucket would otherwise need a tiny float32 collective beside its float16 one.
        ``wire_fp16`` sends float32-only lists as float16 too."""
        dtypes = [self._dtype(a) for a in arrays]
        half, single = np.dtype(np.float16), np.dtype(np.float32)
        mixed = half in dtypes and single in dtypes
        groups = {}
        for a, dtype in zip(arrays, dtypes):
            wire = half if dtype == single and (self.wire_fp16 or mixed) else dtype
            groups.setdefault(wire, []).append(a)
        return list(groups.items())

    def _sum_scalar(self, value, run):
        """Sum one float over the ranks with ``run`` in a float32 buffer; returns the sum."""
        total = self._buffer(np.float32, 1)
        total.fill(value)
        run(total)
        return self.backend.read(total, 0)

    def pop_sqnorms(self):
        """``(local_mean_sqnorm, global_sqnorm)`` summed over calls since the last pop.

        local_mean_sqnorm = (1/p) sum_i |x_i|^2 and global_sqnorm = |(1/p) sum_i x_i|^2, where
        x_i is rank i's input, whatever ``division`` was. Feed them to the noise-scale estimator.
        """
        values = tuple(self._sqnorms)
        self._sqnorms = [0.0, 0.0]
        return values

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
        arrays = self._as_list(data)
        grp = self._group(group)
        if not 0 <= src < grp.size:
            raise ValueError(f"bcast source {src} is not a position in group {group!r} of "
                             f"{grp.size} ranks {grp.ranks}; use 0..{grp.size - 1}")
        root, be = src, self.backend
        src = grp.ranks[root]  # the world rank that sends
        sig = ("bcast", self._signature(arrays), root, bool(inplace))

        def body():
            if inplace:
                for a in arrays:
                    be.bcast(grp, be.flat(a), root, f"bcast from rank {src}")
                return
            for dtype in dict.fromkeys(self._dtype(a) for a in arrays):
                same = [a for a in arrays if self._dtype(a) == dtype]
                buf = self._buffer(dtype, sum(a.size for a in same))
                if self.rank == src:
                    self._pack(same, buf)
                be.bcast(grp, buf, root, f"bcast from rank {src}")
                if self.rank != src:
                    self._unpack(buf, same)
        self._collective(grp, sig, f"bcast (group {group!r})", body)

    def reduce(self, data, dst, division=False, inplace=False, group="world"):
        """Sum (``division``: average) NdArray(s) over ``group`` into member ``dst`` only.

        As nnabla's (communicator.pyx:254-313; ext .cu:564-627): ``dst`` is a position in the
        group (the world rank for "world"), the other members' arrays are left as they were,
        and there is no zeroing rule. Here the sum runs with the group's all-reduce algorithm
        on a fused copy (every member receives it, only ``dst`` keeps it), so ``inplace``
        changes nothing but is accepted; nnabla v1.39's in-place reduce ignores ``group``,
        this one honours it.
        """
        arrays = self._as_list(data)
        grp = self._group(group)
        if isinstance(dst, bool) or not isinstance(dst, (int, np.integer)) \
                or not 0 <= dst < grp.size:
            raise ValueError(f"reduce destination {dst!r} is not a position in group {group!r} "
                             f"of {grp.size} ranks {grp.ranks}; use 0..{grp.size - 1}")
        run, algorithm = self._runner(group, grp)
        be, dst = self.backend, int(dst)
        sig = ("reduce", self._signature(arrays), dst, bool(division), bool(inplace), algorithm,
               str(self.grid) if group == "world" else None)

        def body():
            if grp.size == 1:
                return
            for dtype in dict.fromkeys(self._dtype(a) for a in arrays):
                same = [a for a in arrays if self._dtype(a) == dtype]
                n = sum(a.size for a in same)
                buf = self._buffer(dtype, be.padded_length(n))
                self._pack(same, buf)
                run(buf)
                if grp.rank == dst:
                    if division:
                        be.scale(be.sub(buf, 0, n), 1.0 / grp.size)
                    self._unpack(buf, same)
        self._collective(grp, sig, f"reduce to {dst} ({algorithm}, group {group!r})", body,
                         fold=True)

    def all_reduce_callback(self, data, pack_size, division=False, group="world",
                            scale_grad=1, keep_dtype=False):
        """A callback for ``loss.backward(communicator_callbacks=...)`` that all-reduces the
        gradients ``data`` (NdArray or list) in packs of ``pack_size`` elements while backward
        runs, each gradient first multiplied by ``scale_grad`` (nnabla communicator.pyx:471-536;
        ext .cu:953-1118).

        NCCL backend: nnabla's own C++ callback from the communicator the backend holds
        (group mapped to the backend's group), which nnabla's backward accepts as it is.
        Other backends: a Python callback (``nnabla_torus.comm.backward_callback``); nnabla's
        backward accepts only C++ callbacks, so creating a communicator installs, once per
        process, a ``Variable.backward`` that runs Python callbacks through
        ``function_post_hook`` and hands everything else to nnabla's own backward unchanged.
        """
        from . import backward_callback
        arrays = self._as_list(data)
        grp = self._group(group)
        if not isinstance(pack_size, (int, np.integer)) or isinstance(pack_size, bool) \
                or pack_size < 1:
            raise ValueError(f"all_reduce_callback: pack_size={pack_size!r} must be an integer "
                             f">= 1 (elements per pack, e.g. 2 * 1024 * 1024)")
        native = getattr(self.backend, "all_reduce_callback", None)
        if native is not None:
            callback = native(arrays, int(pack_size), bool(division), grp, float(scale_grad),
                              bool(keep_dtype), half=self._half())
        else:
            dtype = None if keep_dtype else np.float16 if self._half() else np.float32
            callback = backward_callback.AllReduceCallback(
                self, arrays, int(pack_size), bool(division), group, float(scale_grad), dtype)
        if not backward_callback.is_native(callback):
            backward_callback.require()
        return callback

    def native_communicator(self, group="world"):
        """(nnabla's own C++ communicator, its name for ``group``) on the NCCL backend, for
        nnabla's kernels that take a communicator (sync_batch_normalization); None on other
        backends. Its type follows the context's type_config (half or float)."""
        if self._ready() and self._backend_name != "nccl":
            return None
        return self.backend.nnabla_communicator(self._half()), self._group(group).name

    def _half(self):
        """Whether the user's context asks for half precision (nnabla's communicator type T)."""
        return self.ctx is not None and any(b.endswith(":half") for b in self.ctx.backend)

    def all_gather(self, ndarray, ndarray_list, group="world"):
        """``ndarray_list[i]`` receives member i's ``ndarray`` (group order)."""
        grp = self._group(group)
        outs = self._as_list(ndarray_list)
        be, n = self.backend, ndarray.size
        # The list's shapes join the cross-rank check, so a wrong list fails on every rank.
        sig = ("all_gather", self._signature([ndarray]), tuple(tuple(o.shape) for o in outs))

        def body():
            if len(outs) != grp.size or any(tuple(o.shape) != tuple(ndarray.shape) for o in outs):
                raise ValueError(f"all_gather needs {grp.size} arrays of shape "
                                 f"{tuple(ndarray.shape)} in ndarray_list, got "
                                 f"{[tuple(o.shape) for o in outs]}")
            buf = self._buffer(self._dtype(ndarray), n * grp.size)
            be.all_gather_into(grp, be.flat(ndarray, write=False), buf, f"all_gather ({group!r})")
            self._unpack(buf, outs)
        self._collective(grp, sig, f"all_gather (group {group!r})", body)

    def reduce_scatter(self, ndarray_list, ndarray, division=False, group="world"):
        """``ndarray`` receives the sum over members of their ``ndarray_list[my position]``."""
        grp = self._group(group)
        ins = self._as_list(ndarray_list)
        be, n = self.backend, ndarray.size
        sig = ("reduce_scatter", self._signature(ins), tuple(ndarray.shape), bool(division))

        def body():
            if len(ins) != grp.size or any(tuple(i.shape) != tuple(ndarray.shape) for i in ins):
                raise ValueError(f"reduce_scatter needs {grp.size} arrays of shape "
                                 f"{tuple(ndarray.shape)} in ndarray_list, got "
                                 f"{[tuple(i.shape) for i in ins]}")
            # The inputs' dtype: an output made with nn.NdArray(shape) has none until written.
            buf = self._buffer(self._dtype(ins[0]), n * grp.size)
            self._pack(ins, buf)
            shard = be.reduce_scatter(grp, buf, f"reduce_scatter ({group!r})")
            if division:
                be.scale(shard, 1.0 / grp.size)
            be.copy(be.flat(ndarray, write=True), shard)
        self._collective(grp, sig, f"reduce_scatter (group {group!r})", body)

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
        self._guarded("barrier", self._ready().barrier)

    def abort(self):
        self._ready().abort(1)


def default_algorithm(backend, hosts, grid_request=None):
    """The algorithm when none was asked for: torus2d on MPI (unchanged); on NCCL the torus
    only where it pays, over several hosts that hold consecutive ranks (rows inside a host on
    NVLink, columns across hosts; or an explicit grid), else NCCL's own all-reduce: on one
    host torus2d would be NCCL's reduce-scatter + all-gather over the world, with ~6n extra
    device bytes of nnabla's list copies, never faster than its all-reduce."""
    if backend == "mpi" or grid_request:
        return DEFAULTS["algorithm"]
    several = len(hosts.hosts) > 1 and hosts.is_blocked() and (hosts.ranks_per_host or 0) > 1
    return "torus2d" if several else "native"


def prescaled(dtype):
    """Whether an average (``division=True``) of ``dtype`` scales each rank's input by 1/p
    before the sum (float16, as NCCL's ``ncclAvg`` that nnabla's ``division=True`` uses: a
    pre-multiplied sum for floating types, ext ``multi_process_data_parallel_communicator.cu``
    ~790-792): a sum of p float16 inputs overflows 65504 p times sooner than their mean. Other
    dtypes divide the finished sum (exact for integers; one rounding for float32)."""
    return np.dtype(dtype) == np.float16


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
