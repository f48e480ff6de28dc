"""auto's table: the algorithm per byte range, from measured or predicted times.

At ``init()`` the communicator fixes a ``Table`` of byte ranges -> algorithm for its world,
computed on rank 0 and broadcast, so every rank makes the same choice for the same call. Its
source: a profile's cost model (``NNABLA_TORUS_AUTO_PROFILE``), else a quick measurement on the
spot (:func:`measure`), cached on disk (:mod:`.cache`). At each measured size native is
kept unless another candidate is faster by more than ``MARGIN``, so auto is not slower than
native at any measured size; ranges split at the geometric mean of neighbouring sizes.
Sources, timings and the cache: docs/communicator.md#auto. Example::

    >>> t = table_from_times([1 << 14, 1 << 20, 1 << 24],
    ...                      {"native": [1.0, 9.0, 90.0], "torus2d": [2.0, 5.0, 40.0]})
    >>> t.choose(4096), t.choose(1 << 22), t.describe()
    ('native', 'torus2d', 'native < 128 KiB <= torus2d')
"""
import bisect
import math
import time

import numpy as np

from ...knobs import short_repr

SIZES = tuple(1 << k for k in range(12, 27, 2))   # 4 KiB .. 64 MiB, x4 steps (bytes)
MEASURE_ITERS = 3   # timed calls per algorithm and size (after one untimed call); 2 from 16 MiB
LARGE = 16 << 20
# How much faster than native another algorithm must be to replace it at a size (a fraction):
# above the spread of the median of MEASURE_ITERS interleaved calls on a busy host (~5 %).
MARGIN = 0.1


class Table:
    """Algorithm per byte range: ``names[i]`` for ``bounds[i-1] <= nbytes < bounds[i]``."""

    def __init__(self, bounds, names, source):
        self.bounds, self.names, self.source = list(bounds), list(names), source

    def choose(self, nbytes):
        return self.names[bisect.bisect_right(self.bounds, nbytes)]

    def describe(self):
        parts = [self.names[0]]
        for bound, name in zip(self.bounds, self.names[1:]):
            parts += [f"< {_size(bound)} <=", name]
        return " ".join(parts)

    def __eq__(self, other):
        return (self.bounds, self.names) == (other.bounds, other.names)


def table_problem(bounds, names, algorithms):
    """Why ``bounds`` and ``names`` (read from a file) make no Table of ``algorithms``, in a
    few words; None when they do: byte bounds strictly ascending positive integers, one name
    more than bounds, each a known algorithm."""
    if not isinstance(bounds, list) or not isinstance(names, list):
        return f"bounds {short_repr(bounds)} and algorithms {short_repr(names)} must be lists"
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bounds) or \
            any(low >= high for low, high in zip(bounds, bounds[1:])):
        return f"bounds {short_repr(bounds)} must be ascending positive integers (bytes)"
    if len(names) != len(bounds) + 1:
        return (f"{len(names)} algorithms for {len(bounds)} bounds: give one algorithm more "
                f"than bounds")
    unknown = [name for name in names if name not in algorithms]
    if unknown:
        return f"algorithm {short_repr(unknown[0])} is not one of {sorted(algorithms)}"
    return None


def _size(nbytes):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def table_from_times(sizes, times, source="measured", margin=MARGIN):
    """A Table from ``{algorithm: [seconds per size]}`` at ``sizes`` (ascending bytes): at
    each size native, unless the fastest other candidate beats it by more than ``margin``."""
    others = [a for a in times if a != "native"]
    if "native" not in times or not others:
        return table_from_names(sizes, winners(times), source)
    best_other = winners({a: times[a] for a in others})
    names = [other if times[other][i] < (1.0 - margin) * times["native"][i] else "native"
             for i, other in enumerate(best_other)]
    return table_from_names(sizes, names, source)


def table_from_names(sizes, names, source):
    """A Table giving ``names[i]`` around ``sizes[i]``."""
    bounds, merged = [], [names[0]]
    for i in range(1, len(names)):
        if names[i] != merged[-1]:
            # a power-of-two-ish split at the geometric mean of the two measured sizes
            bounds.append(int(2 ** round(math.log2(math.sqrt(sizes[i - 1] * sizes[i])))))
            merged.append(names[i])
    return Table(bounds, merged, source)


def winners(times):
    """``{algorithm: [seconds per size]}`` -> the fastest algorithm at each size."""
    names = list(times)
    return [names[int(np.argmin([times[a][i] for a in names]))]
            for i in range(len(next(iter(times.values()))))]


def measure(run, candidates, sizes=SIZES, iters=MEASURE_ITERS, timer=time.perf_counter,
            slowest=max):
    """``{algorithm: [median seconds per size]}``: ``run(name, nbytes)`` is one collective
    call, ``slowest(seconds)`` the slowest rank's time (a MAX all-reduce), ``timer`` the
    clock. Algorithms interleave at each size so machine noise hits them alike."""
    times = {name: [] for name in candidates}
    for nbytes in sizes:
        calls = {name: [] for name in candidates}
        for i in range(iters + 1):
            for name in candidates:
                start = timer()
                run(name, nbytes)
                took = slowest(timer() - start)
                if i:   # the first call of each warms caches and grows buffers
                    calls[name].append(took)
            if i == iters - 1 and nbytes >= LARGE:
                break   # large sizes: a call costs 10-100 ms here; one fewer
        for name in candidates:
            times[name].append(float(np.median(calls[name])))
    return times
