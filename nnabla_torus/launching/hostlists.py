"""Host lists as schedulers and MPI libraries write them, read into ``[(host, slots)]``.

- Slurm's compressed node lists and task counts (``SLURM_JOB_NODELIST=node[01-04,07]``,
  ``SLURM_TASKS_PER_NODE=2(x3),1``): :func:`expand_nodelist`, :func:`expand_tasks_per_node`;
- hostfiles, as Open MPI and MPICH read them: ``host slots=N`` (also ``count=``/``cpu=``,
  ``max_slots=``; Open MPI 5's PRRTE ``src/util/hostfile/hostfile_lex.l``), ``host:N`` (MPICH's
  hydra), a host repeated on several lines (each line adds its slots, as in PBS's
  ``$PBS_NODEFILE``), ``#`` comments: :func:`read_hostfile`. A line it cannot read is refused
  with its file, line number and the forms it reads, never guessed;
- the allocation of the Slurm or PBS job this runs in: :func:`allocation`.

    >>> expand_nodelist("gpu[08-10,12],login1")
    ['gpu08', 'gpu09', 'gpu10', 'gpu12', 'login1']
    >>> expand_tasks_per_node("4(x2),1")
    [4, 4, 1]
"""
import itertools
import os
import re

# Open MPI's names for a host's slot count and its maximum (PRRTE hostfile_lex.l), and the
# keys both libraries accept that do not change the count (user name, ssh port, topology
# hints; hydra's ifhn= network interface).
SLOTS_KEYS = ("slots", "count", "cpu")
MAX_KEYS = ("max_slots", "max-slots", "slots_max", "slots-max", "cpu_max", "cpu-max",
            "max_cpu", "max-cpu", "count_max", "count-max", "max_count", "max-count")
OTHER_KEYS = ("username", "user-name", "user_name", "user", "port", "boards", "sockets",
              "sockets_per_board", "sockets-per-board", "cores", "cores_per_socket",
              "cores-per-socket", "ifhn")
FORMS = "'host', 'host slots=N [max_slots=M]' (Open MPI) or 'host:N' (MPICH)"
# A host name (RFC 1123 letters, digits, '-' and '.'; '_' as clusters use it) or an IPv6
# address: anything else (a discovery command's error text, a markup line) is not a host.
HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*(?:%[\w.-]+)?")


def _count(text, what):
    """An ASCII decimal integer >= 1, else ValueError naming ``what`` (the text before it)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"{what}{text!r} must be an integer >= 1 in ASCII digits (e.g. "
                         f"'node01 slots=4' or 'node01:4')")
    return int(text)


def _split_top(text, sep=","):
    """``text`` split at ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if depth < 0 or depth > 1:
            raise ValueError(f"node list {text!r}: unbalanced or nested brackets")
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"node list {text!r}: unbalanced brackets")
    return parts + [text[start:]]


def _range(item, whole):
    """The numbers of one bracket item (``07`` or ``01-04``), zero-padded like its lower end."""
    low, dash, high = item.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()):
        raise ValueError(f"node list {whole!r}: {item!r} is not a number or a range a-b")
    if dash and int(high) < int(low):
        raise ValueError(f"node list {whole!r}: range {item!r} runs backwards")
    width = len(low)
    return [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]


def expand_nodelist(text):
    """Host names of a Slurm node list (``scontrol show hostnames`` without Slurm).

    Commas separate names; ``[a-b,c]`` expands ranges and keeps their zero-padding; several
    brackets in one name multiply (``r[1-2]n[1-2]``: r1n1 r1n2 r2n1 r2n2).
    """
    hosts = []
    for name in _split_top(text.strip()):
        if not name:
            raise ValueError(f"node list {text!r}: an empty name")
        pieces = re.split(r"(\[[^\]]*\])", name)
        choices = [[p] if not p.startswith("[") else
                   [n for item in p[1:-1].split(",") for n in _range(item, text)]
                   for p in pieces]
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    return hosts


def expand_tasks_per_node(text):
    """Tasks per host of Slurm's ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: [2, 2, 2, 1])."""
    counts = []
    for item in text.strip().split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not found:
            raise ValueError(f"SLURM_TASKS_PER_NODE={text!r}: {item!r} is not N or N(xM)")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def _parse_line(fields, where):
    """(host, slots) of one hostfile line's fields."""
    host, slots, max_slots = fields[0], None, None
    if host.startswith(("^", "+")) or host == "rank":
        raise ValueError(f"{where}: {host!r}: exclusions (^host), relative hosts (+n0) and "
                         f"rankfile lines are not read here; list the hosts to use as {FORMS}")
    if host.count(":") == 1:                     # MPICH's host:N (not an IPv6 address)
        host, _, count = host.partition(":")
        slots = _count(count, f"{where}: {host}:")
    if not HOST_NAME.fullmatch(host):
        raise ValueError(f"{where}: {host!r} is not a host name or address (ASCII letters, "
                         f"digits, '.', '-', '_'; an IPv6 address); hostfile lines are {FORMS}")
    for field in fields[1:]:
        key, equal, value = field.partition("=")
        if not equal:
            raise ValueError(f"{where}: {field!r} is not key=value; hostfile lines are {FORMS}")
        if key in SLOTS_KEYS:
            if slots is not None:
                raise ValueError(f"{where}: {host} has two slot counts")
            slots = _count(value, f"{where}: {key}=")
        elif key in MAX_KEYS:
            max_slots = _count(value, f"{where}: {key}=")
        elif key not in OTHER_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; hostfile lines are {FORMS}")
    slots = slots if slots is not None else (max_slots or 1)
    if max_slots is not None and slots > max_slots:
        raise ValueError(f"{where}: slots={slots} is more than max_slots={max_slots}; Open MPI "
                         f"places at most max_slots ranks on {host}: lower slots or raise "
                         f"max_slots")
    return host, slots


