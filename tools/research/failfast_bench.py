"""Measure what one ``failfast.gone()`` poll costs (it runs while a wait idles).

    python -m nnabla_torus.launching.mpirun_cmd -np 4 tools/research/failfast_bench.py
    python -m nnabla_torus.launching.mpirun_cmd -np 2 tools/research/failfast_bench.py \\
        --requests 1,63,2175

``gone()`` (nnabla_torus/comm/failfast.py) runs one ``MPI_Testsome`` over the p - 1 exit-notice
receives each rank keeps posted, so that poll's cost grows with the rank count p; it polls at
most every ``failfast.GONE_POLL_S`` (0.1 s), and a call between polls only reads a dict. Rows:

  gone        ``failfast.gone(peers)`` on this job's p ranks: us per call on rank 0 and the
              slowest rank (median of --repeat timings of --calls calls each); the ranks
              take turns while the others sleep, so oversubscribed cores do not count
  testsome K  ``MPI.Request.Testsome`` over K receives that never complete (posted on rank 0
              from rank 1, cancelled at the end): what one poll of ``gone()`` costs on
              p = K + 1 ranks without launching them (2175: the paper's 2,176 GPUs)

The last column is that cost as a share of ``--interval-ms`` (default: the waits'
``waits.LOST_CHECK_S``, 10 ms, at which they call ``gone()``; with ``GONE_POLL_S`` a
``testsome`` row costs its share of 100 ms instead: pass ``--interval-ms 100``).
"""
import argparse
import statistics
import time

import numpy as np

from nnabla_torus.comm import failfast, mpi_tags
from nnabla_torus.comm.communicator import MPI  # MPI started as train.py starts it
from nnabla_torus.comm.waits import LOST_CHECK_S

TAG = mpi_tags.EXIT_TAG + 1     # never sent: the synthetic receives stay pending


def per_call_us(poll, calls, repeat):
    """Median over ``repeat`` timings of ``calls`` calls of ``poll()``, us per call."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            poll()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def in_turn(world, measure):
    """``measure()`` on each rank in turn while the others sleep (no busy MPI wait); the list
    of results on rank 0."""
    results = []
    for turn in range(world.size):
        if world.rank == turn:
            results.append(measure())
        done = world.Ibarrier()
        while not done.Test():
            time.sleep(1e-3)
    return world.gather(results[0], root=0)


def testsome_us(world, count, calls, repeat):
    """us per ``Testsome`` over ``count`` pending receives (rank 0), None on other ranks."""
    if world.rank != 0:
        return None
    buffer = np.zeros(count, np.int64)
    requests = [world.Irecv(buffer[i:i + 1], source=1, tag=TAG) for i in range(count)]
    us = per_call_us(lambda: MPI.Request.Testsome(requests), calls, repeat)
    for request in requests:
        request.Cancel()
        request.Wait()
    return us


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000,
                        help="calls per timing (default: 2000)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="timings per row, the median is shown (default: 5)")
    parser.add_argument("--requests", default="",
                        help="comma-separated K for the testsome rows, e.g. 1,63,2175 "
                             "(default: none; needs 2 or more ranks)")
    parser.add_argument("--gone-poll-s", type=float, default=failfast.GONE_POLL_S,
                        help="seconds between gone()'s Testsome polls for this run; 0 polls "
                             f"on every call, as before the bound (default: "
                             f"{failfast.GONE_POLL_S:g}, failfast.GONE_POLL_S)")
    parser.add_argument("--interval-ms", type=float, default=LOST_CHECK_S * 1e3,
                        help="interval between polls the share column assumes "
                             f"(default: {LOST_CHECK_S * 1e3:g}, waits.LOST_CHECK_S)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.size < 2:
        parser.error("run it on 2 or more ranks (gone() watches peers only then)")
    failfast.GONE_POLL_S = args.gone_poll_s
    failfast.install()
    peers = [r for r in range(world.size) if r != world.rank]
    every = in_turn(world, lambda: per_call_us(lambda: failfast.gone(peers), args.calls,
                                               args.repeat))
    rows = [(f"gone p={world.size}", every[0] if every else None, max(every or [0]))]
    for count in (int(k) for k in args.requests.split(",") if k):
        us = testsome_us(world, count, args.calls, args.repeat)
        rows.append((f"testsome K={count}", us, us))
    world.Barrier()
    if world.rank == 0:
        print(f"# failfast_bench: {MPI.Get_library_version().splitlines()[0].strip()}; "
              f"{world.size} ranks; {args.calls} calls x {args.repeat}, medians; "
              f"gone() polls every {args.gone_poll_s:g} s")
        print(f"# {'row':>18} {'rank0(us)':>10} {'max(us)':>10} {'share':>8}")
        for name, us, worst in rows:
            share = worst / (args.interval_ms * 1e3)
            print(f"  {name:>18} {us:10.2f} {worst:10.2f} {share:8.2%}")


if __name__ == "__main__":
    main()
