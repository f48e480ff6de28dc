"""Published ResNet-50/ImageNet training throughput: the runs the shipped GPU profiles are fitted
to and the larger runs they are checked against, one table with its sources.

Every figure is *published* (read from the source named beside it); none was measured here
(there is no GPU here). MLPerf figures are the median over the five ``result_*.txt`` logs of a
system (training throughput per epoch, the first epoch left out; ``run_start`` to ``run_stop``
for the time to train, which counts evaluation but not initialisation); ``where`` gives
result_0.txt's lines of ``global_batch_size`` and of the first throughput figure used.
Roles: ``fit`` (one node and up to 8 nodes, NVIDIA's MXNet code: the profiles' compute is fitted
to these, :mod:`nnabla_torus.planning.fidelity`), ``check`` (more than 8 nodes: how the model is
checked, never fitted), ``other`` (shown, not fitted: another framework, or a GPU's launch
software, the reason in ``note``). Example::

    >>> sorted({r.profile for r in runs(role="fit")})
    ['abci', 'dgx-a100', 'dgx-h100', 'dgx-h200']
"""
from collections import namedtuple

MLPERF = "github.com/mlcommons/training_results_{}, NVIDIA/results/{}/resnet/result_*.txt"
SOURCES = {
    "mlperf-v0.6": MLPERF.format("v0.6", "<system>") + " (commit f312518c2d61)",
    "mlperf-v0.7": MLPERF.format("v0.7", "<system>") + " (commit 0a8a85a209c8)",
    "mlperf-v1.0": MLPERF.format("v1.0", "<system>") + " (commit 50619b5df63f)",
    "mlperf-v1.1": MLPERF.format("v1.1", "<system>") + " (commit ebe92f81f7a6)",
    "mlperf-v2.0": MLPERF.format("v2.0", "<system>") + " (commit 8437fbb78349)",
    "mlperf-v3.0": MLPERF.format("v3.0", "<system>") + " (commit 63e326c400f5)",
    "mlperf-v3.1": MLPERF.format("v3.1", "<system>") + " (commit d06288b2bd67)",
    "mlperf-v4.0": MLPERF.format("v4.0", "<system>") + " (commit 6fe954378efe)",
    "dle-mxnet": "github.com/NVIDIA/DeepLearningExamples (commit 729963dd47e7), "
                 "MxNet/Classification/RN50v1.5/README.md: training performance (lines 641-687: "
                 "per-GPU batch in the benchmark.py command above each table, mixed precision) "
                 "and 90-epoch time to train (lines 584-605, hours)",
    "yamazaki2019": 'Yamazaki et al., "Yet Another Accelerated SGD: ResNet-50 Training on '
                    'ImageNet in 74.7 seconds", arXiv:1903.12650, abstract: 2,048 GPUs on ABCI, '
                    '"over 1.73 million images/sec", 74.7 s; 81,920 images a step (40 a GPU): '
                    "nnabla_torus/planning/published.py",
    "dle-pytorch": "github.com/NVIDIA/DeepLearningExamples (commit 729963dd47e7), "
                   "PyTorch/Classification/ConvNets/resnet50v1.5/README.md lines 594-607: "
                   "training performance, mixed precision, batch 256 per GPU, pytorch-21.03",
}

PublishedRun = namedtuple("PublishedRun", [
    "profile",        # the shipped profile whose GPU ran it (abci: V100)
    "system",         # the system as its source names it
    "source",         # a key of SOURCES
    "where",          # file and lines in the source
    "nodes",          # hosts
    "gpus_per_node",  # GPUs (ranks) per host
    "inter_GBps",     # a host's inter-host bandwidth, all compute NICs (systems/*.json)
    "local_batch",    # images per GPU per step
    "images_per_s",   # training images per second of the whole job
    "epochs",         # epochs of the run (None: not stated)
    "time_s",         # published time to train, seconds (None: not stated)
    "role",           # fit | check | other (module doc)
    "note",           # why a run is 'other', or what differs ('' when nothing)
    "init_s",         # MLPerf: init_start to run_start, seconds (not in time_s; None: not given)
    "eval_s",         # MLPerf: one evaluation of 50,000 images, eval_start to eval_stop, seconds
], defaults=["", None, None])


