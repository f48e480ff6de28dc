"""Time to accuracy of batch-size policies: measured here or on an emulated cluster, ABCI predicted.

One command runs everything (5 policies x 3 seeds of the embedded digits run on 4 ranks, then
the ABCI prediction from the adaptive runs' measured noise scale) and writes a table, a JSON
file and two plots to --out::

    python tools/time_to_accuracy.py                     # ~16 runs of 25-35 s on a quiet 2-core box
    python tools/time_to_accuracy.py measure --seeds 1   # the measurement only, one seed
    python tools/time_to_accuracy.py measure --cluster emu:2x2 --seeds 1 --out runs/tta-emu
    python tools/time_to_accuracy.py abci --noise-run runs/time_to_accuracy/adaptive-goodput-s1
    python tools/time_to_accuracy.py report              # table and plot again from --out
    python tools/time_to_accuracy.py measure -C clusters-mlp --fixed 64,256,1024 --seeds 1
    python tools/time_to_accuracy.py report --pool runs/a,runs/b --out runs/ab   # pooled
    python tools/time_to_accuracy.py optimum --prior runs/x/batch_prior.json   # model's best
    python tools/time_to_accuracy.py efficiency --pool runs/a,runs/b --out runs/ab  # E(B) checked

``measure`` times each policy (``POLICIES``) from launch to the first validation line with
top-1 >= --target, on seeds drawn at random (printed; --seeds to give them). ``-C`` picks the
task (a train.py recipe: digits-cpu, clusters-mlp, shapes-cpu; docs/tasks.md), its target
``expected: target_top1`` of the recipe; ``--fixed`` replaces the digits' fixed policies by
fixed batches spanning the task's range. "adaptive (prior)"
decides on the prior of one earlier run: --prior, else one adaptive run on another random seed
made first (its batch_prior.json); "adaptive (goodput)" runs with --batch-prior none.
``--cluster emu:HxR`` runs them on the emulated cluster (as root) with its profile; ``abci``
predicts ImageNet/ResNet-50 there (tools/abci_prediction.py); ``optimum`` bounds what any
batch schedule could gain over a fixed batch, under the goodput model, on the noise scale and
step times of the --prior run (tools/batch_optimum.py); ``efficiency`` checks the efficiency
model against the fixed runs of --pool (or --out) and writes the fitted factor on B_simple that
train.py's --efficiency-fit takes (tools/efficiency_check.py). The table, the verdict and how
to read them: docs/adaptive-batch.md#time-to-accuracy-the-side-by-side-comparison.
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time

import abci_prediction
import accuracy_report as rep
import batch_optimum
import efficiency_check
from emucluster.profile import emulated_profile
from nnabla_torus.files import atomic_open
from nnabla_torus.knobs import add_knob, short_repr
from nnabla_torus.launching.mpirun_cmd import mpirun_command
from nnabla_torus.planning import efficiency_fit, priors
from nnabla_torus.planning.controller import MIN_SAMPLES
from nnabla_torus.planning.machine_profile import load_profile, save_profile
from nnabla_torus.planning.recipe_files import read_recipe
from nnabla_torus.planning.schedules import BatchSchedule

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TRAIN = os.path.join(ROOT, "examples", "imagenet", "train.py")
POLICIES = {                     # name: train.py flags (the digits recipe otherwise)
    f"{rep.RECIPE} 0:64,1:128": [],
    "fixed 64": ["--batch-schedule", "0:64"],
    "fixed 128": ["--batch-schedule", "0:128"],                     # 32 x 1: where adaptive
    #     runs held (the model: 1.04-1.13x the optimum)
    "fixed 256": ["--batch-schedule", "0:256"],                     # 32 x 2 on 4 ranks
    "fixed 256 (16 x 4)": ["--batch-schedule", "0:256", "--local-batch", "16"],  # the same
    #     batch at B0's micro-batch (emulated 2x2: 1.35x the images/s of 32 x 2 one
    #     night, 0.93x the next)
    rep.ADAPTIVE: ["--adaptive-batch", "1", "--batch-prior", "none"],
    rep.ADAPTIVE_PRIOR: ["--adaptive-batch", "1", "--batch-prior"],   # + the prior's file
}
USED_SEEDS = range(1, 16)   # seeds the rules were chosen on (docs/measurements/adaptive-batch.md)
PRIOR_FILE = "batch_prior.json"  # what an adaptive run writes into its --output-dir
EMU_CLUSTER = re.compile(r"emu:(\d+)x(\d+)")
DEFAULT_TASK = "digits-cpu"      # -C's default
DEFAULT_TARGET = 0.90            # digits-cpu's: a recipe without expected: target_top1


def slug(policy):
    return re.sub(r"[^a-z0-9]+", "-", policy.lower()).strip("-")


class Launcher:
    """How each run starts: mpirun on this machine, or ``python -m tools.emucluster exec``
    on an emulated cluster (--cluster emu:HxR) with its profile written to --out."""

    def __init__(self, args):
        self.args, self.profile, self.emu = args, "", EMU_CLUSTER.fullmatch(args.cluster)
        self.data = read_recipe(args.task)[0].get("dataset", "digits")
        if args.cluster != "local" and not self.emu:
            raise SystemExit(f"time_to_accuracy.py: --cluster {args.cluster!r}: expected "
                             f"local or emu:HOSTSxRANKS_PER_HOST, e.g. emu:2x2")
        self.hosts, self.per_host = (int(g) for g in self.emu.groups()) if self.emu else (1, 0)
        self.ranks = self.hosts * self.per_host if self.emu else args.ranks
        if self.emu:
            prof = emulated_profile(load_profile("cpu-2core"), self.hosts, self.per_host,
                                    args.emu_rate)
            os.makedirs(args.out, exist_ok=True)
            self.profile = os.path.abspath(os.path.join(args.out, f"{prof.name}.yaml"))
            save_profile(prof, self.profile, "written by tools/time_to_accuracy.py --cluster")

    @property
    def where(self):
        """The machine, for titles and tables."""
        if not self.emu:
            return f"{self.data}, {self.ranks} ranks on this machine"
        return (f"{self.data}, emulated {self.hosts} hosts x {self.per_host} ranks, links "
                f"{self.args.emu_rate}")

    def command(self, train_argv):
        """(argv, environment) of one run of train.py with ``train_argv``."""
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if not self.emu:
            return mpirun_command(self.ranks, [TRAIN, *train_argv],
                                  ["-x", "PYTHONPATH"] + self.args.mpirun_args.split()), env
        return [sys.executable, "-m", "tools.emucluster", "exec",
                "--prefix", self.args.emu_prefix, "--hosts", str(self.hosts),
                "--ranks-per-host", str(self.per_host), "--rate", self.args.emu_rate,
                "--timeout", str(self.args.run_timeout),
                "--mpirun-args", self.args.mpirun_args,
                "--", sys.executable, TRAIN, *train_argv, "--profile", self.profile], env


def task_policies(args):
    """{name: train.py flags} of the task: ``POLICIES`` (digits' batches), or with --fixed the
    recipe's own schedule, a fixed policy per batch of --fixed and the adaptive ones."""
    if not args.fixed:
        return POLICIES
    schedule = read_recipe(args.task)[0]["batch_schedule"]
    fixed = {f"fixed {b}": ["--batch-schedule", f"0:{b}"] for b in args.fixed.split(",")}
    adaptive = {p: POLICIES[p] for p in (rep.ADAPTIVE, rep.ADAPTIVE_PRIOR)}
    return {f"{rep.RECIPE} {schedule}": [], **fixed, **adaptive}


def task_target(args):
    """--target, else the task recipe's ``expected: target_top1``, else 0.90 (digits')."""
    expected = read_recipe(args.task)[0].get("expected") or {}
    return args.target or expected.get("target_top1", DEFAULT_TARGET)


def run_policy(policy, seed, launcher, out_dir, prior="", name=None):
    """One training run; returns its record (times from launch, validation curve, summary).
    ``prior``: the prior file of the "adaptive (prior)" policy; ``name``: its folder."""
    args = launcher.args
    run_dir = os.path.abspath(os.path.join(out_dir, name or f"{slug(policy)}-s{seed}"))
    flags = task_policies(args)[policy] + ([prior] if policy == rep.ADAPTIVE_PRIOR else [])
    cmd, env = launcher.command(["-C", args.task, "--seed", str(seed), "--output-dir", run_dir,
                                 "--log-every", "0", *flags, *args.train_args.split()])
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    lines = [(time.monotonic() - start, line) for line in proc.stdout]
    status = proc.wait()
    os.makedirs(run_dir, exist_ok=True)
    with atomic_open(os.path.join(run_dir, "stdout.log")) as f:
        f.writelines(line for _, line in lines)
    if status != 0 or rep.parse_log(lines)[1] is None:
        raise RuntimeError(f"{policy} seed {seed}: train.py exited with status {status}; "
                           f"last lines:\n" + "".join(line for _, line in lines[-15:]))
    return rep.record_of(policy, seed, run_dir, lines, args.target, launcher.profile,
                         launcher.per_host)


def measure(args):
    """Run every (seed, policy), seed-major so that load drifts evenly; then ``report``."""
    from tqdm import tqdm
    launcher = Launcher(args)
    os.makedirs(args.out, exist_ok=True)
    seeds = draw_seeds(args)
    policies = [p for p in task_policies(args)
                if not args.policies or slug(p) in args.policies.split(",")]
    prior = args.prior
    if rep.ADAPTIVE_PRIOR in policies and not prior:
        seed = draw_seeds(args, 1, avoid=seeds)[0]
        print(f"the prior: one adaptive run, seed {seed}, before the others", flush=True)
        r = run_policy(rep.ADAPTIVE, seed, launcher, args.out, name=f"prior-run-s{seed}")
        prior = os.path.join(r["dir"], PRIOR_FILE)
    records = []
    bar = tqdm([(seed, p) for seed in seeds for p in policies], unit="run", dynamic_ncols=True)
    for seed, policy in bar:
        bar.set_description(f"{policy}, seed {seed}")
        r = run_policy(policy, seed, launcher, args.out, prior)
        records.append(r)
        with atomic_open(os.path.join(args.out, "measured.json")) as f:
            json.dump({"where": launcher.where, "target": args.target, "records": records},
                      f, indent=1)                                    # `report` on a partial run
        bar.write(f"{policy:22s} seed {seed}: {rep.fmt(r['time_s'])} s / {r['steps']} steps to "
                  f"{args.target:.0%}, best top-1 {r['best_top1']:.4f}, final "
                  f"{r['final_top1']:.4f}, {r['images_per_s']:.0f} images/s, batches "
                  f"{r['batch_schedule']}, run {r['wall_s']:.0f} s")
    return report(records, args, launcher.where)


def draw_seeds(args, count=None, avoid=()):
    """--seeds as given, else ``count`` (--seed-count) seeds drawn at random outside
    USED_SEEDS and ``avoid``; printed, so that a run can be repeated."""
    if args.seeds and count is None:
        return [int(s) for s in args.seeds.split(",")]
    pool = sorted(set(range(16, 100000)) - set(avoid))
    seeds = random.SystemRandom().sample(pool, count or args.seed_count)
    print(f"seeds drawn at random: {','.join(map(str, seeds))} (repeat with --seeds)", flush=True)
    return seeds


def measurement_folders(args):
    """The folders whose measured.json ``report`` and ``efficiency`` read: --pool's, else
    --out. A pool written into one of its own folders is refused: that folder's table, verdict
    and fit would then describe the pool, not its measurement."""
    if not args.pool:
        return [args.out]
    folders = args.pool.split(",")
    if len(folders) > 1 and os.path.realpath(args.out) in map(os.path.realpath, folders):
        raise SystemExit(f"time_to_accuracy.py {args.command}: --out {args.out} is one of "
                         f"--pool's folders; give the pool a folder of its own, e.g. --out "
                         f"{args.out.rstrip('/')}-pooled")
    return folders


def read_measurements(folders, asked=0.0, command="report"):
    """(records, where, target) of the measured.json in each of ``folders``, pooled. Their
    times were taken at the target each was measured to: all must share one, which is the
    target (a measurement that recorded none: ``asked``, else DEFAULT_TARGET). ``asked``: the
    target the user asked for (--target, or an explicit -C's recipe; 0: none); another one is
    refused, not relabelled. ``command``: report or efficiency, for the error lines."""
    records, places, targets = [], [], {}
    for folder in folders:
        path = os.path.join(folder, "measured.json")
        try:
            with open(path) as f:
                saved = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"time_to_accuracy.py {command}: cannot read {path} ({e}); give "
                             f"folders a `measure` wrote")
        problem = measurement_problem(saved)
        if problem:
            raise SystemExit(f"time_to_accuracy.py {command}: {path} {problem}: it is not what "
                             f"`measure` writes; measure again or move the file out")
        measured = saved.get("target", asked or DEFAULT_TARGET)
        if asked and measured != asked:
            raise SystemExit(f"time_to_accuracy.py {command}: {path} was measured to "
                             f"{measured:.0%}, not {asked:.0%}: give its task (-C) or "
                             f"--target {measured:g}, or neither")
        targets.setdefault(measured, path)
        records += saved["records"]
        places.append(saved.get("where", ""))
    if len(targets) > 1:
        raise SystemExit(f"time_to_accuracy.py {command}: the measurements were taken to "
                         "different targets ("
                         + ", ".join(f"{t:.0%} in {p}" for t, p in targets.items())
                         + "): pool measurements of one target")
    where = "; ".join(dict.fromkeys(places))
    return records, (where if len(folders) == 1 else
                     f"{where} (pooled: {', '.join(folders)})"), next(iter(targets))


