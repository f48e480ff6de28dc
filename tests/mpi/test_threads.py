"""Collectives called from several threads of each rank (nnabla_torus/comm/threads.py).

One after another (each thread joined before the next starts) the sums are exact; at the same
time the job ends within seconds with ConcurrentCall naming two threads, and no thread sees a
wrong sum first (before: sums like 2001 where 3 was expected, then a hang until the timeout).
Which error ends it is a race: a rank whose first thread paired with another rank's other
thread (their arrays differ in shape) can meet the argument check's mismatch before any rank
sees two of its own threads inside; both end the job, and neither returns a wrong sum.
"""
import re
import time

import pytest

from tests.mpirun import run_mpi
from tests.slowdown import scaled

PROG = "tests/mpi/progs/comm_cases.py"


@pytest.mark.parametrize("ranks, threads", [(2, 2), (2, 4), (4, 2), (4, 3)])
def test_concurrent_collectives_are_refused_naming_both_threads(ranks, threads):
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:      # run_mpi raises on a non-zero exit
        run_mpi(ranks, [PROG, "threads"], timeout=90,
                env={"THREADS": str(threads), "NNABLA_TORUS_TIMEOUT": "60"})
    out = str(failed.value)
    assert re.match(r"exit [1-9]\d*: ", out), out[-3000:]       # ended, not timed out
    assert out.count("one after another OK") == ranks, out[-3000:]
    concurrent = (r"ConcurrentCall: rank \d: all_reduce \(torus2d, group 'world'\) called "
                  r"from thread 'worker-\d' while thread 'worker-\d' is inside all_reduce")
    paired_across_threads = (r"in thread worker-\d: all_reduce \(torus2d, group 'world'\): "
                             r"ranks called it with different arguments")
    assert re.search(concurrent, out) or re.search(paired_across_threads, out), out[-3000:]
    assert "WRONG" not in out and "were not refused" not in out, out[-3000:]
    assert time.monotonic() - start < scaled(60)