def read_hostfile(path):
    """[(host, slots)] in first-appearance order of an Open MPI or MPICH hostfile (or
    ``$PBS_NODEFILE``): a host named on several lines gets the sum of their slots.

    ``slots`` (or ``count``/``cpu``) defaults to 1, or to ``max_slots`` when only that is
    given; ``slots`` above ``max_slots`` is an error (Open MPI places at most ``max_slots``
    ranks on the host even when oversubscribing). Values are ASCII decimal integers >= 1.
    """
    # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first host
    with open(path, encoding="utf-8-sig") as f:
        try:
            lines = f.readlines()
        except UnicodeDecodeError as e:
            raise ValueError(f"hostfile {path} is not UTF-8 text ({e.reason} at byte "
                             f"{e.start}); write one {FORMS} per line") from None
    return parse_hostlines(lines, path, f"hostfile {path}")


def parse_hostlines(lines, where, source):
    """[(host, slots)] of hostfile ``lines`` (the forms of :func:`read_hostfile`), errors
    naming ``where``:line; ``source`` names where they came from when there are none (a
    hostfile, a host discovery command's output)."""
    totals = {}
    for number, line in enumerate(lines, 1):
        text = re.sub(r"\s*=\s*", "=", line.split("#", 1)[0]).strip()
        if not text:
            continue
        host, slots = _parse_line(text.split(), f"{where}:{number}")
        totals[host] = totals.get(host, 0) + slots
    if not totals:
        raise ValueError(f"{source} names no host; write one {FORMS} per line")
    return list(totals.items())


def allocation(environ=None):
    """``(source, [(host, slots)])`` of the scheduler job this process runs in, else None.

    Slurm: ``SLURM_JOB_NODELIST`` (``node[01-04,07]``) with ``SLURM_TASKS_PER_NODE``
    (``4(x2),2``); PBS: ``$PBS_NODEFILE`` (a host per slot, repeated). ValueError naming the
    variable when it cannot be read. Inside a job step (``srun -n 1 nnabla-torus-run ...``,
    ``srun --pty bash``) Slurm overwrites ``SLURM_TASKS_PER_NODE`` with the step's own tasks,
    so the job's slots come from :func:`job_tasks_per_node`.
    """
    environ = os.environ if environ is None else environ
    nodes = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if nodes:
        job = f"Slurm job {environ.get('SLURM_JOB_ID', '?')}"
        hosts = expand_nodelist(nodes)
        name, tasks = job_tasks_per_node(environ)
        if not tasks:
            raise ValueError(f"{job} has no {name}: ask for tasks (sbatch -n N or "
                             f"--ntasks-per-node=N), or give --slots / --hostfile")
        counts = expand_tasks_per_node(tasks)
        if len(counts) == 1 and len(hosts) > 1 and name != "SLURM_TASKS_PER_NODE":
            counts *= len(hosts)                  # a per-node figure: the same on every node
        if len(counts) != len(hosts):
            raise ValueError(f"SLURM_JOB_NODELIST={nodes!r} names {len(hosts)} host(s) but "
                             f"{name}={tasks!r} gives {len(counts)} count(s)")
        if "SLURM_STEP_ID" in environ:
            job += f" (from inside its step {environ['SLURM_STEP_ID']}: {name})"
        return job, list(zip(hosts, counts))
    if environ.get("PBS_NODEFILE"):
        path = environ["PBS_NODEFILE"]
        return (f"PBS job {environ.get('PBS_JOBID', '?')} ($PBS_NODEFILE)",
                read_hostfile(path))
    return None


def job_tasks_per_node(environ):
    """``(variable, text)``: the job's tasks per node in ``SLURM_TASKS_PER_NODE``'s form.

    In the batch script (or ``salloc``'s shell) ``SLURM_TASKS_PER_NODE`` is the job's. Inside a
    step (``SLURM_STEP_ID`` set) it is the step's (1 for ``srun -n 1``), so the job's comes from
    ``SLURM_NTASKS_PER_NODE`` (set when the job asked for ``--ntasks-per-node``; steps inherit
    it), else from ``SLURM_JOB_CPUS_PER_NODE`` divided by ``SLURM_CPUS_PER_TASK`` (default 1):
    the CPUs the job holds on each node, one task per ``--cpus-per-task`` of them (checked
    under Slurm 22.05: ``sbatch -n 4`` then ``srun -n 1`` sees ``SLURM_TASKS_PER_NODE=1`` and
    ``SLURM_JOB_CPUS_PER_NODE=4``).
    """
    if "SLURM_STEP_ID" not in environ:
        return "SLURM_TASKS_PER_NODE", environ.get("SLURM_TASKS_PER_NODE")
    if environ.get("SLURM_NTASKS_PER_NODE"):
        return "SLURM_NTASKS_PER_NODE", environ["SLURM_NTASKS_PER_NODE"]
    cpus = environ.get("SLURM_JOB_CPUS_PER_NODE")
    if not cpus:
        return "SLURM_JOB_CPUS_PER_NODE", None
    per_task = environ.get("SLURM_CPUS_PER_TASK", "")
    per_task = int(per_task) if per_task.isdigit() and int(per_task) > 0 else 1
    counts = [max(1, n // per_task) for n in expand_tasks_per_node(cpus)]
    return ("SLURM_JOB_CPUS_PER_NODE / SLURM_CPUS_PER_TASK",
            ",".join(str(n) for n in counts))