def measurement_problem(saved):
    """What is wrong with a measured.json's content ``saved``, in a few words; None if
    nothing: an object whose target is a fraction in (0, 1] and whose records are a list of
    accuracy_report records (rep.record_problem)."""
    if not isinstance(saved, dict):
        return f"holds a JSON {type(saved).__name__}, not an object"
    target = saved.get("target", DEFAULT_TARGET)
    if isinstance(target, bool) or not isinstance(target, rep.NUMBER) or not 0 < target <= 1:
        return f"has target = {short_repr(target)}, not a top-1 in (0, 1]"
    if not isinstance(saved.get("records"), list):
        return f"has records = {short_repr(saved.get('records'))}, not a list of runs"
    for i, record in enumerate(saved["records"]):
        problem = rep.record_problem(record)
        if problem:
            return f"record {i} {problem}"
    return None


def report(records, args, where):
    """Write the table, verdict, JSON and plot of ``records`` (measured.md, report.json,
    batch_over_epochs.png; never the measurements' measured.json); returns them."""
    for r in records:
        r["predicted_s"] = rep.predicted_seconds(r)
    before = [rep.before_record(args.before, args.target)] if args.before else []
    stats, verdict = rep.summarise(records, args.target)
    seeds = ",".join(str(s) for s in sorted({r["seed"] for r in records}))
    text = (f"{where}\n" + rep.table(stats, args.target, seeds) + "\n\n" + "\n".join(verdict))
    os.makedirs(args.out, exist_ok=True)
    rep.plot_batches(records + before, os.path.join(args.out, "batch_over_epochs.png"), where)
    if before:
        b = before[0]
        text += (f"\n\nbefore ({args.before}): batches {b['batch_schedule']}, {b['steps']} steps / "
                 f"epoch {rep.fmt(b['epoch'], 0)} to {args.target:.0%}, best top-1 "
                 f"{b['best_top1']:.4f}, final {b['final_top1']:.4f}")
    try:
        rows, fit, scale = efficiency_check.check(records)
        text += ("\n\nthe efficiency model at each fixed batch (`efficiency` writes its fit):\n"
                 + efficiency_check.table(rows, args.target, fit, scale))
    except ValueError:
        pass                       # fewer than two fixed batches reached the target: no check
    with atomic_open(os.path.join(args.out, "measured.md")) as f:
        f.write(text + "\n")
    with atomic_open(os.path.join(args.out, "report.json")) as f:
        json.dump({"where": where, "target": args.target, "records": records, "stats": stats,
                   "verdict": verdict}, f, indent=1)
    print(text)
    print(f"wrote {args.out}/measured.md, report.json, batch_over_epochs.png")
    return records


