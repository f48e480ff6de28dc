"""The scheduler of the virtual ranks: it matches each send with its receive, switches between
the ranks' greenlets, and keeps a simulated clock when timed.

``World`` is what ``VirtualComm`` and ``VirtualBackend`` (``nnabla_torus.sim.virtual``) post
to and block on: a send completes only when its receive is posted, and ``Deadlock`` names the
waiting ranks when none can move; ``WallLimit`` stops a run past its wall-clock budget. Timed,
a ``network`` delivers every matched message as a flow; recorded, a ``recorder`` writes every
post and wait down. docs/simulation.md#virtual-ranks.
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
