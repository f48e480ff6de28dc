"""``algorithm="auto"`` inside the communicator: its candidates, and the table of size ranges
it fixes at the first ``set_algorithm("auto")`` (from a profile, else measured at once), the
same on every rank. The table itself and its rules: :mod:`.table`.
"""
import numpy as np
from mpi4py import MPI

from ..backends import synchronize
from ..collectives import REGISTRY, run_algorithm
from ..guarded_calls import collective
from ..job_log import WARNING, note
from . import cache as auto_cache
from . import table as size_table


def candidates(hosts, backend):
    """auto's algorithms: the library's (auto's baseline), then each one whose registry entry
    lets auto pick it on ``hosts`` and runs on ``backend`` (its name): the torus, and
    hierarchical on several hosts."""
    return ["native"] + [name for name, entry in REGISTRY.items() if entry.auto
                         and entry.auto(hosts) and (backend == "mpi" or not entry.mpi_only)]


def fix_table(comm):
    """auto's size ranges, computed on rank 0 (profile, else measured) and broadcast:
    identical on every rank by construction."""
    names = candidates(comm.hosts, comm.settings.backend)
    source, profile = comm.auto_profile, comm.settings.profile
    per_host = comm.hosts.ranks_per_host or comm.size
    saved = profile.calibrated_table(comm.size, per_host) if source else None
    if saved and set(saved[1]) <= set(names):   # measured by tools/calibrate.py
        table = size_table.Table(*saved, f"profile {source}, measured by calibrate")
        note(f"auto ({table.source}, {comm.size} ranks): {table.describe()}")
        return table
    if source and profile.missing_terms(names):
        note(f"auto: profile {source!r} has no software term for "
             f"{profile.missing_terms(names)}; measuring the size ranges instead", WARNING)
        source = ""
    if comm.size == 1:   # nothing is exchanged: nothing to measure
        return size_table.Table([], ["native"], "one rank")
    if source:
        times = profile.predicted_times(names, comm.size, per_host, comm.grid.x,
                                        size_table.SIZES) if comm.rank == 0 else None
        name = f"profile {source}"
    else:
        table = cached_table(comm, names)
        if table is not None:
            return table
        times = measure(comm, names)
        name = "measured at init"
    table = (size_table.table_from_times(size_table.SIZES, times, name) if comm.rank == 0
             else None)
    if comm.rank == 0 and not source:
        auto_cache.save(comm.settings.cache_dir, auto_cache.cache_key(comm, names), table)
    table = MPI.COMM_WORLD.bcast(table, root=0)
    note(f"auto ({name}, {comm.size} ranks): {table.describe()}")
    return table


def cached_table(comm, names):
    """The table rank 0 finds in the cache, on every rank (None on every rank: measure; the
    measurement is announced in one line)."""
    folder = comm.settings.cache_dir
    table, path = None, None
    if comm.rank == 0:
        key = auto_cache.cache_key(comm, names)
        table, path = auto_cache.load(folder, key), auto_cache.cache_path(folder, key)
    table, path = MPI.COMM_WORLD.bcast((table, path), root=0)
    if table is None:
        note(f"auto: measuring its size ranges once for this machine and MPI library "
             f"({comm.size} ranks, ~1 s); the table is cached in {path}")
    else:
        note(f"auto ({table.source}, {comm.size} ranks): {table.describe()}")
    return table


def measure(comm, names):
    """Time the algorithms ``names`` at size_table.SIZES on scratch buffers (collective), each
    call with its argument check as a user's call has it (folded into shared arrivals or not)."""
    world = MPI.COMM_WORLD

    def call_one(name, nbytes):
        buf = comm.workspace.buffer(comm.backend, np.float32, nbytes // 4)
        buf.fill(1.0)
        collective(comm, comm.backend.world_group, ("auto measurement", name, nbytes),
                   f"auto measurement ({name})",
                   lambda: run_algorithm(comm.backend, name, comm.auto_routes[name], buf,
                                         comm._checking), fold=True)
        synchronize(comm)   # NCCL calls return before their kernels end

    return size_table.measure(call_one, names, timer=comm.auto_timer,
                              slowest=lambda t: world.allreduce(t, op=MPI.MAX))
