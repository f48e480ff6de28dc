"""nnabla-torus-run: an elastic launcher that runs each batch phase on the GPU count it pays.

The planner (:func:`nnabla_torus.planning.planner.plan_resize`, ranked by goodput) gives the
rank count, grid and per-rank batch of the current batch phase; the launcher starts ``mpirun``
with that many ranks. The training script (``train.py --elastic 1``) checkpoints, prints one
request line (``REQUEST_PREFIX`` + JSON) and exits ``EXIT_RESIZE`` (75) when another count
pays; the launcher relaunches on it with ``--resume 1``. ``EXIT_STOPPED`` (76): stopped on the
launcher's Ctrl-C (forwarded as SIGUSR1), checkpoint written; 0 ends the run; any other end is
a failure, restarted from the newest checkpoint on the hosts left or, when it would repeat,
stopped (:mod:`.failures`, :mod:`.membership`). Exit statuses, signals, hostfiles, failures:
docs/elastic.md. Example::

    nnabla-torus-run --slots 4 --ranks-schedule 0:1,1:2,2:4 -- \\
        python examples/imagenet/train.py --batch-schedule 0:32,1:64,2:128

Here: the flags, the profile and the job's start (:func:`run`: the first rank count, the
environment and the mpirun arguments; :func:`run_once`: one mpirun, its process group owned).
The rank counts are decided in :mod:`.rank_decision`, the relaunches in :mod:`.relaunch_loop`;
what the launcher and the script tell each other is in :mod:`.elastic_protocol`.
"""
import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..knobs import add_knob, number
from .hostlists import allocation, read_hostfile
from .mpirun_cmd import (env_args, hostfile_args, mpi_library, mpirun_command, mpirun_path,
                         private_session_base)
from ..planning.machine_profile import (PROFILE_ENV, RUN_KEYS, SHAPE_ENVS, add_profile_knob,
                                        add_shape_knobs, load_profile, local_gpu_name,
                                        resolve_profile, shape_of)
from ..planning.schedules import BatchSchedule
from .elastic_protocol import (ENV_COST, ENV_ELASTIC, ENV_LAUNCH, ENV_RANKS, ENV_SLOTS,
                               REQUEST_PREFIX, parse_request)
from .job_lifetime import end_session, end_with_launcher, leave_terminal
from .launcher_log import log
from .membership import HostPool, discovered_hosts, host_source
from .rank_decision import decide_phase, fit_ranks, launch_sequence, phase_images, restart_cost
from .relaunch_loop import relaunch
# Re-exported: train.py, resize.py, the tools and the tests read these here.
from .elastic_protocol import EXIT_RESIZE, EXIT_STOPPED  # noqa: F401
from .rank_decision import decide  # noqa: F401
from .relaunch_loop import resumed  # noqa: F401

# The job's last lines kept: failures.classify reads them (mpirun's report of a death comes
# after the survivors' lines; a 2,000-rank job's survivors print one line each).
TAIL_LINES = 4000
# The launcher's signals that stop the job resumably (forwarded as SIGUSR1); SIGHUP: the
# terminal or ssh session the launcher ran in was closed.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_once(argv, ranks, mpirun_args, env, watch=None):
    """Run one mpirun; return (status, request dict or None, last output lines, interrupted).
    ``watch``: called with every line of the job's output (a JobWatch).

    The job runs in its own session, whose processes are killed (SIGKILL) when anything goes
    wrong in the launcher while the job runs (a broken pipe on our stdout, an error of
    ours...) and when mpirun ended; mpirun gets SIGTERM when the launcher dies (SIGKILL
    too): the launcher never leaves a job behind (:mod:`.job_lifetime`). SIGINT, SIGTERM and
    SIGHUP (a closed terminal: our terminal output then goes to /dev/null) stop the job
    resumably. Output is decoded as UTF-8 with
    undecodable bytes replaced (U+FFFD); a request line that is not JSON is reported and
    ignored (the script's exit status then stops the launcher).
    """
    cmd = mpirun_command(ranks, argv, mpirun_args)
    log(f"launch: {' '.join(cmd)}")
    with private_session_base(env, mpirun_args) as job_env:
        return run_job(cmd, job_env, watch)


