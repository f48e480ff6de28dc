"""Bind a rank to its share of its GPU's NUMA node's CPUs, within the CPUs it was given.

Launchers place ranks without knowing their GPUs: Open MPI 5 maps ranks by package in turn
(rank 1 on socket 1 while it drives GPU 1 on socket 0), srun leaves them on the whole node.
A rank then works far from its GPU, and DALI's ``set_affinity`` pins its threads only where
the GPU's NVML CPU mask meets the thread's own (else it warns per thread). So each rank of
the NCCL backend binds itself once it knows its GPU (nnabla's device: the number of earlier
ranks on its host): to its share of that GPU's NUMA node's CPUs (the node split among the
GPUs on it), or to the part of the node it was given (``taskset``, Slurm's ``--cpu-bind``),
within its cgroup (Slurm's CPUs). Every thread of the process gets the mask (MPI's, NCCL's
and CUDA's threads are running already); memory already touched stays where it is. It works
under any launcher. Knob: ``NNABLA_TORUS_BIND_GPU_NUMA`` (keyword ``bind_gpu_numa``; default
on). Example::

    bind_near_gpu(1, [cuda_bus_id(d) for d in range(2)])
    # "GPU 0000:0f:00.0 on NUMA node 0: bound to CPUs 8-15, 2 GPUs' share"

Where it reads: ``/sys/bus/pci/devices/<bus id>/numa_node`` and
``/sys/devices/system/node/node<N>/cpulist`` (Linux sysfs); the bus id from the CUDA runtime
(``cudaDeviceGetPCIBusId``), which counts devices as nnabla does (``CUDA_VISIBLE_DEVICES``,
``CUDA_DEVICE_ORDER``), unlike ``nvidia-smi``.
"""
import ctypes
import os


def parse_cpulist(text):
    """The CPUs of a sysfs CPU list (``"0-3,8,10-11"``) as a set of ints.

    >>> sorted(parse_cpulist("0-2,8"))
    [0, 1, 2, 8]
    """
    cpus = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def format_cpulist(cpus):
    """The shortest sysfs CPU list of ``cpus``: ``{0, 1, 2, 8}`` -> ``"0-2,8"``."""
    runs = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def normal_bus_id(bus_id):
    """A PCI bus id as sysfs names it: CUDA's ``0000:07:00.0`` and nvidia-smi's
    ``00000000:07:00.0`` both give ``0000:07:00.0`` (lower case, 4-digit domain)."""
    domain, _, rest = bus_id.strip().partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def cuda_bus_id(device, maps="/proc/self/maps"):
    """The PCI bus id of CUDA device ``device`` from the CUDA runtime this process has mapped
    (nnabla-ext-cuda's ``libcudart``), or None when none is mapped or the call fails."""
    with open(maps) as f:
        paths = [line.split()[-1] for line in f]
    path = next((p for p in paths if os.path.basename(p).startswith("libcudart.so")), None)
    if path is None:
        return None
    buf = ctypes.create_string_buffer(64)
    if ctypes.CDLL(path).cudaDeviceGetPCIBusId(buf, len(buf), int(device)) != 0:
        return None
    return normal_bus_id(buf.value.decode())


def gpu_numa_node(bus_id, sysfs="/sys"):
    """The NUMA node of the PCI device ``bus_id``, or None when the host has one node or
    does not say (sysfs gives -1)."""
    try:
        with open(os.path.join(sysfs, "bus/pci/devices", normal_bus_id(bus_id), "numa_node")) as f:
            node = int(f.read())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def node_cpus(node, sysfs="/sys"):
    """The CPUs of NUMA node ``node`` (a set; empty when sysfs does not say)."""
    try:
        with open(os.path.join(sysfs, f"devices/system/node/node{node}/cpulist")) as f:
            return parse_cpulist(f.read())
    except (OSError, ValueError):
        return set()


def set_process_affinity(cpus, tasks="/proc/self/task"):
    """Give every thread of this process the CPU mask ``cpus`` (a thread that ended meanwhile
    is skipped)."""
    for tid in os.listdir(tasks):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass


def own_mask():
    """This thread's CPU mask (a set)."""
    return os.sched_getaffinity(0)


def cores(cpus, sysfs="/sys"):
    """``cpus`` grouped by physical core (hyperthread siblings together, from sysfs
    ``thread_siblings_list``; a CPU alone where sysfs does not say), ordered by first CPU."""
    groups = {}
    for cpu in sorted(cpus):
        try:
            with open(os.path.join(sysfs, f"devices/system/cpu/cpu{cpu}/topology/"
                                          "thread_siblings_list")) as f:
                siblings = parse_cpulist(f.read())
        except (OSError, ValueError):
            siblings = {cpu}
        groups.setdefault(min(siblings | {cpu}), set()).add(cpu)
    return [groups[first] for first in sorted(groups)]


