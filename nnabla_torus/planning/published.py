"""Published large-batch behaviour: the batches published runs trained with, and the noise-scale
prior they imply, one table for the planner (the largest trainable batch) and the batch-size
controller (the prior).

Each entry is a batch a published run used at a point of training and still reached the
published top-1 (the figure and its source beside it). The noise-scale prior reads the batch in
use at a fraction of training as the critical batch there: McCandlish et al. (arXiv:1812.06162,
abstract and section 2.2) find the noise scale B_simple predicts the largest useful batch, and
B_crit ~ B_simple (*derived*: phi = the published batch, with :data:`PRIOR_RSE`, *assumed*).
Example::

    >>> largest_trained_batch("resnet50").batch, largest_trained_batch("resnet50", min_top1=0).batch
    (65536, 81920)
    >>> [round(p) for p in noise_scale_prior("resnet50", 90.0)(np.array([0.0, 0.5]))[0]]
    [34816, 69632]
"""
from collections import namedtuple

import numpy as np

SOURCES = {
    "goyal2017": 'Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", '
                 "arXiv:1706.02677 (2017), abstract: 8,192 images per step, 76.3 % top-1 as at 256",
    "mikami2018": 'Mikami et al., "ImageNet/ResNet-50 Training in 224 Seconds", '
                  "arXiv:1811.05233v1 (2018), abstract; NVIDIA developer blog (Nov 2018): "
                  "34,816 for the first 5 epochs, then 69,632, 75.03 % top-1",
    "akiba2017": 'Akiba et al., "Extremely Large Minibatch SGD: Training ResNet-50 on ImageNet '
                 'in 15 Minutes", arXiv:1711.04325 (2017), abstract: 32,768, 74.9 % top-1',
    "jia2018": 'Jia et al., "Highly Scalable Deep Learning Training System with Mixed-Precision: '
               'Training ImageNet in Four Minutes", arXiv:1807.11205 (2018), abstract: 64K '
               "(65,536), 75.8 % top-1",
    "yamazaki2019": 'Yamazaki et al., "Yet Another Accelerated SGD: ResNet-50 Training on '
                    'ImageNet in 74.7 seconds", arXiv:1903.12650 (2019), abstract: 2,048 GPUs on '
                    "ABCI, 75.08 % top-1; NVIDIA developer blog \"Fujitsu Breaks ImageNet Record "
                    'with V100 Tensor Core GPUs" (2019): the 81,920 batch, with LARS',
}

AUTHORS = {"goyal2017": "Goyal", "mikami2018": "Mikami (Sony)", "akiba2017": "Akiba",
           "jia2018": "Jia", "yamazaki2019": "Yamazaki (Fujitsu)"}   # for one-line citations

PublishedBatch = namedtuple("PublishedBatch", [
    "model",    # the network, as the example's --arch (resnet50)
    "data",     # the dataset (imagenet)
    "epoch",    # the epoch from which the batch was in use
    "batch",    # images per optimizer step
    "top1",     # the published validation top-1 of the run
    "source",   # a key of SOURCES
])

PUBLISHED = (
    PublishedBatch("resnet50", "imagenet", 0.0, 8192, 0.763, "goyal2017"),
    PublishedBatch("resnet50", "imagenet", 0.0, 34816, 0.7503, "mikami2018"),
    PublishedBatch("resnet50", "imagenet", 5.0, 69632, 0.7503, "mikami2018"),
    PublishedBatch("resnet50", "imagenet", 0.0, 32768, 0.749, "akiba2017"),
    PublishedBatch("resnet50", "imagenet", 0.0, 65536, 0.758, "jia2018"),
    PublishedBatch("resnet50", "imagenet", 0.0, 81920, 0.7508, "yamazaki2019"),
)
USUAL_TOP1 = 0.758   # the largest trainable batch is the largest published at this top-1 or
                     # above (Jia et al.'s 65,536; 81,920 reached 75.08 % with LARS and tuning)
SCHEDULE_SOURCE = "mikami2018"   # the published run that changed its batch during training:
                                 # the only one that gives the noise scale's growth
PRIOR_RSE = 0.25                 # *assumed*: the prior's relative error (a published batch is
                                 # one run's choice, not a measurement of phi)


def published_batches(model, data="imagenet"):
    """The PUBLISHED entries of ``model`` on ``data`` (empty when none)."""
    return [p for p in PUBLISHED if p.model == model and p.data == data]


def largest_trained_batch(model, data="imagenet", min_top1=USUAL_TOP1):
    """The largest published batch of ``model`` on ``data`` that reached ``min_top1`` (a
    PublishedBatch; the planner's default cap), or None."""
    entries = [p for p in published_batches(model, data) if p.top1 >= min_top1]
    return max(entries, key=lambda p: p.batch) if entries else None


def noise_scale_prior(model, epochs, data="imagenet"):
    """A function fraction-of-training -> (phi, rse) from the published batch schedule of
    ``model`` (SCHEDULE_SOURCE's run, epochs taken over ``epochs``), or None when none is
    published. phi is the batch in use at that fraction (module doc)."""
    steps = sorted((p.epoch, p.batch) for p in published_batches(model, data)
                   if p.source == SCHEDULE_SOURCE)
    if not steps:
        return None
    starts = np.array([e / epochs for e, _ in steps])
    batches = np.array([b for _, b in steps], float)

    def prior(fraction):
        index = np.searchsorted(starts, np.asarray(fraction, float), side="right") - 1
        phi = batches[np.maximum(index, 0)]
        return phi, np.full_like(phi, PRIOR_RSE)
    return prior


def describe(model, data="imagenet"):
    """One line: where the published prior comes from."""
    entries = published_batches(model, data)
    cited = sorted({p.source for p in entries if p.source == SCHEDULE_SOURCE})
    return (f"published {model} on {data}: noise scale = the batch in use of " +
            "; ".join(SOURCES[s] for s in cited) +
            f" (McCandlish et al.: B_simple ~ the largest useful batch; relative error "
            f"{PRIOR_RSE:.0%} assumed)")
