"""A machine profile as the communicator's ``algorithm="auto"`` reads it
(``NNABLA_TORUS_AUTO_PROFILE``): a table ``tools/calibrate.py`` measured, else the cost
model's time per algorithm and size. The package root registers :class:`AutoProfile` with
:mod:`nnabla_torus.comm.auto`, so the communicator gets it without importing this layer.
"""
from ..comm.collectives import REGISTRY
from .costmodel import allreduce_time
from .machine_profile import load_profile


class AutoProfile:
    """The profile ``name``'s answers to auto (an unknown name raises here)."""

    def __init__(self, name):
        self.name, self.profile = name, load_profile(name)

    def calibrated_table(self, ranks, per_host):
        """(bounds, names) measured by tools/calibrate.py for this job's shape, or None."""
        return (self.profile.extra or {}).get("auto_tables", {}).get((ranks, per_host))

    def missing_terms(self, candidates):
        """The candidates whose software term the profile's cost model lacks (sorted)."""
        return sorted(set(candidates) - set(self.profile.network.software or {}))

    def predicted_times(self, candidates, ranks, per_host, grid_x, sizes):
        """``{algorithm: [seconds per size]}`` from the profile's cost model for this job."""
        net = self.profile.network._replace(gpus_per_host=per_host)
        return {name: [float(allreduce_time(net, name, ranks, n,
                                            grid_x if REGISTRY[name].takes_grid else None))
                       for n in sizes]
                for name in candidates}
