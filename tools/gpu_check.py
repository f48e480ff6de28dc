"""GPU acceptance check (``make gpu-check``): what the CPU test bench cannot prove, in one command.

    make gpu-check              # or: python tools/gpu_check.py [--json gpu_check.json]
    python tools/gpu_check.py --dry-run [--gpus 8]   # print what it would run, run nothing

On a machine with GPUs: installs the ``[gpu]`` extra (nnabla-ext-cuda120 1.39.0 and the CUDA 12
runtime wheels), checks the CUDA driver, CUDA runtime, cuDNN 8, NCCL (>= 2.10.3), Open MPI and
nnabla-ext-cuda it finds (one message per missing piece, with the fix), then on every GPU of
this host (``planned_runs``, printed before they start):

1. the GPU tests, ``pytest -m gpu tests``: the tests marked ``gpu`` (pyproject.toml), which
   ``make test`` on a GPU node runs with the rest and which skip without GPUs: overlap on vs
   off equal, fp16 through nnabla's callback, the noise-scale norms on the device and SyncBN
   against the CPU reference (tests/mpi/test_gpu.py), the communicator's exact sums on every
   grid and algorithm, the NCCL mapping, DALI's batches and labels into device memory;
2. the property suite (``tests/mpi/test_property*.py``, where present) on ``nccl``: its
   real-NCCL cases (``-k "nccl- and not fake"``, ``NNABLA_TORUS_BACKEND=nccl``), in a run and
   verdict of their own; then at every GPU of the node (8 on a DGX): torus2d on each grid
   with two sides > 1 (2x4 and 4x2) and float16 buffers only (gpu_check_cases.py);
   ``examples/imagenet/train.py --context cudnn --algorithm planned`` end to end, 40 steps in
   two launches (validation, checkpoints, a resume) on the embedded digits and on a folder of
   JPEGs through DALI's GPU decoder, each process watched to stay on its own GPU
   (``nvidia-smi``); a rank killed (SIGKILL) during an all-reduce, which must end the job
   naming it within NNABLA_TORUS_TIMEOUT + 10 s; a rank stopped (SIGSTOP) while the ranks
   train through nnabla's all_reduce_callback, which the watchdog must end as fast;
3. ``allreduce_bench``: torus2d on every grid the GPU count allows against NCCL's own
   all-reduce (``native``), device-synchronised times, busbw, exactness, at 1 MiB and at
   ResNet-50's 102,228,128 bytes of float32 gradients;
4. a short ResNet-50 ``train_bench`` (224 px, batch 32 per GPU) with and without overlap, in
   fp32 and fp16;

writes one JSON (``--json``) and a verdict table; exit 1 if a check failed. Without a GPU: a
dry check of the pieces (nothing installed), the list of runs it would make, exit 0. Steps:
docs/gpu.md.
"""
import argparse
import ctypes
import glob
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from nnabla_torus.launching.mpirun_cmd import mpirun_command
from nnabla_torus.comm.topology import factor_pairs
from nnabla_torus.files import atomic_open
from nnabla_torus.knobs import add_knob, number, writable_file
import gpu_check_cases as cases  # noqa: E402  (tools/, beside this file)
from gpu_check_cases import Case, CaseFailed  # noqa: E402

RESNET50_BYTES = 25557032 * 4
# The tests that need GPUs carry the marker `gpu` (pyproject.toml); the property suite runs
# on every backend the environment names, here real NCCL.
PROPERTY_TESTS = "tests/mpi/test_property*.py"
GPU_TESTS = ["-m", "gpu", "tests", f"--ignore-glob={PROPERTY_TESTS}"]   # that suite: its own run
PROPERTY_K = "nccl- and not fake"     # the suite's real-NCCL cases (ids nccl-2, nccl-4)
NCCL_MIN = 21003  # nnabla-ext-cuda 1.39 refuses older NCCL
JPEG_FOLDER = "jpeg-folder"   # the end-to-end case's JPEGs (gpu_check_cases.write_jpeg_folder)


