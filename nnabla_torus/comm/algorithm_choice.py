"""Which all-reduce algorithm a call runs: the one ``set_algorithm`` fixed, or auto's by size.

``set_algorithm`` makes the plan (:mod:`.grid_layouts`) of the named algorithm, or for ``auto``
the plans of its candidates and, the first time, its table of size ranges
(:mod:`.auto.routing`). A call then sums through ``_runner``: the world's algorithm on the
world, a ring on any other group; ``algorithm_counts`` counts the world calls per algorithm.
"""
import numpy as np

from . import grid_layouts
from .auto import routing as auto_routing
from .collectives import AUTO, Plan, get_algorithm
from .guarded_calls import exchange


class AlgorithmChoice:
    """The algorithm methods of :class:`.communicator.TorusCommunicator` (its ``settings``,
    ``hosts``, ``backend``, ``_plans``: plans by (algorithm, grid), ``auto_table``)."""

    def set_algorithm(self, algorithm, grid=None):
        """Switch the world all-reduce to ``algorithm`` (and ``grid``); collective on all ranks.

        ``auto``: the plans of its candidates, and (first time) the table of size ranges."""
        get_algorithm(algorithm, allow_auto=True)
        request = self.settings.grid
        if algorithm == AUTO:
            grid = grid or request or grid_layouts.host_rows(self.hosts, self.size)
            self.auto_plans = {name: self._plan_for(name, grid, quiet=True)
                               for name in auto_routing.candidates(self.hosts)}
            self.algorithm = AUTO
            self.grid = grid_layouts.grid_for("torus2d", grid, self.hosts, self.size, quiet=True)
            self._plan = self.auto_plans["torus2d"]
            if self.auto_table is None:
                self.auto_table = auto_routing.fix_table(self)
            return
        self.algorithm = algorithm
        self.grid = grid_layouts.grid_for(algorithm, grid or request, self.hosts, self.size)
        self._plan = self._plan_for(algorithm, grid)

    def _plan_for(self, algorithm, grid=None, quiet=False):
        grid = grid_layouts.grid_for(algorithm, grid or self.settings.grid, self.hosts, self.size,
                                     quiet)
        key = (algorithm, str(grid))
        if key not in self._plans:
            self._plans[key] = grid_layouts.make_plan(self.backend, self.hosts, self.rank,
                                                      algorithm, grid)
        return self._plans[key]

    def _runner(self, group, grp):
        """(run(buf), algorithm name) for a sum over ``group``: the world algorithm, else a ring."""
        if group == "world":
            return (self._run_auto if self.algorithm == AUTO else self._run_world), self.algorithm

        def run(buf):
            exchange(self, "ring", Plan(grp, grp, None), buf)
        return run, "ring"

    def _run_world(self, buf):
        self.algorithm_counts[self.algorithm] += 1
        exchange(self, self.algorithm, self._plan, buf)

    def _run_auto(self, buf):
        """One world all-reduce routed by its byte count (the same choice on every rank)."""
        name = self.auto_table.choose(buf.size * np.dtype(buf.dtype).itemsize)  # any backend
        self.algorithm_counts[name] += 1
        exchange(self, name, self.auto_plans[name], buf)
