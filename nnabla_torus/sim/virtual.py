"""Virtual backend: N ranks of our own collective code in one process, messages matched in memory.

Each rank is a greenlet that runs the code users run: ``collectives.torus2d`` / ``ring`` /
``hierarchical``, the MPI backend's step generators (inherited, not re-implemented) and the
communicator's settings and route. Only the transport is virtual: ``VirtualComm`` gives the
generators ``Isend`` / ``Irecv`` / ``Dup`` / ``Get_rank``, and ``World``
(:mod:`nnabla_torus.sim.virtual_world`) matches a send with its receive; a send completes only
when its receive is posted, so an ordering bug that MPI's buffering would hide still deadlocks,
and ``Deadlock`` names the waiting ranks instead of hanging. Timed
(``nnabla_torus.sim.simulate``), every matched message becomes a flow on a simulated platform.
``library_all_reduce`` runs our ring. docs/simulation.md#virtual-ranks.
Example (4 ranks, torus2d on 2x2, integer-valued float32 buffers)::

    >>> import numpy as np
    >>> bufs = [np.arange(6, dtype=np.float32) + r for r in range(4)]
    >>> run_allreduce(bufs, "torus2d", grid="2x2", ranks_per_host=2)
    >>> bufs[3].tolist()
    [6.0, 10.0, 14.0, 18.0, 22.0, 26.0]
"""
from ..comm import grid_layouts
from ..comm.collectives import PIPELINE_BYTES, get_algorithm
from ..comm.settings import CommSettings
from ..knobs import TIMEOUT_MAX_S
from ..comm.topology import HostLayout
from ..comm.backends.lanes import run_lanes, waiting_in
from ..comm.backends.mpi import Group, MPIBackend
from .virtual_world import Deadlock, World
from .virtual_world import WallLimit  # noqa: F401  (importers take it from here)


class VirtualComm:
    """What the MPI backend's step generators use of an mpi4py communicator, over a World.

    ``context`` identifies the communicator (the same on every member: members create and
    duplicate their communicators in the same order). Only the first communicator of a group
    carries reduce-scatters (``Group.gather_comm`` is a Dup), so ``reduces`` is True there;
    the timed world charges an add for every byte received on it.
    """

    def __init__(self, world, ranks, position, context, reduces=True):
        self.world, self.ranks, self.position = world, ranks, position
        self.context, self.reduces, self._dups = context, reduces, 0

    def Get_rank(self):
        return self.position

    def Dup(self):
        self._dups += 1
        return VirtualComm(self.world, self.ranks, self.position, (self.context, self._dups),
                           reduces=False)

    def Isend(self, buf, dest, tag=0):
        return self.world.post(True, self, self.ranks[self.position], self.ranks[dest], tag,
                               array_of(buf))

    def Irecv(self, buf, source, tag=0):
        return self.world.post(False, self, self.ranks[source], self.ranks[self.position], tag,
                               array_of(buf))


def array_of(message):
    """The numpy array of an mpi4py message: a buffer, or [buffer, datatype] (``mpi.raw``)."""
    return message[0] if isinstance(message, (list, tuple)) else message


class VirtualBackend(MPIBackend):
    """MPIBackend whose transport is a World: the primitives are the MPI backend's own."""
    name = "virtual"

    def __init__(self, world, rank, segment_bytes=1 << 62, pipeline_bytes=PIPELINE_BYTES):
        # No MPIBackend.__init__: it duplicates MPI.COMM_WORLD. These are the fields the
        # inherited primitives read.
        self.world_sim, self.rank, self.size = world, rank, world.size
        self.timeout = float("inf")
        self.segment_bytes, self.pipeline_bytes = int(segment_bytes), int(pipeline_bytes)
        self.shm = False     # rows exchange messages: the shared-memory row phase is not simulated
        self._groups, self._scratch = {}, {}
        self.finished, self.gen, self.pending, self.waiting = False, 0, 0, ("", ())
        self.world_group = self.group(range(self.size))

    def group(self, ranks):
        key = tuple(ranks)
        if key not in self._groups:
            if self.rank not in key:
                raise ValueError(f"virtual rank {self.rank} is not a member of group {list(key)}")
            comm = VirtualComm(self.world_sim, key, key.index(self.rank),
                               self.world_sim.context_of(key))
            self._groups[key] = Group(comm, key)
        return self._groups[key]

    def wait(self, requests, what, peers):
        """Block this rank's greenlet until all ``requests`` are done (then pay their costs)."""
        self.world_sim.block(self, [r for r in requests if not r.done], len(requests), what,
                             peers)
        self.world_sim.charge(self, requests)

    def run_lanes(self, lanes):
        """Advance generators of waits together: the MPI backend's scheduler
        (``comm/backends/lanes.py``), blocking this greenlet between rounds (BlockingLanes)."""
        if self.world_sim.recorder is not None:
            lanes = self.world_sim.recorder.lanes(self.rank, lanes)
        run_lanes(lanes, BlockingLanes(self), self.rank, self.timeout)

    def library_all_reduce(self, group, buf, what="native all_reduce"):
        """Stand-in for the library's all-reduce: our ring (see the module docstring)."""
        self.all_reduce(group, buf, what)