def wheel_library_dirs():
    """Library folders of the nvidia-*-cu12 wheels in this interpreter's site-packages."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec else []
    return sorted(d for root in roots for d in glob.glob(os.path.join(root, "*", "lib")))


def load(name):
    """ctypes handle of shared library ``name`` from the wheels or the system, else None."""
    for path in [os.path.join(d, name) for d in wheel_library_dirs()] + [name]:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def gpu_count():
    """(GPUs the CUDA driver sees, why none)."""
    cuda = load("libcuda.so.1")
    if cuda is None:
        return 0, "no CUDA driver (libcuda.so.1 not found)"
    count = ctypes.c_int(0)
    status = cuda.cuInit(0)
    if status != 0:
        return 0, f"the CUDA driver found no usable GPU (cuInit returned {status})"
    cuda.cuDeviceGetCount(ctypes.byref(count))
    return count.value, "" if count.value else "the CUDA driver sees 0 GPUs"


def check_pieces():
    """[(piece, ok, what was found or the fix)] for everything up to the device."""
    pieces = []
    gpus, why = gpu_count()
    pieces.append(("CUDA driver and GPUs", gpus > 0, f"{gpus} GPU(s)" if gpus else
                   f"{why}: install the NVIDIA driver"))
    for piece, lib, wheel in [("CUDA 12 runtime", "libcudart.so.12", "nvidia-cuda-runtime-cu12"),
                              ("cuBLAS 12", "libcublas.so.12", "nvidia-cublas-cu12"),
                              ("cuDNN 8", "libcudnn.so.8", "nvidia-cudnn-cu12")]:
        found = load(lib) is not None
        pieces.append((piece, found, lib if found else f"{lib} not found: pip install -e "
                                                       f"'.[gpu]' (pinned {wheel}) or a system "
                                                       f"CUDA 12"))
    nccl = load("libnccl.so.2")
    if nccl is None:
        pieces.append(("NCCL >= 2.10.3", False, "libnccl.so.2 not found: pip install -e '.[gpu]' "
                                                "(pinned nvidia-nccl-cu12)"))
    else:
        version = ctypes.c_int(0)
        nccl.ncclGetVersion(ctypes.byref(version))
        v = version.value
        pieces.append(("NCCL >= 2.10.3", v >= NCCL_MIN, f"NCCL {v // 10000}.{v % 10000 // 100}."
                                                        f"{v % 100}"))
    try:
        from nnabla_torus.comm.backends import cuda_env
        home = cuda_env.prepare_ompi_home(dict(os.environ))
        pieces.append(("Open MPI for mpi4py and nnabla", True, f"OMPI_HOME={home} "
                                                              f"({cuda_env.loaded_libmpi()})"))
    except (RuntimeError, ImportError) as e:
        pieces.append(("Open MPI for mpi4py and nnabla", False, str(e)))
    found = importlib.util.find_spec("nnabla_ext") is not None and \
        importlib.util.find_spec("nnabla_ext.cuda") is not None
    pieces.append(("nnabla-ext-cuda120 1.39.0", found, "importable" if found else
                   "not installed: pip install -e '.[gpu]'"))
    if gpus and found:
        pieces.append(registration())
    return gpus, pieces


REGISTRATION = """
import nnabla_torus
from nnabla.ext_utils import get_extension_context
from nnabla_torus.comm.backends import cuda_env
print(cuda_env.create_communicator(get_extension_context("cudnn")).name)
"""


def registration():
    """(piece, ok, found) for nnabla's NCCL communicator, loaded in a child as a training
    script loads it: ``import nnabla_torus`` first, then the cudnn context, no LD_LIBRARY_PATH
    added (nnabla registers the communicator only if it finds libmpi and NCCL when the
    extension is imported: ext src/nbla/cuda/init.cpp.tmpl ~251-263)."""
    done = subprocess.run([sys.executable, "-c", REGISTRATION], env=child_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in (done.stdout + done.stderr).splitlines()
             if ln.strip() and "[nnabla][INFO]" not in ln]
    last = lines[-1].strip() if lines else "no output"
    ok = done.returncode == 0 and last == "MultiProcessDataParallelCommunicatorNccl"
    return ("nnabla's NCCL communicator registers", ok, last if ok else
            f"{last[:300]}; check the Open MPI and NCCL lines above")


def child_env():
    """The environment of the checks' child processes: the user's, with no LD_LIBRARY_PATH
    added for the wheels' CUDA libraries, so that the checks load the stack as a user's script
    does (``import nnabla_torus`` prepares it, nnabla_torus.comm.backends.cuda_env)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["NNABLA_TORUS_BACKEND"] = "nccl"
    return env


