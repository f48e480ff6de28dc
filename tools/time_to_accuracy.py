"""Time to accuracy of batch-size policies: measured on this machine, predicted on ABCI.

One command runs everything (4 policies x 3 seeds of the embedded digits run on 4 ranks, then
the ABCI prediction from the adaptive runs' measured noise scale) and writes a table, a JSON
file and two plots to --out::

    python tools/time_to_accuracy.py                     # ~12 runs of 15-25 s on a quiet 2-core box
    python tools/time_to_accuracy.py measure --seeds 1   # the measurement only, one seed
    python tools/time_to_accuracy.py abci --noise-run runs/time_to_accuracy/adaptive-goodput-s1
    python tools/time_to_accuracy.py report              # table and plot again from --out

``measure``: for each seed and policy, ``mpirun -np RANKS python examples/imagenet/train.py``
(no dataset flag: the digits recipe, 12 epochs) with the policy's flags; the time to the target
is taken from launch to the arrival of the first validation line with top-1 >= --target (so it
includes start-up, the same for every policy), with the optimizer steps taken by then. The
policies (``POLICIES``): the recipe's 0:64,1:128 schedule, fixed 64, fixed 256, and
``--adaptive-batch 1`` (goodput, nnabla_torus/planning/goodput.py). Reported: per policy the median
over seeds and the spread (min-max) of the time and steps to the target, the best and final
top-1; a verdict (adaptive no slower than the best other policy within its seeds' spread, and
in its final-accuracy band); ``batch_over_epochs.png`` (global batch and noise scale against
epochs, every run).

``abci``: ImageNet/ResNet-50 on the abci profile by prediction. Time from the cost model
(planner); progress from the statistical efficiency E(B) = (phi + B0)/(phi + B) with the
noise scale phi over training taken from a real run (an adaptive run's
``noise_scale.series.txt``, as a function of the fraction of training done) times
--noise-scale-factor (default 34,816 / 64: the ratio of the two recipes' starting batches,
*assumed*: no ImageNet noise scale was measured here; the table also shows a quarter and four
times it). Sony's 34K -> 68K schedule (1,088 then 2,176 GPUs at 32 images each, 90 epochs,
*assumed*) sets the progress to reach; the goodput policy (at most 2,176 GPUs, batches from
34,816) reaches the same progress choosing GPUs, grid and batch at each point by goodput, with
the planner's hysteresis (a change only when the gain exceeds the model error) and a restart
cost per GPU-count change (nnabla_torus.launching.elastic.restart_cost).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples", "imagenet"))

from nnabla_torus.launching import elastic
from nnabla_torus.planning import goodput, planner# noqa: E402
from nnabla_torus.launching.mpirun_cmd import mpirun_command  # noqa: E402
from nnabla_torus.planning.machine_profile import load_profile  # noqa: E402
from nnabla_torus.planning.controller import split_batch  # noqa: E402
from nnabla_torus.planning.schedules import BatchSchedule  # noqa: E402

TRAIN = os.path.join(ROOT, "examples", "imagenet", "train.py")
POLICIES = {                     # name: train.py flags (the digits recipe otherwise)
    "recipe 0:64,1:128": [],
    "fixed 64": ["--batch-schedule", "0:64"],
    "fixed 256": ["--batch-schedule", "0:256"],
    "adaptive (goodput)": ["--adaptive-batch", "1"],
}
ADAPTIVE = "adaptive (goodput)"
BEFORE = "adaptive before (--before run)"
VAL_LINE = re.compile(r"^epoch (\S+) step (\d+): .*val top-1 (\S+)")
SIZES = re.compile(r"(\d+) training / \d+ validation images")
PARAMS = re.compile(r": ([\d,]+) parameters, ")
SONY_SCHEDULE, SONY_LOCAL, SONY_EPOCHS = "0:34816,5:69632", 32, 90.0
IMAGENET = planner.IMAGENET_TRAIN_IMAGES


def slug(policy):
    return re.sub(r"[^a-z0-9]+", "-", policy.lower()).strip("-")


# ----------------------------------------------------------------------------------------------
# measure

def parse_log(lines):
    """(validation lines [(seconds, epoch, step, top1)], summary dict, training images,
    parameters) of train.py's stdout, ``lines`` as (seconds since launch, text)."""
    vals, summary, dataset, params = [], None, None, None
    for now, line in lines:
        match = VAL_LINE.match(line)
        if match and match.group(3) != "None":
            vals.append((now, float(match.group(1)), int(match.group(2)), float(match.group(3))))
        elif line.startswith('{"val_top1"'):
            summary = json.loads(line)
        elif dataset is None and SIZES.search(line):
            dataset = int(SIZES.search(line).group(1))
            params = int(PARAMS.search(line).group(1).replace(",", ""))
    return vals, summary, dataset, params


