"""Import order: nnabla registers its NCCL communicators only if libmpi was findable when
``nnabla_ext.cuda`` was first imported, and a training script imports it early, through
``get_extension_context("cudnn")``.

The extension here is a stand-in on the path (a namespace-package part, as nnabla's own
``nnabla_ext.cpu``) that applies nnabla-ext-cuda 1.39's rule at import: ``dl_mpi_init``
dlopens ``$OMPI_HOME/lib/libmpi.so``, then ``libmpi.so`` on the default path, then
``/usr/lib64``, ``/usr/lib``, ``/opt/openmpi/lib`` (ext ``src/nbla/cuda/communicator/dl_mpi.cpp``
~25-76), and ``init_cuda`` registers the communicators only when that succeeds (ext
``src/nbla/cuda/init.cpp.tmpl`` ~251-263). ``get_extension_context`` imports
``nnabla_ext.<name>`` (nnabla ``python/src/nnabla/ext_utils.py`` ~20-46), and
``nnabla_ext.cudnn`` imports ``nnabla_ext.cuda``. The real stack is checked as far as it
loads without a GPU by ``tools/research/gpu_stack_check.py`` (stage "train.py's order").
"""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.slowdown import scaled

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CUDA_INIT = '''
import ctypes, os
def _dl_mpi_init():  # ext src/nbla/cuda/communicator/dl_mpi.cpp ~25-76, in its order
    home = os.environ.get("OMPI_HOME")
    paths = ([os.path.join(home, "lib", "libmpi.so")] if home else []) + [
        "libmpi.so", "/usr/lib64/libmpi.so", "/usr/lib/libmpi.so", "/opt/openmpi/lib/libmpi.so"]
    for path in paths:
        try:
            ctypes.CDLL(path)
            return True
        except OSError:
            continue
    print("openmpi library is not found, distribution training feature is disabled.")
    return False
REGISTERED = _dl_mpi_init()  # init.cpp.tmpl ~253: if (!dl_mpi_init() && !dl_nccl_init())
'''
CUDNN_INIT = '''
import nnabla as nn
import nnabla_ext.cuda  # noqa: F401  (as nnabla_ext/cudnn/__init__.py does)
def context(device_id="0", type_config="float", **kw):
    return nn.Context(["cudnn:" + type_config, "cuda:" + type_config, "cpu:float"],
                      "CudaCachedArray", device_id)
'''


@pytest.fixture
def extension(tmp_path):
    """A folder holding the stand-in nnabla_ext.cuda and nnabla_ext.cudnn."""
    for name, text in (("cuda", CUDA_INIT), ("cudnn", CUDNN_INIT)):
        folder = tmp_path / "nnabla_ext" / name
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(text)
    return str(tmp_path)


def run(extension, code):
    env = {k: v for k, v in os.environ.items() if k not in ("OMPI_HOME", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = os.pathsep.join([REPO, extension])
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          timeout=scaled(120), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_train_py_order_registers_the_communicators(extension):
    """train.py, train_bench and the MPI test programs: ``import nnabla_torus`` at the top,
    the CUDA context next, the communicator last. Fails without the import hook: nothing
    set OMPI_HOME before the extension looked for libmpi."""
    out = run(extension, """
        import nnabla_torus as C
        from nnabla.ext_utils import get_extension_context
        ctx = get_extension_context("cudnn", device_id="0")
        import nnabla_ext.cuda
        print("registered", nnabla_ext.cuda.REGISTERED)
    """)
    assert "registered True" in out, out


def test_importing_the_package_is_cheap(extension):
    """The hook imports neither CUDA nor MPI until the extension is imported."""
    out = run(extension, """
        import sys
        import nnabla_torus
        print(sorted(m for m in sys.modules if m.startswith(("mpi4py", "nnabla_ext"))))
    """)
    assert out.strip() == "[]", out


def test_extension_imported_first_gets_a_clear_error(extension):
    """The CUDA context made before ``import nnabla_torus``: nnabla registered nothing, and the
    backend says why and how to fix it (instead of "Any of [cuda:float] could not be found")."""
    out = run(extension, """
        from nnabla.ext_utils import get_extension_context
        ctx = get_extension_context("cudnn", device_id="0")
        import nnabla_ext.cuda
        from nnabla_torus.comm.backends import cuda_env
        print("registered", nnabla_ext.cuda.REGISTERED)
        try:
            cuda_env.check_registered(ctx)
        except cuda_env.ExtensionImportedTooEarly as e:
            print("error:", e)
    """)
    # A libmpi.so on the default library path (e.g. a system Open MPI) lets the extension
    # register with that MPI instead; the error then names the second library.
    system_mpi = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libmpi.so')"],
                                capture_output=True).returncode == 0
    assert f"registered {system_mpi}" in out, out
    assert "import nnabla_torus before making the CUDA context" in out, out


def test_prepare_points_nccl_home_at_the_wheel(tmp_path, monkeypatch):
    """dl_nccl_init tries $NCCL_HOME/lib first, then libnccl.so before libnccl.so.2 (ext
    dl_nccl.cpp.tmpl ~32-75): NCCL_HOME makes the wheel's NCCL win over a system libnccl.so."""
    from nnabla_torus.comm.backends import cuda_env
    lib = tmp_path / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    monkeypatch.setattr(cuda_env, "wheel_roots", lambda: [str(tmp_path / "nvidia")])
    env = {}
    assert cuda_env.prepare_nccl_home(env) == str(tmp_path / "nvidia" / "nccl")
    env = {"NCCL_HOME": "/opt/nccl"}
    assert cuda_env.prepare_nccl_home(env) == "/opt/nccl"  # the user's choice is kept


def test_without_the_extension_nothing_is_prepared(tmp_path):
    """A CPU machine: importing nnabla_ext.cuda fails as before and starts no MPI."""
    out = run(str(tmp_path), """
        import sys
        import nnabla_torus
        try:
            import nnabla_ext.cuda
        except ImportError:
            print("ImportError", "mpi4py.MPI" in sys.modules)
    """)
    assert out.strip() == "ImportError False", out