def run(argv, env, timeout):
    """Run ``argv``, echoing its output line by line as it comes (the device tests and
    benchmarks take minutes: a silent terminal looks hung); a CompletedProcess with the
    combined output as stdout. Past ``timeout`` seconds the child is killed and the result
    has exit status 124 and a last line saying so (a FAIL verdict, not a traceback). The
    output ends with the time the child ended (``gpu_check_cases.ENDED``)."""
    import threading
    print("+ " + " ".join(argv), flush=True)
    child = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines = []

    def echo():
        for line in child.stdout:
            lines.append(line)
            print(line, end="", flush=True)
    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        code = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        code = 124
        child.wait()
    ended = time.time()
    reader.join(timeout=10)
    if lines and not lines[-1].endswith("\n"):
        lines.append("\n")
    lines.append(f"gpu-check: ended at {ended:.3f} (exit {code})\n")   # read by the cases
    if code == 124:
        lines.append(f"gpu-check: timed out after {timeout} s and killed: {' '.join(argv)}\n")
        print(lines[-1], end="", flush=True)
    return subprocess.CompletedProcess(argv, code, "".join(lines), "")


def records_of(done, prefix):
    for line in done.stdout.splitlines():
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    return []


def planned_runs(gpus, json_path):
    """[Case(check, argv, extra environment, check of the output or None)] that the device
    checks run on ``gpus`` GPUs, in order; the benchmark's records and the end-to-end runs'
    folders go beside ``json_path``."""
    python = sys.executable
    runs = [Case("GPU tests (pytest -m gpu)", [python, "-m", "pytest", "-q", "-rs", *GPU_TESTS],
                 {})]
    properties = sorted(os.path.relpath(p, REPO)
                        for p in glob.glob(os.path.join(REPO, PROPERTY_TESTS)))
    if properties:
        runs.append(Case("property suite on nccl", [python, "-m", "pytest", "-q", "-rs",
                                                    *properties, "-k", PROPERTY_K],
                         {"NNABLA_TORUS_BACKEND": "nccl"}))
    runs += cases.property_cases(gpus)
    work = work_dir(json_path)
    for data_dir in ("", os.path.join(work, JPEG_FOLDER)):
        runs += cases.e2e_cases(gpus, "cudnn", work, data_dir)
    runs.append(cases.fault_case(gpus))
    runs.append(cases.stop_case(gpus))
    grids = [str(g) for g in factor_pairs(gpus)]
    runs.append(Case("allreduce_bench", mpirun_command(gpus, [
        "tools/allreduce_bench.py", "--algorithms", "torus2d,native", "--grids", ",".join(grids),
        "--sizes", f"1M,{RESNET50_BYTES}", "--rounds", "3", "--json", bench_path(json_path)]),
        {}))
    for type_config in ("float", "half"):
        runs.append(Case(f"ResNet-50 train_bench {type_config}", mpirun_command(gpus, [
            "tools/train_bench.py", "--arch", "resnet50", "--width", "1", "--image-size",
            "224", "--batch", "32", "--iters", "10", "--overlap", "both", "--context",
            "cudnn", "--type-config", type_config]), {}))
    return runs