def add_measure_knobs(m):
    knob = "NNABLA_TORUS_TTA_"
    add_knob(m, "--cluster", knob + "CLUSTER", "local", "where the runs train: local (mpirun "
             "on this machine) or emu:HxR (H emulated hosts of R ranks; needs root)")
    add_knob(m, "--emu-rate", knob + "EMU_RATE", "20mbit", "per-direction rate of each emulated "
             "host link, tc syntax (20mbit: the digits all-reduce outlasts its compute)")
    add_knob(m, "--emu-prefix", knob + "EMU_PREFIX", "tta", "name prefix of the emulated "
             "cluster's namespaces (one comparison at a time per prefix)")
    add_knob(m, "--run-timeout", knob + "RUN_TIMEOUT", 900.0, "seconds before an emulated "
             "run is killed", type=float)
    add_knob(m, "--ranks", knob + "RANKS", 4, "MPI ranks with --cluster local", type=int)
    add_knob(m, "--seeds", knob + "SEEDS", "", "comma-separated seeds (empty: --seed-count "
             "seeds drawn at random above 15, printed)")
    add_knob(m, "--seed-count", knob + "SEED_COUNT", 3, "seeds to draw when --seeds is empty",
             type=int)
    add_knob(m, "--prior", knob + "PRIOR", "", "the batch prior of the adaptive (prior) policy "
             "(a batch_prior.json; empty: one adaptive run on another random seed first)")
    add_knob(m, "--target", knob + "TARGET", 0.0, "validation top-1 to reach (0: the task "
             f"recipe's expected: target_top1, else {DEFAULT_TARGET}; report and efficiency: "
             "the one the measurements were taken to)", type=float)
    add_knob(m, "--fixed", knob + "FIXED", "", "comma-separated global batches, each a fixed "
             "policy, with the recipe's schedule and the adaptive ones (empty: the digits "
             "policies above)")
    add_knob(m, "--policies", knob + "POLICIES", "", "comma-separated subset of "
             + ", ".join(slug(p) for p in POLICIES) + " (empty: all)")
    add_knob(m, "--before", knob + "BEFORE", "", "output folder of an earlier adaptive run "
             "(with its stdout in stdout.log) to draw beside the others")
    add_knob(m, "--train-args", knob + "TRAIN_ARGS", "", "extra train.py flags, space-separated "
             "(e.g. '--epochs 2' for a short check)")
    add_knob(m, "--mpirun-args", knob + "MPIRUN_ARGS", "", "extra mpirun flags, space-separated")