def run_job(cmd, env, watch):
    """``run_once``'s job: run ``cmd``, pass its lines on; (status, request, tail,
    interrupted)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace",
                            start_new_session=True,   # Ctrl-C reaches us only
                            preexec_fn=end_with_launcher())
    interrupts = []

    def on_signal(signum, frame):
        interrupts.append(signum)
        if signum == signal.SIGHUP:
            leave_terminal()
        if len(interrupts) == 1:
            log("stopping: the ranks checkpoint at the end of this step (again to kill)")
            os.kill(proc.pid, signal.SIGUSR1)
        else:
            end_session(proc.pid)

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    tail, request = collections.deque(maxlen=TAIL_LINES), None
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line.rstrip("\n"))
            if watch is not None:
                watch(line)
            if line.startswith(REQUEST_PREFIX):
                request = parse_request(line)
        status = proc.wait()
        left = end_session(proc.pid)
        if left:
            log(f"mpirun ended leaving {len(left)} process(es) of its job running (pid(s) "
                f"{', '.join(map(str, left[:8]))}): killed them")
    except BaseException as e:
        end_job(proc, f"{type(e).__name__}: {e}")
        raise
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return status, request, list(tail), bool(interrupts)

def end_job(proc, why):
    """Kill the job's session (mpirun and its ranks on this host) and say why, on stderr (our
    stdout may be what failed)."""
    end_session(proc.pid)
    proc.wait()
    print(f"nnabla-torus-run: ended the job (mpirun pid {proc.pid} and its session) "
          f"because the launcher failed: {why}", file=sys.stderr, flush=True)


def run(args, prof):
    """Launch, relaunch on requests, stop on anything else; returns the exit status."""
    argv = list(args.command)
    if argv and os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]                              # mpirun_command adds this interpreter
    if args.schedule:
        epoch0, batch0 = BatchSchedule.parse(args.schedule).phases[0]
        first, note = decide_phase(args, prof, batch0, None, phase_images(
            BatchSchedule.parse(args.schedule), epoch0, args.epochs, args.dataset_size), 0.0)
        ranks, fit = fit_ranks(first.gpus, args.total_slots, batch0)
        args.global_batch = batch0
        note = "; ".join(n for n in (note, fit) if n)
    elif args.ranks_schedule:
        ranks, note = fit_ranks(BatchSchedule.parse(args.ranks_schedule).batch(0.0),
                                args.total_slots)
        first = None
    else:
        raise ValueError("give --schedule (the batch schedule to plan the first launch from) "
                         "or --ranks-schedule (fixed rank counts per epoch)")
    log("decision: " + (first.reason if first else
                        f"launch {ranks} ranks: fixed GPU-count schedule (--ranks-schedule)")
        + (f" ({note})" if note else ""))
    env = dict(os.environ, **getattr(args, "job_env", {}),
               **{ENV_ELASTIC: "1", ENV_SLOTS: str(args.total_slots),
                  ENV_COST: str(restart_cost(prof, args.restart_cost)),
                  ENV_LAUNCH: f"{socket.gethostname()}-{os.getpid()}-{time.time():.0f}"})
    if args.ranks_schedule:
        env[ENV_RANKS] = args.ranks_schedule
    library = mpi_library(mpirun_path())
    told = [name for name in (ENV_ELASTIC, ENV_SLOTS, ENV_COST, ENV_RANKS, ENV_LAUNCH,
                              *getattr(args, "job_env", {})) if name in env]
    source = host_source(args)
    pool = HostPool(source, args.exclude_cooldown, good=args.hosts) if source else None
    with tempfile.TemporaryDirectory(prefix="nnabla-torus-run-") as folder:
        def job_args(hosts):
            """mpirun's arguments for a launch on ``hosts`` (None: this machine)."""
            extra = list(args.mpirun_args.split()) if args.mpirun_args else []
            if hosts:
                extra += hostfile_args(library, hosts, folder)
            return extra + env_args(library, env, told)
        return relaunch(args, argv, ranks, job_args, env, run_once, pool)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="nnabla-torus-run", description=__doc__.split("\n")[0],
        epilog="Everything after -- is the training command (python script.py args...).")
    add_knob(parser, "--hostfile", "NNABLA_TORUS_RUN_HOSTFILE", None,
             "hostfile in Open MPI's ('host slots=N') or MPICH's ('host:N') format, a host "
             "repeated per slot allowed; its slots bound the rank count (None: the Slurm or "
             "PBS allocation this runs in, else --slots)")
    add_knob(parser, "--slots", "NNABLA_TORUS_RUN_SLOTS", None,
             "ranks this machine may run when there is no hostfile (None: the allocation's "
             "slots inside a Slurm or PBS job, else CPU cores)",
             type=number(int, low=1))
    # The launcher's defaults describe the digits example on a CPU machine (--model below).
    add_profile_knob(parser, help="cluster profile the planner plans with (shipped name or "
                     "YAML path), passed on to the training command as NNABLA_TORUS_PROFILE")
    add_shape_knobs(parser)
    add_knob(parser, "--model", "NNABLA_TORUS_RUN_MODEL", "resnet18-w0.125-16px",
             "model in the profile (the digits example's network by default)")
    add_knob(parser, "--schedule", "NNABLA_TORUS_RUN_SCHEDULE", None,
             "global-batch schedule 'epoch:batch,...' the first launch (and --dry-run) plans "
             "from; the script's own schedule drives later resizes")
    add_knob(parser, "--local-batch", "NNABLA_TORUS_RUN_LOCAL_BATCH", None,
             "fixed per-rank batch (None: powers of two up to the profile's memory limit)",
             type=number(int, low=1))
    add_knob(parser, "--dataset-size", "NNABLA_TORUS_RUN_DATASET_SIZE", 1438,
             "training images per epoch (1,438: the digits data; ImageNet: 1281167)",
             type=number(int, low=1))
    add_knob(parser, "--epochs", "NNABLA_TORUS_RUN_EPOCHS", 12.0, "epochs of the run",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--restart-cost", ENV_COST, None,
             "seconds one checkpoint-restart costs (None: the profile's run.restart_s: "
             f"measured for cpu-2core, {RUN_KEYS['restart_s']:g} s assumed where a profile has "
             "none)",
             type=number(float, low=0))
    add_knob(parser, "--ranks-schedule", ENV_RANKS, None,
             "fixed rank count per epoch 'epoch:ranks,...' instead of the planner's choice "
             "(the planner's predicted gain is still logged)")
    add_knob(parser, "--max-restarts", "NNABLA_TORUS_RUN_MAX_RESTARTS", 10,
             "relaunches allowed in all (resizes and restarts after a failure) before the "
             "launcher gives up (0: stop on the first failure)", type=number(int, low=0))
    add_knob(parser, "--restarts-per-hour", "NNABLA_TORUS_RUN_RESTARTS_PER_HOUR", 4,
             "restarts after a failure allowed within any hour: a failure that keeps coming "
             "back stops the launcher", type=number(int, low=0))
    add_knob(parser, "--exclude-cooldown", "NNABLA_TORUS_RUN_EXCLUDE_COOLDOWN", 600.0,
             "seconds a host where a rank failed is left out of the launches (0: never left "
             "out); with a host list only", type=number(float, low=0))
    add_knob(parser, "--host-discovery-script", "NNABLA_TORUS_RUN_HOST_DISCOVERY_SCRIPT", None,
             "shell command printing the usable hosts as hostfile lines ('host:N' or 'host "
             "slots=N'), run before every launch, so hosts added later are used at the next "
             "restart (None: --hostfile, else the allocation's nodes Slurm reports up)")
    add_knob(parser, "--mpirun-args", "NNABLA_TORUS_RUN_MPIRUN_ARGS", "",
             "extra mpirun arguments, space-separated")
    add_knob(parser, "--dry-run", "NNABLA_TORUS_RUN_DRY_RUN", False,
             "print the launches the schedule leads to and exit", type=bool, nargs="?",
             const=True)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the training command, after --")
    return parser