def _mlperf(profile, rnd, system, nodes, local, ips, epochs, time_s, init_s, eval_s, lines,
            role="fit", note=""):
    """A PublishedRun of an MLPerf NVIDIA closed-division ResNet result (8 GPUs a node)."""
    nic = {"abci": 50.0, "dgx-a100": 200.0}.get(profile, 400.0)   # systems/<system>.json:
    # DGX-1 4x EDR 100 Gb/s, DGX A100 8x HDR 200 Gb/s, DGX H100/H200 8x NDR 400 Gb/s
    return PublishedRun(profile, f"MLPerf {rnd} {system}", "mlperf-" + rnd,
                        f"{system}/resnet/result_0.txt lines {lines}", nodes, 8, nic, local,
                        ips, epochs, time_s, role, note, init_s, eval_s)


def _dle(profile, gpus, local, ips, hours, source="dle-mxnet", role="fit", note=""):
    """A PublishedRun of a DeepLearningExamples single-node table (90 epochs)."""
    system = {"abci": "DGX-1 (8x V100 16GB)", "dgx-a100": "DGX A100 (8x A100 80GB)"}[profile]
    return PublishedRun(profile, f"{system}, {gpus} GPU", source, "README.md table", 1, gpus,
                        None, local, ips, 90 if hours else None,
                        hours * 3600 if hours else None, role, note)


