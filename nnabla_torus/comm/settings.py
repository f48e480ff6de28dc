"""The communicator's settings: one typed object, each knob's environment twin and default.

Every ``NNABLA_TORUS_*`` knob the communicator and the MPI backend read is a field of
``CommSettings``; its environment variable, default and parser are the field's ``Knob``. A
keyword argument wins over the environment, the environment over the default. Values are
checked here, when the communicator is made, and ``agreement()`` is what ``init()`` compares
across ranks. What each knob means: the README's "Knobs" table (tests/unit/test_docs.py checks
its names and defaults against ``KNOBS``).
"""
from dataclasses import dataclass, field, fields

from ..knobs import TIMEOUT_MAX_S, env_value, knob_value, number, parse_bool
from . import auto, topology
from .collectives import DEFAULT_ALGORITHM, PIPELINE_BYTES, check_backend, get_algorithm

# The longest sleep between two polls of a wait, seconds: every wait (each ring step of every
# collective) may sleep this long once more after its data arrived, so 10 ms already costs a
# 100-step ring up to a second (the reports: POLL_SLEEP_S=10 stalled > 90 s).
POLL_SLEEP_MAX_S = 0.01


@dataclass(frozen=True)
class Knob:
    """A setting's environment variable, default (None: decided at run time, the README says
    how) and parser; ``agreed``: compared across ranks by ``init()``; ``mpi``: read only by the
    MPI backend."""
    env: str
    default: object
    parse: object = str
    agreed: bool = True
    mpi: bool = False


def knob(env, default, parse=str, agreed=True, mpi=False):
    return field(default=None, metadata={"knob": Knob(env, default, parse, agreed, mpi)})


@dataclass
class CommSettings:
    """The communicator's settings, in the order ``init()`` compares them across ranks.

    Units: seconds (``timeout``, ``spin``, ``poll_sleep``), bytes (``*_bytes``). The MPI
    backend's fields are None on other backends. Make it with ``CommSettings.resolve``.
    """
    backend: str = knob("NNABLA_TORUS_BACKEND", None)   # nccl for a CUDA context, else mpi
    algorithm: str = knob("NNABLA_TORUS_ALGORITHM", DEFAULT_ALGORITHM)
    grid: object = knob("NNABLA_TORUS_GRID", None, topology.parse_grid)  # None: default grid
    timeout: float = knob("NNABLA_TORUS_TIMEOUT", 300.0, number(
        float, low=0, strict=True, high=TIMEOUT_MAX_S, hint="seconds, e.g. 300; 86400 for a day"))
    wire_fp16: bool = knob("NNABLA_TORUS_WIRE_FP16", False, bool)
    check: bool = knob("NNABLA_TORUS_CHECK", True, bool)
    ranks_per_host: int = knob("NNABLA_TORUS_RANKS_PER_HOST", None, number(
        int, low=1, hint="ranks per host; unset it to group ranks by host name"))
    auto_profile: str = knob("NNABLA_TORUS_AUTO_PROFILE", "")
    cache_dir: str = knob("NNABLA_TORUS_CACHE_DIR", "~/.cache/nnabla_torus", agreed=False)
    bind_gpu_numa: bool = knob("NNABLA_TORUS_BIND_GPU_NUMA", True, parse_bool)  # nccl only
    shm: bool = knob("NNABLA_TORUS_SHM", True, parse_bool, mpi=True)
    shm_bytes: int = knob("NNABLA_TORUS_SHM_BYTES", 32 << 20, number(
        int, low=1, hint="bytes per member and shared piece, e.g. 33554432"), mpi=True)
    segment_bytes: int = knob("NNABLA_TORUS_SEGMENT_BYTES", 4 << 20, number(
        int, low=1, hint="bytes per ring message, e.g. 4194304"), mpi=True)
    pipeline_bytes: int = knob("NNABLA_TORUS_PIPELINE_BYTES", PIPELINE_BYTES, number(
        int, low=0, hint="bytes per torus piece; 0: no pieces"), mpi=True)
    spin: float = knob("NNABLA_TORUS_SPIN_S", 2e-4, number(
        float, low=0, hint="seconds, e.g. 0.0002"), agreed=False, mpi=True)
    poll_sleep: float = knob("NNABLA_TORUS_POLL_SLEEP_S", 5e-5, number(
        float, low=0, high=POLL_SLEEP_MAX_S,
        hint="seconds a waiting rank sleeps per poll, e.g. 0.00005; 0: yield only"),
        agreed=False, mpi=True)
    profile: object = field(default=None, compare=False, repr=False)  # auto.load_profile()
    # Whether a keyword argument or the environment named the algorithm; else init() chooses
    # one for the backend and the hosts (grid_layouts.default_algorithm).
    algorithm_asked: bool = field(default=True, compare=False)

    @classmethod
    def resolve(cls, ctx=None, algorithm=None, grid=None, backend=None, timeout=None,
                wire_fp16=None, check=None, auto_profile=None, bind_gpu_numa=None, *,
                backend_names):
        """The settings from keyword arguments, else the environment, else the defaults; a
        ValueError names the knob, the value and the allowed range (checked in this order).
        ``backend_names``: the registered backends (``backends.names()``, handed in from above:
        the backends read these settings)."""
        asked = algorithm or env_value(KNOBS["algorithm"].env)
        algorithm = asked or KNOBS["algorithm"].default
        get_algorithm(algorithm, allow_auto=True)  # fail early on a typo
        auto_profile = auto_profile or env_value(KNOBS["auto_profile"].env, "")
        profile = auto.load_profile(auto_profile) if auto_profile else None  # bad name: fails
        grid = grid or env_value(KNOBS["grid"].env)
        if isinstance(grid, str):
            grid = KNOBS["grid"].parse(grid)
        cuda = ctx is not None and any("cuda" in b for b in getattr(ctx, "backend", []))
        backend = backend or env_value(KNOBS["backend"].env, "nccl" if cuda else "mpi")
        if backend not in backend_names:
            raise ValueError(f"unknown backend {backend!r}; choose one of "
                             f"{', '.join(backend_names)} (NNABLA_TORUS_BACKEND or backend=)")
        check_backend(algorithm, backend)
        timeout = _keyword_or_env("timeout", timeout)
        wire_fp16 = _flag("wire_fp16", wire_fp16)
        check = _flag("check", check)
        per_host = env_value(KNOBS["ranks_per_host"].env, None, KNOBS["ranks_per_host"].parse)
        cache_dir = env_value(KNOBS["cache_dir"].env, KNOBS["cache_dir"].default)
        bind_gpu_numa = _keyword_or_env("bind_gpu_numa", bind_gpu_numa)
        backend_knobs = mpi_settings() if backend == "mpi" else {}
        return cls(backend, algorithm, grid, timeout, wire_fp16, check, per_host, auto_profile,
                   cache_dir, bind_gpu_numa, profile=profile, algorithm_asked=bool(asked),
                   **backend_knobs)

    def agreement(self):
        """((name, value), ...) that must be the same on every rank (the MPI backend's only on
        it, and not how long a rank spins or sleeps)."""
        pairs = []
        for f in fields(self):
            spec = f.metadata.get("knob")
            if spec is None or not spec.agreed or (spec.mpi and self.backend != "mpi"):
                continue
            value = getattr(self, f.name)
            pairs.append((f.name, (str(value) if value else None) if f.name == "grid" else value))
        return tuple(pairs)

    def mpi_knobs(self):
        """The MPI backend's keyword arguments."""
        return {name: getattr(self, name) for name, spec in KNOBS.items() if spec.mpi}


