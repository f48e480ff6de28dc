"""A plain nnabla training loop, data-parallel and restartable with the public API only.

A small CNN learns scikit-learn's 8x8 handwritten digits (bundled, no download). The pieces
a user adds to a single-process script (docs/own-script.md): the communicator
(``import nnabla_torus as C``), the all-reduce overlapped with backward
(``BucketedAllReduce``), and a ``State`` that checkpoints and restores the run::

    python examples/own_loop/train.py                               # one process
    nnabla-torus-mpirun -np 4 python examples/own_loop/train.py     # 4 ranks
    nnabla-torus-run --slots 4 --ranks-schedule 0:4 -- python examples/own_loop/train.py
"""
import argparse
import sys

# nnabla logs INFO lines at import (nnabla/logger.py, line 91 at v1.39.0) unless the root
# logger is configured first.
import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import numpy as np
from nnabla.ext_utils import get_extension_context
from sklearn.datasets import load_digits

import nnabla_torus as C
from nnabla_torus.files import atomic_path
from nnabla_torus.knobs import add_knob
from nnabla_torus.overlap import BucketedAllReduce
from nnabla_torus.training import State
from nnabla_torus.training.checkpoint_file import CheckpointError
from nnabla_torus.training.run_lock import RunFolderBusy

GLOBAL_BATCH = 64        # images per optimizer step, on any rank count
MAX_LOCAL_BATCH = 32     # images per rank and forward pass; more ranks' worth accumulate
LEARNING_RATE = 0.05


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_knob(p, "--output-dir", "OWN_LOOP_OUTPUT_DIR", "runs/own_loop",
             "folder for checkpoints and params.h5")
    add_knob(p, "--seed", "OWN_LOOP_SEED", 0, "seed of the initial model and data order",
             type=int)
    add_knob(p, "--epochs", "OWN_LOOP_EPOCHS", 3, "passes over the training images", type=int)
    add_knob(p, "--checkpoint-every", "OWN_LOOP_CHECKPOINT_EVERY", 10,
             "optimizer steps between checkpoints (and one at each epoch's end)", type=int)
    add_knob(p, "--adaptive-batch", "OWN_LOOP_ADAPTIVE_BATCH", False,
             "batch size from the state of learning (AdaptiveBatch)", type=bool)
    add_knob(p, "--resume", "OWN_LOOP_RESUME", False,
             "continue from the newest checkpoint in --output-dir (nnabla-torus-run adds it)",
             type=bool)
    return p.parse_args(argv)


def digits(seed):
    """(train x, train y, val x, val y): 8x8 grey images in [0, 1], a seeded 80/20 split."""
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]        # (1797, 1, 8, 8)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = len(x) * 4 // 5
    return x[order[:cut]], data.target[order[:cut]], x[order[cut:]], data.target[order[cut:]]


def model(x):
    h = F.relu(PF.convolution(x, 16, (3, 3), pad=(1, 1), name="conv1"))
    h = F.max_pooling(h, (2, 2))
    h = F.relu(PF.convolution(h, 32, (3, 3), pad=(1, 1), name="conv2"))
    return PF.affine(h, 10, name="fc")


def main(argv=None):
    args = parse_args(argv)
    if args.adaptive_batch:
        sys.exit("train.py: error: --adaptive-batch 1: nnabla_torus.training.AdaptiveBatch "
                 "is not available yet; run with --adaptive-batch 0")
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    nn.seed(args.seed)
    train_x, train_y, val_x, val_y = digits(args.seed)
    x = nn.Variable((1, 1, 8, 8))
    model(x)                                                     # create the parameters
    params = nn.get_parameters()
    comm.bcast([p.data for p in params.values()], src=0, inplace=True)  # one model everywhere
    solver = S.Momentum(LEARNING_RATE, 0.9)
    solver.set_parameters(params)
    rng = np.random.default_rng(args.seed)     # the shifts; the State restores its state
    state = State(comm, args.output_dir, params, {"momentum": solver}, rng=rng,
                  global_batch=GLOBAL_BATCH, run_files=("params.h5",))
    state.start(args.resume)
    local, accum = state.split(MAX_LOCAL_BATCH)
    state.global_batch = comm.size * local * accum
    state.log(f"global batch {state.global_batch} = {comm.size} rank(s) x {local} x {accum} "
              f"accumulation")
    x, t = nn.Variable((local, 1, 8, 8)), nn.Variable((local, 1))
    loss = F.mean(F.softmax_cross_entropy(model(x), t)) / accum
    reducer = BucketedAllReduce(comm, loss, params)
    steps_per_epoch = len(train_x) // state.global_batch
    while state.step < args.epochs * steps_per_epoch:
        epoch, index = divmod(state.step, steps_per_epoch)
        order = np.random.default_rng([args.seed, epoch]).permutation(len(train_x))
        batch = order[index * state.global_batch:(index + 1) * state.global_batch]
        shifts = rng.integers(-1, 2, size=(len(batch), 2))       # the same draws on every rank
        solver.zero_grad()
        for micro in range(accum):          # this rank's share: micro-batch `micro` of it
            first = (micro * comm.size + comm.rank) * local
            rows = slice(first, first + local)
            x.d = np.stack([np.roll(train_x[i], tuple(s), axis=(1, 2))
                            for i, s in zip(batch[rows], shifts[rows])])
            t.d = train_y[batch[rows], None]
            loss.forward(clear_no_need_grad=True)
            if micro < accum - 1:
                loss.backward(clear_buffer=True)      # accumulates; all-reduced with the last
            else:
                reducer.backward(loss, clear_buffer=True)   # averaged over ranks on return
        solver.update()
        state.step += 1
        state.epoch = state.step / steps_per_epoch
        state.images_seen = state.step * state.global_batch
        if state.step % steps_per_epoch == 0 or state.step % args.checkpoint_every == 0:
            state.progress(f"loss {float(loss.d) * accum:.4f}")
            state.save()
    reducer.close()
    state.log(f"val accuracy {accuracy(val_x, val_y):.3f}")
    if comm.rank == 0:
        with atomic_path(f"{args.output_dir}/params.h5") as temporary:
            nn.save_parameters(temporary, params)
    state.close()


def accuracy(images, labels):
    """Top-1 of the current model on ``images`` (every rank computes it alike)."""
    x = nn.Variable(images.shape)
    x.d = images
    logits = model(x)
    logits.forward(clear_buffer=True)
    return float(np.mean(logits.d.argmax(axis=1) == labels))


if __name__ == "__main__":
    try:
        main()
    except (RunFolderBusy, CheckpointError, FileNotFoundError, ValueError) as error:
        sys.exit(f"train.py: error: {error}")          # raised alike on every rank
