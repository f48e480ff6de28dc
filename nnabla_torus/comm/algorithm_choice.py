"""Which all-reduce algorithm a call runs, and running it: the one ``set_algorithm`` fixed, or
auto's by size.

``set_algorithm`` makes the route (:mod:`.grid_layouts`) of the named algorithm, or for ``auto``
the routes of its candidates and, the first time, its table of size ranges
(:mod:`.auto.routing`). A call then sums each buffer through ``_buffer_sum``: the world's
algorithm on the world, a ring on any other group, each through
``collectives.run_algorithm``; ``algorithm_counts`` counts the world calls per algorithm.
"""
import numpy as np

from . import grid_layouts
from .auto import routing as auto_routing
from .collectives import AUTO, Route, check_backend, run_algorithm


class AlgorithmChoice:
    """The algorithm methods of :class:`.communicator.TorusCommunicator` (its ``settings``,
    ``hosts``, ``backend``, ``_routes``: routes by (algorithm, grid), ``auto_table``)."""

    def set_algorithm(self, algorithm, grid=None):
        """Switch the world all-reduce to ``algorithm`` (and ``grid``); collective on all ranks.

        ``auto``: the routes of its candidates, and (first time) the table of size ranges."""
        backend = self.settings.backend
        check_backend(algorithm, backend)   # also: ValueError for an unknown name
        request = self.settings.grid
        if algorithm == AUTO:
            grid = grid or request or grid_layouts.host_rows(self.hosts, self.size)
            self.auto_routes = {name: self._route_for(name, grid, quiet=True)
                               for name in auto_routing.candidates(self.hosts, backend)}
            self.algorithm = AUTO
            self.grid = grid_layouts.grid_for("torus2d", grid, self.hosts, self.size, quiet=True)
            self._route = self.auto_routes["torus2d"]
            if self.auto_table is None:
                self.auto_table = auto_routing.fix_table(self)
            return
        self.algorithm = algorithm
        self.grid = grid_layouts.grid_for(algorithm, grid or request, self.hosts, self.size)
        self._route = self._route_for(algorithm, grid)

    def _route_for(self, algorithm, grid=None, quiet=False):
        grid = grid_layouts.grid_for(algorithm, grid or self.settings.grid, self.hosts, self.size,
                                     quiet)
        key = (algorithm, str(grid))
        if key not in self._routes:
            self._routes[key] = grid_layouts.make_route(self.backend, self.hosts, self.rank,
                                                        algorithm, grid)
        return self._routes[key]

    def _buffer_sum(self, group, grp):
        """(sum_buffer(buf), algorithm name) for a sum over ``group``: the world algorithm,
        else a ring."""
        if group == "world":
            return (self._sum_auto if self.algorithm == AUTO else self._sum_world), self.algorithm

        def sum_buffer(buf):
            run_algorithm(self.backend, "ring", Route(grp, grp, None), buf, self._checking)
        return sum_buffer, "ring"

    def _sum_world(self, buf):
        self.algorithm_counts[self.algorithm] += 1
        run_algorithm(self.backend, self.algorithm, self._route, buf, self._checking)

    def _sum_auto(self, buf):
        """One world all-reduce routed by its byte count (the same choice on every rank)."""
        name = self.auto_table.choose(buf.size * np.dtype(buf.dtype).itemsize)  # any backend
        self.algorithm_counts[name] += 1
        run_algorithm(self.backend, name, self.auto_routes[name], buf, self._checking)