def parse_args(argv=None):
    """Parse and validate; sets ``hosts`` ([(host, slots)] of the hostfile, else of the Slurm
    or PBS allocation, else []) and ``total_slots``. Raises ValueError naming the bad value."""
    args = build_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.hostfile and args.slots:
        raise ValueError("give --hostfile or --slots, not both")
    if args.host_discovery_script and (args.hostfile or args.slots):
        raise ValueError("give --host-discovery-script or --hostfile / --slots, not both")
    job = None if args.hostfile or args.slots or args.host_discovery_script else allocation()
    if args.host_discovery_script:
        job = (f"host discovery {args.host_discovery_script!r}",
               discovered_hosts(args.host_discovery_script))
    if args.hostfile or job:
        source, args.hosts = (args.hostfile, read_hostfile(args.hostfile)) if args.hostfile \
            else job
        args.total_slots = sum(s for _, s in args.hosts)
        log(f"{'hostfile ' if args.hostfile else ''}{source}: {len(args.hosts)} host(s) "
            f"({', '.join(f'{h}:{s}' for h, s in args.hosts[:4])}"
            f"{', ...' if len(args.hosts) > 4 else ''}), {args.total_slots} slots")
    else:
        args.hosts = []
        args.total_slots = args.slots or os.cpu_count() or 1
    if not args.dry_run and not args.command:
        raise ValueError("no training command: put it after --, e.g. -- python "
                         "examples/imagenet/train.py")
    if args.dry_run and not args.schedule:
        raise ValueError("--dry-run needs --schedule (the global-batch schedule to plan)")
    return args