def add_abci_knobs(a):
    knob = "NNABLA_TORUS_TTA_"
    add_knob(a, "--noise-run", knob + "NOISE_RUN", "", "an adaptive run's output folder "
             "(empty with all: the first seed's), or published: the published ResNet-50 prior "
             "(nnabla_torus/planning/published.py; the factors then multiply it)")
    add_knob(a, "--noise-scale-factor", knob + "NOISE_SCALE_FACTOR", 34816 / 64,
             "ImageNet noise scale / the run's (34,816/64: the recipes' starting batches; "
             "*assumed*)", type=float)
    add_knob(a, "--skip-samples", knob + "SKIP_SAMPLES", MIN_SAMPLES, "noise-scale estimates "
             "left out at the start, as the confidence rule does (train.py's "
             "--adaptive-min-samples)",
             type=int)
    add_knob(a, "--profile", knob + "PROFILE", "abci", "cluster profile of the prediction")
    a.add_argument("--restart-cost", type=float, default=None,
                   help="seconds per GPU-count change (default: nnabla_torus.launching."
                        "elastic's for the profile)")


def optimum(args, fractions=(0.5, 0.75)):
    """Print the model's times of fixed batches and of the pointwise best schedule on the
    --prior run (its noise scale and step times) and the digits recipe (B0, epochs, per-rank
    batch)."""
    if not args.prior:
        sys.exit("time_to_accuracy.py optimum: give --prior (an adaptive run's batch_prior.json)")
    key, prior = read_prior(args.prior)
    recipe, _ = read_recipe(args.task)
    base = BatchSchedule.parse(recipe["batch_schedule"]).batch(0)
    images = recipe["epochs"] * key["data"]["images"]
    times = batch_optimum.schedule_times(prior, base, images, recipe["local_batch"], fractions)
    print(f"the model's time to B0-progress on {args.prior} ({key['machine']}; "
          f"B0 = {base}, {images:,} images in the run):")
    print("\n".join(batch_optimum.describe(times, fractions)))
    return 0


