"""``algorithm="auto"``: every all-reduce goes to the algorithm that is fastest at its size.

:mod:`.table` holds the size ranges and their rules, :mod:`.cache` keeps a measured table on
disk, :mod:`.routing` fixes the table inside the communicator. A profile named by
``NNABLA_TORUS_AUTO_PROFILE`` comes through :func:`load_profile`, whose loader the package
root registers (the planning layer's :class:`nnabla_torus.planning.auto_profile.AutoProfile`),
so this layer never imports the planner's. The root hands in its version too
(:func:`register_package_version`), which the cache key holds.
"""
_profile_loader = None
_package_version = None


def register_profile_loader(loader):
    """Set ``loader(name)``: a profile name -> an object with ``calibrated_table(ranks,
    per_host)``, ``missing_terms(candidates)`` and ``predicted_times(candidates, ranks,
    per_host, grid_x, sizes)``."""
    global _profile_loader
    _profile_loader = loader


def load_profile(name):
    """The profile ``name`` as auto reads it (an unknown name raises, naming the shipped ones)."""
    if _profile_loader is None:
        raise RuntimeError("no profile loader is registered for NNABLA_TORUS_AUTO_PROFILE "
                           "(import nnabla_torus first: the package root registers it)")
    return _profile_loader(name)


def register_package_version(version):
    """Set the nnabla_torus version that :mod:`.cache`'s key holds (the package root's
    ``__version__``: this layer does not import the root)."""
    global _package_version
    _package_version = version


def package_version():
    """The nnabla_torus version the package root registered."""
    return _package_version
