"""Run nnabla's own communicator tests (v1.39.0 ``python/test/communicator/``) against the
nnabla_torus communicator on CPU, under mpirun, and print each rank's pytest counts.

    python tools/research/nnabla_suite.py --nnabla-src ~/src/nnabla -np 2 3 4

``--nnabla-src`` is a checkout of https://github.com/sony/nnabla at tag v1.39.0 (nnabla's
tests are not in its wheel, and this repository does not copy them). The tests run unchanged;
only their fixture ``comm_nccl_opts`` is ours (tools/research/nnabla_suite_fixture/conftest.py: our
communicator on a CPU context instead of nnabla's on CUDA), in a temporary folder of links to
nnabla's files. Each rank runs the whole suite, as nnabla's ``mpiexec -n 2 pytest`` does; a
test that hangs is ended by the communicator's timeout. Results: docs/dropin.md.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from nnabla_torus.launching.mpirun_cmd import mpirun_command  # noqa: E402

SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|skipped)[^=]*?) in [\d.]+s")


def suite_folder(nnabla_src, folder):
    """``folder`` with links to nnabla's test helpers and communicator tests, and our conftest."""
    test = os.path.join(nnabla_src, "python", "test")
    comm_tests = os.path.join(test, "communicator")
    if not os.path.isfile(os.path.join(comm_tests, "test_all_reduce.py")):
        raise SystemExit(f"{comm_tests}/test_all_reduce.py not found: --nnabla-src must be a "
                         f"checkout of sony/nnabla (git clone -b v1.39.0 "
                         f"https://github.com/sony/nnabla)")
    for name in ("conftest.py", "nbla_test_utils.py"):   # autouse scope, function_tester
        os.symlink(os.path.join(test, name), os.path.join(folder, name))
    inner = os.path.join(folder, "communicator")
    os.mkdir(inner)
    for name in sorted(os.listdir(comm_tests)):
        if name.startswith("test_") and name.endswith(".py"):
            os.symlink(os.path.join(comm_tests, name), os.path.join(inner, name))
    os.symlink(os.path.join(HERE, "nnabla_suite_fixture", "conftest.py"),
               os.path.join(inner, "conftest.py"))
    return inner


def run(nnabla_src, ranks, timeout, pytest_args=()):
    """{rank: pytest's summary line} of one mpirun of the suite on ``ranks`` ranks."""
    with tempfile.TemporaryDirectory(prefix="nnabla_suite_") as folder:
        inner = suite_folder(os.path.abspath(nnabla_src), folder)
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   NNABLA_TORUS_TIMEOUT=os.environ.get("NNABLA_TORUS_TIMEOUT", "60"),
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = mpirun_command(ranks, ["-m", "pytest", inner, "-q", "-p", "no:cacheprovider",
                                     "--test-communicator", "-o", "addopts=", "--color=no",
                                     *pytest_args])
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout)
    out = done.stdout + done.stderr
    lines = [m.group(1) for m in map(SUMMARY.match, out.splitlines()) if m]
    return out, lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nnabla-src", default=os.environ.get("NNABLA_SRC"),
                        help="checkout of sony/nnabla v1.39.0; env NNABLA_SRC (default: none)")
    parser.add_argument("-np", type=int, nargs="+", default=[2],
                        help="rank counts, one mpirun each (default: 2)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds one mpirun may take (default: 1800)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print pytest's whole output (default: the summaries)")
    args, pytest_args = parser.parse_known_args()
    if not args.nnabla_src:
        parser.error("--nnabla-src (or NNABLA_SRC) is required")
    for ranks in args.np:
        out, lines = run(args.nnabla_src, ranks, args.timeout, pytest_args)
        if args.verbose:
            print(out)
        print(f"{ranks} ranks: " + ("; ".join(lines) if lines else "no pytest summary:\n" + out),
              flush=True)


if __name__ == "__main__":
    main()
