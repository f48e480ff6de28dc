"""The NCCL backend's set-up and failure paths on one process, against ``fake_nccl``.

What a GPU job meets first (issue 10): libmpi.so for nnabla-ext-cuda (finding 2), a hung NCCL
phase (3), an MPI error inside nnabla when a peer died (6), clocks stopped before the device
finished (5). Multi-rank behaviour is in tests/mpi/test_nccl_mapping.py.
"""
import ctypes
import os
import stat
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import nnabla as nn
from nnabla_torus.comm.backends import cuda_env, nccl, synchronize
from nnabla_torus.testing import fake_nccl
from nnabla_torus.comm.backends.nccl import NCCLBackend, NCCLGroup
from nnabla_torus.comm.errors import RankLost
from nnabla_torus.files import UnsafeFolder
from tests.slowdown import scaled

MPI_ERROR = ("runtime error in MultiProcessDataParallelCommunicatorNccl: `MPI_Allreduce(&condition,"
             " &result, 1, MPI_C_BOOL, MPI_LAND, comm)` failed by `MPI_ERR_PROC_FAILED: Process "
             "Failure`.")



@pytest.fixture(autouse=True)
def real_nnabla_functions():
    """fake_nccl gives F.identity & co. CUDA rules process-wide; give them back after a test."""
    yield
    fake_nccl.reset()

def dl_mpi_search(environ):
    """The first libmpi.so nnabla-ext-cuda's dl_mpi.cpp would load: $OMPI_HOME/lib, the default
    search path, then three fixed folders; (path, handle) or (None, None)."""
    candidates = [os.path.join(environ["OMPI_HOME"], "lib", "libmpi.so")] \
        if environ.get("OMPI_HOME") else []
    candidates += ["libmpi.so", "/usr/lib64/libmpi.so", "/usr/lib/libmpi.so",
                   "/opt/openmpi/lib/libmpi.so"]
    for path in candidates:
        try:
            return path, ctypes.CDLL(path, mode=os.RTLD_LAZY)
        except OSError:
            continue
    return None, None


def test_finding2_ompi_home_points_nnabla_at_mpi4pys_open_mpi(tmp_path):
    loaded = cuda_env.loaded_libmpi()
    assert loaded and os.path.basename(loaded).startswith("libmpi.so"), loaded
    env = {}  # before: the registry's Open MPI has a linker script at lib/libmpi.so, found by
    # none of nnabla's candidates (or a system MPI that is not mpi4py's is)
    home = cuda_env.prepare_ompi_home(env, cache_dir=str(tmp_path))
    assert env["OMPI_HOME"] == home
    path, handle = dl_mpi_search(env)
    assert path == os.path.join(home, "lib", "libmpi.so") and handle is not None
    assert os.path.samefile(path, loaded)
    assert cuda_env.prepare_ompi_home(env, cache_dir=str(tmp_path)) == home  # idempotent


def test_ompi_home_is_made_in_the_users_cache_folder_not_a_shared_one(tmp_path):
    env = {"NNABLA_TORUS_CACHE_DIR": str(tmp_path / "cache")}
    home = cuda_env.prepare_ompi_home(env)
    assert os.path.dirname(home) == str(tmp_path / "cache")   # before: /tmp/nnabla_torus-<uid>
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700


@pytest.mark.parametrize("mode, owner, why", [
    (0o777, 0, r"writable by group or others \(mode 777\)"),
    (0o770, 0, r"writable by group or others \(mode 770\)"),
    (0o700, 1, r"owned by uid \d+, not by this user \(uid \d+\)")])
def test_a_cache_folder_another_user_can_write_is_refused(tmp_path, mode, owner, why):
    if owner and os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    os.chown(folder, os.getuid() + owner, -1)
    # before: used as it was, so its other writer could re-point lib/libmpi.so
    with pytest.raises(UnsafeFolder, match=rf"refusing {folder}: it is {why}, so another user "
                                           r"could change what it holds\. Fix: set "
                                           r"NNABLA_TORUS_CACHE_DIR to a folder only you "
                                           r"can write"):
        cuda_env.prepare_ompi_home({}, cache_dir=str(folder))
    assert os.listdir(folder) == []