def read_prior(path):
    """(key, prior spec) of the batch_prior.json at ``path`` (priors.read_file's checks, and
    the key's training images and machine, and step times, which ``optimum`` needs);
    SystemExit, one line, when it lacks any."""
    def refuse(why):
        raise SystemExit(f"time_to_accuracy.py optimum: --prior {path} {why}; give the "
                         f"batch_prior.json of an adaptive run (its --output-dir)")
    try:
        with open(path) as f:
            key = json.load(f)["key"]
        images, machine = key["data"]["images"], key["machine"]
    except OSError as e:
        refuse(f"cannot be read ({e.strerror or e})")
    except ValueError as e:
        refuse(f"is not JSON ({e})")
    except (KeyError, TypeError):
        refuse("has no key with data.images and machine")
    if isinstance(images, bool) or not isinstance(images, int) or images < 1 or \
            not isinstance(machine, str):
        refuse(f"has images {short_repr(images)} and machine {short_repr(machine)}, not a count "
               f">= 1 and a name")
    prior, line = priors.read_file(path, key)
    if prior is None:        # priors' line: "batch prior: <why>; measuring from B0"
        refuse("is not usable: " + line[len("batch prior: "):].rsplit("; measuring", 1)[0])
    if prior["step_times"] is None:
        refuse("has no step times (a run that never refitted them)")
    return key, prior


