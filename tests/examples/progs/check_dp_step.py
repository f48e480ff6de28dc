"""N ranks x batch b (x accumulation) take the same step as one process with batch N*b (mpirun).

A small network without batch norm (so the per-rank batch does not change the function), label
smoothing, weight decay on weights only, momentum SGD and LARS, with and without overlapped
all-reduce and through the FP16 path's dynamic loss scaling (run in fp32 here; with and without
overlap),
one and two micro-batches. Two optimizer steps (the second uses momentum state)
must match the single-process reference within 1e-5, and the parameters must be bitwise
identical on every rank. Prints "PASSED check_dp_step" on rank 0.
"""
import hashlib
import os
import sys

import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                                "imagenet"))
import nnabla_torus as C  # noqa: E402
from nnabla_torus.planning.controller import BatchPlan  # noqa: E402
from nnabla_torus.loss_scaling import DynamicLossScaling  # noqa: E402
from nnabla_torus.overlap import BucketedAllReduce  # noqa: E402
from tests.mpirun import passed_line  # noqa: E402
import train  # noqa: E402
from config import TrainConfig  # noqa: E402

LOCAL_BATCH, IMAGE, CLASSES, STEPS, DECAY, SMOOTHING = 3, 6, 5, 2, 1e-2, 0.1


def tiny_model(x, test):
    with nn.parameter_scope("conv"):
        h = F.relu(PF.convolution(x, 4, (3, 3), pad=(1, 1)))
    with nn.parameter_scope("fc"):
        return PF.affine(h, CLASSES)


class SliceStream:
    """This rank's micro-batches, in order, cut from one global batch per step."""

    def __init__(self, images, labels, rank, accum):
        self.images, self.labels, self.rank, self.accum = images, labels, rank, accum
        self.calls = 0

    def next_batch(self, batch_size):
        step, micro = divmod(self.calls, self.accum)
        self.calls += 1
        start = (self.rank * self.accum + micro) * batch_size
        return (self.images[step][start:start + batch_size],
                self.labels[step][start:start + batch_size])


def run_reference(cfg, images, labels):
    with nn.parameter_scope("ref"):
        x, t, loss, objective, logits = train.build_graph(
            tiny_model, len(images[0]), IMAGE, SMOOTHING, accum_steps=1)
        solvers = train.SolverGroup(cfg, nn.get_parameters())
        for step in range(STEPS):
            x.d, t.d = images[step], labels[step]
            solvers.zero_grad()
            objective.forward()
            objective.backward()
            solvers.weight_decay(DECAY)
            solvers.update()
        return {k: v.d.copy() for k, v in nn.get_parameters().items()}


def run_data_parallel(cfg, comm, images, labels, accum, mode, initial):
    """mode: "plain" (all-reduce after backward), "overlap" (buckets during backward), and
    "fp16-plain" / "fp16-overlap": the same with dynamic loss scaling (scale 8, in fp32 here)."""
    nn.clear_parameters()
    with nn.parameter_scope("dp"):
        graph = train.build_graph(tiny_model, LOCAL_BATCH, IMAGE, SMOOTHING, accum_steps=accum)
        params = nn.get_parameters()
        for name, value in initial.items():
            params[name].d = value
        solvers = train.SolverGroup(cfg, params)
        grads = [v.grad for v in params.values()]
        reducer = BucketedAllReduce(comm, graph[3], params, bucket_mib=1e-4) \
            if mode.endswith("overlap") else None
        scaler = DynamicLossScaling(8.0) if mode.startswith("fp16") else None
        plan = BatchPlan(LOCAL_BATCH * accum * comm.size, LOCAL_BATCH, accum, 1.0, True, "test")
        stream = SliceStream(images, labels, comm.rank, accum)
        for _ in range(STEPS):
            train.train_step(stream, graph, plan, solvers, comm, grads, reducer, scaler)
            if scaler is None or scaler.unscale(solvers):
                solvers.weight_decay(DECAY)
                solvers.update()
        return {k: v.d.copy() for k, v in params.items()}


def main():
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    for optimizer in ("momentum", "lars"):
        cfg = TrainConfig(optimizer=optimizer, base_lr=0.5, momentum=0.9)
        for accum in (1, 2):
            rng = np.random.RandomState(7)                 # same data on every rank
            global_batch = LOCAL_BATCH * accum * comm.size
            images = rng.randint(-3, 4, (STEPS, global_batch, 3, IMAGE, IMAGE)).astype(np.float32)
            labels = rng.randint(0, CLASSES, (STEPS, global_batch, 1)).astype(np.int32)
            nn.clear_parameters()
            nn.seed(11)
            with nn.parameter_scope("ref"):
                train.build_graph(tiny_model, 1, IMAGE, 0.0, 1)
                initial = {k: v.d.copy() for k, v in nn.get_parameters().items()}
            reference = run_reference(cfg, images, labels)
            for mode in ("plain", "overlap", "fp16-plain", "fp16-overlap"):
                result = run_data_parallel(cfg, comm, images, labels, accum, mode, initial)
                for name in reference:
                    assert not np.allclose(reference[name], initial[name]), name
                    np.testing.assert_allclose(result[name], reference[name], rtol=1e-5,
                                               atol=1e-6, err_msg=f"{optimizer} {name}")
                digest = hashlib.sha256(b"".join(result[k].tobytes() for k in sorted(result)))
                digests = MPI.COMM_WORLD.allgather(digest.hexdigest())
                assert len(set(digests)) == 1, f"parameters differ across ranks: {digests}"
                if comm.rank == 0:
                    print(f"{optimizer} accum={accum} {mode}: matches batch "
                          f"{global_batch} on one process; ranks agree")
    if comm.rank == 0:
        print(passed_line("check_dp_step"))


if __name__ == "__main__":
    main()
