"""Training recipes: where the shipped ones are, how a name is found, how a file is read.

A recipe is a YAML file of training knobs with provenance tags (:mod:`.provenance`). The
published runs (``sony-224s``, ``sony-122s``) and the ImageNet example's recipes ship in
``recipes/`` beside this module (package data, so an installed wheel has them too). One lookup
rule for every reader (``examples/imagenet/config.py`` for training, :mod:`.run_forecast`
for ``nnabla-torus-plan --recipe``): a bare name is a shipped recipe, anything with a path
separator or a ``.yaml`` / ``.yml`` suffix is a path. Example::

    values, path = read_recipe("sony-224s")     # values["batch_schedule"] == "0:34816,5:69632"
"""
import os

import yaml

from .provenance import load_tagged

RECIPE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")


def shipped_recipes():
    """Names of the recipes in RECIPE_DIR, sorted."""
    return sorted(f[:-5] for f in os.listdir(RECIPE_DIR) if f.endswith(".yaml"))


def recipe_path(name):
    """The file of recipe ``name`` (a shipped name or a path); ValueError naming the shipped
    ones when there is none."""
    path = name if os.path.sep in name or name.endswith((".yaml", ".yml")) else \
        os.path.join(RECIPE_DIR, name + ".yaml")
    if not os.path.isfile(path):
        raise ValueError(f"recipe {name!r} not found (looked for {path}); "
                         f"use one of {shipped_recipes()} or a path to a YAML file")
    return path


def read_recipe(name):
    """(values, path) of recipe ``name``: its tagged YAML as a dict.

    ValueError names the file and line of invalid YAML, and refuses a published tag without
    a known source (:func:`.provenance.load_tagged`).
    """
    path = recipe_path(name)
    with open(path) as f:
        try:
            values, _ = load_tagged(f, f"recipe {path}")
        except yaml.YAMLError as e:
            mark, start = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else path
            context = f", {e.context} at line {start.line + 1}" if start and e.context else ""
            raise ValueError(f"recipe {where}: not valid YAML ({getattr(e, 'problem', None) or e}"
                             f"{context}); write one 'key: value' per line") from None
    return values, path
