"""Binding a rank near its GPU, on a fake sysfs tree (two NUMA nodes, four GPUs) and fake
masks: its share of the node when it was given the whole node (or none of it: the launcher
put it on the other socket), the part of the node it was given, nothing on a one-node host or
without a bus id, and the job's one line."""
import os

import pytest

from nnabla_torus.comm import gpu_binding as gb

# A DGX-like host: GPUs 0-1 on node 0 (CPUs 0-7), GPUs 2-3 on node 1 (CPUs 8-15); one NIC
# with no node (-1).
GPUS = {"0000:07:00.0": 0, "0000:0f:00.0": 0, "0000:47:00.0": 1, "0000:4e:00.0": 1,
        "0000:99:00.0": -1}


@pytest.fixture
def sysfs(tmp_path):
    for bus, node in GPUS.items():
        os.makedirs(tmp_path / "bus/pci/devices" / bus)
        (tmp_path / "bus/pci/devices" / bus / "numa_node").write_text(f"{node}\n")
    for node, cpus in ((0, "0-7\n"), (1, "8-15\n")):
        os.makedirs(tmp_path / f"devices/system/node/node{node}")
        (tmp_path / f"devices/system/node/node{node}/cpulist").write_text(cpus)
    return str(tmp_path)


class Rank:
    """A rank's CPU mask and the masks it was bound to."""

    def __init__(self, cpus, allowed=range(16)):
        self.cpus, self.allowed, self.bound = set(cpus), set(allowed), []

    def mask(self):
        return self.cpus

    def bind(self, cpus):      # the kernel: within the cgroup, EINVAL when none is left
        if not set(cpus) & self.allowed:
            raise OSError(22, "Invalid argument")
        self.bound.append(set(cpus))
        self.cpus = set(cpus) & self.allowed


def test_cpulists_read_and_written_as_sysfs_writes_them():
    assert gb.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert gb.parse_cpulist("") == set()
    assert gb.format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert gb.normal_bus_id("00000000:4E:00.0") == "0000:4e:00.0"   # nvidia-smi's form
    assert gb.normal_bus_id("0000:4E:00.0") == "0000:4e:00.0"       # CUDA's


HOST = list(GPUS)[:4]          # the bus ids of devices 0-3: two GPUs on each node


def test_unbound_ranks_split_their_gpus_node(sysfs):
    """srun or mpirun without binding: each rank the whole host; the two ranks of a node take
    a half each (nvidia-smi's form of the bus id is read too)."""
    bound = []
    for device in range(4):
        rank = Rank(range(16))
        said = gb.bind_near_gpu(device, ["00000000:07:00.0"] + HOST[1:], sysfs, rank.mask,
                                rank.bind)
        bound.append(rank.cpus)
    assert bound == [set(range(0, 4)), set(range(4, 8)), set(range(8, 12)), set(range(12, 16))]
    assert said == "GPU 0000:4e:00.0 on NUMA node 1: bound to CPUs 12-15, 2 GPUs' share"


def test_hyperthread_siblings_stay_with_one_rank(sysfs, tmp_path):
    """Node 1 as Linux numbers a 2-way SMT socket: 8-11 and their siblings 24-27. A split of
    the sorted list would give one rank 8-11 and the other their siblings: the same cores."""
    (tmp_path / "devices/system/node/node1/cpulist").write_text("8-11,24-27\n")
    for cpu in range(8, 12):
        for twin in (cpu, cpu + 16):
            topology = tmp_path / f"devices/system/cpu/cpu{twin}/topology"
            os.makedirs(topology)
            (topology / "thread_siblings_list").write_text(f"{cpu},{cpu + 16}\n")
    bound = []
    for device in (2, 3):
        rank = Rank(range(32), allowed=range(32))
        gb.bind_near_gpu(device, HOST, sysfs, rank.mask, rank.bind)
        bound.append(rank.cpus)
    assert bound == [{8, 9, 24, 25}, {10, 11, 26, 27}]


