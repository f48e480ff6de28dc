"""Records, tables and plots of tools/time_to_accuracy.py runs (no launching here).

A run's record comes from train.py's stdout, each line with the seconds since launch at which
it arrived (:func:`record_of`); :func:`summarise` takes the medians and spreads over seeds per
policy and the verdict; :func:`table` is the Markdown table; :func:`plot_batches` the batch
over epochs. Example::

    r = record_of("fixed 64", 1, "runs/tta/fixed-64-s1", [(2.5, "epoch 1.00 step 23: ...")], 0.9)
    stats, verdict = summarise([r], 0.9)
"""
import itertools
import json
import math
import os
import re
import statistics

import numpy as np

import _example  # noqa: F401  (examples/imagenet on sys.path, for its config and training_planner)
from nnabla_torus.files import atomic_path
from nnabla_torus.knobs import short_repr
from nnabla_torus.planning.splits import split_batch

ADAPTIVE = "adaptive (goodput)"
ADAPTIVE_PRIOR = "adaptive (prior)"           # the same, deciding on an earlier run's prior
ADAPTIVES = (ADAPTIVE, ADAPTIVE_PRIOR)
RECIPE = "recipe"                              # the policy "recipe <its batch schedule>"
BEFORE = "adaptive before (--before run)"
# time of day first
VAL_LINE = re.compile(r"^(?:\d\d:\d\d:\d\d )?epoch (\S+) step (\d+): .*val top-1 (\S+)")
VAL_SECONDS = re.compile(r"val top-1 \S+ top-5 \S+ \((\S+) s\)")   # the validation's own time
SIZES = re.compile(r"(\d+) training / \d+ validation images")
PARAMS = re.compile(r": ([\d,]+) parameters, ")


def parse_log(lines):
    """(validation lines [(seconds, epoch, step, top1)], summary dict, training images,
    parameters) of train.py's stdout, ``lines`` as (seconds since launch, text). A validation's
    seconds leave out the time every validation up to it took, where its line gives it: the
    instrument is not the run (four validations an epoch cost clusters' 4 ranks ~2 s an epoch,
    half of fixed 1024's training time)."""
    vals, summary, dataset, params = [], None, None, None
    validating = 0.0
    for now, line in lines:
        match = VAL_LINE.match(line)
        if match:
            took = VAL_SECONDS.search(line)
            validating += float(took.group(1)) if took else 0.0
        if match and match.group(3) != "None":
            vals.append((now - validating, float(match.group(1)), int(match.group(2)),
                         float(match.group(3))))
        elif line.startswith('{"val_top1"'):
            summary = json.loads(line)
        elif dataset is None and SIZES.search(line):
            dataset = int(SIZES.search(line).group(1))
            params = int(PARAMS.search(line).group(1).replace(",", ""))
    return vals, summary, dataset, params


def record_of(policy, seed, run_dir, lines, target, profile="", ranks_per_host=0):
    """The run's record: time and steps to ``target``, accuracies, training images/s, and the
    profile (train.py's --profile, "" = its default) and ranks per host it planned with."""
    vals, summary, dataset, params = parse_log(lines)
    hit = next((v for v in vals if v[3] >= target), None)
    return {"policy": policy, "seed": seed, "dir": run_dir, "dataset": dataset, "params": params,
            "time_s": hit[0] if hit else None, "steps": hit[2] if hit else None,
            "epoch": hit[1] if hit else None, "best_top1": max(v[3] for v in vals),
            "final_top1": summary["val_top1"], "wall_s": lines[-1][0] if lines else None,
            "images_per_s": summary.get("images_per_sec"), "ranks": summary.get("ranks"),
            "total_steps": summary["steps"], "batch_schedule": summary["batch_schedule"],
            "profile": profile, "ranks_per_host": ranks_per_host, "val": vals}


# The fields of a record that the tables, verdicts and plots read: (types, None allowed).
NUMBER = (int, float)
RECORD_FIELDS = {
    "policy": (str, False), "seed": (int, False), "dir": (str, False),
    "batch_schedule": (str, False), "best_top1": (NUMBER, False), "final_top1": (NUMBER, False),
    "time_s": (NUMBER, True), "steps": (int, True), "epoch": (NUMBER, True),
    "images_per_s": (NUMBER, True), "ranks": (int, True), "dataset": (int, True),
    "params": (int, True), "profile": (str, False), "ranks_per_host": (int, False),
    "val": (list, False),
}


