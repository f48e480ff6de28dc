"""How much slower this machine runs now than the one the tests' time limits were set on.

Every wall-clock limit of the suite (a job's hard timeout, a bound on how soon a failure ends
a run) was measured on a 2-core machine with nothing else running. Under load, or on a slower
machine, the same job takes longer, so the limits are multiplied by one factor measured once
per test session::

    from tests.slowdown import scaled
    out = run_mpi(4, argv, timeout=120)        # run_mpi scales its timeout itself
    assert elapsed < scaled(20)                # a bound of 20 s on the reference machine

The factor is ``$NNABLA_TORUS_TEST_SLOWDOWN`` when set (a number >= 1); else the wall time of a
fixed pure-Python loop divided by its time on the reference machine, at least 1. The first
measurement sets the variable, so the jobs the tests start (which import this module too)
reuse it instead of measuring again.
"""
import os
import time

ENV = "NNABLA_TORUS_TEST_SLOWDOWN"
# Seconds the whole loop takes on the reference machine (2 cores, Python 3.10.13) when it has a
# core to itself: its CPU time there, 0.28 s (its wall time was 2.2 s at a load average of 7.7).
REFERENCE_S = 0.28
LOOP_SLICES = 8        # the loop runs in slices, so that a short burst of load is averaged in
LOOP_LENGTH = 1_000_000  # additions per slice


def measure_slowdown():
    """The wall time of the calibration loop over REFERENCE_S, at least 1 (no unit)."""
    start = time.perf_counter()
    for _ in range(LOOP_SLICES):
        total = 0
        for i in range(LOOP_LENGTH):
            total += i
        time.sleep(0)                      # let other processes run between slices
    return max(1.0, (time.perf_counter() - start) / REFERENCE_S)


def slowdown():
    """This session's factor: ``$NNABLA_TORUS_TEST_SLOWDOWN``, else measured once and stored
    there. ValueError names a value that is not a number >= 1."""
    text = os.environ.get(ENV)
    if text is None:
        factor = measure_slowdown()
        os.environ[ENV] = f"{factor:.2f}"
        return factor
    try:
        factor = float(text)
    except ValueError:
        factor = float("nan")
    if not factor >= 1:   # also catches nan
        raise ValueError(f"{ENV}={text!r} is not a valid value: must be a number >= 1 (how many "
                         f"times slower than the reference machine); unset it to measure")
    return factor


def scaled(seconds):
    """``seconds`` (a limit set on the reference machine) times this session's slowdown."""
    return seconds * slowdown()
