"""Record a collective's schedule for the SimGrid replay: every virtual rank's posts and waits,
in order, written as the trace simgrid_replay.cpp reads.

``Recorder`` is a virtual World's ``recorder`` (sim/virtual_world.py): an untimed run of the
real schedule code posts and waits through it, each real byte standing for ``scale`` simulated
bytes; ``write`` checks that first-in-first-out matching pairs the messages as MPI's tags do
(``check_order``) and writes the ops (format and op codes: simgrid_replay.cpp's header).
docs/simulation.md, "The SimGrid engine in detail".
"""
import array

import numpy as np

MAGIC = 0x3230304753544e4e   # "NNTSG002", as in simgrid_replay.cpp
SEND, RECV, WAIT, SEND_CAPPED, RECV_CAPPED, LANES, DEP = 1, 2, 3, 4, 5, 6, 7


class Recorder:
    """Every virtual rank's posts and waits, in order (a World's ``recorder``; see the module
    doc). ``platform``: the simulate.Platform timed later; ``scale``: simulated bytes per byte.

    Ops go to streams: stream r < ranks is rank r's; each lane of a pipelined collective gets
    a stream of its own (``lanes``), and a lane that waits for another's piece records a DEP
    on the op count that lane had reached when the untimed run let it go on.
    """

    def __init__(self, platform, scale):
        self.platform, self.scale, self.ranks = platform, float(scale), platform.ranks
        self.ints, self.floats = [], []   # per stream: op and int fields; bytes, rates, seconds
        self.ops, self.posts = [], []     # per stream: ops written, requests numbered
        for _ in range(self.ranks):
            self._stream()
        self.current = list(range(self.ranks))   # the stream a rank's posts go to
        self.lane_of = {}             # rank -> {id(request): lane stream} while in lanes
        self.keys = {}                # communicator context -> small int (the mailbox key)
        self.tags = {}                # (src, dst, key, send) -> hash of its tags in order
        self.pairs = {}               # (src, dst) -> real bytes sent (for the links' bytes)
        self.waits = 0
        self.straggler = platform.faults.straggler

    def _stream(self):
        for part, kind in ((self.ints, "i"), (self.floats, "d")):
            part.append(array.array(kind))
        self.ops.append(0)
        self.posts.append(0)
        return len(self.ops) - 1

    def _op(self, stream, fields, values=()):
        self.ints[stream].extend(fields)
        self.floats[stream].extend(values)
        self.ops[stream] += 1

    def post(self, request, send, src, dst, key, nbytes):
        me, peer = (src, dst) if send else (dst, src)
        stream = self.current[me]
        request.rid = self.posts[stream]
        self.posts[stream] += 1
        if stream >= self.ranks:
            self.lane_of[me][id(request)] = stream
        context, tag = key
        key = self.keys.setdefault(context, len(self.keys))
        side = (src, dst, key, send)   # the tag order per side, hashed (see check_order)
        self.tags[side] = (self.tags.get(side, 0) * 1000003 + tag + 1) & ((1 << 61) - 1)
        if self.straggler in (src, dst):
            self._op(stream, (SEND_CAPPED if send else RECV_CAPPED, peer, key),
                     (nbytes * self.scale, self.platform.route(src, dst)[2]))
        else:
            self._op(stream, (SEND if send else RECV, peer, key), (nbytes * self.scale,))
        if send:
            self.pairs[src, dst] = self.pairs.get((src, dst), 0) + nbytes

    def cost(self, rank, reduce_bytes, send_bytes, sends):
        return self.platform.cost(rank, reduce_bytes, send_bytes, sends, self.scale)

    def wait(self, rank, requests, seconds):
        stream = self.current[rank]
        if rank in self.lane_of and requests:   # a lane's wait: the stream of its requests
            stream = self.lane_of[rank][id(requests[0])]
        self._op(stream, [WAIT, len(requests)] + [r.rid for r in requests], (seconds,))
        self.waits += 1

    def lanes(self, rank, lanes):
        """``lanes`` (run_lanes' generators) wrapped so that each records to its own stream."""
        main = self.current[rank]
        streams = [self._stream() for _ in lanes]
        self._op(main, [LANES, len(streams)] + streams)
        self.lane_of[rank] = {}
        blocked = {}    # lane stream -> its callable item (waits for another lane), not yet true
        live = [len(lanes)]

        def wrap(lane, stream):
            while True:
                self.current[rank] = stream
                item = next(lane, None)
                for other, ready in list(blocked.items()):   # did this lane let one go on?
                    if ready():
                        self._op(other, (DEP, stream, self.ops[stream]))
                        del blocked[other]
                if item is None:
                    break
                if callable(item[0]):
                    if item[0]():   # true already, made so by an unknown lane: wait for all
                        for other in streams:
                            if other != stream:
                                self._op(stream, (DEP, other, self.ops[other]))
                    else:
                        blocked[stream] = item[0]
                yield item
            live[0] -= 1
            if not live[0]:
                self.current[rank] = main
                del self.lane_of[rank]
        return [wrap(lane, stream) for lane, stream in zip(lanes, streams)]

    def carried(self):
        """Simulated bytes per platform link (as simulate.FlowNetwork.carried)."""
        carried = np.zeros(len(self.platform.capacity))
        for (src, dst), nbytes in self.pairs.items():
            carried[list(self.platform.route(src, dst)[0])] += nbytes * self.scale
        return carried

    def check_order(self):
        """Raise RuntimeError unless every (source, destination, communicator) posted its sends
        and its receives in the same tag order.

        The replay matches messages first in, first out per (source, destination,
        communicator), not per tag: a mailbox per tag would be one per ring step (9.5 M for a
        2,176-rank ring, gigabytes in SimGrid). With the same tag order on both sides the two
        rules pair the same messages; our schedules post tags in step order, so they do.
        """
        for (src, dst, key, send), order in self.tags.items():
            if send and self.tags.get((src, dst, key, False)) != order:
                raise RuntimeError(f"rank {src} sends to rank {dst} on communicator {key} in "
                                   f"another tag order than rank {dst} receives them: the "
                                   f"SimGrid replay matches per communicator, first in first "
                                   f"out; use the flow engine (--sim-engine flow)")

    def write(self, path):
        """The trace simgrid_replay.cpp reads (format in its header comment)."""
        self.check_order()
        head = [MAGIC, self.ranks, len(self.ops)] + [len(a) for a in self.ints + self.floats]
        with open(path, "wb") as f:
            f.write(np.array(head, "<i8").tobytes())
            for part in self.ints + self.floats:
                f.write(part.tobytes())
