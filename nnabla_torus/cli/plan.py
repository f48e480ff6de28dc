"""nnabla-torus-plan: how many GPUs, which grid, algorithm and batch, from a cluster profile.

Examples::

    nnabla-torus-plan --profile abci --model resnet50 --schedule 0:34816,5:69632 --local-batch 32
    nnabla-torus-plan --profile abci --noise-scale 20000 --max-gpus 4096 --plot plan.png --explain
    nnabla-torus-plan --profile cpu-2core --model resnet18-w0.125-16px --json -
    nnabla-torus-plan --profile abci --recipe sony-122s --fit-recipe sony-224s

Prints one row per candidate GPU count (its best grid, algorithm and batch), then the
recommendation. With ``--recipe`` it predicts the recipe's end-to-end training time instead
(per phase, plus the profile's fixed costs) beside the figures the recipe states as
published. Every flag has an environment twin: NNABLA_TORUS_PLAN_* (``--max-gpus``:
NNABLA_TORUS_PLAN_MAX_GPUS), except ``--profile``, which shares NNABLA_TORUS_PROFILE with
train.py.
"""
import argparse
import json
import sys

import numpy as np

from ..planning import costmodel, planner
from ..planning.costmodel import ALGORITHMS
from ..knobs import TIMEOUT_MAX_S, BadValue, add_knob, number, writable_file
from ..planning import large_batch, model_cost
from ..planning.machine_profile import (add_profile_knob, add_shape_knobs, list_profiles,
                                        load_profile, model_of, resolve_profile, shape_of)
from ..planning.schedules import BatchSchedule
from ..comm.collectives import registry_entry
from ..comm.topology import parse_grid
from .plan_recipe import run_recipe

# (Plan field, column title, value format); every title is the full name, no legend needed.
COLUMNS = [("gpus", "GPUs", "{:d}"), ("grid", "grid", "{}"), ("algorithm", "algorithm", "{}"),
           ("local_batch", "per-GPU batch", "{:d}"), ("accum_steps", "accumulation", "{:d}"),
           ("global_batch", "global batch", "{:,d}"), ("step_time_s", "step time (s)", "{:.4f}"),
           ("images_per_s", "images/s", "{:,.0f}"),
           ("scaling_efficiency", "scaling efficiency", "{:.1%}"),
           ("statistical_efficiency", "statistical efficiency", "{:.1%}"),
           ("time_to_train_s", "time to train (s)", "{:,.1f}")]
WIDTHS = [max(len(title), 10) for _, title, _ in COLUMNS]
HEADER = "  ".join(title.rjust(w) for (_, title, _), w in zip(COLUMNS, WIDTHS))


def gpu_list(text):
    """``"1,4,8"`` -> [1, 4, 8]; each count an integer >= 1."""
    return [number(int, low=1, hint="GPU counts, e.g. 1,4,8")(c.strip()) for c in text.split(",")]


def schedule(text):
    """A BatchSchedule from ``"epoch:batch,..."``; its errors as argparse messages."""
    try:
        return BatchSchedule.parse(text)
    except ValueError as e:
        raise BadValue(str(e)) from None


