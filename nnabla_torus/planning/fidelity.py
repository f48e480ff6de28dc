"""The cost model held against published runs: each run of
:mod:`~nnabla_torus.planning.published_throughput` predicted from its shipped profile, the
least-squares fit that gives the profiles' compute, and the model's error on its fitting runs.

A run is predicted with its profile reshaped to the run's nodes, GPUs per node and NICs, the
step as the profile's compute ``a + b x batch`` overlapped (``gamma``) with the all-reduce of
the profile's gradient bytes. NVIDIA's runs all-reduce with NCCL (under Horovod), which picks
ring or tree by size and scale; the model's fastest of ``native`` (a flat ring at these sizes),
``hierarchical`` and ``torus2d`` on any grid stands in for it (a flat ring alone is 6-8x too
slow on 3,584 GPUs). The fit (:func:`fit`) is one least-squares problem over every fitting run,
on log step times: one fixed cost ``a`` and one ``gamma`` for all GPUs, one ``b`` per GPU
profile (the V100's published batches, 192-208, are too close to fix ``a`` alone; the A100's
51-512 and the H100's 50-400 are not). The shipped profiles hold its result, rounded. Example::

    >>> run = runs("dgx-h100", "fit")[0]      # MLPerf v3.0, one DGX H100, 400 per GPU
    >>> round(predict(run).images_per_s / run.images_per_s, 3)
    1.014
"""
from collections import namedtuple

import numpy as np

from .costmodel import allreduce_terms, overlap
from .machine_profile import Shape, load_profile, model_of
from .planner import IMAGENET_TRAIN_IMAGES, grids
from .published_throughput import runs

MODEL = "resnet50"
ALGORITHMS = ("native", "hierarchical", "torus2d")   # NCCL's stand-ins (module doc)
GAMMAS = (1.0, 1.5, 2.0, 3.0, 5.0, 10.0)   # overlap exponents tried (10: the larger term alone)

Prediction = namedtuple("Prediction", [
    "compute_s",      # a + b x local batch
    "allreduce_s",    # the all-reduce of the gradients (0 on one GPU)
    "step_s",         # the two overlapped by gamma
    "images_per_s",   # whole job
    "time_s",         # epochs x ImageNet's 1,281,167 images / images_per_s (None: no epochs)
])

Fit = namedtuple("Fit", [
    "a_s",      # fixed seconds per step, every GPU
    "b_s",      # {profile: seconds per image}
    "gamma",    # overlap exponent, every GPU
])


def run_profile(run):
    """The run's profile reshaped to its nodes, GPUs per node and inter-host bandwidth."""
    return load_profile(run.profile, Shape(hosts=run.nodes, gpus_per_host=run.gpus_per_node,
                                           inter_GBps=run.inter_GBps))


def allreduce_s(run):
    """Seconds of the run's gradient all-reduce: the cost model's fastest algorithm and grid
    (0 on one GPU)."""
    ranks = run.nodes * run.gpus_per_node
    if ranks == 1:
        return 0.0
    prof = run_profile(run)
    nbytes, g = model_of(prof, MODEL).grad_bytes, run.gpus_per_node
    return min(float(sum(allreduce_terms(prof.network, name, ranks, nbytes, x).values()))
               for name in ALGORITHMS for x in grids(ranks, name, g))


def predict(run, a_s=None, b_s=None, gamma=None):
    """The run's Prediction from its shipped profile (``a_s``, ``b_s``, ``gamma`` replace the
    profile's compute when given)."""
    comp = model_of(load_profile(run.profile), MODEL)
    a_s, b_s = comp.a_s if a_s is None else a_s, comp.b_s if b_s is None else b_s
    gamma = comp.gamma if gamma is None else gamma
    t_c, t_n = a_s + b_s * run.local_batch, allreduce_s(run)
    step = float(overlap(t_c, t_n, gamma))
    ips = run.nodes * run.gpus_per_node * run.local_batch / step
    time_s = run.epochs * IMAGENET_TRAIN_IMAGES / ips if run.epochs else None
    return Prediction(t_c, t_n, step, ips, time_s)


def fit(fitting=None):
    """The least-squares Fit of the fitting runs' step times (module doc): ``a`` and the
    ``b``s for each gamma of :data:`GAMMAS`, the gamma with the smallest error kept."""
    from scipy.optimize import least_squares
    fitting = runs(role="fit") if fitting is None else fitting
    names = sorted({r.profile for r in fitting})
    which = np.array([names.index(r.profile) for r in fitting])
    batch = np.array([r.local_batch for r in fitting], float)
    step = np.array([r.nodes * r.gpus_per_node * r.local_batch / r.images_per_s
                     for r in fitting])
    t_n = np.array([allreduce_s(r) for r in fitting])
    best = None
    for gamma in GAMMAS:
        def log_error(x):   # x: log a, then log b per profile
            t_c = np.exp(x[0]) + np.exp(x[1:])[which] * batch
            return np.log(overlap(t_c, t_n, gamma) / step)
        start = np.r_[np.log(5e-3), np.log(np.median(step / batch)) * np.ones(len(names))]
        result = least_squares(log_error, start)
        if best is None or result.cost < best[0]:
            best = (result.cost, result.x, gamma)
    _, x, gamma = best
    return Fit(float(np.exp(x[0])), dict(zip(names, np.exp(x[1:]).tolist())), gamma)


def errors(profile=None, role="fit"):
    """{run: predicted / published images/s - 1} of ``profile``'s runs in ``role``."""
    return {r: predict(r).images_per_s / r.images_per_s - 1 for r in runs(profile, role)}


def model_error(profile=None):
    """The largest |relative error| of images/s over the fitting runs (of ``profile``'s GPU,
    else of every GPU): what a predicted difference must beat to be told apart."""
    return max(abs(e) for e in errors(profile).values())


RunCostsFit = namedtuple("RunCostsFit", [
    "startup_s",               # {profile: start-up of one node, seconds}
    "startup_s_per_doubling",  # seconds more per doubling of nodes, every GPU
    "validation_gpu_s",        # {profile: one evaluation of 50,000 images on one GPU, seconds}
])


def run_costs_fit(fitting=None):
    """The published runs' start-up and evaluation as :mod:`.fixed_costs` prices them: MLPerf's
    initialisation (init_start to run_start) = one intercept per GPU profile + one slope per
    doubling of nodes (least squares; the V100's runs are all one node), and one evaluation's
    seconds x the run's GPUs, the median per profile."""
    fitting = [r for r in (runs(role="fit") if fitting is None else fitting) if r.init_s]
    names = sorted({r.profile for r in fitting})
    design = np.zeros((len(fitting), len(names) + 1))
    for row, r in enumerate(fitting):
        design[row, names.index(r.profile)] = 1.0
        design[row, -1] = np.log2(r.nodes)
    x = np.linalg.lstsq(design, np.array([r.init_s for r in fitting]), rcond=None)[0]
    gpu_s = {n: float(np.median([r.eval_s * r.nodes * r.gpus_per_node for r in fitting
                                 if r.profile == n])) for n in names}
    return RunCostsFit(dict(zip(names, x[:-1].tolist())), float(x[-1]), gpu_s)
