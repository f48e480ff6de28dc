"""A plain nnabla loop, data-parallel, restartable and adaptive, on the public API only.

A small CNN learns scikit-learn's 8x8 digits. Added to a one-process script (docs/own-script.md):
the communicator, ``BucketedAllReduce``, a ``State`` and an ``AdaptiveBatch``. Run it as
``nnabla-torus-mpirun -np 4 examples/own_loop/train.py --adaptive-batch 1``.
"""
import argparse
import sys
import time

import logging     # configured first: nnabla logs INFO lines at import (logger.py, v1.39.0)
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import numpy as np
from sklearn.datasets import load_digits

import nnabla_torus as C
from nnabla_torus.files import atomic_path
from nnabla_torus.knobs import add_knob
from nnabla_torus.overlap import BucketedAllReduce
from nnabla_torus.planning.schedules import BatchSchedule
from nnabla_torus.training import (EXIT_STOPPED, AdaptiveBatch, CheckpointError, RunFolderBusy,
                                   State)

GLOBAL_BATCH = 64        # images per optimizer step, on any rank count (and the lr's batch)
MIN_BATCH, MAX_BATCH = 16, 512    # the adaptive global batch's bounds; it starts at MIN_BATCH
MAX_LOCAL_BATCH = 32     # images per rank and forward pass; more ranks' worth accumulate
LEARNING_RATE = 0.05


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_knob(p, "--output-dir", "OWN_LOOP_OUTPUT_DIR", "runs/own_loop", "the run's folder")
    add_knob(p, "--seed", "OWN_LOOP_SEED", 0, "seed of the model and the data order", type=int)
    add_knob(p, "--epochs", "OWN_LOOP_EPOCHS", 3, "passes over the training images", type=int)
    add_knob(p, "--checkpoint-every", "OWN_LOOP_CHECKPOINT_EVERY", 10,
             "optimizer steps between checkpoints (and one at each epoch's end)", type=int)
    add_knob(p, "--adaptive-batch", "OWN_LOOP_ADAPTIVE_BATCH", False,
             f"the global batch of AdaptiveBatch, else {GLOBAL_BATCH}", type=bool)
    add_knob(p, "--target-accuracy", "OWN_LOOP_TARGET_ACCURACY", 0.9,
             "validation accuracy (at each epoch's end) whose first reach is timed", type=float)
    add_knob(p, "--resume", "OWN_LOOP_RESUME", False,
             "continue the newest checkpoint in --output-dir (nnabla-torus-run adds it)", type=bool)
    return p.parse_args(argv)


def digits(seed):
    """(train x, train y, val x, val y): 8x8 grey images in [0, 1], a seeded 80/20 split."""
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]        # (1797, 1, 8, 8)
    order, cut = np.random.default_rng(seed).permutation(len(x)), len(x) * 4 // 5
    return x[order[:cut]], data.target[order[:cut]], x[order[cut:]], data.target[order[cut:]]


def model(x):
    h = F.max_pooling(F.relu(PF.convolution(x, 16, (3, 3), pad=(1, 1), name="conv1")), (2, 2))
    h = F.relu(PF.convolution(h, 32, (3, 3), pad=(1, 1), name="conv2"))
    return PF.affine(h, 10, name="fc")