def _add_search_knobs(parser):
    """What to plan on: the profile, model, GPU counts, algorithms and batches."""
    add_profile_knob(parser, help=f"cluster profile: shipped name "
                     f"({', '.join(list_profiles())}) or a file path")
    add_shape_knobs(parser)
    add_knob(parser, "--model", "NNABLA_TORUS_PLAN_MODEL", "resnet50",
             "model: one of the profile's, or any name with --gflops-per-image and --params")
    add_knob(parser, "--gflops-per-image", "NNABLA_TORUS_PLAN_GFLOPS_PER_IMAGE", None,
             "training GFLOPs per image of a model the profile does not know (6 x its forward "
             "multiply-adds; model_cost.count_cost counts them from an nnabla graph): its step "
             "time is scaled from the profile's calibrated model", 
             type=number(float, low=0, strict=True))
    add_knob(parser, "--params", "NNABLA_TORUS_PLAN_PARAMS", None,
             "parameters of that model (all-reduced as FP16: 2 bytes each)",
             type=number(int, low=1))
    add_knob(parser, "--max-gpus", "NNABLA_TORUS_PLAN_MAX_GPUS", None,
             "largest GPU count to consider (None: every GPU of the profile)",
             type=number(int, low=1))
    add_knob(parser, "--gpus", "NNABLA_TORUS_PLAN_GPUS", None,
             "comma-separated GPU counts to consider instead (e.g. 1,4,8)", type=gpu_list)
    add_knob(parser, "--allow-beyond-profile", "NNABLA_TORUS_PLAN_ALLOW_BEYOND_PROFILE", False,
             f"let --max-gpus/--gpus exceed the profile's GPUs (up to "
             f"{planner.BEYOND_PROFILE}x them)", type=bool, nargs="?", const=True)
    add_knob(parser, "--algorithms", "NNABLA_TORUS_PLAN_ALGORITHMS", ",".join(ALGORITHMS),
             "comma-separated all-reduce algorithms to consider")
    add_knob(parser, "--schedule", "NNABLA_TORUS_PLAN_SCHEDULE", None,
             "global-batch schedule 'epoch:batch,...' turned into GPU counts at --local-batch",
             type=schedule)
    add_knob(parser, "--batch", "NNABLA_TORUS_PLAN_BATCH", None,
             "fixed global batch (None: choose it from the noise scale)", type=number(int, low=1))
    add_knob(parser, "--nearest-batch", "NNABLA_TORUS_PLAN_NEAREST_BATCH", False,
             "when --batch cannot be split as GPUs x per-GPU batch x accumulation, plan the "
             "nearest feasible global batch instead (and say so); else that is an error "
             "naming the nearest ones", type=bool, nargs="?", const=True)
    add_knob(parser, "--local-batch", "NNABLA_TORUS_PLAN_LOCAL_BATCH", None,
             "fixed per-GPU batch (None: try powers of two up to the memory limit)",
             type=number(int, low=1))


def _add_objective_knobs(parser):
    """What a plan is scored by: noise scale, dataset, epochs, scaling efficiency."""
    add_knob(parser, "--noise-scale", "NNABLA_TORUS_PLAN_NOISE_SCALE", None,
             "gradient noise scale B_noise in samples (None: statistical efficiency 1)",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--base-batch", "NNABLA_TORUS_PLAN_BASE_BATCH", 256,
             "reference batch B0 of the statistical efficiency", type=number(int, low=1))
    add_knob(parser, "--dataset-size", "NNABLA_TORUS_PLAN_DATASET_SIZE",
             planner.IMAGENET_TRAIN_IMAGES, "training samples per epoch", type=number(int, low=1))
    add_knob(parser, "--epochs", "NNABLA_TORUS_PLAN_EPOCHS", 90.0, "epochs to train",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--min-efficiency", "NNABLA_TORUS_PLAN_MIN_EFFICIENCY", 0.0,
             "minimum scaling efficiency of a plan (0..1)", type=number(float, low=0, high=1))


def _add_output_knobs(parser):
    """What is shown: table rows, JSON, plot, a recipe's prediction."""
    add_knob(parser, "--rows", "NNABLA_TORUS_PLAN_ROWS", "log",
             "table rows: 'log' (powers of two and the recommendation) or 'all'",
             choices=("log", "all"))
    add_knob(parser, "--json", "NNABLA_TORUS_PLAN_JSON", None,
             "write the table and recommendation as JSON to this path ('-': stdout)",
             type=writable_file)
    add_knob(parser, "--plot", "NNABLA_TORUS_PLAN_PLOT", None,
             "write a PNG of step time and scaling efficiency versus GPU count per algorithm",
             type=writable_file)
    add_knob(parser, "--recipe", "NNABLA_TORUS_PLAN_RECIPE", None,
             "predict this training recipe's end-to-end time (a shipped name, e.g. sony-224s, "
             "or a path) beside its published figures")
    add_knob(parser, "--fit-recipe", "NNABLA_TORUS_PLAN_FIT_RECIPE", None,
             "first fit the model's per-image compute (b_ms) to this recipe's published time, "
             "then predict --recipe with it (a held-out check when the recipes differ)")


def _add_explain_and_simulate_knobs(parser):
    """The recommendation's terms and the re-ranking by a timed simulation."""
    add_knob(parser, "--explain", "NNABLA_TORUS_PLAN_EXPLAIN", False,
             "print the compute and all-reduce phase terms of the recommendation", type=bool,
             nargs="?", const=True)
    add_knob(parser, "--simulate", "NNABLA_TORUS_PLAN_SIMULATE", 0,
             "re-rank the K best candidates (the best plan of each GPU count, by goodput; "
             "with --schedule: the phases) by a timed simulation of their all-reduce "
             "(nnabla_torus.sim.simulate; 0: off)", type=number(int, low=0))
    add_knob(parser, "--max-wall", "NNABLA_TORUS_PLAN_MAX_WALL", 600.0,
             "wall-clock seconds allowed per simulated all-reduce",
             type=number(float, low=0, strict=True, high=TIMEOUT_MAX_S))
    add_knob(parser, "--sim-engine", "NNABLA_TORUS_SIM_ENGINE", "auto",
             "engine of --simulate: simgrid (SimGrid replay), flow (our flow model) or auto "
             "(simgrid when libsimgrid-dev and g++ are here)",
             choices=("auto", "simgrid", "flow"))   # simulate.ENGINES (not imported: greenlet)


