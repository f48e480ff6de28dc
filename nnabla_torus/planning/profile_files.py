"""Profile files: the shipped profiles' folder and names, reading a profile file, writing one.

Shipped profiles live in ``nnabla_torus/planning/profiles/`` and are named without their
extension (``abci``, ``cpu-2core``); any other profile is a YAML (or JSON) file by its path.
"""
import json
import os

import yaml

from ..files import atomic_open
from . import safe_yaml
from .profile_schema import profile_to_dict

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")


# GPU model (a substring of the name nvidia-smi prints) -> the shipped profile whose per-GPU
# compute and device memory speed describe it; also the choices of --gpu-model.
GPU_PROFILES = {"v100": "abci", "a100": "dgx-a100", "h100": "dgx-h100", "h200": "dgx-h200"}


def gpu_profiles_text():
    """GPU_PROFILES as help texts and docs print it: ``V100: abci, A100: dgx-a100, ...``."""
    return ", ".join(f"{model.upper()}: {profile}" for model, profile in GPU_PROFILES.items())


def list_profiles():
    """Names of the shipped profiles."""
    return sorted(os.path.splitext(f)[0] for f in os.listdir(PROFILE_DIR)
                  if f.endswith((".yaml", ".yml", ".json")))


def read_profile_file(name_or_path):
    """(path, parsed file) of a shipped profile name (``abci``) or a profile file path."""
    path = name_or_path
    if not os.path.exists(path):
        candidates = [os.path.join(PROFILE_DIR, name_or_path + ext)
                      for ext in (".yaml", ".yml", ".json")]
        path = next((c for c in candidates if os.path.exists(c)), None)
        if path is None:
            raise ValueError(f"no profile file or shipped profile {name_or_path!r}; "
                             f"shipped: {list_profiles()}")
    try:
        with open(path) as f:
            raw = json.load(f) if path.endswith(".json") else safe_yaml.load(f)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:   # a folder, no
        # permission, not text, malformed JSON (a ValueError) or YAML
        why = e.strerror if isinstance(e, OSError) and e.strerror else \
            " ".join(str(e).split())
        raise ValueError(f"profile {name_or_path!r}: cannot read {path}: {why}; give a profile "
                         f"file (YAML or JSON) or a shipped name: {list_profiles()}") from None
    if raw is None:
        raise ValueError(f"{path}: the file is empty")
    return path, raw


def save_profile(prof, path, header=""):
    """Write ``prof`` as YAML (``header`` lines are written first as comments)."""
    with atomic_open(path, "w") as f:
        for line in header.splitlines():
            f.write(f"# {line}\n")
        yaml.safe_dump(profile_to_dict(prof), f, sort_keys=False)
