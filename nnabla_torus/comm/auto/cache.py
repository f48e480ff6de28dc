"""auto's measured table, kept on disk so a machine measures it once.

One JSON file per key under the cache folder (``NNABLA_TORUS_CACHE_DIR``, default
``~/.cache/nnabla_torus``), named by a hash of the key and holding the key beside the table.
The key is what the table depends on: rank 0's host name and the number of hosts, the world
size and ranks per host, the MPI library and its version (``MPI.Get_library_version()``,
first line), the mpi4py and nnabla_torus versions, the backend and auto's candidates. Any
change (another machine, an upgraded library) gives another file, so the old table is never
used for it. Only rank 0 reads and writes; the communicator broadcasts what it read. A file
that cannot be read, parsed or written, or whose table is damaged (an unknown algorithm,
bounds not ascending byte counts, not one algorithm more than bounds: ``table_problem``), is a
one-line warning and a fresh measurement.
"""
import hashlib
import json
import os

from mpi4py import MPI

from ...files import atomic_open
from ..job_log import WARNING, note
from . import package_version
from ..collectives import ALGORITHMS
from .table import Table, table_problem


def cache_key(comm, candidates):
    """The dict a cached table must match exactly (see the module docstring)."""
    import mpi4py

    return {"host": comm._host_names[0] if comm._host_names else MPI.Get_processor_name(),
            "hosts": len(comm.hosts.hosts), "ranks": comm.size,
            "ranks_per_host": comm.hosts.ranks_per_host or 0,
            "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
            "mpi4py": mpi4py.__version__, "nnabla_torus": package_version(),
            "backend": comm.settings.backend, "candidates": list(candidates)}


def cache_path(folder, key):
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser(folder), f"auto-table-{digest}.json")


def load(folder, key):
    """The cached Table for ``key``, or None (no file, another key, or a bad file: warned)."""
    path = cache_path(folder, key)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
        if saved["key"] != key:
            return None
        bounds, names = saved["bounds"], saved["names"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        note(f"auto: ignoring the unreadable cached table {path} ({e}); measuring again", WARNING)
        return None
    problem = table_problem(bounds, names, ALGORITHMS)
    if problem:           # a damaged file would end the job at its first all-reduce
        note(f"auto: ignoring the damaged cached table {path} ({problem}); measuring again",
             WARNING)
        return None
    return Table(bounds, names, f"cached in {path}")


def save(folder, key, table):
    """Write ``table`` for ``key`` (atomically: a temporary file renamed); a failure warns."""
    path = cache_path(folder, key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_open(path, "w") as f:
            json.dump({"key": key, "bounds": table.bounds, "names": table.names}, f, indent=1)
        return path
    except OSError as e:
        note(f"auto: could not cache the measured table in {path} ({e}); the next job "
             f"measures again (set NNABLA_TORUS_CACHE_DIR to a writable folder)", WARNING)
        return None