def load_launcher_profile(args):
    """The profile the launcher plans with (the one default-profile rule: a GPU job when this
    host has a GPU), reshaped by the shape flags; logs which and why. Sets ``args.job_env``:
    the profile and shape for the training command (the same environment twins)."""
    gpu = local_gpu_name()
    name, why = resolve_profile(args.profile, gpus=bool(gpu), gpu_name=gpu)
    prof = load_profile(name, shape_of(args))
    slots = ("the host list's" if args.hosts else "--slots" if args.slots
             else "this machine's CPU cores")
    log(f"profile {prof.name} ({why}) for the cost model: {prof.hosts} host(s) x "
        f"{prof.network.gpus_per_host} GPUs" + "".join(f"; reshaped: {n}"
                                                        for n in prof.extra["shape"])
        + f"; the launches use at most {args.total_slots} slot(s) ({slots})")
    args.job_env = {PROFILE_ENV: name}
    args.job_env.update({env: str(getattr(args, "shape_" + field))
                         for field, env in SHAPE_ENVS.items()
                         if getattr(args, "shape_" + field) is not None})
    return prof


def main(argv=None):
    try:
        args = parse_args(argv)
        prof = load_launcher_profile(args)
        if args.dry_run:
            for epoch, ranks, d in launch_sequence(args, prof):
                grid = d.plan.grid if d.gpus == ranks else "(planner re-plans)"
                print(f"launch at epoch {epoch:g}: {ranks} ranks, {d.plan.algorithm} on {grid}, "
                      f"{d.plan.local_batch} x {d.plan.accum_steps} per rank, global batch "
                      f"{d.plan.global_batch}")
            return 0
        return run(args, prof)
    except (ValueError, OSError) as e:
        sys.exit(f"nnabla-torus-run: error: {e}")


if __name__ == "__main__":
    sys.exit(main())
