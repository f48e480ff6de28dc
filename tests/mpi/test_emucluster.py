"""The emulated cluster (tools/emucluster): 2 hosts x 2 ranks, shaped links, a killed rank
(named by the survivors and mpirun).

The MPI tests need root, `ip netns` and `unshare`, and are skipped with the reason otherwise.
Each run uses its own prefix and subnet (from the pid), a hard timeout, and checks afterwards
that no namespace, link or process of the run is left.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from nnabla_torus.launching.mpirun_cmd import mpirun_path
from tests.mpirun import DIED, LOST, expect_passed
from tests.slowdown import scaled
from tests.unit.test_mpirun_cmd import VERSIONS
from tools.emucluster import cli, launch
from tools.emucluster.layout import Layout
from tools.emucluster.shaping import LinkSpec, parse_bytes, parse_rate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = f"nt{os.getpid() % 1000000}"
SUBNET = f"10.213.{100 + os.getpid() % 150}.0/24"
TAG = uuid.uuid4().hex  # in every launched process's environment, to find stragglers


def emulation_unavailable():
    """Why the emulated cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` not installed"
    # Root without CAP_SYS_ADMIN (some containers) can list namespaces but not create them.
    probe = f"{PREFIX}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot create network namespaces: {made.stderr.decode().strip()}"
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        return "`unshare --uts` does not work here"
    try:
        mpirun_path()
    except RuntimeError as e:
        return str(e)
    return None


UNAVAILABLE = emulation_unavailable()
needs_emulation = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


def emucluster(args, timeout):
    """Run ``python -m tools.emucluster ARGS`` under a hard timeout (``scaled(timeout)`` s);
    return (exit code, output)."""
    env = dict(os.environ, NNABLA_TORUS_EMU_TEST_TAG=TAG, NNABLA_TORUS_EMU_PREFIX=PREFIX,
               NNABLA_TORUS_EMU_SUBNET=SUBNET)
    proc = subprocess.Popen([sys.executable, "-m", "tools.emucluster"] + args, cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        subprocess.run([sys.executable, "-m", "tools.emucluster", "down"], cwd=REPO, env=env)
        raise AssertionError(f"emucluster {' '.join(args)} hung for {scaled(timeout):.0f} s:"
                             f"\n{out}")
    return proc.returncode, out


def tagged_processes():
    """PIDs of live processes started by this test module's runs."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if TAG.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def assert_nothing_left():
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{PREFIX}-" not in netns, netns
    assert not os.path.exists(f"/run/nnabla-torus-emucluster/{PREFIX}")
    deadline = time.monotonic() + scaled(5)  # killed processes may take a moment to be reaped
    while tagged_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged_processes() == []


def run_on_cluster(cluster_args, prog_args, timeout=150):
    code, out = emucluster(["exec", "--hosts", "2", "--ranks-per-host", "2",
                            "--timeout", f"{scaled(timeout - 30):.0f}"] + cluster_args
                           + ["--", sys.executable] + prog_args, timeout=timeout)
    assert_nothing_left()
    return code, out


# -- without root: names, addresses, link specs -------------------------------------------

def test_layout_names_and_addresses():
    lay = Layout("nntorus", 3, "10.213.0.0/24")
    assert lay.host_names == ["nntorus-h0", "nntorus-h1", "nntorus-h2"]
    assert (lay.switch, lay.switch_address, lay.host_address(2)) == ("nntorus-sw", "10.213.0.1",
                                                                     "10.213.0.4")
    assert lay.owns_namespace("nntorus-h17") and lay.owns_namespace("nntorus-sw")
    assert not lay.owns_namespace("nntorus-h1x") and not lay.owns_namespace("other-h1")
    with pytest.raises(ValueError, match="hosts=300"):
        Layout("nntorus", 300, "10.213.0.0/24")
    with pytest.raises(ValueError, match="prefix"):
        Layout("Bad-Prefix", 2, "10.213.0.0/24")


def test_link_spec_rates_and_burst():
    assert (parse_rate("1gbit") == 1e9 and parse_rate("100mbit") == 1e8
            and parse_rate("none") is None)
    assert parse_bytes("64k") == 65536 and parse_bytes("1500") == 1500
    assert LinkSpec("1gbit").burst_bytes == 250000      # 2 ms of line rate
    assert LinkSpec("100mbit").burst_bytes == 65536     # at least one GSO packet
    with pytest.raises(ValueError, match="1gbit"):
        LinkSpec("1 gigabit")


def test_refuses_without_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["up"]) == 2
    assert "needs root" in capsys.readouterr().err


@pytest.mark.parametrize("library, named", [
    ("mpich", "is MPICH"), ("impi", "is Intel MPI"), ("openmpi4", "is Open MPI 4.1.4")])
def test_another_mpi_library_is_refused_before_any_host_is_made(library, named, monkeypatch,
                                                                capsys):
    """The cluster's per-host launch is PRRTE's (Open MPI 5): the others get one line naming
    them instead of hydra's "unrecognized argument" after the hosts were built."""
    text = {**VERSIONS, "openmpi4": "mpirun (Open MPI) 4.1.4\n"}[library]
    monkeypatch.setattr(launch, "version_text", lambda mpirun: text)
    monkeypatch.setattr(launch, "find_mpirun", lambda: "/opt/mpi/bin/mpirun")
    monkeypatch.setattr(cli.net, "check_privileges", lambda: None)
    monkeypatch.setattr(cli, "cluster_up", lambda args: pytest.fail("hosts built"))
    assert cli.main(["exec", "--", "python", "-c", "pass"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("emucluster: error: the emulated cluster "
                                                   "needs Open MPI 5"), err
    assert f"/opt/mpi/bin/mpirun {named}: run it with the Open MPI venv's python" in err, err


# -- on the emulated cluster ---------------------------------------------------------------

@needs_emulation
@pytest.mark.parametrize("mapping, rate, hosts_of_ranks", [
    ("by-host", "1gbit", (0, 0, 1, 1)),    # consecutive ranks share a host
    ("round-robin", "none", (0, 1, 0, 1)),
])
def test_allreduce_across_hosts(mapping, rate, hosts_of_ranks):
    code, out = run_on_cluster(["--rate", rate, "--map", mapping],
                               ["tests/mpi/progs/emu_allreduce.py", "--sizes", "4K,1M",
                                "--iters", "2"])
    assert code == 0, out
    placement = " ".join(f"{r}:{PREFIX}-h{h}" for r, h in enumerate(hosts_of_ranks))
    assert f"HOSTS {placement}" in out, out
    expect_passed(out, "emu_allreduce")


@pytest.mark.slow
@needs_emulation
def test_pipelined_torus_across_hosts(tmp_path):
    """torus2d 2x2 on 2 hosts x 2: rows inside a host, columns across, so buffers go in pieces
    (4 KiB here: 17 and 256 pieces) whose phases overlap over real TCP; sums exact."""
    out_json = tmp_path / "bench.json"
    code, out = run_on_cluster(["--rate", "1gbit", "--mpirun-args",
                                "-x NNABLA_TORUS_PIPELINE_BYTES=4096"],
                               ["tools/allreduce_bench.py", "--sizes", "68K,1M", "--algorithms",
                                "torus2d", "--grids", "2x2", "--iters", "1", "--warmup", "0",
                                "--json", str(out_json)])
    assert code == 0, out
    records = {r["algorithm"]: r for r in json.loads(out_json.read_text())
               if r["bytes"] == 1 << 20}
    assert records["torus2d"]["pipelined"] and not records["native"]["pipelined"], records
    assert all(r["correct"] for r in records.values()), records


@needs_emulation
@pytest.mark.parametrize("algorithm", ["torus2d", "native"])
def test_killed_rank_is_named_and_stops_every_rank_promptly(algorithm):
    """Rank 3 (host 1) dies inside an all-reduce: the job ends non-zero within the timeout, the
    survivors that saw it die over TCP (host 0) and mpirun name rank 3, and nobody else."""
    timeout = 20  # NNABLA_TORUS_TIMEOUT: the bound on the survivors' exit
    start = time.time()
    code, out = run_on_cluster(["--rate", "1gbit", "--mpirun-args",
                                f"-x NNABLA_TORUS_TIMEOUT={timeout} "
                                f"-x NNABLA_TORUS_ALGORITHM={algorithm}"],
                               ["tests/mpi/progs/emu_fault.py", "--api", "communicator",
                                "--size", "1M", "--victim", "3", "--kill-at", "3"])
    end = time.time()
    killed = re.search(r"KILL 3 (\d+\.\d+)", out)
    assert killed and start < float(killed.group(1)), out
    assert code != 0 and "DONE" not in out, out
    # The whole run, cluster teardown included, ends within the timeout of the kill (measured:
    # about 1 s; the survivors leave the ending to mpirun, and abort after 5 s if it does not).
    assert end - float(killed.group(1)) < scaled(timeout), out
    assert [int(r) for r in DIED.findall(out)] == [3], out
    reports = LOST.findall(out)
    assert reports and all(lost == "3" for _, lost in reports), out
    assert f"rank 3 ran on {PREFIX}-h1" in out, out
    assert "MPI_ABORT was invoked" not in out and "Socket closed" not in out, out


@needs_emulation
def test_interrupt_tears_everything_down():
    env = dict(os.environ, NNABLA_TORUS_EMU_TEST_TAG=TAG, NNABLA_TORUS_EMU_PREFIX=PREFIX,
               NNABLA_TORUS_EMU_SUBNET=SUBNET)
    proc = subprocess.Popen([sys.executable, "-m", "tools.emucluster", "exec", "--hosts", "2",
                             "--", sys.executable, "tests/mpi/progs/emu_fault.py", "--api",
                             "mpi4py", "--seconds", "60"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:  # the job is running once rank 0 has finished one all-reduce
            if line.startswith("START"):
                break
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=scaled(30))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run([sys.executable, "-m", "tools.emucluster", "down"], cwd=REPO, env=env)
    assert proc.returncode == 130 and "interrupted" in out, out
    assert_nothing_left()


@pytest.mark.slow
@needs_emulation
def test_time_to_accuracy_on_the_emulated_cluster(tmp_path):
    """tools/time_to_accuracy.py --cluster emu:2x1, 2 epochs of fixed 64, fixed 256 and
    adaptive over 20 Mbit/s links: the table, the verdict and the measured throughput of the
    larger batch (its all-reduce is amortised over 4x the images: measured 2.7x here)."""
    env = dict(os.environ, NNABLA_TORUS_EMU_TEST_TAG=TAG, NNABLA_TORUS_EMU_SUBNET=SUBNET)
    argv = [sys.executable, "tools/time_to_accuracy.py", "measure", "--cluster", "emu:2x1",
            "--emu-rate", "20mbit", "--emu-prefix", PREFIX, "--run-timeout", f"{scaled(150):.0f}",
            "--seeds", "1", "--policies", "fixed-64,fixed-256,adaptive-goodput",
            "--target", "0.2", "--train-args", "--epochs 2 --warmup-epochs 0",
            "--out", str(tmp_path)]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=scaled(400))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run([sys.executable, "-m", "tools.emucluster", "down", "--prefix", PREFIX],
                           cwd=REPO, env=env)
    assert_nothing_left()
    assert proc.returncode == 0, out[-4000:]
    saved = json.loads((tmp_path / "measured.json").read_text())
    assert saved["where"] == "digits, emulated 2 hosts x 1 ranks, links 20mbit"
    speed = {r["policy"]: r["images_per_s"] for r in saved["records"]}
    assert speed["fixed 256"] > 1.3 * speed["fixed 64"], speed
    verdict = json.loads((tmp_path / "report.json").read_text())["verdict"]
    assert any(line.startswith("throughput: fixed 256") for line in verdict)
    assert (tmp_path / "batch_over_epochs.png").stat().st_size > 0
    assert (tmp_path / "emu-2x1-20mbit.yaml").exists()


@needs_emulation
def test_a_killed_host_is_left_out_and_the_run_finishes_on_the_other(tmp_path):
    """nnabla-torus-run on 2 hosts x 2 ranks; every process of host 1 SIGKILLed at step 10
    (checkpoints every 4): the launcher names the lost host, leaves it out and the run
    finishes on host 0's 2 ranks from step 8."""
    env = dict(os.environ, NNABLA_TORUS_EMU_TEST_TAG=TAG, NNABLA_TORUS_EMU_PREFIX=PREFIX,
               NNABLA_TORUS_EMU_SUBNET=SUBNET)
    proc = subprocess.Popen([sys.executable, "-m", "tools.emucluster", "exec", "--hosts", "2",
                             "--ranks-per-host", "2", "--timeout", f"{scaled(150):.0f}",
                             "--launcher", "nnabla-torus-run", "--", sys.executable,
                             "tests/mpi/progs/failing_fake.py", str(tmp_path), "--steps", "60",
                             "--every", "4"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 10:"):
                subprocess.run([sys.executable, "-m", "tools.emucluster", "kill", "--host", "1"],
                               cwd=REPO, env=env, timeout=scaled(30))
                break
        out, _ = proc.communicate(timeout=scaled(180))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run([sys.executable, "-m", "tools.emucluster", "down"], cwd=REPO, env=env)
    out = "".join(lines) + out
    assert_nothing_left()
    assert proc.returncode == 0, out
    assert f"host {PREFIX}-h1 left out for 600 s" in out, out
    assert re.search(rf"restart 1 after a failure: \S.* \(host {PREFIX}-h1", out), out
    assert "relaunching from the newest checkpoint" in out and "FINISHED 2 60" in out, out


@needs_emulation
@pytest.mark.slow
def test_a_killed_launcher_leaves_no_process_on_any_host():
    """nnabla-torus-run SIGKILLed while its 2 hosts x 2 ranks wait without a word. Before:
    prterun, both hosts' prted and the 4 ranks ran on (11 processes left after 8 s)."""
    code, out = emucluster(["up", "--hosts", "2"], timeout=120)
    assert code == 0, out
    job = f"NNABLA_TORUS_TEST_JOB={uuid.uuid4().hex}"     # this job's processes only

    def left():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if job.encode() in f.read().split(b"\0"):
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            found.append(f.read().split(b"\0")[0].decode())
            except OSError:
                continue
        return found
    try:
        layout, _ = cli.load_layout(PREFIX)
        argv = launch.launcher_argv(layout, cli.state_dir(PREFIX), 2, "by-host",
                                    [sys.executable, "tests/mpi/progs/elastic_fake.py", "wait"])
        env = dict(os.environ, PYTHONPATH=REPO, **dict([job.split("=")]))
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "WAITING" in line:
                break
        assert any(name.endswith("prted") for name in left()), "".join(lines)   # remote
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)
        remaining = left()
    finally:
        emucluster(["down"], timeout=60)
    assert remaining == [], "".join(lines)
    assert_nothing_left()
