"""The runs of ``make gpu-check`` beyond pytest (tools/gpu_check.py): the example end to end,
the property suite at the node's full rank count, and a rank killed during an all-reduce. One
code for both places: real GPUs (``--context cudnn``, ``NNABLA_TORUS_BACKEND=nccl``) and this
machine's fake (``--context cpu``, ``fake-nccl``: tests/examples/test_gpu_e2e.py,
tests/mpi/test_gpu_fault.py), each run as (name, argv, environment, check of its output).

End to end (``e2e_cases``): ``train.py --algorithm planned`` for E2E_STEPS optimizer steps in
two launches, the first to E2E_STEPS / 2 with checkpoints, the second resumed from the last,
each with a validation per epoch; on the embedded digits (DALI over its JPEG cache) and on a
folder of larger JPEGs of varied sizes (``write_jpeg_folder``; on a GPU decoded by nvJPEG,
DALI's "mixed" decoder). Checked: exit 0, the validation and checkpoint lines, the resume, the
overlap trial's legs (when the planner's choice started one: both configurations timed, one
decision; on real GPUs of one host none must start: the planner keeps nnabla's own path,
native with its callback, the most travelled one) and no stray device context
(``ContextWatch`` on GPUs; the fake's device rule here).

Example::

    for case in e2e_cases(8, "cudnn", "/tmp/gpu-check", data_dir=""):
        done = run(case.argv, env, 1800)
        print(case.check(done.stdout, done.returncode))
"""
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import namedtuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:   # run as tools/gpu_check.py: the tree's tests package, for its regexes
    sys.path.insert(0, REPO)
from nnabla_torus.launching.mpirun_cmd import mpirun_command  # noqa: E402
from tests.mpirun import DIED, LOST  # noqa: E402

TRAIN = "examples/imagenet/train.py"
E2E_STEPS = 40            # optimizer steps of the end-to-end case, over both launches
STEPS_PER_EPOCH = 10      # so that each launch validates and checkpoints twice
LOCAL_BATCH = 8
FAULT_TIMEOUT_S = 20      # NNABLA_TORUS_TIMEOUT of the fault case
FAULT_SLACK_S = 10        # the job must end within the timeout plus this, from the kill
KILLED = re.compile(r"^KILL (\d+) ([\d.]+)$", re.M)       # emu_fault.py's victim, at its death
STOPPED = re.compile(r"^STOP (\d+) ([\d.]+)$", re.M)      # stop_in_backward.py's, at its stop
ENDED = re.compile(r"^gpu-check: ended at ([\d.]+)", re.M)  # tools/gpu_check.py's run()

# check(output, exit status) -> detail line, CaseFailed if the run did not do what it should;
# None: tools/gpu_check.py reads the run's output itself
Case = namedtuple("Case", "name argv env check", defaults=(None,))


class CaseFailed(Exception):
    """A run's output does not show what its case asks for (the message says what)."""


def _expect(condition, message):
    if not condition:
        raise CaseFailed(message)


def e2e_train_images(ranks, steps_per_epoch=STEPS_PER_EPOCH):
    """Training images of the end-to-end case on ``ranks`` ranks: ``steps_per_epoch`` global
    batches of LOCAL_BATCH per rank (640 on 8 ranks), so that both launches reach their steps."""
    return steps_per_epoch * LOCAL_BATCH * ranks


