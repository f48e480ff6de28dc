"""SimGrid engine: our collectives' schedules, recorded once, replayed on a SimGrid platform.

Record each rank's sends, receives and waits on the virtual World (sim/virtual_world.py),
replay them with simgrid_replay.cpp (SimGrid's S4U API, compiled on first use into
$NNABLA_TORUS_CACHE) on a platform generated from the same ``simulate.Platform`` as the flow
engine. Why a replay and not SimGrid's Python binding or SMPI, the platform's zones and the
network model's settings (with the SimGrid sources they come from): docs/simulation.md.
"""
import array
import hashlib
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

from .virtual import WallLimit, run_allreduce
from ..knobs import env_value

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simgrid_replay.cpp")
CXX = "g++"   # the compiler (a module attribute so that tests can point it elsewhere)
MAGIC = 0x3230304753544e4e   # "NNTSG002", as in simgrid_replay.cpp
SEND, RECV, WAIT, SEND_CAPPED, RECV_CAPPED, LANES, DEP = 1, 2, 3, 4, 5, 6, 7
CONFIG = ("network/model:CM02", "network/latency-factor:1", "network/bandwidth-factor:1",
          "network/weight-S:0", "network/TCP-gamma:1e30", "network/crosstraffic:0",
          "contexts/stack-size:256")   # KiB per actor (8 MiB by default; thousands of actors)
FIX = ("the SimGrid engine needs SimGrid's C++ library and a C++17 compiler: "
       "'apt-get install libsimgrid-dev g++' (Debian/Ubuntu; tools/setup_venv.sh does it as "
       "root), or use the flow engine (--sim-engine flow, NNABLA_TORUS_SIM_ENGINE=flow, "
       "engine='flow')")

_built = {}   # binary path, or the SimGridUnavailable of a failed build, per (source, compiler)


class SimGridUnavailable(RuntimeError):
    """SimGrid's library or the compiler is missing: the replay program cannot be built."""


def replay_binary():
    """Path of the compiled replay program (built on first use, cached by source hash)."""
    with open(SOURCE, "rb") as f:
        tag = hashlib.sha256(f.read() + CXX.encode()).hexdigest()[:16]
    known = _built.get(tag)
    if isinstance(known, Exception):
        raise known
    if known:
        return known
    cache = os.path.expanduser(env_value("NNABLA_TORUS_CACHE", "~/.cache/nnabla_torus"))
    path = os.path.join(cache, f"simgrid_replay-{tag}")
    try:
        if not os.path.exists(path):
            _compile(path)
    except SimGridUnavailable as e:
        _built[tag] = e
        raise
    _built[tag] = path
    return path


def _compile(path):
    flags = ["-lsimgrid"]
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--cflags", "--libs", "simgrid"],
                               capture_output=True, text=True)
        flags = found.stdout.split() if found.returncode == 0 else flags
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as e:
        raise SimGridUnavailable(f"cannot create the cache folder for the replay program ({e}); "
                                 f"point NNABLA_TORUS_CACHE at a writable folder") from None
    tmp = f"{path}.{os.getpid()}.tmp"   # renamed when complete: concurrent builds do not clash
    cmd = [CXX, "-O2", "-std=c++17", SOURCE, "-o", tmp] + flags
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise SimGridUnavailable(f"cannot run the compiler {CXX!r} ({e}); {FIX}") from None
    if proc.returncode != 0:
        said = " | ".join(proc.stderr.strip().splitlines()[:3])
        raise SimGridUnavailable(f"building {os.path.basename(SOURCE)} failed ({' '.join(cmd)}: "
                                 f"{said}); {FIX}")
    os.replace(tmp, path)


def available():
    """True when the replay program builds (SimGrid's library and the compiler are here)."""
    try:
        replay_binary()
        return True
    except SimGridUnavailable:
        return False


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


