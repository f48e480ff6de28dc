"""Virtual backend: N ranks of our own collective code in one process, messages matched in memory.

Each rank is a greenlet that runs the code users run: ``collectives.torus2d`` / ``ring`` /
``hierarchical``, the MPI backend's step generators (inherited, not re-implemented) and the
communicator's settings and plan. Only the transport is virtual: ``VirtualComm`` gives the
generators ``Isend`` / ``Irecv`` / ``Dup`` / ``Get_rank``, and ``World`` matches a send with
its receive; a send completes only when its receive is posted, so an ordering bug that MPI's
buffering would hide still deadlocks, and ``Deadlock`` names the waiting ranks instead of
hanging. Timed (``nnabla_torus.sim.simulate``), every matched message becomes a flow on a
simulated platform. ``library_all_reduce`` runs our ring. docs/simulation.md#virtual-ranks.
Example (4 ranks, torus2d on 2x2, integer-valued float32 buffers)::

    >>> import numpy as np
    >>> bufs = [np.arange(6, dtype=np.float32) + r for r in range(4)]
    >>> run_allreduce(bufs, "torus2d", grid="2x2", ranks_per_host=2)
    >>> bufs[3].tolist()
    [6.0, 10.0, 14.0, 18.0, 22.0, 26.0]
"""
import gc
import heapq
import time
from collections import deque

try:
    from greenlet import greenlet, getcurrent
except ImportError as e:   # an optional extra: the communicator itself does not need it
    raise ImportError("virtual ranks and the simulator need greenlet: "
                      "pip install 'nnabla-torus[simulate]' (or pip install greenlet)") from e

from ..comm import grid_layouts
from ..comm.collectives import PIPELINE_BYTES, get_algorithm
from ..comm.settings import CommSettings
from ..knobs import TIMEOUT_MAX_S
from ..comm.topology import HostLayout
from ..comm.backends.mpi import Group, MPIBackend

MAX_RANKS = 1 << 16   # a sanity bound on the world size (one greenlet and buffer per rank)


class Deadlock(RuntimeError):
    """No virtual rank can move: every unfinished rank waits for a message never sent."""


class WallLimit(RuntimeError):
    """The simulation ran longer (wall clock) than its ``max_wall`` seconds."""


class Request:
    """A posted send or receive: ``done`` once matched (untimed) or delivered (timed)."""
    __slots__ = ("done", "waiter", "gen", "nbytes", "send", "reduces", "rid")  # rid: recorder's

    def __init__(self, send, reduces):
        self.done, self.waiter, self.gen, self.nbytes = False, None, 0, 0
        self.send, self.reduces = send, reduces


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
        """Advance generators of waits together (as MPIBackend.run_lanes), blocking on any."""
        if self.world_sim.recorder is not None:
            lanes = self.world_sim.recorder.lanes(self.rank, lanes)
        waiting = [[lane, next(lane, None)] for lane in lanes]
        waiting = [entry for entry in waiting if entry[1] is not None]
        while waiting:
            moved = False
            for entry in list(waiting):
                lane, item = entry
                while item is not None and (item[0]() if callable(item[0])
                                            else all(r.done for r in item[0])):
                    if not callable(item[0]):
                        self.world_sim.charge(self, item[0])
                    item, moved = next(lane, None), True
                entry[1] = item
                if item is None:
                    waiting.remove(entry)
            if waiting and not moved:
                pending = [r for _, item in waiting if not callable(item[0])
                           for r in item[0] if not r.done]
                what = next((item[1] for _, item in waiting if item[1]), "pipelined all-reduce")
                if not pending:   # every lane waits for another lane: none can ever move
                    raise Deadlock(f"virtual rank {self.rank}: its lanes wait for each other "
                                   f"in {what!r}")
                self.world_sim.block(self, pending, 1, what,
                                     [p for _, item in waiting for p in item[2]])

    def library_all_reduce(self, group, buf, what="native all_reduce"):
        """Stand-in for the library's all-reduce: our ring (see the module docstring)."""
        self.all_reduce(group, buf, what)


