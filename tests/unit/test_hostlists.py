"""Host lists: Slurm's compressed node lists and task counts, hostfiles in every form Open MPI
and MPICH read (and $PBS_NODEFILE), refusals naming file, line and the forms read."""
import pytest

from nnabla_torus.launching import hostlists
from nnabla_torus.launching.hostlists import (expand_nodelist, expand_tasks_per_node,
                                              read_hostfile)


@pytest.mark.parametrize("text, hosts", [
    ("vm", ["vm"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("gpu[8-10],login1", ["gpu8", "gpu9", "gpu10", "login1"]),
    ("a[098-101]", ["a098", "a099", "a100", "a101"]),          # padding of the lower end
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("x[1],y-[3-4]-ib", ["x1", "y-3-ib", "y-4-ib"]),
])
def test_slurm_node_lists_expand(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text, message", [
    ("node[1-3", "unbalanced"), ("node]1[", "unbalanced"), ("node[[1]]", "nested"),
    ("node[3-1]", "runs backwards"), ("node[a-b]", "not a number"), ("a,,b", "empty name")])
def test_bad_node_lists_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        expand_nodelist(text)


def test_slurm_tasks_per_node():
    assert expand_tasks_per_node("4") == [4]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8(x2),4,2(x1)") == [8, 8, 4, 2]
    with pytest.raises(ValueError, match=r"'2\(3\)' is not N or N\(xM\)"):
        expand_tasks_per_node("2(3)")


def test_every_hostfile_form(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(
        "# Open MPI, MPICH and PBS lines in one file\n"
        "node1 slots=4            # Open MPI\n"
        "node2:4\n"                                   # MPICH (read as 1 slot before)
        "node3 slots = 2 max_slots=4\n"               # spaces around '=' (PRRTE's lexer)
        "node4 max_slots=3\n"                         # max alone bounds the host
        "node5 count=2\nnode6 cpu=3 port=2222 username=me\n"
        "node7\nnode7\nnode7\n"                       # one line per slot ($PBS_NODEFILE)
        "node8:2 ifhn=ib0\n\n   \n")
    assert read_hostfile(str(path)) == [("node1", 4), ("node2", 4), ("node3", 2), ("node4", 3),
                                        ("node5", 2), ("node6", 3), ("node7", 3), ("node8", 2)]
    path.write_text("node1 slots=2\nnode2\nnode1 slots=2\n")      # repeated lines add up
    assert read_hostfile(str(path)) == [("node1", 4), ("node2", 1)]


@pytest.mark.parametrize("line, message", [
    ("node1 4", r"hosts:1: '4' is not key=value; hostfile lines are 'host', 'host slots=N"),
    ("node1 slot=4", "hosts:1: unknown key 'slot'"),
    ("node1:0", "hosts:1: node1:'0' must be an integer >= 1"),
    ("node1:four", "must be an integer >= 1"),
    ("node1 slots=\u0664", "slots='\u0664' must be an integer >= 1 in ASCII digits"),
    ("node1:2 slots=4", "node1 has two slot counts"),
    ("node1 slots=8 max_slots=4", "slots=8 is more than max_slots=4"),
    ("^node1", "exclusions"), ("+n0", "relative hosts"),
    ("%%%", "hosts:1: '%%%' is not a host name or address"),     # before: a host named %%%
    ("<html><body>502 Bad Gateway", "'<html><body>502' is not a host name"),
    ("rank 0=node1 slot=0", "rankfile lines")])
def test_unreadable_hostfile_lines_are_refused(tmp_path, line, message):
    path = tmp_path / "hosts"
    path.write_text(f"{line}\n")
    with pytest.raises(ValueError, match=message):
        read_hostfile(str(path))


def test_an_empty_hostfile_is_refused(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="names no host"):
        read_hostfile(str(path))
    assert "host:N" in hostlists.FORMS


def test_a_hostfile_with_a_byte_order_mark_or_other_bytes(tmp_path):
    """A BOM (Windows editors) is not part of the first host name; bytes that are not UTF-8
    are refused with the file's name, not a UnicodeDecodeError."""
    path = tmp_path / "hosts"
    path.write_bytes(b"\xef\xbb\xbfnode1 slots=2\nnode2\n")
    assert read_hostfile(str(path)) == [("node1", 2), ("node2", 1)]
    path.write_bytes(b"node1 slots=2\nn\xe9ode2\n")
    with pytest.raises(ValueError, match=rf"hostfile {path} is not UTF-8 text"):
        read_hostfile(str(path))


def test_inside_a_job_step_the_slots_are_the_jobs():
    """srun -n 1 nnabla-torus-run (or srun --pty bash): SLURM_TASKS_PER_NODE is the step's 1;
    the job's tasks come from SLURM_NTASKS_PER_NODE, else its CPUs per node per task (the
    variables Slurm 22.05 set for sbatch -n 4 / -N 2 --ntasks-per-node=4 -c 2 here)."""
    step = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "1",
            "SLURM_JOB_NODELIST": "vm", "SLURM_JOB_CPUS_PER_NODE": "4"}
    source, hosts = hostlists.allocation(step)
    assert hosts == [("vm", 4)] and source.startswith("Slurm job 7 (from inside its step 0")
    two = dict(step, SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_CPUS_PER_NODE="8(x2)",
               SLURM_CPUS_PER_TASK="2")
    assert hostlists.allocation(two)[1] == [("n1", 4), ("n2", 4)]
    assert hostlists.allocation(dict(two, SLURM_NTASKS_PER_NODE="3"))[1] == [("n1", 3),
                                                                              ("n2", 3)]
    batch_script = {k: v for k, v in step.items() if k != "SLURM_STEP_ID"}
    assert hostlists.allocation(batch_script)[1] == [("vm", 1)]   # its own tasks, as before