def record_problem(record):
    """What is wrong with ``record`` (a record_of dict read back from JSON), in a few words:
    the first field of RECORD_FIELDS missing, of another type or not finite; None if nothing."""
    if not isinstance(record, dict):
        return f"is a JSON {type(record).__name__}, not an object"
    for key, (types, optional) in RECORD_FIELDS.items():
        if key not in record:
            return f"has no {key!r}"
        value = record[key]
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, types) or (
                isinstance(value, float) and not math.isfinite(value)):
            kinds = " or ".join(t.__name__ for t in (types if isinstance(types, tuple)
                                                     else (types,)))
            return f"has {key} = {short_repr(value)}, not a finite {kinds}" + (
                " or null" if optional else "")
    if not all(isinstance(v, list) and len(v) == 4 and all(
            isinstance(x, NUMBER) and not isinstance(x, bool) for x in v) for v in record["val"]):
        return "has a val entry that is not [seconds, epoch, step, top-1]"
    return None


def before_record(run_dir, target):
    """The record of an earlier adaptive run (``--before``: its output folder with its
    stdout in stdout.log; no arrival times, so only its batches and accuracy count)."""
    path = os.path.join(run_dir, "stdout.log")
    try:
        with open(path, errors="replace") as f:
            lines = [(0.0, line) for line in f]
    except OSError as e:
        raise ValueError(f"--before {run_dir}: cannot read {path} ({e.strerror or e}); give "
                         f"the output folder of an adaptive run, with its stdout in stdout.log"
                         ) from None
    vals, summary = parse_log(lines)[:2]
    if summary is None or not vals:
        raise ValueError(f"--before {run_dir}: {path} has no validation line or no summary "
                         f"line of train.py")
    return record_of(BEFORE, 0, run_dir, lines, target)


def predicted_seconds(record):
    """Seconds the run's steps up to the target take by the cost model of the profile the run
    planned with (load-free, start-up and validation excluded): train.py's own TrainingPlanner."""
    from config import parse_config
    from training_planner import TrainingPlanner
    if None in (record["steps"], record["ranks"], record["params"], record["dataset"]):
        return None                              # not reached, or a log without the sizes
    ranks = record["ranks"]
    cfg = parse_config(["--seed", str(record["seed"])]
                       + (["--profile", record["profile"]] if record["profile"] else []))
    run = TrainingPlanner.from_config(cfg, record["params"], ranks, record["dataset"], True,
                                 record["ranks_per_host"] or ranks)
    batch = read_series(record["dir"], "global_batch")
    batch = batch[batch[:, 0] <= record["steps"], 1].astype(int)
    if not len(batch):
        return None                              # its run folder moved: no batch series
    local, accum = np.array([split_batch(b, ranks, cfg.local_batch) for b in batch]).T
    return float(np.sum(batch / run.throughput(local, accum)))


REACHED_KEYS = ("time_s", "steps", "epoch")   # None in a run that never reached the target


def spread(values, missing=None):
    """(median, min, max) of the values; a None counts as ``missing`` (None: left out);
    (None,) * 3 when nothing is left."""
    values = [missing if v is None else v for v in values]
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def median_interval(values, confidence=0.95):
    """(median, low, high, coverage) of ``values``: the median and its distribution-free
    interval, the order statistics x_(k) and x_(n+1-k) for the largest k whose coverage
    1 - 2 P(Binomial(n, 1/2) < k) is at least ``confidence`` (the sign test's interval;
    Conover, Practical Nonparametric Statistics, 3rd ed., section 3.2); with too few values for
    that (n <= 5 at 95 %) k = 1, min-max, and its smaller coverage says so.

    >>> median_interval([0.91, 1.10, 1.26, 0.96, 1.11])
    (1.1, 0.91, 1.26, 0.9375)
    """
    x, n = sorted(values), len(values)
    k = 1
    while k + 1 <= (n + 1) // 2 and _coverage(n, k + 1) >= confidence:
        k += 1
    return statistics.median(x), x[k - 1], x[n - k], _coverage(n, k)