class World:
    """The scheduler of ``size`` virtual ranks: message matching, and a clock when timed.

    ``network`` (optional, see ``nnabla_torus.sim.simulate.FlowNetwork``) has ``attach(world)``,
    ``start(src, dst,
    nbytes, done)`` (call ``done()`` when delivered), ``next_time()``, ``advance(t)`` and
    ``cost(rank, reduce_bytes, send_bytes, sends)`` (seconds a rank computes after a wait).
    ``max_wall``: wall-clock seconds before WallLimit is raised (None: no limit).
    ``recorder`` (optional, untimed runs; see ``nnabla_torus.sim.simgrid.Recorder``) has
    ``post(request, send, src, dst, key, nbytes)``, ``cost`` (as the network's) and
    ``wait(rank, requests, seconds)``: it writes down every rank's posts and waits in order.
    """

    def __init__(self, size, network=None, max_wall=None, recorder=None):
        if not 1 <= size <= MAX_RANKS:
            raise ValueError(f"virtual world size {size} outside 1..{MAX_RANKS}")
        self.size, self.network, self.max_wall = size, network, max_wall
        self.recorder = recorder
        self.now = 0.0
        self.messages = 0
        self._events = []   # (time, seq, callback)
        self._seq = 0
        self._sends, self._recvs = {}, {}
        self._contexts = {}  # group's ranks -> small int (hashing 2,176-tuples is slow)
        self._ready = deque()
        self._hub = None
        if network is not None:
            network.attach(self)

    # -- messages ---------------------------------------------------------------------------
    def context_of(self, ranks):
        """The communicator id of the group over ``ranks`` (the same for all its members)."""
        return self._contexts.setdefault(ranks, len(self._contexts))

    def post(self, send, comm, src, dst, tag, buf):
        req = Request(send, comm.reduces)
        req.nbytes = buf.nbytes
        key = (comm.context, src, dst, tag)
        if self.recorder is not None:
            self.recorder.post(req, send, src, dst, (comm.context, tag), req.nbytes)
        mine, other = (self._sends, self._recvs) if send else (self._recvs, self._sends)
        queue = other.get(key)
        if not queue:
            mine.setdefault(key, deque()).append((req, buf))
            return req
        peer, peer_buf = queue.popleft()
        if not queue:
            del other[key]
        (sreq, sbuf), (rreq, rbuf) = ((req, buf), (peer, peer_buf)) if send else \
            ((peer, peer_buf), (req, buf))
        if sbuf.nbytes != rbuf.nbytes:
            raise ValueError(f"virtual rank {dst}: message from rank {src} (tag {tag}) has "
                             f"{sbuf.nbytes} bytes, the receive expects {rbuf.nbytes}")
        rbuf[...] = sbuf
        self.messages += 1
        if self.network is None:
            self.complete(sreq)
            self.complete(rreq)
        else:
            self.network.start(src, dst, sbuf.nbytes,
                               lambda: (self.complete(sreq), self.complete(rreq)))
        return req

    def complete(self, req):
        req.done = True
        rank = req.waiter
        if rank is not None and rank.gen == req.gen:
            rank.pending -= 1
            if rank.pending == 0:
                rank.gen += 1
                self._ready.append(rank)

    # -- ranks ------------------------------------------------------------------------------
    def block(self, rank, pending, need, what, peers):
        """Switch away from ``rank`` until ``min(need, len(pending))`` of ``pending`` are done."""
        if not pending:
            return
        rank.pending = min(need, len(pending))
        for r in pending:
            r.waiter, r.gen = rank, rank.gen
        rank.waiting = (what, peers)
        self._hub.switch()

    def charge(self, rank, requests):
        """Timed: sleep ``rank`` for the compute its completed ``requests`` imply (recorded:
        write the wait and those seconds down instead)."""
        model = self.network if self.network is not None else self.recorder
        if model is None:
            return
        seconds = model.cost(
            rank.rank, sum(r.nbytes for r in requests if r.reduces and not r.send),
            sum(r.nbytes for r in requests if r.send), any(r.send for r in requests))
        if model is self.recorder:
            self.recorder.wait(rank.rank, requests, seconds)
        elif seconds > 0:
            self.at(self.now + seconds, lambda: self._ready.append(rank))
            rank.gen += 1   # nothing else may wake it meanwhile
            self._hub.switch()

    def at(self, when, callback):
        """Run ``callback`` at simulated time ``when``."""
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, callback))

    def run(self, body, backends):
        """Run ``body(backend)`` on every virtual rank to completion; returns simulated seconds.

        Raises Deadlock when no rank can move, WallLimit past ``max_wall``, and any rank's
        exception as RuntimeError naming the rank.
        """
        self._hub = getcurrent()
        start = time.monotonic()
        collecting = gc.isenabled()
        gc.disable()   # thousands of live greenlets make every full collection slow
        try:
            return self._run(body, backends, start)
        finally:
            if collecting:
                gc.enable()

    def _run(self, body, backends, start):
        def make(b):
            def main():
                body(b)
                b.finished = True
            b.greenlet = greenlet(main)
            return b
        self._ready = deque(make(b) for b in backends)
        steps = 0
        while True:
            while self._ready:
                b = self._ready.popleft()
                try:
                    b.greenlet.switch()
                except (Deadlock, WallLimit):
                    raise
                except Exception as e:
                    raise RuntimeError(f"virtual rank {b.rank} of {self.size}: "
                                       f"{type(e).__name__}: {e}") from e
                steps += 1
                if self.max_wall is not None and steps % 4096 == 0 \
                        and time.monotonic() - start > self.max_wall:
                    raise WallLimit(self._wall_message(start))
            t = min(self._events[0][0] if self._events else float("inf"),
                    self.network.next_time() if self.network else float("inf"))
            if t == float("inf"):
                break
            self.now = t
            if self.network:
                self.network.advance(t)
            while self._events and self._events[0][0] <= t:
                heapq.heappop(self._events)[2]()
            if self.max_wall is not None and time.monotonic() - start > self.max_wall:
                raise WallLimit(self._wall_message(start))
        stuck = [b for b in backends if not b.finished]
        if stuck:
            shown = "; ".join(f"rank {b.rank} waits in {b.waiting[0]!r} for rank(s) "
                              f"{sorted(set(b.waiting[1]))[:4]}" for b in stuck[:4])
            raise Deadlock(f"{len(stuck)} of {self.size} virtual ranks can never finish "
                           f"(no message in flight): {shown}")
        return self.now

    def _wall_message(self, start):
        return (f"simulation of {self.size} ranks exceeded --max-wall {self.max_wall:g} s "
                f"(ran {time.monotonic() - start:.1f} s, {self.messages} messages, simulated "
                f"time {self.now * 1e3:.3f} ms); raise --max-wall or simulate fewer ranks")


def make_ranks(world, ranks_per_host, algorithm, grid=None, pipeline_bytes=PIPELINE_BYTES):
    """(backends, plans) of every virtual rank (a ``collectives.Plan`` each); ranks placed
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
    rank_plans = [grid_layouts.make_plan(b, hosts, b.rank, algorithm, grid) for b in backends]
    return backends, rank_plans


def run_allreduce(buffers, algorithm, grid=None, ranks_per_host=1, network=None,
                  pipeline_bytes=PIPELINE_BYTES, max_wall=None, recorder=None):
    """Sum ``buffers`` (one 1-D numpy array per rank) in place with ``algorithm``.

    Runs the collective as the communicator would (its grid and plan, the algorithm from
    ``collectives``); returns (simulated seconds, World) when ``network`` is given, else None;
    ``recorder``: see World.
    """
    world = World(len(buffers), network, max_wall, recorder)
    backends, rank_plans = make_ranks(world, ranks_per_host, algorithm, grid, pipeline_bytes)
    run = get_algorithm(algorithm)
    seconds = world.run(lambda b: run(b, rank_plans[b.rank], buffers[b.rank]), backends)
    return (seconds, world) if network is not None or recorder is not None else None