def test_a_rank_bound_to_its_gpus_package_takes_its_share(sysfs):
    rank = Rank(range(8))                    # Open MPI's --bind-to package, package 0 = node 0
    said = gb.bind_near_gpu(1, HOST, sysfs, rank.mask, rank.bind)
    assert rank.bound == [{4, 5, 6, 7}] and said.endswith("bound to CPUs 4-7, 2 GPUs' share")
    rank = Rank(range(8))                    # the only GPU of the host's ranks on node 0
    said = gb.bind_near_gpu(0, HOST[:1], sysfs, rank.mask, rank.bind)
    assert rank.bound == [] and said.endswith("CPUs 0-7, already bound")


def test_a_part_of_the_node_given_is_kept(sysfs):
    rank = Rank({3, 4, 5, 6, 7, 8, 9})      # taskset or Slurm's --cpu-bind across both nodes
    said = gb.bind_near_gpu(0, HOST, sysfs, rank.mask, rank.bind)
    assert rank.bound == [{3, 4, 5, 6, 7}] and said.endswith("bound to CPUs 3-7")
    rank = Rank({1, 2})                     # already on the node: left alone
    said = gb.bind_near_gpu(1, HOST, sysfs, rank.mask, rank.bind)
    assert rank.bound == [] and said.endswith("CPUs 1-2, already bound")


def test_a_rank_on_the_other_socket_moves_within_its_cgroup(sysfs):
    rank = Rank(range(8), allowed={0, 1, 2, 3, 12, 13})   # Open MPI: package 0; GPU on node 1
    said = gb.bind_near_gpu(3, HOST, sysfs, rank.mask, rank.bind)
    assert rank.bound == [set(range(12, 16))] and rank.cpus == {12, 13}
    assert said.endswith("bound to CPUs 12-13, 2 GPUs' share (from CPUs 0-7, none on that "
                         "node)")
    rank = Rank(range(4), allowed=range(4))             # the cgroup has no CPU of node 1
    said = gb.bind_near_gpu(2, HOST, sysfs, rank.mask, rank.bind)
    assert rank.cpus == {0, 1, 2, 3}
    assert said.endswith("CPUs 8-11 not allowed here (Invalid argument), left on CPUs 0-3")


def test_more_gpus_than_cpus_on_a_node_share_them_all(sysfs, tmp_path):
    (tmp_path / "devices/system/node/node1/cpulist").write_text("8\n")
    rank = Rank(range(16))
    gb.bind_near_gpu(3, HOST, sysfs, rank.mask, rank.bind)
    assert rank.cpus == {8}


def test_nothing_is_bound_without_a_node_or_a_bus_id(sysfs):
    rank = Rank(range(16))
    assert gb.bind_near_gpu(0, ["0000:99:00.0"], sysfs, rank.mask, rank.bind).endswith(
        "has no NUMA node in sysfs (one-node host): not bound")
    assert gb.bind_near_gpu(0, ["0000:aa:00.0"], sysfs, rank.mask, rank.bind).endswith(
        "not bound")                                       # not in sysfs at all
    assert gb.bind_near_gpu(1, [HOST[0], None], sysfs, rank.mask, rank.bind) == (
        "GPU's bus id unknown: not bound")
    assert rank.bound == []