def node_share(cores, index, count):
    """The CPUs of part ``index`` of ``count`` contiguous, near-equal parts of ``cores`` (lists
    of CPUs, one per physical core: ``cores()``), so no two parts share a core; all of them
    when there are fewer cores than parts.

    >>> sorted(node_share([{8, 24}, {9, 25}, {10, 26}, {11, 27}], 1, 2))
    [10, 11, 26, 27]
    """
    if len(cores) < count:
        index, count = 0, 1
    part = cores[len(cores) * index // count: len(cores) * (index + 1) // count]
    return set().union(*part)


def bind_near_gpu(device, bus_ids, sysfs="/sys", mask=own_mask, bind=set_process_affinity):
    """Bind this process near GPU ``device``; return one phrase saying what it did or why not.

    ``bus_ids``: the PCI bus id of every GPU the host's ranks use, by device (``cuda_bus_id``;
    None when unknown). A rank given its GPU's whole NUMA node (unbound, or bound to a package)
    takes its share of the node's CPUs: the node's physical cores split among the GPUs on it,
    as ``mpirun --map-by ppr:G:numa:pe=C`` would, so the host's DALI threads do not pile onto
    the same cores. A rank given part of the node (``taskset``, Slurm's ``--cpu-bind``) keeps
    that part.
    A rank with no CPU there (Open MPI put it on the other socket) takes its share of the node
    within its cgroup (the kernel narrows the mask to it; a cgroup with none of those CPUs
    leaves the rank where it was). ``bind(cpus)`` sets the mask (tests pass a recorder)."""
    bus_id = bus_ids[device]
    if bus_id is None:
        return "GPU's bus id unknown: not bound"
    node = gpu_numa_node(bus_id, sysfs)
    if node is None:
        return f"GPU {bus_id} has no NUMA node in sysfs (one-node host): not bound"
    here, cpus = set(mask()), node_cpus(node, sysfs)
    if not cpus:
        return f"GPU {bus_id} on NUMA node {node}, whose CPUs sysfs does not list: not bound"
    peers = [d for d, b in enumerate(bus_ids) if b is not None and gpu_numa_node(b, sysfs) == node]
    near = cpus & here
    whole_node = near == cpus or not near
    wanted = (node_share(cores(cpus, sysfs), peers.index(device), len(peers)) if whole_node
              else near)
    if wanted == here:
        return f"GPU {bus_id} on NUMA node {node}: CPUs {format_cpulist(here)}, already bound"
    try:
        bind(wanted)
    except OSError as e:     # EINVAL: the cgroup allows none of these CPUs
        return (f"GPU {bus_id} on NUMA node {node}: CPUs {format_cpulist(wanted)} not allowed "
                f"here ({e.strerror}), left on CPUs {format_cpulist(here)}")
    share = f", {len(peers)} GPUs' share" if whole_node and len(peers) > 1 else ""
    moved = "" if near else f" (from CPUs {format_cpulist(here)}, none on that node)"
    return (f"GPU {bus_id} on NUMA node {node}: bound to CPUs {format_cpulist(mask())}"
            f"{share}{moved}")


def binding_line(said):
    """The job's one line from every rank's ``(host, device, phrase)``: each distinct host
    layout once, with the hosts that have it.

    >>> line = binding_line([("a", 0, "p"), ("a", 1, "q"), ("b", 0, "p"), ("b", 1, "q")])
    >>> line.split("off): ")[1]
    'hosts a, b: device 0: p; device 1: q'
    """
    per_host = {}
    for host, device, phrase in said:
        per_host.setdefault(host, []).append((device, phrase))
    layouts = {}
    for host, items in per_host.items():
        text = "; ".join(f"device {device}: {phrase}" for device, phrase in sorted(items))
        layouts.setdefault(text, []).append(host)
    parts = [f"host{'s' if len(hosts) > 1 else ''} {', '.join(hosts[:3])}"
             f"{f' and {len(hosts) - 3} more' if len(hosts) > 3 else ''}: {text}"
             for text, hosts in layouts.items()]
    return ("ranks near their GPUs (NNABLA_TORUS_BIND_GPU_NUMA=0 turns it off): "
            + " | ".join(parts))
