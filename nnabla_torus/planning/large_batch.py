"""How large a global batch a model is known to train with, and where the planner's
statistical efficiency comes from.

Without a gradient noise scale the planner's statistical efficiency is 1 at every batch, so the
largest batch that fits looks best (ABCI: 4,312 GPUs at batch 1,103,872, which nobody has
trained). For a model whose large-batch behaviour is published, the planner instead keeps the
global batch at or below the largest batch published runs trained to their usual accuracy
(statistical efficiency 1 up to it, 0 beyond) and says so; for other models it says that no
statistical limit is known. A noise scale (given, or measured by the run) replaces both.

The published runs, their batches, top-1 and sources are one table,
:data:`nnabla_torus.planning.published.PUBLISHED` (shared with the batch-size controller's
prior): the default cap is the largest batch published at the usual top-1 (Jia et al.'s
65,536 at 75.8 %); up to 81,920 has reached ~75 % with LARS and careful tuning.

    >>> limit = published_limit("resnet50")
    >>> limit.max_batch
    65536
"""
from collections import namedtuple

from . import published

Limit = namedtuple("Limit", [
    "max_batch",   # the default cap: largest global batch planned without a noise scale
    "largest",     # the largest published batch that trained to about the usual accuracy
    "source",      # the runs, for the plan's line
])


def published_limit(model):
    """The published Limit of ``model`` (the full-width network: ``resnet50`` or
    ``resnet50-w1-224px``), or None when no statistical limit is known."""
    arch, _, variant = model.partition("-")
    if variant and not variant.startswith("w1-"):
        return None
    default = published.largest_trained_batch(arch)
    if default is None:
        return None
    largest = published.largest_trained_batch(arch, min_top1=0.0)
    runs = ", ".join(f"{published.AUTHORS[p.source]} {p.batch:,} ({p.top1:.2%})"
                     for p in sorted(published.published_batches(arch), key=lambda p: p.batch))
    return Limit(default.batch, largest.batch,
                 f"{arch}/ImageNet published runs: {runs}; default {default.batch:,}, the "
                 f"largest at >= {published.USUAL_TOP1:.1%} top-1")


StatSource = namedtuple("StatSource", [
    "max_batch",   # largest global batch to plan (None: no cap)
    "kind",        # "measured noise scale", "given noise scale", "published default", "none"
    "line",        # one line for the plan: the source and what it means
])


def efficiency_source(model, noise_scale=None, measured=False, batch_fixed=False):
    """The StatSource of a plan of ``model``: the noise scale when there is one (``measured``
    by the run, else given), else the published limit (:func:`published_limit`) (not when
    ``batch_fixed``: the user set the global batch), else none."""
    if noise_scale is not None:
        kind = "measured noise scale" if measured else "given noise scale"
        return StatSource(None, kind, f"statistical efficiency: {kind}, B_noise = "
                          f"{noise_scale:g} samples")
    limit = published_limit(model)
    if batch_fixed:
        above = "" if limit is None else (f"; the default cap for {model} would be "
                                          f"{limit.max_batch:,} (published runs reached ~75 % "
                                          f"top-1 up to {limit.largest:,})")
        return StatSource(None, "none", "statistical efficiency: none (1): the global batch is "
                          "set by --batch/--schedule" + above)
    if limit is None:
        return StatSource(None, "none", f"statistical efficiency: none known for {model} (1 at "
                          f"every batch): no statistical limit known; --noise-scale gives one")
    return StatSource(limit.max_batch, "published default",
                      f"statistical efficiency: published default, global batch at most "
                      f"{limit.max_batch:,} ({limit.source}); --noise-scale replaces it")
