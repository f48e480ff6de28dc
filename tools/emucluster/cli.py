"""Command line of the emulated cluster: ``up``, ``run``, ``link``, ``kill``, ``status``,
``down``, ``exec``.

Run as root from the repository root (every flag has an environment twin, see ``--help``)::

    python -m tools.emucluster up --hosts 2 --rate 1gbit
    python -m tools.emucluster run --ranks-per-host 4 --map by-host -- python prog.py
    python -m tools.emucluster link --host 1 down        # emulate a cut cable
    python -m tools.emucluster kill --host 1             # a lost host: SIGKILL all it runs
    python -m tools.emucluster run --ranks-per-host 2 --launcher nnabla-torus-run -- python \
        examples/imagenet/train.py --checkpoint-every 5  # relaunched on the hosts left
    python -m tools.emucluster down                      # idempotent, cleans leftovers too
    python -m tools.emucluster exec --hosts 2 --ranks-per-host 4 --rate 1gbit -- python prog.py

``exec`` builds, runs and tears down in one go, also on error, Ctrl-C, SIGTERM or SIGHUP.
The exit code is the job's (124 after ``--timeout``, 130 after an interrupt).
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time

from nnabla_torus.files import atomic_open
from nnabla_torus.knobs import add_knob
from . import launch, net, shaping
from .layout import Layout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE_ROOT = "/run/nnabla-torus-emucluster"


def state_dir(prefix):
    return os.path.join(STATE_ROOT, prefix)


def add_name_knobs(parser):
    add_knob(parser, "--prefix", env="NNABLA_TORUS_EMU_PREFIX", default="nntorus",
             help="name prefix of the namespaces: hosts PREFIX-hI (also their hostnames), "
                  "switch PREFIX-sw")


def add_cluster_knobs(parser):
    add_knob(parser, "--hosts", env="NNABLA_TORUS_EMU_HOSTS", default=2, type=int,
             help="number of emulated hosts")
    add_knob(parser, "--subnet", env="NNABLA_TORUS_EMU_SUBNET", default="10.213.0.0/24",
             help="IPv4 subnet the cluster creates and uses exclusively (switch .1, hosts .2...)")
    add_knob(parser, "--rate", env="NNABLA_TORUS_EMU_RATE", default="none",
             help="per-direction rate of each host link, tc syntax (1gbit, 100mbit) or none")
    add_knob(parser, "--burst", env="NNABLA_TORUS_EMU_BURST", default="auto",
             help="token-bucket depth in bytes (64k, 4m); auto = 2 ms of rate, >= 64 KiB")
    add_knob(parser, "--queue-ms", env="NNABLA_TORUS_EMU_QUEUE_MS", default=50.0, type=float,
             help="link queue in milliseconds of rate; beyond it packets are dropped")
    add_knob(parser, "--tcp-retries2", env="NNABLA_TORUS_EMU_TCP_RETRIES2", default=6, type=int,
             help="net.ipv4.tcp_retries2 in every namespace: retransmissions before TCP gives up "
                  "on a cut link (6: ~25 s; 15, Linux's default: ~15 min, during which mpirun "
                  "cannot reach the cut host's daemon and hangs after the ranks have exited)")
    add_knob(parser, "--delay-ms", env="NNABLA_TORUS_EMU_DELAY_MS", default=0.0, type=float,
             help="one-way delay per link direction in ms (needs netem; 0 = off)")
    add_knob(parser, "--loss-pct", env="NNABLA_TORUS_EMU_LOSS_PCT", default=0.0, type=float,
             help="packet loss per link direction in percent (needs netem; 0 = off)")


def add_job_knobs(parser):
    add_knob(parser, "--ranks-per-host", env="NNABLA_TORUS_EMU_RANKS_PER_HOST", default=1,
             type=int, help="MPI ranks on each emulated host (they share memory)")
    add_knob(parser, "--map", env="NNABLA_TORUS_EMU_MAP", default="by-host",
             choices=sorted(launch.MAPPINGS),
             help="rank placement: by-host (consecutive ranks share a host) or round-robin")
    add_knob(parser, "--timeout", env="NNABLA_TORUS_EMU_TIMEOUT", default=0.0, type=float,
             help="kill the job after this many seconds and exit 124 (0 = no limit)")
    add_knob(parser, "--mpirun-args", env="NNABLA_TORUS_EMU_MPIRUN_ARGS", default="",
             help="extra mpirun arguments, shell-quoted (e.g. '--mca btl_tcp_links 2')")
    add_knob(parser, "--launcher", env="NNABLA_TORUS_EMU_LAUNCHER", default="mpirun",
             choices=("mpirun", "nnabla-torus-run"),
             help="mpirun (one job) or nnabla-torus-run (relaunched after a failure on the "
                  "hosts left, e.g. after `kill --host I`)")
    add_knob(parser, "--launcher-args", env="NNABLA_TORUS_EMU_LAUNCHER_ARGS", default="",
             help="nnabla-torus-run's own flags, shell-quoted (default: --ranks-schedule 0:N, "
                  "every slot)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="after --: the program every rank runs")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m tools.emucluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="create the hosts, links and shaping")
    run = sub.add_parser("run", help="run an MPI job on a cluster made by `up`")
    link = sub.add_parser("link", help="set one host's link up or down")
    kill = sub.add_parser("kill", help="kill every process of one host (a lost host)")
    status = sub.add_parser("status", help="show the cluster and its link counters")
    down = sub.add_parser("down", help="delete everything of --prefix (idempotent)")
    one_shot = sub.add_parser("exec", help="up, run, down in one go")
    for p in (up, run, link, kill, status, down, one_shot):
        add_name_knobs(p)
    for p in (up, one_shot):
        add_cluster_knobs(p)
    for p in (run, one_shot):
        add_job_knobs(p)
    for p in (link, kill):
        p.add_argument("--host", type=int, required=True, help="host index (0-based)")
    link.add_argument("state", choices=("up", "down"))
    return parser


def cluster_up(args):
    """Create and shape the cluster described by ``args``; return its Layout."""
    layout = Layout(args.prefix, args.hosts, args.subnet)
    spec = shaping.LinkSpec(args.rate, args.burst, args.queue_ms, args.delay_ms, args.loss_pct)
    net.create(layout, args.tcp_retries2)
    try:
        shaping.shape(layout, spec)
        launch.write_state_files(layout, state_dir(args.prefix))
        with atomic_open(os.path.join(state_dir(args.prefix), "layout.json"), "w") as f:
            json.dump({"prefix": layout.prefix, "hosts": layout.hosts,
                       "subnet": str(layout.subnet), "link": spec.describe()}, f)
    except BaseException:
        cluster_down(args.prefix)
        raise
    netem = shaping.netem_available(layout.switch, layout.switch_port(0))
    print(f"emucluster: {layout.hosts} hosts {', '.join(layout.host_names)} on {layout.subnet} "
          f"via switch {layout.switch}; links: {spec.describe()}; "
          f"netem {'present' if netem else 'absent (no delay/loss)'}", file=sys.stderr)
    return layout


def load_layout(prefix):
    path = os.path.join(state_dir(prefix), "layout.json")
    if not os.path.exists(path):
        raise net.ClusterError(f"no emulated cluster with prefix {prefix!r}: run `up` first")
    with open(path) as f:
        saved = json.load(f)
    return Layout(saved["prefix"], saved["hosts"], saved["subnet"]), saved


def cluster_down(prefix):
    """Delete every namespace, link and state file of ``prefix``; safe to repeat."""
    layout = Layout(prefix, 1, "10.213.0.0/24")  # names only: any host count is matched
    interrupts = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, interrupts)  # a second Ctrl-C must not stop cleanup
    try:
        net.destroy(layout)
        shutil.rmtree(state_dir(prefix), ignore_errors=True)
        if os.path.isdir(STATE_ROOT) and not os.listdir(STATE_ROOT):
            os.rmdir(STATE_ROOT)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupts)
    left = net.leftovers(layout)
    if left:
        raise net.ClusterError(f"could not delete {', '.join(left)}: see `ip netns pids`")


def run_job(layout, args):
    """Run ``args.command`` across ``layout``; kill what it leaves in the hosts; return its code."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ValueError("no command given: put the program after --, e.g. -- python prog.py")
    if args.launcher == "nnabla-torus-run":
        argv = launch.launcher_argv(layout, state_dir(layout.prefix), args.ranks_per_host,
                                    args.map, command, shlex.split(args.mpirun_args),
                                    shlex.split(args.launcher_args))
    else:
        argv = launch.mpirun_argv(layout, state_dir(layout.prefix), args.ranks_per_host,
                                  args.map, command, extra_args=shlex.split(args.mpirun_args))
    env = dict(os.environ)
    # Ranks import the project (nnabla_torus, tools) as they would from a checkout.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    try:
        return launch.run_job(argv, timeout=args.timeout or None, env=env)
    finally:
        for namespace in layout.namespaces:
            net.kill_namespace_processes(namespace)


def raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    args = build_parser().parse_args(argv)
    # Tear down on Ctrl-C and kill, also when started in the background (where the shell
    # ignores SIGINT); keep SIGHUP ignored under nohup.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, raise_interrupt)
    try:
        net.check_privileges()
        return dispatch(args)
    except KeyboardInterrupt:
        print("emucluster: interrupted", file=sys.stderr)
        return 130
    except (net.ClusterError, ValueError) as e:
        print(f"emucluster: error: {e}", file=sys.stderr)
        return 2


def dispatch(args):
    if args.action in ("run", "exec"):
        launch.mpirun_path()              # refuse another MPI library before building hosts
    if args.action == "up":
        cluster_up(args)
    elif args.action == "down":
        cluster_down(args.prefix)
    elif args.action == "run":
        return run_job(load_layout(args.prefix)[0], args)
    elif args.action == "link":
        net.set_link(load_layout(args.prefix)[0], args.host, args.state == "up")
    elif args.action == "kill":
        layout = load_layout(args.prefix)[0]
        if not 0 <= args.host < layout.hosts:
            raise ValueError(f"--host {args.host}: the cluster has hosts 0..{layout.hosts - 1}")
        net.kill_namespace_processes(layout.host_names[args.host], signals=(signal.SIGKILL,))
        print(f"emucluster: killed every process of {layout.host_names[args.host]} at "
              f"{time.time():.3f}", file=sys.stderr)
    elif args.action == "status":
        layout, saved = load_layout(args.prefix)
        print(json.dumps(saved))
        print(shaping.qdisc_report(layout))
    elif args.action == "exec":
        layout = cluster_up(args)
        try:
            return run_job(layout, args)
        finally:
            cluster_down(args.prefix)
    return 0