def build_parser():
    parser = argparse.ArgumentParser(prog="nnabla-torus-plan", description=__doc__.split("\n")[0])
    for add in (_add_search_knobs, _add_objective_knobs, _add_output_knobs,
                _add_explain_and_simulate_knobs):
        add(parser)
    return parser


# Flags a mode does not use: (flag, the mode's flag or None for "without --simulate", why).
# Given with that mode (a value other than the default) they are refused, not ignored.
IGNORED = [
    ("--max-gpus", "--gpus", "--gpus lists the GPU counts to plan"),
    ("--max-gpus", "--schedule", "each phase runs on batch / --local-batch GPUs"),
    ("--gpus", "--schedule", "each phase runs on batch / --local-batch GPUs"),
    ("--batch", "--schedule", "the schedule sets the global batch of each phase"),
    ("--nearest-batch", "--schedule", "each phase's batch must be a multiple of --local-batch"),
    ("--rows", "--schedule", "the table has one row per phase"),
    ("--plot", "--schedule", "the plot draws a table of GPU counts"),
    ("--max-wall", None, "it limits --simulate"),
    ("--sim-engine", None, "it chooses the engine of --simulate"),
] + [(flag, "--recipe", "--recipe predicts the recipe's own schedule and GPU counts")
     for flag in ("--max-gpus", "--gpus", "--allow-beyond-profile", "--schedule", "--batch",
                  "--nearest-batch", "--local-batch", "--noise-scale", "--base-batch",
                  "--epochs", "--min-efficiency", "--rows", "--plot", "--explain",
                  "--simulate")]


def refuse_ignored(parser, args):
    """``parser.error`` for a flag that the mode of ``args`` would ignore (``IGNORED``)."""
    def given(flag):
        name = flag[2:].replace("-", "_")
        return getattr(args, name) != parser.get_default(name)
    for flag, mode, why in IGNORED:
        if given(flag) and (given(mode) if mode else not args.simulate):
            with_mode = f"with {mode}" if mode else "without --simulate"
            parser.error(f"{flag} has no effect {with_mode} ({why}): leave one of them out")


def simulated(prof, model, plans, max_wall, engine=None):
    """Lines of the K plans re-ranked by simulated step time, with both all-reduce times."""
    from ..sim.virtual import WallLimit
    from ..sim.simgrid import SimGridUnavailable
    from ..sim.simulate import rerank, resolve_engine
    try:
        engine = resolve_engine(engine)
        ranked = rerank(prof, model, plans, max_wall, engine)
    except (WallLimit, SimGridUnavailable) as e:
        raise SystemExit(f"nnabla-torus-plan: {e}") from None
    lines = [f"# re-ranked by simulated step time (simulated / closed-form all-reduce, ms; "
             f"engine: {engine})",
             "  gpus     grid    algorithm  sim_ms  model_ms  sim_step_s  model_step_s"]
    comp = model_of(prof, model)
    for plan, sim, step in ranked:
        model_ms = float(costmodel.step_terms(prof.network, comp, plan.algorithm, plan.gpus,
                                              plan.local_batch, plan.accum_steps,
                                              parse_grid(plan.grid).x)["allreduce"]) * 1e3
        lines.append(f"{plan.gpus:>6d} {plan.grid:>8s} {plan.algorithm:>12s} {sim * 1e3:7.2f} "
                     f"{model_ms:9.2f} {step:11.4f} {plan.step_time_s:13.4f}")
    return lines


def format_row(plan):
    values = plan._asdict()
    return "  ".join(fmt.format(values[name]).rjust(w)
                     for (name, _, fmt), w in zip(COLUMNS, WIDTHS))


def shown(per_gpus, best, rows):
    """The table rows: all, or GPU counts that are powers of two plus the recommendation."""
    if rows == "all":
        return per_gpus
    return [p for p in per_gpus if p.gpus & (p.gpus - 1) == 0 or p.gpus == best.gpus]


