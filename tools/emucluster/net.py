"""Create and delete the emulated hosts: network namespaces, veth links and a bridge.

Each host ``PREFIX-hI`` is a network namespace whose ``eth0`` is one end of a veth pair; the
other end (``PREFIX-hI`` in the root namespace) is a port of the bridge ``PREFIX-br``, which
also carries the root namespace's address (mpirun's out-of-band channel). Example::

    lay = Layout("nntorus", 2, "10.213.0.0/24")
    create(lay)      # raises ClusterError (after undoing its work) when a step fails
    destroy(lay)     # idempotent; also removes leftovers of a killed run
"""
import ipaddress
import json
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
    """Refuse early, with the fix, when not root or when `ip netns` / `tc` / `unshare` is missing."""
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


def link_exists(name, namespace=None):
    argv = ["ip"] + (["-n", namespace] if namespace else []) + ["link", "show", "dev", name]
    return run(argv, check=False).returncode == 0


def check_subnet_free(layout):
    """Refuse a subnet that overlaps an address or route this machine already has."""
    ours = {layout.bridge}
    for entry in json.loads(run(["ip", "-j", "-4", "addr"]).stdout or "[]"):
        if entry.get("ifname") in ours:
            continue
        for info in entry.get("addr_info", []):
            net = ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network
            if net.overlaps(layout.subnet):
                raise ClusterError(f"subnet {layout.subnet} overlaps {net} on {entry['ifname']}: "
                                   "choose another with --subnet / NNABLA_TORUS_EMU_SUBNET")


def create(layout):
    """Build bridge, namespaces and links for ``layout``; on any failure undo and re-raise."""
    check_subnet_free(layout)
    taken = [name for name in layout.host_names if name in namespaces()]
    if taken or link_exists(layout.bridge):
        raise ClusterError(f"an emulated cluster with prefix {layout.prefix!r} already exists "
                           f"({', '.join(taken) or layout.bridge}): run `down` first or "
                           "use another --prefix")
    try:
        _create_bridge(layout)
        for index in range(layout.hosts):
            _create_host(layout, index)
    except BaseException:
        destroy(layout)
        raise


def _create_bridge(layout):
    run(["ip", "link", "add", layout.bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{layout.bridge_address}/{layout.subnet.prefixlen}",
         "dev", layout.bridge])
    run(["ip", "link", "set", layout.bridge, "up"])


def _create_host(layout, index):
    host, port = layout.host_name(index), layout.bridge_port(index)
    run(["ip", "netns", "add", host])
    run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host])
    run(["ip", "link", "set", port, "master", layout.bridge, "up"])
    address = f"{layout.host_address(index)}/{layout.subnet.prefixlen}"
    run(["ip", "-n", host, "addr", "add", address, "dev", "eth0"])
    run(["ip", "-n", host, "link", "set", "eth0", "up"])
    run(["ip", "-n", host, "link", "set", "lo", "up"])


def set_link(layout, index, up):
    """Bring host ``index``'s link up or down (both veth ends), e.g. to emulate a cable cut."""
    state = "up" if up else "down"
    run(["ip", "link", "set", layout.bridge_port(index), state])
    run(["ip", "-n", layout.host_name(index), "link", "set", "eth0", state])


def namespace_pids(namespace):
    """PIDs of the processes inside ``namespace`` (ranks, Open MPI daemons)."""
    out = run(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(pid) for pid in out.split()]


def kill_namespace_processes(namespace, grace=2.0):
    """SIGTERM every process in ``namespace``, then SIGKILL what is left after ``grace`` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
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
    """Delete everything ``layout.prefix`` owns, including leftovers of any host count.

    Idempotent: safe after a killed run, a half-built cluster or nothing at all. Processes
    still inside a host namespace are killed first (a namespace with live processes would
    otherwise outlive its name).
    """
    for namespace in namespaces():
        if layout.owns_namespace(namespace):
            kill_namespace_processes(namespace)
            run(["ip", "netns", "del", namespace], check=False)
    for link in _owned_links(layout):
        run(["ip", "link", "del", link], check=False)


def _owned_links(layout):
    """Root-namespace links named like ours: the bridge and any orphaned bridge port."""
    names = [entry["ifname"] for entry in json.loads(run(["ip", "-j", "link"]).stdout or "[]")]
    return [name for name in names
            if name == layout.bridge or layout.owns_namespace(name.split("@")[0])]


def leftovers(layout):
    """What of ``layout.prefix`` still exists: namespace and link names (empty when clean)."""
    return [ns for ns in namespaces() if layout.owns_namespace(ns)] + _owned_links(layout)
