"""Create and delete the emulated hosts: network namespaces, veth links and a bridge.

Everything lives in namespaces of our own, so the machine's root namespace gains no interface,
address or route. ``PREFIX-sw`` is the switch: it holds the bridge ``br0`` with the address
``.1`` and runs mpirun (like a login node). Each host ``PREFIX-hI`` has an ``eth0`` whose
veth peer ``hI`` is a port of ``br0``. Example::

    lay = Layout("nntorus", 2, "10.213.0.0/24")
    create(lay, tcp_retries2=15)   # raises ClusterError (after undoing its work) when a step fails
    destroy(lay)                   # idempotent; also removes leftovers of a killed run
"""
import os
import shutil
import signal
import subprocess
import time


class ClusterError(RuntimeError):
    """A step of building or running the emulated cluster failed; the message says the fix."""


def run(argv, check=True):
    """Run a system command; on failure raise ClusterError with its stderr."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def check_privileges():
    """Refuse early, with the fix, when not root or when `ip netns` / `tc` / `unshare` is
    missing."""
    if os.geteuid() != 0:
        raise ClusterError("emucluster needs root (network namespaces, veth, tc): "
                           "run it with sudo, e.g. `sudo .venv/bin/python -m tools.emucluster ...`")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            raise ClusterError(f"`{tool}` not found: install {package}")
    if run(["ip", "netns", "list"], check=False).returncode != 0:
        raise ClusterError("`ip netns` does not work here (no network-namespace support or "
                           "no /run/netns); emucluster needs CONFIG_NET_NS and root")


def namespaces():
    """Names of all network namespaces known to `ip netns`."""
    lines = run(["ip", "netns", "list"]).stdout.splitlines()
    return [line.split()[0] for line in lines if line.strip()]


def create(layout, tcp_retries2):
    """Build switch, hosts and links for ``layout``; on any failure undo and re-raise.

    ``tcp_retries2`` is set in every namespace: how long TCP keeps retransmitting to a peer
    behind a cut link before it reports an error (15, Linux's default, is ~15 minutes).
    """
    taken = [name for name in namespaces() if layout.owns_namespace(name)]
    if taken:
        raise ClusterError(f"an emulated cluster with prefix {layout.prefix!r} already exists "
                           f"({', '.join(taken)}): run `down` first or use another --prefix")
    try:
        _create_switch(layout)
        for index in range(layout.hosts):
            _create_host(layout, index)
        for namespace in layout.namespaces:
            run(["ip", "netns", "exec", namespace, "sysctl", "-q",
                 f"net.ipv4.tcp_retries2={tcp_retries2}"])
    except BaseException:
        destroy(layout)
        raise


def _create_switch(layout):
    sw = layout.switch
    run(["ip", "netns", "add", sw])
    run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
    run(["ip", "-n", sw, "addr", "add", f"{layout.switch_address}/{layout.subnet.prefixlen}",
         "dev", "br0"])
    run(["ip", "-n", sw, "link", "set", "br0", "up"])
    run(["ip", "-n", sw, "link", "set", "lo", "up"])


def _create_host(layout, index):
    host, port, sw = layout.host_name(index), layout.switch_port(index), layout.switch
    run(["ip", "netns", "add", host])
    run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0",
         "netns", host])
    run(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
    address = f"{layout.host_address(index)}/{layout.subnet.prefixlen}"
    run(["ip", "-n", host, "addr", "add", address, "dev", "eth0"])
    run(["ip", "-n", host, "link", "set", "eth0", "up"])
    run(["ip", "-n", host, "link", "set", "lo", "up"])


def set_link(layout, index, up):
    """Bring host ``index``'s link up or down (both veth ends), e.g. to emulate a cable cut."""
    if not 0 <= index < layout.hosts:
        raise ValueError(f"host {index} out of range 0..{layout.hosts - 1}")
    state = "up" if up else "down"
    run(["ip", "-n", layout.switch, "link", "set", layout.switch_port(index), state])
    run(["ip", "-n", layout.host_name(index), "link", "set", "eth0", state])


def namespace_pids(namespace):
    """PIDs of the processes inside ``namespace`` (mpirun, ranks, Open MPI daemons)."""
    out = run(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(pid) for pid in out.split()]


def kill_namespace_processes(namespace, grace=2.0, signals=(signal.SIGTERM, signal.SIGKILL)):
    """SIGTERM every process in ``namespace``, then SIGKILL what is left after ``grace`` s
    (``signals=(signal.SIGKILL,)``: at once, as a host that dies)."""
    for sig in signals:
        for pid in namespace_pids(namespace):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while namespace_pids(namespace) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not namespace_pids(namespace):
            return


def destroy(layout):
    """Delete every namespace ``layout.prefix`` owns, whatever its host count.

    Idempotent: safe after a killed run, a half-built cluster or nothing at all. Processes
    inside are killed first (a namespace with live processes would outlive its name); the
    veths and the bridge vanish with their namespaces.
    """
    for namespace in namespaces():
        if layout.owns_namespace(namespace):
            kill_namespace_processes(namespace)
            run(["ip", "netns", "del", namespace], check=False)


def leftovers(layout):
    """Namespaces of ``layout.prefix`` that still exist (empty when clean)."""
    return [ns for ns in namespaces() if layout.owns_namespace(ns)]
