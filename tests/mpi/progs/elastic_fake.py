"""A stand-in training script for the elastic launcher's tests (no nnabla: starts fast).

Usage: elastic_fake.py MODE [RANKS] [--resume 1]. Modes:
  grow    first run asks for RANKS ranks (default 2; exit 75), the resumed run prints
          RAN ON <size> and ends
  always  asks for 2 ranks every time (the launcher's restart limit stops it)
  fail    prints a few lines, then exits with status 3
  wait    waits for SIGUSR1 (the launcher's Ctrl-C), then exits 76 as train.py does
  early   sleeps without a SIGUSR1 handler (a Ctrl-C during start-up kills it)
"""
import json
import signal
import sys
import time

from mpi4py import MPI

from nnabla_torus.launching import elastic


def request(ranks):
    if MPI.COMM_WORLD.rank == 0:
        print(elastic.REQUEST_PREFIX + json.dumps(
            {"ranks": ranks, "epoch": 1.0, "global_batch": 64, "reason": "test: grow"}),
            flush=True)
    MPI.COMM_WORLD.Barrier()
    sys.exit(elastic.EXIT_RESIZE)


def main():
    mode, resumed = sys.argv[1], "--resume" in sys.argv
    wanted = int(sys.argv[2]) if sys.argv[2:3] and sys.argv[2].isdigit() else 2
    comm = MPI.COMM_WORLD
    if mode == "grow" and not resumed or mode == "always":
        request(wanted)
    if mode == "fail":
        if comm.rank == 0:
            print("\n".join(f"line {i}" for i in range(30)), flush=True)
            print("Traceback: something broke", flush=True)
        sys.exit(3)
    if mode == "wait":
        got = []
        signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
        comm.Barrier()                       # every rank handles SIGUSR1 before WAITING
        if comm.rank == 0:
            print("WAITING", flush=True)
        deadline = time.time() + 60
        while not got and time.time() < deadline:
            time.sleep(0.05)
        comm.Barrier()
        sys.exit(elastic.EXIT_STOPPED)
    if mode == "early":
        comm.Barrier()
        if comm.rank == 0:
            print("STARTING", flush=True)
        time.sleep(60)
    if comm.rank == 0:
        print(f"RAN ON {comm.size}", flush=True)


if __name__ == "__main__":
    main()
