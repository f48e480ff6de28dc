"""No file the package, the example or the tools write is written in place (issue 65).

A static check over their source, so that it covers every path, not only those a short run
takes: each write-mode ``open``, ``os.open`` and library writer (``savefig``,
``nn.save_parameters``, nnabla's ``save``, ``np.save``...) must write to the ``temporary``
that ``nnabla_torus.files.atomic_path`` yields (``atomic_open`` does this for ``open``), or sit
in one of the few places listed in ``ALLOWED`` with the reason it is safe. nnabla's
``MonitorSeries`` (truncates, then appends in place) is not used at all.
"""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED = ("nnabla_torus", "examples", "tools")
WRITER_METHODS = {"savefig", "save_parameters", "tofile", "write_text", "write_bytes", "to_csv"}
NUMPY_WRITERS = {"save", "savez", "savez_compressed", "savetxt"}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}

# (file, function) -> why writing there in place loses nothing
ALLOWED = {
    ("nnabla_torus/files.py", "atomic_path"): "the helper itself",
    ("nnabla_torus/files.py", "atomic_open"): "the helper itself",
    ("nnabla_torus/training/checkpoint_file.py", "save_checkpoint"):
        "np.savez into memory (a BytesIO); the file goes through atomic_path",
    ("nnabla_torus/launching/job_lifetime.py", "leave_terminal"):
        "/dev/null opened to replace a hung-up terminal: no file is written",
    ("examples/imagenet/embedded.py", "ensure"): "the lock file, opened to append: never cut",
    ("examples/imagenet/embedded.py", "_write"):
        "a data set built in a fresh <root>.tmp-<pid> folder, renamed into place whole",
    ("nnabla_torus/launching/mpirun_cmd.py", "hostfile_args"):
        "the hostfile in the launcher's own TemporaryDirectory",
    ("nnabla_torus/sim/simgrid.py", "replay"): "inputs in the replay's TemporaryDirectory",
    ("nnabla_torus/sim/simgrid_trace.py", "write"): "the trace in the replay's TemporaryDirectory",
    ("tools/host_mpi_latency.py", "main"): "a C source in a TemporaryDirectory",
    ("tools/research/gpu_stack_check.py", "build_stub"):
        "stub libraries' C sources in the check's own build folder, compiled and thrown away",
}


def python_files():
    for top in SCANNED:
        for folder, _, names in os.walk(os.path.join(REPO, top)):
            for name in sorted(names):
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def constant(node):
    return node.value if isinstance(node, ast.Constant) else None


def writes_in_place(call, nnabla_save_names):
    """Why ``call`` writes a file in place, or None (not a write, or to ``temporary``)."""
    func, args = call.func, call.args
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    owner = getattr(func.value, "id", None) if isinstance(func, ast.Attribute) else None
    if name == "MonitorSeries":
        return "nnabla's MonitorSeries truncates and appends in place"
    if name == "open" and owner in (None, "io"):
        mode = constant(args[1]) if len(args) > 1 else next(
            (constant(k.value) for k in call.keywords if k.arg == "mode"), "r")
        if not isinstance(mode, str) or not set(mode) & set("wax+"):
            return None
        why = f"open(..., {mode!r})"
    elif name == "open" and owner == "os":
        flags = {n.attr for n in ast.walk(args[1]) if isinstance(n, ast.Attribute)}
        if not flags & WRITE_FLAGS:
            return None
        why = "os.open for writing"
    elif name in WRITER_METHODS or (owner in ("np", "numpy") and name in NUMPY_WRITERS) \
            or (isinstance(func, ast.Name) and name in nnabla_save_names):
        why = f"{name}()"
    else:
        return None
    target = args[0] if args else None
    return None if isinstance(target, ast.Name) and target.id == "temporary" else why


def in_place_writes(path):
    """[(file, function, line, why)] of the writes in ``path`` that are not through files.py."""
    tree = ast.parse(open(path).read(), path)
    relative = os.path.relpath(path, REPO)
    nnabla_save_names = {alias.asname or alias.name for node in ast.walk(tree)
                         if isinstance(node, ast.ImportFrom) and node.module == "nnabla.utils.save"
                         for alias in node.names}
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if isinstance(child, ast.Call):
                why = writes_in_place(child, nnabla_save_names)
                if why and (relative, function) not in ALLOWED:
                    found.append((relative, function, child.lineno, why))
            visit(child, inner)
    visit(tree, "<module>")
    return found


def test_every_file_is_written_through_files_py():
    found = [w for path in python_files() for w in in_place_writes(path)]
    assert not found, "written in place (use nnabla_torus.files.atomic_open/atomic_path):\n" + \
        "\n".join(f"  {file}:{line} in {function}: {why}" for file, function, line, why in found)


def test_the_check_sees_the_writes_it_must_refuse(tmp_path):
    source = tmp_path / "writer.py"
    source.write_text(
        "import os\nimport numpy as np\nfrom nnabla.utils.save import save\n"
        "from nnabla.monitor import MonitorSeries\n"
        "def f(path, fig, nn):\n"
        "    open(path, 'w'); open(path, mode='ab'); open(path); open(path, 'rb')\n"
        "    os.open(path, os.O_WRONLY | os.O_CREAT); os.open(path, os.O_RDONLY)\n"
        "    fig.savefig(path); nn.save_parameters(path); save(path, {}); np.savez(path)\n"
        "    MonitorSeries('loss')\n"
        "    with atomic_path(path) as temporary:\n"
        "        fig.savefig(temporary); open(temporary, 'w')\n")
    whys = [why for _, _, _, why in in_place_writes(str(source))]
    assert whys == ["open(..., 'w')", "open(..., 'ab')", "os.open for writing", "savefig()",
                    "save_parameters()", "save()", "savez()",
                    "nnabla's MonitorSeries truncates and appends in place"]