def efficiency(records, args, where):
    """Print and write (efficiency.md, efficiency_fit.json) the efficiency model checked at
    each fixed batch of ``records``."""
    rows, fit, scale = efficiency_check.check(records)
    text = f"{where}\n" + efficiency_check.table(rows, args.target, fit, scale)
    os.makedirs(args.out, exist_ok=True)
    with atomic_open(os.path.join(args.out, "efficiency.md")) as f:
        f.write(text + "\n")
    print(text)
    task = fitted_task(records)
    if scale and math.isfinite(scale.rse) and task:
        efficiency_fit.save(scale._replace(task=task),
                            os.path.join(args.out, "efficiency_fit.json"))
        print(f"wrote {args.out}/efficiency_fit.json (train.py --efficiency-fit) for "
              f"{efficiency_fit.describe_task(task)}")
    elif scale and math.isfinite(scale.rse):
        print(f"efficiency_fit.json not written: no adaptive run left its {PRIOR_FILE}, which "
              f"names the model and data the fit is for")
    else:
        print("efficiency_fit.json not written: the factor's error is unknown (it needs fixed "
              "runs at two or more batches, three or more runs, and two or more adaptive runs "
              "for B_simple)")
    return 0


def fitted_task(records):
    """The task ``records`` trained (efficiency_fit.task_of: model and data), as the
    adaptive runs' batch_prior.json name it; None when none left one. Runs of different
    tasks are refused: a fit of their pool would describe neither."""
    tasks = {}
    for r in (r for r in records if r["policy"] in rep.ADAPTIVES):
        path = os.path.join(r["dir"], PRIOR_FILE)
        try:
            with open(path) as f:
                task = efficiency_fit.task_of(json.load(f)["key"])
        except (OSError, ValueError, KeyError, TypeError):
            continue                          # a run that left no prior: others may name it
        tasks.setdefault(json.dumps(task, sort_keys=True), (task, path))
    if not tasks:
        return None
    (task, path), *others = tasks.values()
    sizes = (task["model"].get("parameters"), task["data"].get("images"))
    unlike = [f"{efficiency_fit.describe_task(t)} in {p}" for t, p in others] + [
        f"{r['params']:,} parameters on {r['dataset']:,} images in {r['dir']}" for r in records
        if None not in (r.get("params"), r.get("dataset"))
        and (r["params"], r["dataset"]) != sizes]
    if unlike:
        raise SystemExit(f"time_to_accuracy.py efficiency: the runs trained different tasks "
                         f"({efficiency_fit.describe_task(task)} in {path}; {unlike[0]}): "
                         f"pool measurements of one task")
    return task


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("command", nargs="?", default="all",
                        choices=("all", "measure", "abci", "report", "optimum",
                                 "efficiency"),
                        help="all (default): measure, then abci from the first adaptive run; "
                             "report: table and plot again from --out's measured.json "
                             "(never rewritten); "
                             "optimum: the model's best schedule on --prior's run; "
                             "efficiency: E(B) predicted against measured at each fixed batch")
    add_knob(parser, "--out", "NNABLA_TORUS_TTA_OUT", "runs/time_to_accuracy",
             "folder for the runs, tables and plots")
    add_knob(parser, "--task", "NNABLA_TORUS_TTA_TASK", DEFAULT_TASK, "the task: a train.py "
             "recipe (digits-cpu, clusters-mlp, shapes-cpu: docs/tasks.md) or a YAML path; "
             "report and efficiency take the target their measurements were taken to",
             short="-C")
    add_knob(parser, "--pool", "NNABLA_TORUS_TTA_POOL", "", "report: comma-separated folders "
             "of earlier measurements, pooled into one table and verdict written to --out, "
             "a folder outside the pool (each seed paired with the fixed batch of its own "
             "folder; empty: --out's own)")
    add_measure_knobs(parser.add_argument_group("measure"))
    add_abci_knobs(parser.add_argument_group("abci"))
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command in ("report", "efficiency"):
        asked = args.target or (task_target(args) if args.task != DEFAULT_TASK else 0.0)
        records, where, args.target = read_measurements(measurement_folders(args), asked,
                                                        args.command)
        try:
            if args.command == "efficiency":
                return efficiency(records, args, where)
            report(records, args, where)
        except ValueError as e:          # a run folder's series, --before, too few batches
            raise SystemExit(f"time_to_accuracy.py {args.command}: {e}") from None
        return 0
    args.target = task_target(args)
    if args.command == "optimum":
        return optimum(args)
    if args.command in ("all", "measure"):
        records = measure(args)
        adaptive = [r for r in records if r["policy"] == rep.ADAPTIVE]
        if not args.noise_run and adaptive:
            args.noise_run = adaptive[0]["dir"]
    if args.command in ("all", "abci"):
        if not args.noise_run:
            sys.exit("time_to_accuracy.py abci: give --noise-run (an --adaptive-batch 1 run's "
                     "output folder)")
        abci_prediction.abci(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
