"""How large a global batch a model is known to train with, and where the planner's
statistical efficiency comes from.

Without a gradient noise scale the planner's statistical efficiency is 1 at every batch, so the
largest batch that fits looks best (ABCI: 4,312 GPUs at batch 1,103,872, which nobody has
trained). For a model whose large-batch behaviour is published, the planner instead keeps the
global batch at or below the largest batch published runs trained to their usual accuracy
(statistical efficiency 1 up to it, 0 beyond) and says so; for other models it says that no
statistical limit is known. A noise scale (given, or measured by the run) replaces both.

ResNet-50 on ImageNet, batch -> top-1 (the records table of Mikami et al., arXiv 1811.05233,
and the later runs): Goyal et al. 2017 8K 76.3 %; Akiba et al. 2017 32K 74.9 %; Jia et al.
2018 64K 75.8 %; Mikami et al. 2018 34K -> 68K 75.03 %; Ying et al. 2018 (TPU v3) 65,536
76.3 %; Yamazaki et al. 2019 (Fujitsu) 81,920 75.08 %. The default limit is 65,536: the
largest batch two groups trained to >= 75.8 % (Jia, Ying); up to 81,920 has reached ~75 %
with LARS and careful tuning.

    >>> limit = published_limit("resnet50")
    >>> limit.max_batch
    65536
"""
from collections import namedtuple

Limit = namedtuple("Limit", [
    "max_batch",   # the default cap: largest global batch planned without a noise scale
    "largest",     # the largest published batch that trained to about the usual accuracy
    "source",      # the runs, for the plan's line
])

PUBLISHED = {
    "resnet50": Limit(65536, 81920, "ResNet-50/ImageNet keeps ~75-76 % top-1 up to ~64-82K: Goyal 8K, "
                             "Akiba 32K, Jia 64K, Sony 34K->68K, Ying (Google) 65,536, "
                             "Yamazaki (Fujitsu) 81,920; default 65,536"),
}


def published_limit(model):
    """The published Limit of ``model`` (the full-width network: ``resnet50`` or
    ``resnet50-w1-224px``), or None when no statistical limit is known."""
    arch, _, variant = model.partition("-")
    if variant and not variant.startswith("w1-"):
        return None
    return PUBLISHED.get(arch)


StatSource = namedtuple("StatSource", [
    "max_batch",   # largest global batch to plan (None: no cap)
    "kind",        # "measured noise scale", "given noise scale", "published default", "none"
    "line",        # one line for the plan: the source and what it means
])


def efficiency_source(model, noise_scale=None, measured=False, batch_fixed=False):
    """The StatSource of a plan of ``model``: the noise scale when there is one (``measured``
    by the run, else given), else the published limit of :data:`PUBLISHED` (not when
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