class _PlatformXml:
    """The XML elements of one simulate.Platform: its link ids, capacities and latency halves."""

    def __init__(self, platform):
        self.p, self.net, self.faults = platform, platform.net, platform.faults
        self.names, self.caps = platform.names, [float(c) for c in platform.capacity[:-1]]
        self.multi = platform.racks > 1
        self.intra = self.net.intra.latency_s / platform.share

    def half(self, latency, rank):   # a rank's share of a route's latency; the straggler's is more
        return latency * (self.faults.slowdown - 0.5 if rank == self.faults.straggler else 0.5)

    def link(self, index, latency=0.0):
        return (f'<link id="{self.names[index]}" bandwidth="{self.caps[index]!r}Bps" '
                f'latency="{latency!r}s"/>')

    @staticmethod
    def wire(name, latency):   # latency only: never limits a rate
        return (f'<link id="{name}" bandwidth="1e30Bps" latency="{latency!r}s" '
                f'sharing_policy="FATPIPE"/>')

    @staticmethod
    def route(tag, src, dst, links, gw=None):
        gws = f' gw_src="{gw[0]}" gw_dst="{gw[1]}"' if gw else ""
        ctn = "".join(f'<link_ctn id="{name}"/>' for name in links)
        return f'<{tag} src="{src}" dst="{dst}"{gws} symmetrical="NO">{ctn}</{tag}>'

    def host_zone(self, h):
        """Host h's zone: its ranks, routers, ports, bus and the routes among its ranks."""
        p, names, route, multi = self.p, self.names, self.route, self.multi
        ranks = range(h * p.g, min((h + 1) * p.g, p.ranks))
        out = [f'<zone id="h{h}" routing="Full">']
        out += [f'<host id="r{r}" speed="1f"/>' for r in ranks]
        out.append(f'<router id="g{h}"/>' + (f'<router id="x{h}"/>' if multi else ""))
        for r in ranks:
            out += [self.link(p.port_out + r, self.half(self.intra, r)),
                    self.link(p.port_in + r, self.half(self.intra, r)),
                    self.wire(f"lo[{r}]", self.half(self.net.inter.latency_s, r))]
            if multi:
                out.append(self.wire(f"xlo[{r}]", self.half(self.net.spine.latency_s, r)))
        out.append(self.link(p.bus + h))
        for r in ranks:
            out += [route("route", f"r{r}", f"r{s}", (names[p.port_out + r], names[p.bus + h],
                                                      names[p.port_in + s]))
                    for s in ranks if s != r]
            out += [route("route", f"r{r}", f"g{h}", (f"lo[{r}]",)),
                    route("route", f"g{h}", f"r{r}", (f"lo[{r}]",))]
            if multi:
                out += [route("route", f"r{r}", f"x{h}", (f"xlo[{r}]",)),
                        route("route", f"x{h}", f"r{r}", (f"xlo[{r}]",))]
        out.append("</zone>")
        return out

    def rack_zone(self, rack):
        """Rack ``rack``'s zone: its host zones, NICs, host-to-host and spine routes."""
        p, names, route, multi = self.p, self.names, self.route, self.multi
        hosts = range(rack * p.per_rack, min((rack + 1) * p.per_rack, p.hosts))
        out = [f'<zone id="rack{rack}" routing="Full">']
        for h in hosts:
            out += self.host_zone(h)
        if multi:
            out.append(f'<zone id="s{rack}" routing="Full"><router id="rg{rack}"/></zone>')
        for h in hosts:
            out += [self.link(p.nic_out + h), self.link(p.nic_in + h)]
        for a in hosts:
            out += [route("zoneRoute", f"h{a}", f"h{b}", (names[p.nic_out + a],
                                                          names[p.nic_in + b]), (f"g{a}", f"g{b}"))
                    for b in hosts if b != a]
            if multi:
                out += [route("zoneRoute", f"h{a}", f"s{rack}", (names[p.nic_out + a],),
                              (f"x{a}", f"rg{rack}")),
                        route("zoneRoute", f"s{rack}", f"h{a}", (names[p.nic_in + a],),
                              (f"rg{rack}", f"x{a}"))]
        out.append("</zone>")
        return out

    def spine(self):
        """The racks' up and down links and the rack-to-rack routes over them."""
        p, names, racks = self.p, self.names, range(self.p.racks)
        out = [self.link(p.up + k) for k in racks] + [self.link(p.down + k) for k in racks]
        out += [self.route("zoneRoute", f"rack{a}", f"rack{b}",
                           (names[p.up + a], names[p.down + b]), (f"rg{a}", f"rg{b}"))
                for a in racks for b in racks if a != b]
        return out