def explain(prof, model, plan):
    """Lines giving each term of ``plan``'s step time (seconds, milliseconds shown)."""
    comp = model_of(prof, model)
    grid_x = parse_grid(plan.grid).x
    terms = costmodel.step_terms(prof.network, comp, plan.algorithm, plan.gpus,
                                 plan.local_batch, plan.accum_steps, grid_x)
    lines = [f"step time of {plan.gpus} GPUs, {plan.algorithm} on {plan.grid}, "
             f"{plan.local_batch} x {plan.accum_steps} per GPU, "
             f"{comp.grad_bytes / 1e6:.1f} MB of gradients, gamma={comp.gamma:g}:"]
    for name, value in terms.items():
        lines.append(f"  {name:<36s} {float(value) * 1e3:10.3f} ms")
    net = prof.network
    if registry_entry(plan.algorithm).layout != "world" and plan.gpus > 1:
        x, y = grid_x, plan.gpus // grid_x
        for rows, label in ((True, "row phases"), (False, "column phases")):
            crosses, flows = costmodel.grid_links(x, y, net.gpus_per_host, rows)
            line = f"  {label}: " + (f"cross hosts, {int(flows)} flow(s) out of a host"
                                     if crosses else "inside each host")
            if net.hosts_per_rack:
                crosses, flows = costmodel.rack_links(net, x, y, rows)
                line += (f"; cross the spine, {int(flows)} flow(s) out of a rack" if crosses
                         else "; inside each rack")
            lines.append(line)
    return lines


def plot(path, result):
    """PNG: step time and scaling efficiency per GPU count, one line per algorithm.

    Drawn at the recommendation's per-GPU batch and accumulation (best grid per GPU count).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols, best = result.candidates, result.best
    same_batch = (cols["local_batch"] == best.local_batch) & (cols["accum_steps"] == best.accum_steps)
    fig, (ax_time, ax_eff) = plt.subplots(1, 2, figsize=(11, 4))
    fig.suptitle(f"{best.local_batch} per GPU x {best.accum_steps} accumulation", fontsize=10)
    for a, name in enumerate(ALGORITHMS):
        idx = planner.best_per_gpus(cols, same_batch & (cols["algorithm"] == a))
        if len(idx) == 0:
            continue
        ax_time.plot(cols["gpus"][idx], cols["step_time_s"][idx] * 1e3, label=name)
        ax_eff.plot(cols["gpus"][idx], cols["scaling_efficiency"][idx] * 100, label=name)
    for ax, label in ((ax_time, "predicted step time (ms)"),
                      (ax_eff, "predicted scaling efficiency (%)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_schedule(args, prof, common, report, out):
    """The plan of each phase of ``--schedule``: print the table, return the report."""
    if args.local_batch is None:
        raise SystemExit("--schedule needs --local-batch (images per GPU in every phase)")
    phases = planner.plan_schedule(prof, args.model, args.schedule, args.local_batch, **common)
    print(f"# model {args.model}: schedule {args.schedule} at {args.local_batch} per GPU",
          file=out)
    print(" epoch " + HEADER, file=out)
    for start, best in phases:
        print(f"{start:6g} " + format_row(best), file=out)
        if args.explain:
            print("\n".join(explain(prof, args.model, best)), file=out)
    report["phases"] = [dict(start_epoch=s, **p._asdict()) for s, p in phases]
    if args.simulate:
        print("\n".join(simulated(prof, args.model, [p for _, p in phases][:args.simulate],
                                   args.max_wall, args.sim_engine)), file=out)
    return report


def run_table(args, prof, common, report, out):
    """The best plan of each GPU count and the recommendation: print them, return the report.
    """
    batch = dict(max_gpus=args.max_gpus, counts=args.gpus,
                 local_batches=None if args.local_batch is None else [args.local_batch], **common)
    try:
        result = planner.plan(prof, args.model, target_batch=args.batch, **batch)
    except planner.UnsplittableBatch as e:
        if not args.nearest_batch:
            raise ValueError(f"{e}: ask for one of them, or pass --nearest-batch to plan the "
                             f"nearest") from None
        result = planner.plan(prof, args.model, target_batch=e.nearest, **batch)
        print(f"# --batch {e.batch} cannot be split over these candidates: planned the nearest "
              f"feasible global batch {e.nearest} instead (--nearest-batch)", file=out)
        report.update(batch_asked=e.batch, batch_planned=e.nearest)
    best = result.best
    print(f"# model {args.model}: {len(result.candidates['gpus'])} candidates planned in "
          f"{result.seconds:.3f} s", file=out)
    print(HEADER, file=out)
    for plan in shown(result.per_gpus, best, args.rows):
        print(format_row(plan) + ("  <- recommended" if plan.gpus == best.gpus else ""),
              file=out)
    print(f"recommendation: {best.gpus} GPUs, {best.algorithm} on grid {best.grid}, "
          f"{best.local_batch} per GPU x {best.accum_steps} accumulation = global batch "
          f"{best.global_batch:,}; {best.images_per_s:,.0f} images/s, scaling efficiency "
          f"{best.scaling_efficiency:.1%}, predicted time to train {best.time_to_train_s:,.1f} s "
          f"(statistical efficiency {best.statistical_efficiency:.0%}: "
          f"{report['statistical_efficiency_source']})", file=out)
    if args.explain:
        print("\n".join(explain(prof, args.model, best)), file=out)
    if args.plot:
        plot(args.plot, result)
    if args.simulate:
        top = sorted(result.per_gpus, key=lambda p: -p.goodput)[:args.simulate]
        print("\n".join(simulated(prof, args.model, top, args.max_wall, args.sim_engine)),
              file=out)
    report.update(recommendation=best._asdict(), planning_seconds=result.seconds,
                  per_gpus=[p._asdict() for p in result.per_gpus])
    return report


def priced_model(args, prof):
    """(profile, note): ``prof`` with ``args.model`` priced from --gflops-per-image and
    --params when the profile does not know it (note: how; '' when it does)."""
    given = args.gflops_per_image is not None or args.params is not None
    if args.model in prof.models:
        if given:
            raise ValueError(f"profile {prof.name!r} has model {args.model!r} calibrated: "
                             f"leave out --gflops-per-image and --params, or use another name")
        return prof, ""
    if args.gflops_per_image is None or args.params is None:
        raise ValueError(f"profile {prof.name!r} has no model {args.model!r}; it has "
                         f"{sorted(prof.models)}: give --gflops-per-image and --params to price "
                         f"it from its own cost, or calibrate it with tools/calibrate.py")
    ref = prof.models[model_cost.reference_model(prof, args.gflops_per_image) or
                      sorted(prof.models)[0]]
    comp, note = model_cost.priced_compute(prof, args.gflops_per_image, 2 * args.params,
                                           ref.max_local_batch)
    return prof._replace(models={**prof.models, args.model: comp}), f"model {args.model}: {note}"


def describe(prof, why, model_note):
    """The plan's first lines: the profile and why it was used, its reshaping, the model."""
    lines = [f"# profile {prof.name} ({why}): {prof.hosts} hosts x "
             f"{prof.network.gpus_per_host} GPUs, inter-host {prof.network.inter.bandwidth_Bps / 1e9:g} "
             f"GB/s per host"]
    lines += [f"# reshaped: {n}" for n in prof.extra.get("shape", [])]
    lines += [f"# {model_note}"] if model_note else []
    return lines