def _coverage(n, k):
    """1 - 2 P(Binomial(n, 1/2) < k): the chance that [x_(k), x_(n+1-k)] holds the median."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n


def paired_ratios(records, policy, reference):
    """[(seed, time of ``policy`` / time of ``reference``)] over the seeds both ran in one
    measurement (records paired by seed and folder: pooled measurements may share seeds);
    never reached is inf, a seed neither reached is left out."""
    def key(r):
        return os.path.dirname(r["dir"]), r["seed"]

    def seconds(r):
        return math.inf if r["time_s"] is None else r["time_s"]
    reached = {key(r): seconds(r) for r in records if r["policy"] == reference}
    pairs = []
    for r in records:
        if r["policy"] == policy and key(r) in reached:
            mine, theirs = seconds(r), reached[key(r)]
            if mine < math.inf or theirs < math.inf:
                pairs.append((r["seed"], mine / theirs if theirs < math.inf else 0.0))
    return pairs


def paired_verdict(records, policy, reference):
    """One line: ``policy`` / ``reference`` per seed, its median and interval, and whether the
    interval shows a difference; None without a pair."""
    pairs = paired_ratios(records, policy, reference)
    if not pairs:
        return None
    ratios = [ratio for _, ratio in pairs]
    median, low, high, coverage = median_interval(ratios)
    faster = sum(ratio <= 1.0 for ratio in ratios)
    shown = ("behind: the whole interval is above 1" if low > 1.0 else
             "ahead: the whole interval is below 1" if high < 1.0 else
             "no difference shown over these seeds")
    return (f"per seed, time to the target of {policy} / {reference}: median "
            f"{fmt(median, 2)}, {coverage:.1%} interval {fmt(low, 2)}-{fmt(high, 2)} over "
            f"{len(ratios)} seeds ({faster} of them at most 1): {shown}; ratios "
            + ", ".join(fmt(ratio, 2) for ratio in sorted(ratios)))


def batch_range(record):
    """(smallest, largest) global batch the run trained with."""
    batch = read_series(record["dir"], "global_batch")
    return (int(batch[:, 1].min()), int(batch[:, 1].max())) if len(batch) else (None, None)


def policy_stats(rows):
    """Medians and spreads over the seeds of one policy's records."""
    batches = [b for b in map(batch_range, rows) if b[0] is not None]   # moved run folders
    #                                                                        have no series
    return {"runs": len(rows), "reached": sum(r["time_s"] is not None for r in rows),
            # a seed that never reached the target is slower than every one that did: its
            # time is inf, not left out (3 seeds of 5 at 35-37 s and 2 never is not 36 s)
            **{key: spread([r.get(key) for r in rows], math.inf) for key in REACHED_KEYS},
            **{key: spread([r.get(key) for r in rows])
               for key in ("predicted_s", "best_top1", "final_top1", "images_per_s")},
            "batches": (min((b[0] for b in batches), default=None),
                        max((b[1] for b in batches), default=None))}


def summarise(records, target):
    """{policy: stats} (policies in the order of their first record) and the verdict lines,
    one verdict per adaptive policy against the best fixed one (and, paired, the recipe)."""
    policies = list(dict.fromkeys(r["policy"] for r in records))
    stats = {p: policy_stats([r for r in records if r["policy"] == p]) for p in policies}
    fixed = {p: s for p, s in stats.items() if p not in ADAPTIVES and s["time_s"][0] < math.inf}
    if not fixed:
        return stats, []
    best = min(fixed, key=lambda p: fixed[p]["time_s"][0])
    b, verdict = fixed[best], []
    references = [best] + [p for p in stats if p.startswith(RECIPE + " ") and p != best]
    modelled = {p: s["predicted_s"][0] for p, s in stats.items()
                if s["predicted_s"][0] is not None}
    for name in (p for p in ADAPTIVES if p in stats):
        a = stats[name]
        fast = a["time_s"][0] <= b["time_s"][2] and a["time_s"][0] < math.inf
        band = a["final_top1"][0] >= b["final_top1"][1] - 0.01
        verdict.append(f"time to {target:.0%}: {name} median {fmt(a['time_s'][0])} s, best "
                       f"other policy {best} median {fmt(b['time_s'][0])} s (seeds up to "
                       f"{fmt(b['time_s'][2])} s): " + ("PASS" if fast else "FAIL"))
        if name in modelled and len(modelled) > 1:
            other = min((p for p in modelled if p not in ADAPTIVES), key=modelled.get)
            verdict.append(f"load-free check, cost-model time of the steps to {target:.0%}: "
                           f"{name} {modelled[name]:.1f} s, best other {other} "
                           f"{modelled[other]:.1f} s (information, not the verdict)")
        for reference in references:
            paired = paired_verdict(records, name, reference)
            if paired:
                verdict.append(paired)
        verdict.append(f"final top-1: {name} median {a['final_top1'][0]:.4f}, {best} seeds "
                       f"{b['final_top1'][1]:.4f}-{b['final_top1'][2]:.4f} (band: its lowest "
                       f"- 0.01): " + ("PASS" if band else "FAIL"))
    if not verdict:
        return stats, []
    return stats, verdict + throughput_lines(stats) + efficiency_lines(records, target)