def record_of(policy, seed, run_dir, lines, target):
    """The run's record: time and steps to ``target``, accuracies, batches."""
    vals, summary, dataset, params = parse_log(lines)
    hit = next((v for v in vals if v[3] >= target), None)
    return {"policy": policy, "seed": seed, "dir": run_dir, "dataset": dataset, "params": params,
            "time_s": hit[0] if hit else None, "steps": hit[2] if hit else None,
            "epoch": hit[1] if hit else None, "best_top1": max(v[3] for v in vals),
            "final_top1": summary["val_top1"], "wall_s": lines[-1][0] if lines else None,
            "total_steps": summary["steps"], "batch_schedule": summary["batch_schedule"],
            "val": vals}


def run_policy(policy, seed, args, out_dir):
    """One training run; returns its record (times from launch, validation curve, summary)."""
    run_dir = os.path.join(out_dir, f"{slug(policy)}-s{seed}")
    argv = [TRAIN, "--seed", str(seed), "--output-dir", run_dir, "--log-every", "0",
            *POLICIES[policy], *args.train_args.split()]
    cmd = mpirun_command(args.ranks, argv, ["-x", "PYTHONPATH"] + args.mpirun_args.split())
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    lines = [(time.monotonic() - start, line) for line in proc.stdout]
    status = proc.wait()
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "stdout.log"), "w") as f:
        f.writelines(line for _, line in lines)
    if status != 0 or parse_log(lines)[1] is None:
        raise RuntimeError(f"{policy} seed {seed}: train.py exited with status {status}; "
                           f"last lines:\n" + "".join(line for _, line in lines[-15:]))
    return record_of(policy, seed, run_dir, lines, args.target)


def before_record(run_dir, target):
    """The record of an earlier adaptive run (``--before``: its output folder with its
    stdout in stdout.log; no arrival times, so only its batches and accuracy count)."""
    with open(os.path.join(run_dir, "stdout.log"), errors="replace") as f:
        lines = [(0.0, line) for line in f]
    return record_of(BEFORE, 0, run_dir, lines, target)


def predicted_seconds(record, ranks):
    """Seconds the run's steps up to the target take by the cost model of the profile the run
    planned with (load-free, start-up and validation excluded): train.py's own TrainingPlanner."""
    from config import parse_config
    from planning import TrainingPlanner
    if record["steps"] is None:
        return None
    cfg = parse_config(["--seed", str(record["seed"])])
    run = TrainingPlanner.from_config(cfg, record["params"], ranks, record["dataset"], True, ranks)
    batch = read_series(record["dir"], "global_batch")
    batch = batch[batch[:, 0] <= record["steps"], 1].astype(int)
    local, accum = np.array([split_batch(b, ranks, cfg.local_batch) for b in batch]).T
    return float(np.sum(batch / run.throughput(local, accum)))