class BlockingLanes:
    """The virtual ranks' transport for the lane scheduler: a wait is done when every request
    is (then it pays their costs); a round that moved no lane blocks the rank's greenlet on
    the pending requests, and raises Deadlock when the lanes only wait for each other."""

    def __init__(self, backend):
        self.backend = backend

    def done(self, requests):
        if not all(r.done for r in requests):
            return False
        self.backend.world_sim.charge(self.backend, requests)
        return True

    def progressed(self):
        pass

    def idle(self, items):
        pending = [r for ready, _, _ in items if not callable(ready) for r in ready if not r.done]
        what, peers = waiting_in(items)
        if not pending:   # every lane waits for another lane: none can ever move
            raise Deadlock(f"virtual rank {self.backend.rank}: its lanes wait for each other "
                           f"in {what!r}")
        self.backend.world_sim.block(self.backend, pending, 1, what, peers)


def make_ranks(world, ranks_per_host, algorithm, grid=None, pipeline_bytes=PIPELINE_BYTES):
    """(backends, routes) of every virtual rank (a ``collectives.Route`` each); ranks placed
    host by host.

    ``grid``: "XxY" or topology.Grid for torus2d (None: the communicator's default grid);
    errors (a grid that does not fit the world) are the communicator's ValueErrors.
    """
    if ranks_per_host < 1 or world.size % ranks_per_host:
        raise ValueError(f"ranks per host {ranks_per_host} must divide the virtual world size "
                         f"{world.size} (ranks are placed host by host)")
    hosts = HostLayout([list(range(h, h + ranks_per_host))
                        for h in range(0, world.size, ranks_per_host)])
    backends = [VirtualBackend(world, r, pipeline_bytes=pipeline_bytes)
                for r in range(world.size)]
    # The communicator's settings (keyword arguments, else its NNABLA_TORUS_* variables, all
    # checked as a communicator checks them), with a timeout that virtual time never reaches.
    settings = CommSettings.resolve(algorithm=algorithm, grid=grid, backend="mpi",
                                    timeout=TIMEOUT_MAX_S, check=False, backend_names=("mpi",))
    grid = grid_layouts.grid_for(algorithm, settings.grid, hosts, world.size)
    rank_routes = [grid_layouts.make_route(b, hosts, b.rank, algorithm, grid) for b in backends]
    return backends, rank_routes


def run_allreduce(buffers, algorithm, grid=None, ranks_per_host=1, network=None,
                  pipeline_bytes=PIPELINE_BYTES, max_wall=None, recorder=None):
    """Sum ``buffers`` (one 1-D numpy array per rank) in place with ``algorithm``.

    Runs the collective as the communicator would (its grid and route, the algorithm from
    ``collectives``); returns (simulated seconds, World) when ``network`` is given, else None;
    ``recorder``: see World.
    """
    world = World(len(buffers), network, max_wall, recorder)
    backends, rank_routes = make_ranks(world, ranks_per_host, algorithm, grid, pipeline_bytes)
    run = get_algorithm(algorithm)
    seconds = world.run(lambda b: run(b, rank_routes[b.rank], buffers[b.rank]), backends)
    return (seconds, world) if network is not None or recorder is not None else None