def platform_xml(platform):
    """SimGrid platform (XML, DTD 4.1) of a simulate.Platform (docs/simulation.md: its zones
    and where the latencies sit)."""
    xml = _PlatformXml(platform)
    out = ['<?xml version="1.0"?>',
           '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
           '<platform version="4.1">', '<zone id="top" routing="Full">']
    for rack in range(platform.racks):
        out += xml.rack_zone(rack)
    if xml.multi:
        out += xml.spine()
    out += ["</zone>", "</platform>", ""]
    return "\n".join(out)


def replay(platform, recorder, max_wall=None, spent=0.0):
    """(simulated seconds, wall seconds) of ``recorder``'s schedule on ``platform`` (SimGrid).

    Raises WallLimit when ``spent`` (the recording's wall seconds) plus the replay run past
    ``max_wall`` wall seconds (the process is killed), SimGridUnavailable when the program
    cannot be built.
    """
    binary = replay_binary()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nnabla_torus_simgrid_") as tmp:
        xml, trace = os.path.join(tmp, "platform.xml"), os.path.join(tmp, "trace.bin")
        with open(xml, "w") as f:
            f.write(platform_xml(platform))
        recorder.write(trace)
        cmd = [binary, xml, trace, "--log=root.thresh:warning"] + [f"--cfg={c}" for c in CONFIG]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=None if max_wall is None else max_wall - spent)
        except subprocess.TimeoutExpired:
            raise WallLimit(f"SimGrid replay of {platform.ranks} ranks exceeded --max-wall "
                            f"{max_wall:g} s (recording {spent:.1f} s, replay killed after "
                            f"{time.monotonic() - start:.1f} s); raise --max-wall, simulate "
                            f"fewer ranks or use --sim-engine flow") from None
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 3 or words[0] != "end" \
            or int(words[2]) != recorder.waits:
        said = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
        raise RuntimeError(f"SimGrid replay of {platform.ranks} ranks failed (exit "
                           f"{proc.returncode}, {recorder.waits} waits recorded): {said}")
    return float(words[1]), time.monotonic() - start


def simulate(platform, buffers, algorithm, grid, ranks_per_host, scale, pipeline_bytes,
             max_wall=None):
    """Record ``algorithm`` on ``buffers`` (summed in place), replay it on ``platform``.

    Returns (simulated seconds, bytes per link, messages, record wall s, replay wall s);
    ``max_wall`` bounds both steps together (WallLimit).
    """
    start = time.monotonic()
    recorder = Recorder(platform, scale)
    _, world = run_allreduce(buffers, algorithm, grid, ranks_per_host, max_wall=max_wall,
                             pipeline_bytes=pipeline_bytes, recorder=recorder)
    recorded = time.monotonic() - start
    if max_wall is not None and recorded >= max_wall:
        raise WallLimit(f"simulation of {platform.ranks} ranks exceeded --max-wall {max_wall:g} s "
                        f"while recording ({recorded:.1f} s, {world.messages} messages); raise "
                        f"--max-wall or simulate fewer ranks")
    seconds, replayed = replay(platform, recorder, max_wall, recorded)
    return seconds, recorder.carried(), world.messages, recorded, replayed