def main(argv=None):
    args = parse_args(argv)
    comm = C.MultiProcessDataParallelCommunicator(nn.Context())     # nnabla's default: CPU
    comm.init()
    nn.seed(args.seed)
    train_x, train_y, val_x, val_y = digits(args.seed)
    model(nn.Variable((1, 1, 8, 8)))                             # create the parameters
    params = nn.get_parameters()
    comm.bcast([p.data for p in params.values()], src=0, inplace=True)  # one model everywhere
    solver = S.Momentum(LEARNING_RATE, 0.9)
    solver.set_parameters(params)
    state = State(comm, args.output_dir, params, {"momentum": solver},
                  global_batch=GLOBAL_BATCH, run_files=("params.h5",))
    fixed = None if args.adaptive_batch else BatchSchedule.parse(f"0:{GLOBAL_BATCH}")
    batch = AdaptiveBatch(comm, MAX_LOCAL_BATCH, min_batch=MIN_BATCH, max_batch=MAX_BATCH,
                          base_batch=GLOBAL_BATCH, schedule=fixed)   # fixed: 64 throughout
    state.start(args.resume)
    for line in batch.load_state_dict(state.extras["batch"]) if args.resume else []:
        state.log(line)                # another rank count: the global batch split anew
    epoch, offset = state.extras.get("position", (0, 0))   # offset: images of epoch used
    clock, reached, reducer, stopping = time.perf_counter(), False, None, False   # this job's s
    while not stopping:
        plan = batch.plan(epoch + offset / len(train_x), [solver])     # alike on every rank
        local, accum, state.global_batch = plan.local_batch, plan.accum_steps, plan.global_batch
        if offset + state.global_batch > len(train_x):      # the epoch's tail is left out
            epoch, offset = epoch + 1, 0
        if epoch == args.epochs:
            break
        for line in batch.pop_notes():         # why the batch is kept (or fixed)
            state.log(f"step {state.step}: {line}")
        if plan.changed or reducer is None:       # at the start and at each change: a graph
            state.log(f"step {state.step}: global batch {plan.global_batch} = {comm.size} "
                      f"rank(s) x {local} x {accum} accumulation; {plan.reason}")
            x, t = nn.Variable((local, 1, 8, 8)), nn.Variable((local, 1))
            loss = F.mean(F.softmax_cross_entropy(model(x), t)) / accum
            if reducer is not None:
                reducer.close()
            reducer = BucketedAllReduce(comm, loss, params)
        order = np.random.default_rng([args.seed, epoch]).permutation(len(train_x))
        images = order[offset:offset + state.global_batch]
        solver.set_learning_rate(LEARNING_RATE * plan.lr_factor)
        batch.begin_step()                     # starts the step's clock
        solver.zero_grad()
        for micro in range(accum):          # this rank's share: micro-batch `micro` of it
            share = images[(micro * comm.size + comm.rank) * local:][:local]
            x.d, t.d = train_x[share], train_y[share, None]
            loss.forward(clear_no_need_grad=True)
            if micro < accum - 1:
                loss.backward(clear_buffer=True)      # accumulates; all-reduced with the last
            else:
                reducer.backward(loss, clear_buffer=True)   # averaged over ranks on return
        batch.end_step(reducer.wait_s)         # the noise scale; the rank-mean step time
        solver.update()
        state.step, offset = state.step + 1, offset + state.global_batch
        state.epoch = epoch + offset / len(train_x)
        state.images_seen += state.global_batch
        epoch_end = offset + state.global_batch > len(train_x)    # validated, checkpointed
        if epoch_end and not reached and accuracy(val_x, val_y) >= args.target_accuracy:
            reached = True
            state.log(f"target accuracy {args.target_accuracy} reached at step {state.step}, "
                      f"epoch {state.epoch:.3f}: {time.perf_counter() - clock:.2f} s")
        stopping = state.stop_requested()      # the launcher's Ctrl-C or SIGTERM, any rank
        if epoch_end or stopping or state.step % args.checkpoint_every == 0:
            state.progress(f"loss {float(loss.d) * accum:.4f}")
            state.extras = dict(position=[epoch, offset], batch=batch.state_dict())
            state.save()
    reducer.close()
    if comm.rank == 0 and not stopping:
        with atomic_path(f"{args.output_dir}/params.h5") as temporary:
            nn.save_parameters(temporary, params)
    state.close()
    return EXIT_STOPPED if stopping else 0    # 76: stopped with a checkpoint, not failed


def accuracy(images, labels):
    """Top-1 of the current model on ``images`` (every rank computes it alike)."""
    logits = model(nn.Variable.from_numpy_array(images))
    logits.forward(clear_buffer=True)
    return float(np.mean(logits.d.argmax(axis=1) == labels))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RunFolderBusy, CheckpointError, FileNotFoundError, ValueError) as error:
        sys.exit(f"train.py: error: {error}")          # raised alike on every rank