def spread(values):
    """(median, min, max) of the values that exist; (None,) * 3 when none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def summarise(records, target):
    """{policy: stats} and the verdict lines."""
    stats = {}
    for policy in POLICIES:
        rows = [r for r in records if r["policy"] == policy]
        if not rows:
            continue
        stats[policy] = {
            "runs": len(rows), "reached": sum(r["time_s"] is not None for r in rows),
            "time_s": spread([r["time_s"] for r in rows]),
            "steps": spread([r["steps"] for r in rows]),
            "epochs": spread([r["epoch"] for r in rows]),
            "predicted_s": spread([r.get("predicted_s") for r in rows]),
            "best_top1": spread([r["best_top1"] for r in rows]),
            "final_top1": spread([r["final_top1"] for r in rows])}
    verdict = []
    fixed = {p: s for p, s in stats.items() if p != ADAPTIVE and s["time_s"][0] is not None}
    if ADAPTIVE in stats and fixed:
        best = min(fixed, key=lambda p: fixed[p]["time_s"][0])
        a, b = stats[ADAPTIVE], fixed[best]
        fast = a["time_s"][0] is not None and a["time_s"][0] <= b["time_s"][2]
        band = a["final_top1"][0] >= b["final_top1"][1] - 0.01
        verdict.append(f"time to {target:.0%}: adaptive median {fmt(a['time_s'][0])} s, best "
                       f"other policy {best} median {fmt(b['time_s'][0])} s (seeds up to "
                       f"{fmt(b['time_s'][2])} s): " + ("PASS" if fast else "FAIL"))
        modelled = {p: s["predicted_s"][0] for p, s in stats.items()
                    if s["predicted_s"][0] is not None}
        if ADAPTIVE in modelled and len(modelled) > 1:
            other = min((p for p in modelled if p != ADAPTIVE), key=modelled.get)
            verdict.append(f"load-free check, cost-model time of the steps to {target:.0%}: "
                           f"adaptive {modelled[ADAPTIVE]:.1f} s, best other {other} "
                           f"{modelled[other]:.1f} s (information, not the verdict)")
        verdict.append(f"final top-1: adaptive median {a['final_top1'][0]:.4f}, {best} seeds "
                       f"{b['final_top1'][1]:.4f}-{b['final_top1'][2]:.4f} (band: its lowest "
                       f"- 0.01): " + ("PASS" if band else "FAIL"))
    return stats, verdict


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def table(stats, target, seeds):
    head = (f"| policy | time to {target:.0%} (s), median [min-max] | steps | epochs | "
            f"cost-model time of those steps (s) | best top-1 | final top-1 | reached |\n"
            f"| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for policy, s in stats.items():
        t, st, ep, pr, b, f = (s[k] for k in ("time_s", "steps", "epochs", "predicted_s",
                                              "best_top1", "final_top1"))
        rows.append(f"| {policy} | {fmt(t[0])} [{fmt(t[1])}-{fmt(t[2])}] | {fmt(st[0], 0)} "
                    f"[{fmt(st[1], 0)}-{fmt(st[2], 0)}] | {fmt(ep[0], 0)} | {fmt(pr[0])} "
                    f"[{fmt(pr[1])}-{fmt(pr[2])}] | {b[0]:.4f} | {f[0]:.4f} "
                    f"[{f[1]:.4f}-{f[2]:.4f}] | {s['reached']}/{s['runs']} |")
    return "\n".join([f"seeds {seeds}", head] + rows)


def read_series(run_dir, name):
    path = os.path.join(run_dir, f"{name}.series.txt")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return np.zeros((0, 2))
    return np.loadtxt(path, ndmin=2)


def epoch_of_step(record, steps):
    """Epoch at the end of optimizer ``steps`` (array), interpolated between the run's
    validation lines (each at an epoch end, with its step count)."""
    known = [(0, 0.0)] + [(v[2], v[1]) for v in record["val"]]
    return np.interp(steps, [k[0] for k in known], [k[1] for k in known])


def plot_batches(records, path):
    """Global batch (and the noise scale of adaptive runs) against epochs, every run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    names = list(POLICIES) + [BEFORE]
    colours = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = dict(zip(names, [dict(lw=1.5), dict(lw=4, alpha=0.4), dict(lw=1.5),
                              dict(lw=1.5, ls="--"), dict(lw=1.5, ls=":")]))
    for r in records:
        batch = read_series(r["dir"], "global_batch")
        label = r["policy"] if r["seed"] in (records[0]["seed"], 0) else None
        x = epoch_of_step(r, batch[:, 0] - 1)            # the batch of step k starts at k - 1
        top.step(x, batch[:, 1], where="post", color=colours[r["policy"]], label=label,
                 **styles[r["policy"]])
        noise = read_series(r["dir"], "noise_scale")
        if len(noise):
            bottom.plot(epoch_of_step(r, noise[:, 0]), noise[:, 1], color=colours[r["policy"]],
                        alpha=0.8, label=f"noise scale B_simple, {r['policy']}, seed "
                                         f"{r['seed'] or '?'}")
    top.set(ylabel="global batch (images)", yscale="log",
            title="batch over epochs (digits, 4 ranks)")
    top.legend(fontsize=8)
    bottom.set(xlabel="epoch", ylabel="noise scale (images)", yscale="log")
    if bottom.lines:
        bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def measure(args):
    from tqdm import tqdm
    os.makedirs(args.out, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = [p for p in POLICIES if not args.policies or slug(p) in args.policies.split(",")]
    runs = [(seed, p) for seed in seeds for p in policies]   # seed-major: load drifts evenly
    records = []
    bar = tqdm(runs, unit="run", dynamic_ncols=True)
    for seed, policy in bar:
        bar.set_description(f"{policy}, seed {seed}")
        r = run_policy(policy, seed, args, args.out)
        records.append(r)
        bar.write(f"{policy:22s} seed {seed}: {fmt(r['time_s'])} s / {r['steps']} steps to "
                  f"{args.target:.0%}, best top-1 {r['best_top1']:.4f}, final "
                  f"{r['final_top1']:.4f}, batches {r['batch_schedule']}, run {r['wall_s']:.0f} s")
    return report(records, args)


def report(records, args):
    """Write the table, verdict, JSON and plot of ``records``; returns them."""
    for r in records:
        r["predicted_s"] = predicted_seconds(r, args.ranks)
    before = [before_record(args.before, args.target)] if args.before else []
    stats, verdict = summarise(records, args.target)
    seeds = ",".join(str(s) for s in sorted({r["seed"] for r in records}))
    text = table(stats, args.target, seeds) + "\n\n" + "\n".join(verdict)
    plot_batches(records + before, os.path.join(args.out, "batch_over_epochs.png"))
    if before:
        b = before[0]
        text += (f"\n\nbefore ({args.before}): batches {b['batch_schedule']}, {b['steps']} steps / "
                 f"epoch {fmt(b['epoch'], 0)} to {args.target:.0%}, best top-1 "
                 f"{b['best_top1']:.4f}, final {b['final_top1']:.4f}")
    with open(os.path.join(args.out, "measured.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "measured.json"), "w") as f:
        json.dump({"records": records, "stats": stats, "verdict": verdict}, f, indent=1)
    print(text)
    print(f"wrote {args.out}/measured.md, measured.json, batch_over_epochs.png")
    return records


# ----------------------------------------------------------------------------------------------
# abci: prediction

def noise_curve(run_dir, skip):
    """(fraction of training, phi) of a run: its noise_scale series against its image count,
    without the first ``skip`` estimates (those the confidence rule would not act on)."""
    noise = read_series(run_dir, "noise_scale")[skip:]
    batch = read_series(run_dir, "global_batch")
    if not len(noise):
        raise ValueError(f"{run_dir} has no noise_scale.series.txt: give an --adaptive-batch "
                         f"run's output directory (--noise-run)")
    images = dict(zip(batch[:, 0].astype(int), np.cumsum(batch[:, 1])))
    done = np.array([images[int(s)] for s in noise[:, 0]]) / np.cumsum(batch[:, 1])[-1]
    return done, noise[:, 1]


class Candidates:
    """Every (GPU count, grid, algorithm, per-GPU batch, accumulation) on the profile, with
    throughput scored once; goodput for a phi is then one vectorised product."""

    def __init__(self, prof, max_gpus, base_batch):
        result = planner.plan(prof, "resnet50", max_gpus=max_gpus, b_noise=1.0,
                              base_batch=base_batch, accum_steps=(1, 2, 4, 8),
                              beyond_profile=False)
        cols = result.candidates
        keep = cols["global_batch"] >= base_batch           # B0 is the smallest batch
        self.cols = {k: v[keep] for k, v in cols.items()}
        self.base_batch = base_batch

    def best(self, phi, current, model_error):
        """(index, Decision) of the goodput choice from ``current`` (index or None)."""
        c = self.cols
        d = goodput.decide(c["global_batch"], c["images_per_s"], phi, 0.0, self.base_batch,
                           current if current is not None else 0, model_error)
        if current is None or d.change:
            return d.best, d
        return current, d


def predict_abci(curve, factor, prof, restart_s, steps=400):
    """Seconds (and the trajectories) of Sony's schedule and of the goodput policy."""
    done, phi_run = curve
    sony = BatchSchedule.parse(SONY_SCHEDULE)
    phases = planner.plan_schedule(prof, "resnet50", sony, SONY_LOCAL, dataset_size=IMAGENET,
                                   epochs=SONY_EPOCHS)
    b0 = sony.batch(0)

    def phi_at(fraction):
        return float(np.interp(fraction, done, phi_run)) * factor

    # Sony's schedule: progress (images at B0's efficiency) over 90 epochs, indexed by the
    # fraction of its own progress (two passes: the second uses the first's total).
    total = None
    for _ in range(2):
        progress, seconds, fixed_path = 0.0, 0.0, []
        for e in np.linspace(0, SONY_EPOCHS, steps, endpoint=False):
            plan = [p for s, p in phases if s <= e][-1]
            images = IMAGENET * SONY_EPOCHS / steps
            f = progress / total if total else e / SONY_EPOCHS
            progress += images * float(goodput.efficiency(plan.global_batch, phi_at(f), b0))
            seconds += images / plan.images_per_s
            fixed_path.append((f, plan.gpus, plan.global_batch, phi_at(f)))
        total = progress
    fixed_s = seconds
    cand = Candidates(prof, phases[-1][1].gpus, b0)
    error = goodput.model_error_of(prof)
    current, seconds, restarts, path = None, 0.0, 0, []
    for f in np.linspace(0, 1, steps, endpoint=False):
        phi = phi_at(f)
        index, _ = cand.best(phi, current, error)
        if current is not None and cand.cols["gpus"][index] != cand.cols["gpus"][current]:
            restarts += 1
        current = index
        g = cand.cols["images_per_s"][index] * float(goodput.efficiency(
            cand.cols["global_batch"][index], phi, b0))
        seconds += total / steps / g
        path.append((f, int(cand.cols["gpus"][index]), int(cand.cols["global_batch"][index]), phi))
    return {"factor": factor, "fixed_s": fixed_s, "fixed_restart_s": restart_s * (len(phases) - 1),
            "goodput_s": seconds + restarts * restart_s,
            "restarts": restarts, "fixed_path": fixed_path, "goodput_path": path,
            "epochs_equivalent": total / IMAGENET}


def abci(args):
    prof = load_profile(args.profile)
    curve = noise_curve(args.noise_run, args.skip_samples)
    restart_s = elastic.restart_cost(prof.name, args.restart_cost)
    factors = [args.noise_scale_factor * m for m in (0.25, 1.0, 4.0)]
    results = [predict_abci(curve, k, prof, restart_s) for k in factors]
    lines = [f"ImageNet/ResNet-50 on {prof.name} (predicted; noise-scale shape from "
             f"{args.noise_run}, restart {restart_s:g} s per GPU-count change)",
             "| noise scale x | phi over training | Sony 34K->68K (1,088->2,176 GPUs) | goodput "
             "(<= 2,176 GPUs), restarts included | goodput's batches | GPU counts | restarts |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        batches = sorted({p[2] for p in r["goodput_path"]})
        gpus = sorted({p[1] for p in r["goodput_path"]})
        phis = [p[3] for p in r["goodput_path"]]
        lines.append(f"| {r['factor']:.0f} | {min(phis):,.0f}-{max(phis):,.0f} | "
                     f"{r['fixed_s']:.0f} s (+{r['fixed_restart_s']:.0f} s if relaunched at "
                     f"epoch 5) | {r['goodput_s']:.0f} s "
                     f"({r['fixed_s'] / r['goodput_s']:.2f}x) | {batches[0]:,}-{batches[-1]:,} | "
                     f"{gpus[0]:,}-{gpus[-1]:,} | {r['restarts']} |")
    text = "\n".join(lines)
    plot_abci(results[1], os.path.join(args.out, "abci_batch_over_training.png"))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "abci.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "abci.json"), "w") as f:
        json.dump(results, f)
    print(text)
    print(f"wrote {args.out}/abci.md, abci.json, abci_batch_over_training.png")


def plot_abci(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, key in (("Sony 34K->68K", "fixed_path"), ("goodput", "goodput_path")):
        p = np.array(result[key], float)
        ax.step(p[:, 0], p[:, 2], where="post", label=f"{name}: global batch")
    p = np.array(result["goodput_path"], float)
    ax.plot(p[:, 0], p[:, 3], ":", label="noise scale phi (scaled digits run)")
    ax.set(xlabel="fraction of training progress", ylabel="images", yscale="log",
           title=f"abci, ResNet-50 (predicted), noise scale x {result['factor']:.0f}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------

def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("command", nargs="?", default="all",
                        choices=("all", "measure", "abci", "report"),
                        help="all (default): measure, then abci from the first adaptive run; "
                             "report: table and plot again from --out's measured.json")
    parser.add_argument("--out", default="runs/time_to_accuracy",
                        help="folder for the runs, tables and plots (default: %(default)s)")
    m = parser.add_argument_group("measure")
    m.add_argument("--ranks", type=int, default=4, help="MPI ranks (default: %(default)s)")
    m.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: %(default)s)")
    m.add_argument("--target", type=float, default=0.90,
                   help="validation top-1 to reach (default: %(default)s)")
    m.add_argument("--policies", default="",
                   help="comma-separated subset of " + ", ".join(slug(p) for p in POLICIES)
                   + " (default: all)")
    m.add_argument("--before", default="",
                   help="output folder of an earlier adaptive run (with its stdout in "
                        "stdout.log) to draw beside the others, e.g. the noise-scale-only "
                        "controller's")
    m.add_argument("--train-args", default="", help="extra train.py flags, space-separated")
    m.add_argument("--mpirun-args", default="", help="extra mpirun flags, space-separated")
    a = parser.add_argument_group("abci")
    a.add_argument("--noise-run", default="",
                   help="an adaptive run's output folder (default with all: the first seed's)")
    a.add_argument("--noise-scale-factor", type=float, default=34816 / 64,
                   help="ImageNet noise scale / the run's (default: 34,816/64, the recipes' "
                        "starting batches; *assumed*)")
    a.add_argument("--skip-samples", type=int, default=20,
                   help="noise-scale estimates left out at the start, as the confidence rule "
                        "does (default: %(default)s, train.py's --adaptive-min-samples)")
    a.add_argument("--profile", default="abci", help="cluster profile (default: %(default)s)")
    a.add_argument("--restart-cost", type=float, default=None,
                   help="seconds per GPU-count change (default: nnabla_torus.launching.elastic's for "
                        "the profile)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "report":
        with open(os.path.join(args.out, "measured.json")) as f:
            report(json.load(f)["records"], args)
        return 0
    if args.command in ("all", "measure"):
        records = measure(args)
        adaptive = [r for r in records if r["policy"] == ADAPTIVE]
        if not args.noise_run and adaptive:
            args.noise_run = adaptive[0]["dir"]
    if args.command in ("all", "abci"):
        if not args.noise_run:
            sys.exit("time_to_accuracy.py abci: give --noise-run (an --adaptive-batch 1 run's "
                     "output folder)")
        abci(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
