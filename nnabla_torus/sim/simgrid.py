"""SimGrid engine: our collectives' schedules, recorded once, replayed on a SimGrid platform.

Record each rank's sends, receives and waits on the virtual World (sim/virtual_world.py) with
``simgrid_trace.Recorder``, replay them with simgrid_replay.cpp (SimGrid's S4U API, compiled
here on first use into $NNABLA_TORUS_CACHE) on a platform generated from the same
``simulate.Platform`` as the flow engine (``simgrid_platform``). Why a replay and not
SimGrid's Python binding or SMPI, the platform's zones and the network model's settings (with
the SimGrid sources they come from): docs/simulation.md.
"""
import hashlib
import os
import shutil
import subprocess
import tempfile
import time

from .simgrid_platform import platform_xml
from .simgrid_trace import Recorder
from .virtual import WallLimit, run_allreduce
from ..knobs import env_value

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simgrid_replay.cpp")
CXX = "g++"   # the compiler (a module attribute so that tests can point it elsewhere)
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