def throughput_lines(stats):
    """Whether larger batches bought throughput in these runs: measured training images/s of
    the largest fixed batch over the smallest (same runs, so the load affects both)."""
    fixed = {s["batches"][0]: s for p, s in stats.items()
             if p not in ADAPTIVES and s["batches"][0] == s["batches"][1]}
    if len(fixed) < 2 or None in fixed:
        return []
    small, large = fixed[min(fixed)], fixed[max(fixed)]
    gain = large["images_per_s"][0] / small["images_per_s"][0]
    return [f"throughput: fixed {max(fixed)} trains {large['images_per_s'][0]:.0f} images/s, "
            f"fixed {min(fixed)} {small['images_per_s'][0]:.0f} (medians): larger batches "
            + (f"buy {gain:.2f}x" if gain > 1.05 else f"buy nothing ({gain:.2f}x)")]


def implied_phi(small, large, ratio):
    """The noise scale at which the goodput model's efficiency gives ``ratio``, the epochs to a
    target at batch ``small`` over those at ``large``: images to a target are proportional to
    phi + B (nnabla_torus/planning/goodput.py), so ratio = (phi + small) / (phi + large); 0 at
    ratio <= small / large (the larger batch saved no steps), inf at ratio >= 1 (it cost no
    images).

    >>> round(implied_phi(64, 256, 0.647))
    288
    """
    if ratio >= 1.0:
        return math.inf
    if ratio <= small / large:
        return 0.0
    return (small - ratio * large) / (ratio - 1.0)


def val_interval(record):
    """Epochs between the validation that saw the target and the one before (from 0 for the
    first): how finely the run's epochs to the target are known (None if never reached)."""
    if record["epoch"] is None:
        return None
    return record["epoch"] - max([v[1] for v in record["val"] if v[1] < record["epoch"]],
                                 default=0.0)


def fixed_epochs(records):
    """{batch: [epochs to the target, one per run]} of the fixed single-batch runs, each less
    half its validation interval (:func:`val_interval`; half an epoch at epoch-end
    validations): a validation sees the target reached on average half an interval after it
    was (None for a run that never reached it)."""
    epochs = {}
    for r in records:
        phases = r["batch_schedule"].split(",")
        if r["policy"] not in ADAPTIVES and len(phases) == 1:
            epochs.setdefault(int(phases[0].split(":")[1]), []).append(
                None if r["epoch"] is None else r["epoch"] - val_interval(r) / 2)
    return epochs


def measured_b_simple(records):
    """The noise scale B_simple each adaptive run measured up to the target (its median)."""
    measured = []
    for r in (r for r in records if r["policy"] in ADAPTIVES):
        noise = read_series(r["dir"], "noise_scale")
        noise = noise[noise[:, 0] <= (r["steps"] or math.inf)]
        if len(noise):
            measured.append(float(np.median(noise[:, 1])))
    return measured


def efficiency_lines(records, target):
    """The efficiency model checked on these runs: the phi that the epochs to ``target`` of
    each two fixed batches imply (:func:`implied_phi`, on :func:`fixed_epochs`' means),
    against the noise scale B_simple the adaptive runs measured up to the target."""
    mean = {batch: statistics.mean(e) for batch, e in fixed_epochs(records).items()
            if None not in e}
    measured = measured_b_simple(records)
    lines = []
    for small, large in itertools.combinations(sorted(mean), 2):
        phi = implied_phi(small, large, mean[small] / mean[large])
        lines.append(f"efficiency model: fixed {small} and fixed {large} reached {target:.0%} "
                     f"after {mean[small]:.1f} and {mean[large]:.1f} epochs (means, half a "
                     f"validation interval before the validation that saw it), as E(B) predicts "
                     f"at phi = "
                     + ("infinity (the larger batch cost no more epochs)" if phi == math.inf
                        else f"{phi:.0f}") + "; the adaptive runs measured B_simple "
                     + (span(spread(measured), 0) + " (each run's median up to the target)"
                        if measured else "- (no adaptive run with a noise-scale series)"))
    return lines


