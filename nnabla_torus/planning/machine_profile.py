"""Which cluster profile a tool uses, and loading it: the default-profile rule, --profile and
:func:`load_profile`.

A profile holds hosts, links and per-model compute coefficients for the cost model. Its keys and
their checks are in profile_schema, reading and writing its file in profile_files, reshaping it
by --hosts and the like in profile_reshape; tools and tests import all of them from here. Every
key, with its unit, is in docs/costmodel.md#cluster-profiles. Example::

    >>> prof = load_profile("abci")
    >>> prof.network.gpus_per_host, sorted(prof.models)
    (4, ['resnet50'])
"""
import subprocess

from ..knobs import add_knob
# What importers use from here is imported from the modules that hold it (noqa: re-exports).
from .profile_files import (GPU_PROFILES, PROFILE_DIR, gpu_profiles_text,  # noqa: F401
                            list_profiles, read_profile_file, save_profile)
from .profile_reshape import SHAPE_ENVS, Shape, add_shape_knobs, reshape, shape_of  # noqa: F401
from .profile_schema import (RUN_KEYS, Profile, model_of, profile_from_dict,  # noqa: F401
                             profile_to_dict)

PROFILE_ENV = "NNABLA_TORUS_PROFILE"   # the --profile twin of every tool and of train.py
CPU_PROFILE = "cpu-2core"
GPU_FALLBACK = "abci"


def local_gpu_name():
    """The first GPU's name from ``nvidia-smi`` ('' when there is none or no driver)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and \
        out.stdout.strip() else ""


def default_profile(gpus, gpu_name=None):
    """The name :func:`profile_rule` picks.

    >>> default_profile(gpus=False)
    'cpu-2core'
    """
    return profile_rule(gpus, gpu_name)[0]


def profile_rule(gpus, gpu_name=None):
    """The one default-profile rule of nnabla-torus-plan, nnabla-torus-run and train.py, when
    neither --profile nor NNABLA_TORUS_PROFILE names one: (profile name, why).

    1. a CPU job: ``cpu-2core`` (calibrated on a 2-core machine);
    2. a GPU job on a GPU of :data:`GPU_PROFILES` (``gpu_name``, else nvidia-smi's first GPU):
       that GPU's profile (:func:`gpu_profiles_text` lists them);
    3. any other GPU job (no GPU seen here, e.g. planning from a laptop, or another model):
       ``abci``, the paper's V100 cluster; the reason says how to describe yours.

    nnabla-torus-plan plans GPU jobs; nnabla-torus-run's job is a GPU job when this host has
    a GPU; train.py's when its context is not cpu.

    >>> profile_rule(gpus=False)[0], profile_rule(True, "NVIDIA A100-SXM4-80GB")[0]
    ('cpu-2core', 'dgx-a100')
    """
    describe = ("describe your cluster with --profile FILE (tools/calibrate.py writes one), or "
                "reshape a shipped profile with --hosts N --gpus-per-host G "
                "[--inter-bandwidth GBps] [--gpu-model " + "|".join(GPU_PROFILES) + "]")
    if not gpus:
        return CPU_PROFILE, "the default for CPU jobs"
    name = local_gpu_name() if gpu_name is None else gpu_name
    for model, profile in GPU_PROFILES.items():
        if model in name.lower():
            return profile, (f"the default for a GPU job on {name} ({model.upper()} class); "
                            f"{describe}")
    seen = f"an unknown GPU ({name})" if name else "no GPU seen on this host"
    return GPU_FALLBACK, (f"the default for GPU jobs ({seen}: ABCI's V100 nodes as in the "
                          f"paper); {describe}")


def add_profile_knob(parser, help):
    """Add ``--profile`` (env NNABLA_TORUS_PROFILE; default: :func:`profile_rule`,
    resolved by :func:`resolve_profile`)."""
    return add_knob(parser, "--profile", PROFILE_ENV, None,
                    help + "; None: cpu-2core for CPU jobs, the profile of this host's GPU "
                    f"for GPU jobs ({gpu_profiles_text()}), else abci")


def resolve_profile(given, gpus, gpu_name=None):
    """(profile name or path, why): ``given`` (--profile or NNABLA_TORUS_PROFILE) or the rule."""
    if given:
        return given, "named by --profile / NNABLA_TORUS_PROFILE"
    return profile_rule(gpus, gpu_name)


def load_profile(name_or_path, shape=None):
    """Load a shipped profile by name (``abci``) or any profile file by path, reshaped by
    ``shape`` (a :data:`Shape`, e.g. from the --hosts/--gpus-per-host flags; None: as written).
    What the reshape changed is in ``extra["shape"]`` (lines for the plan)."""
    path, raw = read_profile_file(name_or_path)
    notes = []
    try:
        if not isinstance(raw, dict):
            raise ValueError(f"a profile is a mapping of keys (name, hosts, links, models, "
                             f"...), not a {type(raw).__name__}")
        prof = profile_from_dict(raw)            # the file as written: its own errors first
        if shape is not None and any(v is not None for v in shape):
            raw, notes = reshape(raw, shape)
            prof = profile_from_dict(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: {e}") from None
    prof.extra["shape"] = notes
    return prof