def run(args, out=sys.stdout):
    name, why = resolve_profile(args.profile, gpus=True)
    prof = load_profile(name, shape_of(args))
    prof, model_note = priced_model(args, prof)
    head = describe(prof, why, model_note)
    if args.recipe:
        print("\n".join(head), file=out)
        return {"profile": prof.name, "model": args.model, **run_recipe(args, prof, out)}
    if args.fit_recipe:
        raise ValueError("--fit-recipe needs --recipe (the recipe to predict after the fit)")
    stat = large_batch.efficiency_source(args.model, args.noise_scale,
                                         batch_fixed=args.batch is not None or bool(args.schedule))
    common = dict(algorithms=args.algorithms.split(","), b_noise=args.noise_scale,
                  base_batch=args.base_batch, dataset_size=args.dataset_size,
                  epochs=args.epochs, min_efficiency=args.min_efficiency,
                  beyond_profile=args.allow_beyond_profile)
    print("\n".join(head + [f"# {stat.line}"]), file=out)
    report = {"profile": prof.name, "profile_reason": why, "model": args.model,
              "reshaped": prof.extra.get("shape", []), "model_note": model_note,
              "statistical_efficiency_source": stat.kind, "statistical_efficiency": stat.line}
    if args.schedule:
        return run_schedule(args, prof, common, report, out)
    return run_table(args, prof, dict(common, max_global_batch=stat.max_batch), report, out)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_ignored(parser, args)
    try:
        report = run(args, out=sys.stderr if args.json == "-" else sys.stdout)
    except ValueError as e:
        raise SystemExit(f"nnabla-torus-plan: {e}")
    if args.json:
        text = json.dumps(report, indent=1, default=lambda v: np.asarray(v).tolist())
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