def fmt(value, digits=1):
    """``value`` rounded; "-" for None (no run has it), "never" for inf (not reached)."""
    if value is None:
        return "-"
    return "never" if value == math.inf else f"{value:.{digits}f}"


def span(triple, digits=1):
    """"median [min-max]" of a spread ("-" when no run has the value)."""
    if triple[0] is None:
        return "-"
    return f"{fmt(triple[0], digits)} [{fmt(triple[1], digits)}-{fmt(triple[2], digits)}]"


def table(stats, target, seeds):
    """The Markdown table of ``summarise``'s stats."""
    head = (f"| policy | time to {target:.0%} (s), median [min-max] | steps | epochs | "
            f"cost-model time of those steps (s) | train images/s | batches | best top-1 | "
            f"final top-1 | reached |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- "
            f"| --- |")
    rows = [f"| {policy} | {span(s['time_s'])} | {span(s['steps'], 0)} | "
            f"{fmt(s['epoch'][0], 0)} | {span(s['predicted_s'])} | "
            f"{span(s['images_per_s'], 0)} | "
            f"{fmt(s['batches'][0], 0)}-{fmt(s['batches'][1], 0)} | "
            f"{s['best_top1'][0]:.4f} | {span(s['final_top1'], 4)} | "
            f"{s['reached']}/{s['runs']} |" for policy, s in stats.items()]
    return "\n".join([f"seeds {seeds}", head] + rows)


def read_series(run_dir, name):
    """(step, value) rows of a run's ``NAME.series.txt`` (train.py's monitors)."""
    path = os.path.join(run_dir, f"{name}.series.txt")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return np.zeros((0, 2))
    try:
        rows = np.loadtxt(path, ndmin=2)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path} ({' '.join(str(e).split())}): train.py writes "
                         f"'step value' lines; measure the run again or move it out") from None
    if rows.shape[1] != 2 or not np.all(np.isfinite(rows)):
        raise ValueError(f"{path}: not 'step value' lines of finite numbers; measure the run "
                         f"again or move it out")
    return rows


def epoch_of_step(record, steps):
    """Epoch at the end of optimizer ``steps`` (array), interpolated between the run's
    validation lines (each at an epoch end, with its step count)."""
    known = [(0, 0.0)] + [(v[2], v[1]) for v in record["val"]]
    return np.interp(steps, [k[0] for k in known], [k[1] for k in known])


def plot_batches(records, path, where):
    """Global batch (and the noise scale of adaptive runs) against epochs, every run;
    ``where`` names the machine in the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    names = list(dict.fromkeys(r["policy"] for r in records))
    colours = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = {"fixed 64": dict(lw=4, alpha=0.4), ADAPTIVE: dict(lw=1.5, ls="--"),
              ADAPTIVE_PRIOR: dict(lw=1.5, ls="-."),
              BEFORE: dict(lw=1.5, ls=":")}
    for r in records:
        batch = read_series(r["dir"], "global_batch")
        label = r["policy"] if r["seed"] in (records[0]["seed"], 0) else None
        x = epoch_of_step(r, batch[:, 0] - 1)            # the batch of step k starts at k - 1
        top.step(x, batch[:, 1], where="post", color=colours[r["policy"]], label=label,
                 **styles.get(r["policy"], dict(lw=1.5)))
        noise = read_series(r["dir"], "noise_scale")
        if len(noise):
            bottom.plot(epoch_of_step(r, noise[:, 0]), noise[:, 1], color=colours[r["policy"]],
                        alpha=0.8, label=f"noise scale B_simple, {r['policy']}, seed "
                                         f"{r['seed'] or '?'}")
    top.set(ylabel="global batch (images)", yscale="log", title=f"batch over epochs ({where})")
    top.legend(fontsize=8)
    bottom.set(xlabel="epoch", ylabel="noise scale (images)", yscale="log")
    if bottom.lines:
        bottom.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=90)
    plt.close(fig)