def test_no_cuda_runtime_mapped_gives_no_bus_id(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n")
    assert gb.cuda_bus_id(0, str(maps)) is None


def test_the_process_mask_reaches_every_thread(tmp_path, monkeypatch):
    tasks = tmp_path / "task"
    for tid in ("100", "101", "102"):
        os.makedirs(tasks / tid)
    set_for = []

    def setaffinity(tid, cpus):
        if tid == 102:
            raise ProcessLookupError(tid)      # a thread that ended meanwhile
        set_for.append((tid, set(cpus)))
    monkeypatch.setattr(gb.os, "sched_setaffinity", setaffinity)
    gb.set_process_affinity({2, 3}, str(tasks))
    assert sorted(set_for) == [(100, {2, 3}), (101, {2, 3})]


def test_one_line_per_host_layout():
    same = "GPU 0000:07:00.0 on NUMA node 0: bound to CPUs 0-7"
    other = "GPU 0000:47:00.0 on NUMA node 1: bound to CPUs 8-15"
    said = [(f"h{h}", d, same if d == 0 else other) for h in range(5) for d in (1, 0)]
    said.append(("odd", 0, "GPU's bus id unknown: not bound"))
    line = gb.binding_line(said)
    assert line == ("ranks near their GPUs (NNABLA_TORUS_BIND_GPU_NUMA=0 turns it off): "
                    f"hosts h0, h1, h2 and 2 more: device 0: {same}; device 1: {other} | "
                    "host odd: device 0: GPU's bus id unknown: not bound")
    assert "\n" not in line


def test_init_binds_on_the_nccl_backend_only(monkeypatch, caplog):
    """The communicator's step: the NCCL backend binds (or not, knob off) and logs the line;
    another backend (no GPU: this machine) binds nothing and says so at debug only."""
    from types import SimpleNamespace
    from nnabla_torus.comm.communicator import TorusCommunicator
    asked = []
    monkeypatch.setattr(gb, "cuda_bus_id", lambda device: f"bus{device}")
    monkeypatch.setattr(gb, "bind_near_gpu", lambda device, buses: asked.append(
        (device, buses)) or f"{buses[device]}: bound")

    def run(backend, on):
        comm = object.__new__(TorusCommunicator)      # what init() has set by then
        comm.settings = SimpleNamespace(backend=backend, bind_gpu_numa=on)
        comm.backend = SimpleNamespace(device_id=1, local_ranks=2)
        comm._host_names, comm.init_notes = ["h"], []     # rank: MPI's, 0 here
        caplog.clear()
        with caplog.at_level("DEBUG", logger="nnabla_torus"):
            comm._bind_near_gpu()
        logged = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert comm.init_notes == [text for level, text in logged if level == "INFO"]
        return logged
    assert run("nccl", True) == [("INFO", "ranks near their GPUs (NNABLA_TORUS_BIND_GPU_NUMA=0 "
                                          "turns it off): host h: device 1: bus1: bound")]
    assert asked == [(1, ["bus0", "bus1"])]
    assert run("nccl", False)[0][1].endswith("device 1: not bound (NNABLA_TORUS_BIND_GPU_NUMA=0)")
    assert run("mpi", True) == [("DEBUG", "mpi backend: no GPU, ranks not bound near one")]
    assert run("fake-nccl", True)[0][0] == "DEBUG" and len(asked) == 1


def test_a_real_process_and_its_running_threads_get_the_mask(sysfs, tmp_path):
    """The kernel's side, in a child process: a thread started before the binding ends up
    on the GPU's share too (the fake node 0 is given this machine's first CPU)."""
    import subprocess
    import sys
    first = min(os.sched_getaffinity(0))
    (tmp_path / "devices/system/node/node0/cpulist").write_text(f"{first}\n")
    child = f"""
import os, threading
from nnabla_torus.comm import gpu_binding as gb
started, done = threading.Event(), threading.Event()
masks = []
def worker():
    started.set(); done.wait(); masks.append(os.sched_getaffinity(0))
t = threading.Thread(target=worker); t.start(); started.wait()
print(gb.bind_near_gpu(0, ["0000:07:00.0"], {sysfs!r}))
done.set(); t.join()
print(sorted(os.sched_getaffinity(0)), sorted(masks[0]))
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=60)
    lines = done.stdout.splitlines()
    assert lines[-1] == f"[{first}] [{first}]", done.stdout + done.stderr
    if len(os.sched_getaffinity(0)) > 1:
        assert lines[0] == f"GPU 0000:07:00.0 on NUMA node 0: bound to CPUs {first}"