OLD_A100 = "A100 40 GB, NGC 20.06: the A100's launch software"
RUNS = (
    # V100 SXM2 16 GB (DGX-1, as ABCI's nodes); MLPerf: nodes, per-GPU batch, images/s, epochs,
    # time to train, init, one evaluation (seconds), result_0.txt lines
    _mlperf("abci", "v0.6", "dgx1_ngc19.05_mxnet", 1, 208, 11222, 60, 6910.0, 10.7, 4.21,
            "292, 343"),
    _mlperf("abci", "v0.7", "dgx1_ngc20.06_mxnet", 1, 208, 11181, 37, 4275.2, 16.5, 4.13,
            "101, 167"),
    _dle("abci", 1, 192, 1376, 24.2),
    _dle("abci", 8, 192, 10723, 3.0),
    _dle("abci", 1, 256, 1200, None, "dle-pytorch", "other", "PyTorch, not MXNet"),
    _dle("abci", 8, 256, 8322, None, "dle-pytorch", "other", "PyTorch, not MXNet"),
    _mlperf("abci", "v0.6", "dgx1_n130_ngc19.05_mxnet", 130, 52, 1147241, 86, 101.4, 21.2, 0.05,
            "5001, 5728", "check"),
    PublishedRun("abci", "Yamazaki et al. (Fujitsu), ABCI, MXNet", "yamazaki2019", "abstract",
                 512, 4, None, 40, 1.73e6, None, 74.7, "check", "epochs not stated"),
    # A100 SXM4 (v0.7: 40 GB; from v1.0: 80 GB)
    _mlperf("dgx-a100", "v0.7", "dgxa100_ngc20.06_mxnet", 1, 408, 22503, 41, 2366.7, 13.0, 2.23,
            "97, 141", "other", OLD_A100),
    _mlperf("dgx-a100", "v0.7", "dgxa100_n2_ngc20.06_mxnet", 2, 204, 37349, 41, 1424.8, 13.0,
            1.16, "161, 246", "other", OLD_A100),
    _mlperf("dgx-a100", "v1.0", "dgxa100_ngc21.05_mxnet", 1, 408, 26687, 35, 1724.5, 29.3, 1.24,
            "437, 503"),
    _mlperf("dgx-a100", "v1.0", "dgxa100_n8_ngc21.05_mxnet", 8, 204, 200575, 45, 294.6, 42.0,
            0.09, "1031, 2491"),
    _mlperf("dgx-a100", "v1.1", "dgxa100_ngc21.09_mxnet", 1, 408, 26345, 35, 1749.1, 54.3, 1.24,
            "187, 209"),
    _mlperf("dgx-a100", "v1.1", "dgxa100_n8_ngc21.09_mxnet", 8, 51, 166645, 35, 272.2, 92.5,
            0.13, "243, 265"),
    _mlperf("dgx-a100", "v2.0", "dgxa100_ngc22.04_mxnet", 1, 408, 27191, 35, 1720.2, 37.3, 1.24,
            "187, 209"),
    _mlperf("dgx-a100", "v2.0", "dgxa100_n8_ngc22.04_mxnet", 8, 51, 167670, 35, 270.1, 47.7,
            0.13, "243, 265"),
    _dle("dgx-a100", 1, 512, 3410.52, 8.75),
    _dle("dgx-a100", 8, 512, 26673.72, 1.14),
    _dle("dgx-a100", 1, 256, 2470, None, "dle-pytorch", "other", "PyTorch, not MXNet"),
    _dle("dgx-a100", 8, 256, 16621, None, "dle-pytorch", "other", "PyTorch, not MXNet"),
    _mlperf("dgx-a100", "v0.7", "dgxa100_n96_ngc20.06_mxnet", 96, 45, 1250830, 59, 63.4, 22.7,
            0.05, "5417, 6961", "check", OLD_A100),
    _mlperf("dgx-a100", "v1.1", "dgxa100_n128_ngc21.09_mxnet", 128, 35, 2308409, 60, 34.5,
            321.1, 0.02, "1203, 1225", "check"),
    _mlperf("dgx-a100", "v2.0", "dgxa100_n128_ngc22.04_mxnet", 128, 35, 2363777, 60, 34.0, 77.8,
            0.02, "1203, 1225", "check"),
    _mlperf("dgx-a100", "v1.1", "dgxa100_n540_ngc21.09_mxnet", 540, 15, 7279358, 85, 20.9,
            370.8, 0.03, "4499, 4526", "check"),
    # H100 SXM5 80 GB (DGX H100; Eos is DGX H100 nodes)
    _mlperf("dgx-h100", "v3.0", "dgxh100_ngc23.04_mxnet", 1, 400, 56075, 35, 816.1, 54.1, 0.40,
            "179, 201"),
    _mlperf("dgx-h100", "v3.0", "dgxh100_n8_ngc23.04_mxnet", 8, 50, 294760, 35, 159.9, 55.7,
            0.07, "179, 201"),
    _mlperf("dgx-h100", "v3.1", "eos_ngc23.09_mxnet", 1, 400, 56431, 35, 811.3, 45.4, 0.40,
            "179, 201"),
    _mlperf("dgx-h100", "v3.1", "eos_n8_ngc23.09_mxnet", 8, 50, 318167, 35, 149.7, 64.9, 0.07,
            "179, 201"),
    _mlperf("dgx-h100", "v4.0", "eos_ngc24.04_mxnet", 1, 400, 57290, 35, 798.1, 42.4, 0.33,
            "181, 203"),
    _mlperf("dgx-h100", "v4.0", "eos_n8_ngc24.04_mxnet", 8, 50, 314129, 35, 150.3, 58.0, 0.07,
            "181, 203"),
    _mlperf("dgx-h100", "v3.0", "dgxh100_n64_ngc23.04_mxnet", 64, 40, 2249715, 50, 29.9, 140.3,
            0.01, "179, 201", "check"),
    _mlperf("dgx-h100", "v3.0", "dgxh100_n96_ngc23.04_mxnet", 96, 42, 3412683, 56, 22.2, 141.7,
            0.01, "179, 201", "check"),
    _mlperf("dgx-h100", "v3.1", "coreweave_hgxh100_n448_ngc23.04_mxnet", 448, 16, 10108578, 77,
            11.0, 188.7, 0.01, "179, 206", "check", "CoreWeave HGX H100"),
    _mlperf("dgx-h100", "v4.0", "eos_n316_ngc24.04_mxnet", 316, 16, 6885678, 70, 13.9, 90.8,
            0.01, "181, 203", "check"),
    # H200 SXM5 141 GB (one published single-node run)
    _mlperf("dgx-h200", "v4.0", "h200_ngc24.04_mxnet", 1, 400, 63608, 35, 721.4, 60.7, 0.32,
            "181, 203"),
)


def runs(profile=None, role=None):
    """The RUNS of ``profile`` (None: all) in ``role`` (None: all), in table order."""
    return [r for r in RUNS if profile in (None, r.profile) and role in (None, r.role)]
