"""Run examples/imagenet/train.py (as ``python train.py``) with one environment variable set on
one rank only, as a host with its own environment would: a variable exported on one node only.

Usage: train_env_on_rank.py RANK NAME=VALUE <train.py arguments...>
"""
import os
import runpy
import sys

from mpi4py import MPI

TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "imagenet",
                     "train.py")


def main():
    rank, assignment, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if MPI.COMM_WORLD.rank == rank:
        name, value = assignment.split("=", 1)
        os.environ[name] = value
    sys.argv = [TRAIN] + argv
    sys.path.insert(0, os.path.dirname(TRAIN))
    runpy.run_path(TRAIN, run_name="__main__")


if __name__ == "__main__":
    main()