def work_dir(json_path):
    """The end-to-end runs' folder (outputs, checkpoints, the JPEG folder) beside the JSON."""
    return os.path.abspath(os.path.splitext(json_path)[0] + "_work")


def bench_path(json_path):
    return os.path.abspath(os.path.splitext(json_path)[0] + "_allreduce.json")


def print_plan(gpus, json_path):
    """Print the runs of ``planned_runs`` (what a GPU node would run), one per line, and the
    tests ``pytest -m gpu`` selects in this tree (collected, not run)."""
    print(f"gpu-check: on a node with {gpus} GPUs it runs, in this order (children see "
          f"NNABLA_TORUS_BACKEND=nccl and the repository on PYTHONPATH):")
    runs = planned_runs(gpus, json_path)
    images = cases.e2e_train_images(gpus)
    print(f"  (end to end: {images} training images, the JPEG folder's too: {cases.LOCAL_BATCH} "
          f"per rank x {gpus} ranks x {cases.STEPS_PER_EPOCH} steps an epoch; steps "
          f"0-{cases.E2E_STEPS // 2}, then {cases.E2E_STEPS // 2}-{cases.E2E_STEPS} resumed)")
    for check, argv, extra, _ in runs:
        env = "".join(f"{k}={v} " for k, v in extra.items())
        print(f"  {check}: {env}{shlex.join(argv)}")
    if not any(case.name.startswith("property suite on") for case in runs):
        print(f"  (no {PROPERTY_TESTS} in this tree: no property suite to run)")
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *GPU_TESTS],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    tests = [line for line in done.stdout.splitlines() if "::" in line]
    print(f"gpu-check: pytest -m gpu selects {len(tests)} test(s) here (each skips without the "
          f"GPUs it needs):")
    for test in tests:
        print(f"  {test}")


def device_checks(gpus, env, json_path):
    """(results dict, [(check, verdict, detail)]) of the checks on ``gpus`` GPUs."""
    verdicts, results = [], {"train": []}
    bench_json = bench_path(json_path)
    if os.path.exists(bench_json):   # a failed run must not report the last run's records
        os.remove(bench_json)
    runs = planned_runs(gpus, json_path)
    cases.write_jpeg_folder(os.path.join(work_dir(json_path), JPEG_FOLDER),
                            cases.e2e_train_images(gpus))
    for check, argv, extra, case_check in runs:
        with cases.ContextWatch() as contexts:
            done = run(argv, dict(env, **extra), 3600)
        if case_check is not None:
            check, verdict, detail = case_verdict(check, case_check, done, contexts.stray())
            if not contexts.seen:   # a container's PID namespace hides the ranks' PIDs
                detail += "; nvidia-smi listed no process: GPU placement unchecked"
            verdicts.append((check, verdict, detail))
            continue
        if check == "allreduce_bench":
            results["allreduce"] = (json.load(open(bench_json)) if os.path.exists(bench_json)
                                    else [])
            exact = done.returncode == 0 and all(r["correct"] for r in results["allreduce"])
            verdicts.append(("all-reduce results exact (torus2d, NCCL)",
                             "PASS" if exact else "FAIL", f"{len(results['allreduce'])} records"))
            for r in results["allreduce"]:
                if r["bytes"] == RESNET50_BYTES:
                    verdicts.append((f"{r['algorithm']} {r['grid']} at {r['bytes']} B", "INFO",
                                     f"{r['time_us'] / 1e3:.2f} ms, busbw {r['busbw_GBps']:.1f} "
                                     f"GB/s, x{r['ratio_to_native']:.2f} of NCCL's all-reduce"))
        elif check.startswith("ResNet-50 train_bench"):
            type_config = check.split()[-1]
            records = records_of(done, "RECORDS ")
            results["train"] += [dict(r, type_config=type_config) for r in records]
            verdicts.append((check, "PASS" if done.returncode == 0 and records else "FAIL",
                             "; ".join(f"overlap {r['overlap']}: {r['images_per_sec']:.0f} "
                                       f"img/s, all-reduce {r['allreduce_share']:.0%}"
                                       for r in records)))
        else:
            tail = (done.stdout.strip().splitlines() or ["no output"])[-1]
            verdicts.append((check, "PASS" if done.returncode == 0 else "FAIL", tail))
    return results, verdicts