def write_jpeg_folder(root, train_images, classes=4, val_per_class=8, seed=0):
    """Write ``root``/train (``train_images`` JPEGs, rounded up to a multiple of ``classes``)
    and ``root``/val of ``classes`` class folders, sides of 40-300 pixels and varied aspect
    (what DALI's decoder and random crop meet in ImageNet, in small); returns ``root``. An
    existing folder is kept when it holds as many training images, else written anew."""
    from PIL import Image
    per_class = -(-train_images // classes)
    if os.path.isdir(os.path.join(root, "val")):
        if jpeg_count(os.path.join(root, "train")) == per_class * classes:
            return root
        shutil.rmtree(root)     # another rank count's folder: too few (or many) images
    shutil.rmtree(root + ".tmp", ignore_errors=True)
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = os.path.join(root + ".tmp", split, f"class{c}")
            os.makedirs(folder, exist_ok=True)
            for k in range(count):
                h, w = rng.integers(40, 300, 2)
                pixels = rng.integers(0, 255, (h, w, 3), np.uint8) // 4 + 48 * c
                Image.fromarray(pixels.astype(np.uint8)).save(
                    os.path.join(folder, f"img{k}.JPEG"), "JPEG", quality=90)
    os.replace(root + ".tmp", root)
    return root


def jpeg_count(folder):
    """JPEG files under ``folder``."""
    return sum(name.endswith(".JPEG") for _, _, names in os.walk(folder) for name in names)


def e2e_cases(ranks, context, workdir, data_dir="", python=None, steps=E2E_STEPS,
              steps_per_epoch=STEPS_PER_EPOCH, extra=()):
    """The two launches of the end-to-end case on ``ranks`` ranks (module doc). The digits
    train the demo's ResNet-18 x0.125, a JPEG folder the ImageNet recipe's ResNet-50 (its 161
    gradients through nnabla's callback); ``steps``, ``steps_per_epoch`` and ``extra``
    train.py flags (e.g. a smaller network) for the fake on a few CPU cores."""
    name = "jpeg folder" if data_dir else "embedded digits"
    out_dir = os.path.join(workdir, "e2e-" + ("jpeg" if data_dir else "digits"))
    common = [TRAIN, "--context", context, "--algorithm", "planned", "--data-dir", data_dir,
              "--output-dir", out_dir,
              "--train-images", str(e2e_train_images(ranks, steps_per_epoch)),
              "--image-size", "32", "--local-batch", str(LOCAL_BATCH), "--batch-schedule",
              f"0:{LOCAL_BATCH * ranks}", "--epochs", str(steps // steps_per_epoch + 1),
              "--warmup-epochs", "0", "--checkpoint-every", str(max(1, steps_per_epoch // 2)),
              "--progress", "0", "--seed", "5", *extra]
    half = steps // 2
    native = context != "cpu"     # one NCCL host: nnabla's own path (module doc)
    first = mpirun_command(ranks, common + ["--max-steps", str(half)], python=python)
    second = mpirun_command(ranks, common + ["--max-steps", str(steps), "--resume", "1"],
                            python=python)
    return [Case(f"train.py end to end, {name}, steps 0-{half}", first, {},
                 lambda out, code: check_train(out, code, half, False, native)),
            Case(f"train.py end to end, {name}, resumed, steps {half}-{steps}", second, {},
                 lambda out, code: check_train(out, code, steps, True, native))]


def check_train(out, code, steps, resumed, native=False):
    """The detail line of a train.py launch that did what the case asks; CaseFailed if not.
    ``native``: the run must have kept nnabla's own path, native with its callback and no
    overlap trial (what the planner chooses on one NCCL host)."""
    tail = "\n".join(out.splitlines()[-15:])
    _expect(code == 0, f"exit {code}: {tail}")
    _expect("fake device rule" not in out, "a graph or array on another GPU (fake device rule)")
    _expect(re.search(r"val top-1 [\d.]+ top-5", out), f"no validation line: {tail}")
    _expect(re.search(r"^  checkpoint: +\S+", out, re.M), f"no checkpoint written: {tail}")
    summary = re.findall(r'^\{"val_top1".*"steps": (\d+)', out, re.M)
    _expect(summary and int(summary[-1]) == steps, f"not {steps} steps: {summary}")
    if resumed:
        _expect(re.search(r"^resumed from \S+: step \d+", out, re.M), "no 'resumed from' line")
    legs = overlap_legs(out)
    _expect(not native or legs == "no overlap trial (planner's algorithm: native)",
            f"one NCCL host left nnabla's own path (native, its callback): {legs}")
    return f"{steps} steps, validated, checkpointed{', resumed' if resumed else ''}; {legs}"


def overlap_legs(out):
    """What the overlap trial did: none (the planner's algorithm overlaps, e.g. native with
    nnabla's callback on one host), or both configurations timed and one decision logged."""
    algorithm = re.findall(r'"in_use": \{[^}]*"algorithm": "(\w+)"', out)
    if "timing both on this run next" not in out:
        return f"no overlap trial (planner's algorithm: {algorithm[-1] if algorithm else '?'})"
    decided = out.count("from the run's measured step times")
    _expect(decided == 1, f"overlap trial started, {decided} decisions logged (1 expected)")
    return "overlap trial: both legs timed, one decision"


def fault_case(ranks, python=None, size="64M"):
    """The last rank SIGKILLs itself inside an all-reduce loop (tests/mpi/progs/emu_fault.py):
    the job must end non-zero naming it within FAULT_TIMEOUT_S + FAULT_SLACK_S of the kill."""
    victim = ranks - 1
    argv = mpirun_command(ranks, ["tests/mpi/progs/emu_fault.py", "--size", size, "--victim",
                                  str(victim), "--kill-at", "3"], python=python)
    return Case(f"kill -9 of rank {victim} during an all-reduce", argv,
                {"NNABLA_TORUS_TIMEOUT": str(FAULT_TIMEOUT_S)},
                lambda out, code: check_fault(out, code, victim))


def check_fault(out, code, victim):
    """The detail of a fault run that ended in time naming ``victim``; CaseFailed if not."""
    _expect(code not in (0, 124), f"exit {code}: the job did not end by itself on the kill")
    killed = KILLED.findall(out)
    _expect(killed and int(killed[0][0]) == victim, f"rank {victim} did not kill itself")
    named = {int(r) for r in DIED.findall(out)} | {
        int(r) for _, lost in LOST.findall(out) for r in lost.split(",") if r.strip()}
    _expect(named == {victim}, f"named rank(s) {sorted(named)}, not [{victim}]")
    seconds = ended_in_time(out, killed[0][1], "kill")
    return f"rank {victim} named, job ended {seconds:.1f} s after the kill"


def ended_in_time(out, start, what):
    """Seconds from ``start`` (unix time of the ``what``) to the run's end stamp; CaseFailed
    past FAULT_TIMEOUT_S + FAULT_SLACK_S."""
    ended = ENDED.findall(out)
    _expect(ended, "no end stamp (run it with tools/gpu_check.py's run)")
    seconds = float(ended[-1]) - float(start)
    _expect(seconds <= FAULT_TIMEOUT_S + FAULT_SLACK_S,
            f"ended {seconds:.1f} s after the {what} (limit {FAULT_TIMEOUT_S + FAULT_SLACK_S} s)")
    return seconds


def stop_case(ranks, context="cudnn", at="check", python=None):
    """The last rank SIGSTOPs itself (a hung rank) while every rank trains through nnabla's
    all_reduce_callback, the default GPU path (tests/mpi/progs/stop_in_backward.py): the
    watchdog must end the job, naming that backward, within FAULT_TIMEOUT_S + FAULT_SLACK_S
    of the stop. ``at``: where the peers then wait (that program's doc)."""
    victim = ranks - 1
    argv = mpirun_command(ranks, ["tests/mpi/progs/stop_in_backward.py", "--victim",
                                  str(victim), "--at", at, "--context", context], python=python)
    return Case(f"SIGSTOP of rank {victim} in backward through nnabla's callback", argv,
                {"NNABLA_TORUS_TIMEOUT": str(FAULT_TIMEOUT_S), "NNABLA_TORUS_ALGORITHM": "native"},
                lambda out, code: check_stop(out, code, victim))


def check_stop(out, code, victim):
    """The detail of a stop run that the watchdog ended in time; CaseFailed if not."""
    _expect(code not in (0, 124), f"exit {code}: the job did not end by itself on the stop")
    stopped = STOPPED.findall(out)
    _expect(stopped and int(stopped[0][0]) == victim, f"rank {victim} did not stop itself")
    _expect("all_reduce_callback did not finish within" in out,
            "no watchdog line naming the backward through nnabla's callback")
    seconds = ended_in_time(out, stopped[0][1], "stop")
    return f"rank {victim} stopped, the watchdog ended the job {seconds:.1f} s later"


def property_cases(ranks, python=None):
    """The property suite (tests/mpi/progs/property_cases.py) on ``ranks`` ranks: torus2d on
    each grid with two sides > 1 (2x4 and 4x2 on 8), and with float16 buffers only."""
    from nnabla_torus.comm.topology import factor_pairs
    prog = ["tests/mpi/progs/property_cases.py", "--sequences", "4", "--calls", "40"]
    grids = [str(g) for g in factor_pairs(ranks) if min(g.x, g.y) > 1]

    def passed(out, code):
        _expect(code == 0 and "PASSED property_cases" in out.splitlines(),
                f"exit {code}: {out.strip().splitlines()[-1:] or 'no output'}")
        return "every result equals numpy's"
    cases = [Case(f"property suite, {ranks} ranks, torus2d {g}", mpirun_command(
        ranks, prog, python=python), {"NNABLA_TORUS_GRID": g}, passed) for g in grids]
    cases.append(Case(f"property suite, {ranks} ranks, float16 buffers", mpirun_command(
        ranks, prog + ["--dtypes", "float16"], python=python), {}, passed))
    return cases


class ContextWatch:
    """While a job runs, the GPUs each process holds a context on (``nvidia-smi
    --query-compute-apps``, polled each ``every`` s); ``stray()`` names the processes on more
    than one GPU (a rank that touched another rank's GPU: a peer copy, a context made there)."""

    def __init__(self, every=1.0):
        self.every, self.seen = every, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self):
        while not self._stop.is_set():
            try:
                apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid",
                                       "--format=csv,noheader"], capture_output=True, text=True,
                                      timeout=30).stdout.splitlines()
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in apps:
                pid, _, uuid = line.partition(", ")
                self.seen.setdefault(pid.strip(), set()).add(uuid.strip())
            self._stop.wait(self.every)

    def stray(self):
        return {pid: sorted(gpus) for pid, gpus in self.seen.items() if len(gpus) > 1}
