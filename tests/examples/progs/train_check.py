"""Run examples/imagenet/train.py's main() under mpirun, then compare parameters across ranks.

Usage: train_check.py [--save-params FILE.npz] <train.py arguments...>
Rank 0 prints PARAMS_EQUAL (every parameter, batch-norm statistics included, bitwise identical
on every rank) or PARAMS_DIFFER, and with --save-params writes them for the test to compare,
then ``FINAL_LOSS <x>``: the loss of the final parameters on a fixed batch (the first 64
training images, whole-image crops, batch statistics), a pure function of the parameters.
"""
import hashlib
import os
import sys

import numpy as np
import nnabla as nn
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                                "imagenet"))
import data  # noqa: E402
import train  # noqa: E402
from config import parse_config  # noqa: E402
from models import get_model  # noqa: E402


def main():
    argv, save = sys.argv[1:], None
    if argv[:1] == ["--save-params"]:
        save, argv = argv[1], argv[2:]
    train.main(argv)
    params = {k: v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()}
    digest = hashlib.sha256(b"".join(params[k].tobytes() for k in sorted(params))).hexdigest()
    digests = MPI.COMM_WORLD.allgather(digest)
    if MPI.COMM_WORLD.rank == 0:
        print("PARAMS_EQUAL" if len(set(digests)) == 1 else f"PARAMS_DIFFER {digests}", flush=True)
        if save:
            np.savez(save, **params)
        print(f"FINAL_LOSS {final_loss(argv):.8f}", flush=True)


def final_loss(argv):
    cfg = parse_config(argv)
    train_set, _ = train.open_datasets(cfg, log=print)
    images, labels = next(data.make_loader(train_set, 64, train=True, image_size=cfg.image_size,
                                           seed=0, crop_scale=(1.0, 1.0), flip=False))
    x, t, loss, _, _ = train.build_graph(get_model(cfg.arch, train_set.num_classes, cfg.width),
                                         64, cfg.image_size, 0.0, 1)
    x.d, t.d = images, labels
    loss.forward()
    return float(loss.d)


if __name__ == "__main__":
    main()