def test_finding2_a_wrong_ompi_home_is_refused_with_the_fix(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so").write_text("INPUT(libmpi.so.40)\n")  # the registry's script
    with pytest.raises(RuntimeError, match=r"OMPI_HOME=.*linker script.*Fix: unset OMPI_HOME"):
        cuda_env.prepare_ompi_home({"OMPI_HOME": str(tmp_path)})


@pytest.fixture
def backend():
    be = NCCLBackend(None, timeout=1.0, fake_device=fake_nccl)
    yield be
    be.close()


def pair(be):
    """A two-member group this process is in (the other member never comes)."""
    return NCCLGroup("world", [0, 1], 0, be.world)


def test_finding3_a_hung_nccl_phase_aborts_naming_the_phase(backend, monkeypatch, capfd):
    aborted = threading.Event()
    release = threading.Event()
    monkeypatch.setattr(backend._dog, "abort", aborted.set)
    comm = backend._comms[np.dtype(np.float32)]
    monkeypatch.setattr(comm, "all_reduce", lambda *a, **k: None)  # enqueued, never completes
    monkeypatch.setattr(backend, "synchronize", lambda: release.wait(10))
    buf = backend.buffer_of(nn.NdArray.from_numpy_array(np.ones(8, np.float32)))
    start = time.monotonic()
    worker = threading.Thread(target=backend.all_reduce, args=(pair(backend), buf))
    worker.start()
    assert aborted.wait(5), "the watchdog did not fire"
    elapsed = time.monotonic() - start
    release.set()
    worker.join()
    err = capfd.readouterr().err
    assert 0.9 < elapsed < scaled(3), elapsed
    assert "NCCL all_reduce on group [0, 1] (rank 0 on " in err and "within 1 s" in err, err


def test_a_hung_nccl_wait_names_a_lost_rank_in_the_line_tests_read(backend, monkeypatch,
                                                                    capfd):
    """Issue 66: survivors waiting in NCCL for a dead rank; the watchdog's abort names it in
    the form tests/mpirun.py's LOST reads (the old line, "rank 0 (host): lost rank(s) [3];",
    did not match it)."""
    from tests.mpirun import LOST
    aborted = []
    monkeypatch.setattr(nccl, "lost_ranks", lambda: [3])
    monkeypatch.setattr(backend, "world", type("World", (), {"Abort": aborted.append})())
    with backend._dog.guard("NCCL all_reduce on group [0, 3]"):
        backend._abort_hung()
    assert aborted == [70]
    assert LOST.findall(capfd.readouterr().out) == [("0", "3")]


def test_finding6_an_mpi_error_inside_nnabla_names_the_dead_rank(backend, monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError(MPI_ERROR)
    monkeypatch.setattr(backend._comms[np.dtype(np.float32)], "all_reduce", failing)
    buf = backend.buffer_of(nn.NdArray.from_numpy_array(np.ones(8, np.float32)))
    monkeypatch.setattr(nccl, "lost_ranks", lambda: [3])
    with pytest.raises(RankLost, match=r"rank 0: lost rank\(s\) \[3\] during NCCL all_reduce on "
                                       r"group \[0, 1\]"):
        backend.all_reduce(pair(backend), buf)
    monkeypatch.setattr(nccl, "lost_ranks", lambda: [])   # nobody known dead: say what failed
    with pytest.raises(RuntimeError, match=r"rank 0 \(.*\): NCCL all_reduce .* an MPI call "
                                           r"inside nnabla failed: .*MPI_ERR_PROC_FAILED"):
        backend.all_reduce(pair(backend), buf)


class SlowDevice:
    """A communicator whose all_reduce enqueues 50 ms of device work that only synchronize()
    waits for, as a GPU's NCCL call returns before its kernel ends."""
    WORK_S = 0.05

    def __init__(self):
        self.backend = self
        self.queued = 0

    def all_reduce(self, data, **kwargs):
        self.queued += 1

    @staticmethod
    def buffer_of(ndarray, write=True):
        return ndarray

    @staticmethod
    def copy(dst, src):
        pass

    def synchronize(self):
        time.sleep(self.WORK_S * self.queued)
        self.queued = 0


def test_finding5_synchronize_waits_for_the_device_and_is_a_no_op_on_host():
    comm = SlowDevice()
    comm.all_reduce(None)
    start = time.perf_counter()
    synchronize(comm)
    assert time.perf_counter() - start >= SlowDevice.WORK_S
    synchronize(object())  # the MPI backend has no device: nothing to wait for


def test_finding5_allreduce_bench_stops_its_clock_after_the_device(monkeypatch):
    import tools.allreduce_bench as bench
    comm = SlowDevice()
    nd = nn.NdArray.from_numpy_array(np.zeros(4, np.float32))
    times = bench.time_calls(comm, [nd], [np.zeros(4, np.float32)], 2, MPI.COMM_WORLD)
    assert min(times) >= SlowDevice.WORK_S, times


def test_finding5_train_bench_times_the_all_reduce_to_device_completion():
    import tools.train_bench as bench
    timed = bench.TimedComm(SlowDevice())
    timed.all_reduce(None)
    assert timed.seconds >= SlowDevice.WORK_S, timed.seconds


class DeviceArray:
    """An NdArray on a GPU as far as where its head is: reading or writing ``data`` moves the
    head to the host (nnabla ``python/src/nnabla/_nd_array.pyx`` ``data``, ~332-350), and the
    next use on the device casts it back, a host-to-device copy (``cast``, ~307)."""

    def __init__(self, values):
        self.values, self.head = np.array(values), "device"

    @property
    def data(self):
        self.head = "host"
        return self.values

    @property
    def size(self):
        return self.values.size


class CountingDevice:
    """A communicator on one GPU counting host-to-device copies and device work by phase."""

    def __init__(self):
        self.backend = self
        self.events = []

    def buffer_of(self, ndarray, write=True):
        if ndarray.head == "host":
            self.events.append("H2D")
            ndarray.head = "device"
        return ndarray

    def copy(self, dst, src):
        self.events.append("D2D")
        dst.values[...] = src.values

    def all_reduce(self, nd, inplace=True):
        self.events.append("all_reduce(")
        self.buffer_of(nd)                   # as TorusCommunicator._all_reduce does
        self.events.append(")")

    def synchronize(self):
        self.events.append("sync")


def test_issue19_finding2_allreduce_bench_times_no_host_to_device_copy():
    """The input is reset on the device before each timed call; with ``nd.data[...] =
    source`` every timed all_reduce began with a host-to-device copy of the whole buffer."""
    import tools.allreduce_bench as bench
    comm = CountingDevice()
    nd, source = DeviceArray(np.zeros(4)), DeviceArray(np.arange(4.0))
    nd.data  # e.g. the exactness check of the previous round read it on the host
    bench.time_calls(comm, [nd], [source], 3, MPI.COMM_WORLD)
    timed = " ".join(comm.events).split("all_reduce(")[1:]
    assert all("H2D" not in call.split(")")[0] for call in timed), comm.events
    assert comm.events.count("D2D") == 3 and nd.values.tolist() == [0, 1, 2, 3]
    # the reset's device copy has finished before the clock starts
    assert " ".join(comm.events).count("D2D sync all_reduce(") == 3, comm.events


class CountingControl:
    """Rank 0 of a 2,176-rank control communicator whose peers all agree, counting the
    messages rank 0 posts per argument check (mpi4py's request objects: REQUEST_NULL)."""

    def __init__(self, size, signature):
        from nnabla_torus.comm.rendezvous import call_hash
        self.size, self.messages, self.digest = size, 0, call_hash(signature)

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return 0

    def Irecv(self, buf, source, tag):
        self.messages += 1
        buf[...] = self.digest
        return MPI.REQUEST_NULL

    def Isend(self, buf, dest, tag):
        self.messages += 1
        return MPI.REQUEST_NULL

    def Iallreduce(self, send, recv, op):
        self.messages += 1
        recv[...] = send
        return MPI.REQUEST_NULL


def test_issue19_finding7_the_argument_check_costs_rank_0_no_more_at_2176_ranks():
    """On NCCL (no shared memory) every call was checked through rank 0: 2(p - 1) messages
    there per call; large groups now use one non-blocking all-reduce."""
    from nnabla_torus.comm.rendezvous import check_same_call
    signature = ("all_reduce", (("float32", (17,)),), True, False)
    costs = []
    for size in (8, 2176):
        control = CountingControl(size, signature)
        check_same_call(control, list(range(size)), signature, 5.0, "all_reduce")
        costs.append(control.messages)
    assert costs[1] <= 2 * 7, costs   # no more than the gather costs at 8 ranks


@pytest.mark.parametrize("size", [3, 4, 8, 2176])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_issue19_finding12_fused_buffers_split_into_16_byte_aligned_chunks(size, dtype):
    """The world (and each row: its size divides the world's) cuts a fused buffer into equal
    chunks; each must start at a multiple of 16 bytes. Padding only to a multiple of p left
    17 float32 values on 4 ranks in 5-value (20-byte) chunks."""
    be = object.__new__(NCCLBackend)   # padded_length needs only the world size
    be.size = size
    itemsize = np.dtype(dtype).itemsize
    for count in (1, 17, 289, 25557032):
        n = be.padded_length(count, dtype)
        assert count <= n < count + size * 16 // itemsize
        for row in (r for r in range(1, size + 1) if size % r == 0):
            assert (n // row * itemsize) % 16 == 0, (count, n, row)


def test_issue19_finding10_train_bench_does_not_count_backward_as_all_reduce():
    """Backward's kernels queued before the all-reduce (50 ms here) are not all-reduce time:
    timing from the call to its synchronisation counted them in "all-reduce share"."""
    import tools.train_bench as bench
    device = SlowDevice()
    device.queued = 1                      # backward's work, still running on the device
    timed = bench.TimedComm(device)
    timed.all_reduce(None)
    assert SlowDevice.WORK_S <= timed.seconds < 2 * SlowDevice.WORK_S, timed.seconds


def test_issue19_finding3_no_bucketing_during_backward_on_the_nccl_backend():
    """NCCL through nnabla's Python API runs on backward's stream (NCCLBackend.overlaps_backward
    cites the lines): on NCCL, overlap only through nnabla's all_reduce_callback (algorithm
    native, with or without the noise-scale norms, which the post hook takes on the device);
    train.py all-reduces after backward otherwise, and keeps overlap on host backends."""
    from nnabla_torus.overlap import on_device, overlaps_backward

    class Comm:
        def __init__(self, backend, algorithm="torus2d", track_sqnorms=False):
            self.backend, self.algorithm, self.track_sqnorms = backend, algorithm, track_sqnorms
    nccl = object.__new__(NCCLBackend)
    assert not overlaps_backward(Comm(nccl))
    assert overlaps_backward(Comm(nccl, "native")) and on_device(Comm(nccl, "native"))
    assert on_device(Comm(nccl, "native", track_sqnorms=True))
    from nnabla_torus.comm.backends.mpi import MPIBackend
    mpi = object.__new__(MPIBackend)
    assert overlaps_backward(Comm(mpi, "native")) and not on_device(Comm(mpi, "native"))
    assert overlaps_backward(object())


def test_issue33_nnabla_s_watchdog_is_left_warning_only(monkeypatch, caplog):
    """Enabled, nnabla's watchdog std::terminates the rank (SIGABRT, no peer named) when any
    host-side call of its communicator outlives its timeout (ext watch_dog.cpp 40-51): the
    backend no longer enables it, times its warning like our watchdog, and says what a user's
    NNABLA_MPI_WATCH_DOG_ENABLE=1 does."""
    monkeypatch.delenv("NNABLA_MPI_WATCH_DOG_ENABLE", raising=False)
    monkeypatch.delenv("NNABLA_MPI_WATCH_DOG_TIMEOUT", raising=False)
    nccl.nnabla_watchdog(12.5)
    assert "NNABLA_MPI_WATCH_DOG_ENABLE" not in os.environ
    assert os.environ["NNABLA_MPI_WATCH_DOG_TIMEOUT"] == "13"
    monkeypatch.setenv("NNABLA_MPI_WATCH_DOG_ENABLE", "1")
    with caplog.at_level("WARNING", logger="nnabla_torus"):
        nccl.nnabla_watchdog(12.5)
    assert "SIGABRT" in caplog.text and "unset it" in caplog.text, caplog.text


def test_issue33_a_hang_inside_a_call_that_holds_the_gil_ends_the_process():
    """nnabla's init() and new_group hold the GIL (no Python watchdog runs): the deadline is
    faulthandler's C thread, which ends the process with exit 1 and the traceback, after the
    call's timeout plus the grace (1 s here instead of GIL_HELD_GRACE_S, for a short test)."""
    import subprocess
    import sys
    prog = ("import time; from nnabla_torus.comm import watchdog\n"
            "watchdog.GIL_HELD_GRACE_S = 1\n"
            "with watchdog.gil_held_deadline(1):\n    time.sleep(30)\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                          timeout=scaled(60))
    assert done.returncode == 1 and time.monotonic() - start < scaled(25)
    assert "Timeout (0:00:02)!" in done.stderr and "line 4 in <module>" in done.stderr, done.stderr


def test_issue33_pop_sqnorms_on_the_device_is_a_checked_collective(monkeypatch):
    """DeviceSquaredNorms.pop all-reduces over the world: it goes through the same arrival
    check and failure handling as every collective (guarded_calls.collective)."""
    from nnabla_torus.comm import communicator as communicator_module
    from nnabla_torus.comm.communicator import TorusCommunicator
    comm = TorusCommunicator(backend="mpi")
    calls = []
    monkeypatch.setattr(comm, "_group", lambda name: f"group {name}")
    monkeypatch.setattr(communicator_module, "collective",
                        lambda c, grp, sig, what, body: calls.append((grp, sig, what)) or body())
    assert comm.pop_sqnorms() == (0.0, 0.0) and calls == []        # host sums: no collective
    comm.sqnorms.device = type("Device", (), {"pop": lambda self: (2.0, 3.0)})()
    assert comm.pop_sqnorms() == (2.0, 3.0)
    assert calls == [("group world", ("pop_sqnorms",), "pop_sqnorms (noise-scale norms, "
                      "all_reduce)")]


@pytest.mark.parametrize("bucket_mib, grad_bytes, buffers", [
    (25, 4, 3), (25, 2, 3), (13, 4, 3), (1, 4, 40), (100, 4, 3), (1e-6, 4, 10485760)])
def test_issue33_device_packs_get_at_least_three_of_nnabla_s_buffers(bucket_mib, grad_bytes,
                                                                     buffers):
    """nnabla splits a fixed 40 MiB into pack buffers (ext .hpp 190-191, .cu 966-968): a 25 MiB
    pack got one buffer (packs never pipelined), a 100 MiB one none. The fake computes the count
    as nnabla does; the overlap's packs are capped so that there are 3 or more."""
    from nnabla_torus.overlap import device_pack_size
    parent = type("Parent", (), {"dtype": np.dtype(np.float32 if grad_bytes == 4 else
                                                   np.float16)})()
    pack = device_pack_size(bucket_mib, grad_bytes)
    made = fake_nccl.FakeAllReduceCallback(parent, None, [], pack, True, 1.0)
    assert made.buffers == buffers
    before = fake_nccl.FakeAllReduceCallback(parent, None, [], int(25 * 2 ** 20) // grad_bytes,
                                             True, 1.0)
    assert before.buffers == 1
    with pytest.raises(ValueError, match="no buffer"):
        fake_nccl.FakeAllReduceCallback(parent, None, [], 100 * 2 ** 20 // 4, True, 1.0)


def test_a_device_squared_norm_beyond_float32_is_finite(backend):
    """Before: the float32 device sum of gradients ~1e20 was inf, and the noise scale skipped
    every observation of a run whose gradients were finite."""
    buf = backend.empty(np.float32, 17)
    buf.fill(1e20)
    assert backend.sqnorm(buf) == pytest.approx(17 * float(np.float32(1e20)) ** 2, rel=1e-5)
    buf.fill(3.0)
    assert backend.sqnorm(buf) == pytest.approx(153.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_issue47_a_fused_buffer_packs_through_nnabla_s_concatenate_in_its_dtype(backend, dtype):
    """float16 gradients pack and unpack through one nnabla Concatenate in float16, the path a
    GPU takes (before: float16 on the fake took one copy per array, so FP16 packing through
    Concatenate ran only on a GPU). 17 and 5 elements: sizes no world divides."""
    from nnabla_torus.comm.array_layout import Part
    values = [np.arange(17) / 4 - 2, np.arange(5) * 3.0]
    arrays = [nn.NdArray.from_numpy_array(v.astype(dtype)) for v in values]
    part = Part(dtype, arrays, [np.dtype(dtype)] * 2)
    buf = backend.empty(dtype, part.n)
    backend.pack(part, buf)
    fn = part.device[0]
    assert type(fn).__name__ == "Function" and fn.name == "Concatenate"
    assert fn.context.backend[0] == ("cpu:half" if dtype == np.float16 else "cpu:float")
    packed = buf.narrow().data
    assert packed.dtype == dtype
    np.testing.assert_array_equal(packed, np.concatenate(values).astype(dtype))
    backend.scale(buf, 0.5)
    backend.unpack(buf, part)
    for a, v in zip(arrays, values):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a.data, (v / 2).astype(dtype))
