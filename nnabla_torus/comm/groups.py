"""The communicator's named groups, as nnabla's: ``new_group``, ``list_groups``, ``find_group``.

A group is a name for a list of world ranks (``"world"``: all of them, registered by
``init()``); its members make its backend group at ``new_group``, after checking that they all
passed the same list (:func:`.rendezvous.check_group_lists`). A collective on a group runs on
the backend group :meth:`NamedGroups._group` returns, on members only.
"""
from .guarded_calls import guarded
from .rendezvous import check_group_lists
from .settings import DEFAULTS


class NamedGroups:
    """The group methods of :class:`.communicator.TorusCommunicator` (its ``_groups``: name ->
    ranks, ``_group_control``: the world communicator of the list check, ``backend``)."""

    def new_group(self, name_ranks):
        """Register group ``(name, ranks)``; members create its communicator. Returns ``name``."""
        name, ranks = name_ranks
        ranks = [int(r) for r in ranks]
        if name in self._groups:
            raise ValueError(f"group {name!r} exists already with ranks {self._groups[name]}")
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise ValueError(f"group {name!r}: ranks {ranks} must be distinct and in "
                             f"[0, {self.size})")
        if self.rank in ranks:
            be = self._ready()

            def create():   # members agree on the list first: a mismatch would block in MPI
                check_group_lists(self._group_control, name, ranks, self.timeout,
                                  getattr(be, "spin", DEFAULTS["spin"]),
                                  getattr(be, "poll_sleep", DEFAULTS["poll_sleep"]))
                be.group(ranks)
            guarded(self, f"new_group {name!r}", create)
        self._groups[name] = ranks
        return name

    def list_groups(self):
        return {name: list(ranks) for name, ranks in self._groups.items()}

    def find_group(self, group):
        """The ranks of ``group``, or ``[]`` for an unknown name (as nnabla)."""
        return list(self._groups.get(group, []))

    def _group(self, group):
        """The backend group for ``group``, raising ValueError if this rank is not a member."""
        be = self._ready()
        if group not in self._groups:
            raise ValueError(f"unknown group {group!r}; known: {sorted(self._groups)}")
        ranks = self._groups[group]
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not a member of group {group!r} "
                             f"(ranks {ranks}); only members may call its collectives")
        return be.world_group if group == "world" else be.group(ranks)