def case_verdict(check, case_check, done, stray):
    """(check, PASS or FAIL, detail) of a gpu_check_cases run; FAIL too when a process of it
    held contexts on more than one GPU (``stray``: pid -> GPUs)."""
    try:
        detail = case_check(done.stdout, done.returncode)
    except CaseFailed as e:
        return check, "FAIL", str(e)
    if stray:
        return check, "FAIL", f"processes on more than one GPU: {stray}"
    return check, "PASS", detail


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_knob(parser, "--json", "NNABLA_TORUS_GPU_CHECK_JSON", "gpu_check.json",
             "write the results here (checked before the checks run)", type=writable_file)
    parser.add_argument("--no-install", action="store_true",
                        help="do not pip install the [gpu] extra first")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the runs a GPU node would make and exit 0 (runs nothing)")
    add_knob(parser, "--gpus", "NNABLA_TORUS_GPU_CHECK_GPUS", 8,
             "GPUs of the node --dry-run (and the no-GPU run) describes", type=number(int, low=1))
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.dry_run:
        print_plan(args.gpus, args.json)
        return 0
    gpus, _ = gpu_count()
    if gpus and not args.no_install:
        command = [sys.executable, "-m", "pip", "install", "-q", "-e", f"{REPO}[gpu]"]
        print("+ " + " ".join(command), flush=True)
        done = subprocess.run(command)
        if done.returncode:
            print(f"gpu-check: installing the [gpu] extra failed (pip exit {done.returncode}, "
                  f"its messages above). Fix the cause (network, disk, index), or install the "
                  f"GPU stack yourself and run: python tools/gpu_check.py --no-install")
            return 1
        importlib.invalidate_caches()   # the nvidia-* wheels are new to this interpreter
    gpus, pieces = check_pieces()
    report = {"host": platform.node(), "gpus": gpus,
              "pieces": [dict(piece=p, ok=ok, found=f) for p, ok, f in pieces]}
    for piece, ok, found in pieces:
        print(f"{'ok' if ok else 'MISSING':>8}  {piece}: {found}")
    missing = [p for p, ok, _ in pieces if not ok]
    if gpus == 0:
        print(f"gpu-check: no GPU here ({pieces[0][2]}); dry check of the pieces above done, "
              f"device checks skipped")
        print_plan(args.gpus, args.json)
        report["verdict"] = "no GPU: dry check only"
    elif missing or gpus < 2:
        print(f"gpu-check: cannot run the device checks: {', '.join(missing) or f'{gpus} GPU'} "
              f"(needs every piece above and 2 or more GPUs)")
        report["verdict"] = "FAIL: missing pieces"
    else:
        results, verdicts = device_checks(gpus, child_env(), args.json)
        report.update(results, verdicts=[dict(check=c, verdict=v, detail=d)
                                         for c, v, d in verdicts])
        report["verdict"] = "FAIL" if any(v == "FAIL" for _, v, _ in verdicts) else "PASS"
        print(f"\n# gpu-check on {gpus} GPUs of {platform.node()} (results: {args.json})")
        for check, verdict, detail in verdicts:
            print(f"{verdict:>5}  {check}: {detail}")
    with atomic_open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    return 1 if report["verdict"].startswith("FAIL") else 0

if __name__ == "__main__":
    sys.exit(main())