KNOBS = {f.name: f.metadata["knob"] for f in fields(CommSettings) if "knob" in f.metadata}
DEFAULTS = {name: spec.default for name, spec in KNOBS.items()}  # by keyword name


def _keyword_or_env(name, value):
    spec = KNOBS[name]
    return knob_value(value, name, spec.env, spec.default, spec.parse)


def _flag(name, value):
    """A boolean: the keyword argument's truth value, else the environment (1/0, true/false)."""
    spec = KNOBS[name]
    return bool(value if value is not None else env_value(spec.env, spec.default, bool))


def mpi_settings(segment_bytes=None, pipeline_bytes=None, spin=None, poll_sleep=None, shm=None,
                 shm_bytes=None):
    """The MPI backend's knobs (keyword argument, else environment, else default), validated."""
    given = dict(shm=shm, shm_bytes=shm_bytes, segment_bytes=segment_bytes,
                 pipeline_bytes=pipeline_bytes, spin=spin, poll_sleep=poll_sleep)
    return {name: _keyword_or_env(name, value) for name, value in given.items()}


def differences(calls, ranks=None):
    """The settings that differ across ranks, one line each: value on rank(s) [...].

    ``calls``: one sequence of (name, value) pairs per rank (``ranks[i]``, default ``i``); a
    name a rank does not have (one rank with another backend has other backend knobs) is shown
    as "unset" there."""
    ranks = list(range(len(calls))) if ranks is None else ranks
    settings = [dict(call) for call in calls]
    names = list(dict.fromkeys(name for call in calls for name, _ in call))
    lines = []
    for name in names:
        by_value = {}
        for rank, setting in zip(ranks, settings):
            value = repr(setting[name]) if name in setting else "unset"
            by_value.setdefault(value, []).append(rank)
        if len(by_value) > 1:
            lines.append(f"  {name}: " + "; ".join(f"{value} on rank(s) {ranks}"
                                                   for value, ranks in by_value.items()))
    return lines
