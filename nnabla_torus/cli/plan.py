"""nnabla-torus-plan: how many GPUs, which grid, algorithm and batch, from a cluster profile.

Examples::

    nnabla-torus-plan --profile abci --model resnet50 --schedule 0:34816,5:69632 --local-batch 32
    nnabla-torus-plan --profile abci --noise-scale 20000 --max-gpus 4096 --plot plan.png --explain
    nnabla-torus-plan --profile cpu-2core --model resnet18-w0.125-16px --json -
    nnabla-torus-plan --profile abci --recipe sony-122s --fit-recipe sony-224s
    nnabla-torus-plan --profile dgx-h100 --hosts 2 --nnp digits.nnp --dataset-size 60000

``--nnp FILE`` or ``--model-fn MODULE:FUNCTION`` plans for a model of your own: its parameter
arrays, bytes and FLOPs are counted from its nnabla graph, and start-up, validation and the
input pipeline come from your data (``--startup-s``, ``--val-images``, ``--loader-rate``)
or are left out, each with a line saying so.

Prints one row per candidate GPU count (its best grid, algorithm and batch), then the
recommendation. With ``--recipe`` it predicts the recipe's end-to-end training time instead
(per phase, plus the profile's fixed costs) beside the figures the recipe states as
published. Every flag has an environment twin: NNABLA_TORUS_PLAN_* (``--max-gpus``:
NNABLA_TORUS_PLAN_MAX_GPUS), except ``--profile``, which shares NNABLA_TORUS_PROFILE with
train.py.
"""
import argparse
import json
import math
import sys

import numpy as np

from ..files import atomic_open
from ..planning import large_batch, model_cost, planner
from ..planning.fixed_costs import run_costs, with_own_data
from ..planning.candidates import gpus_text
from ..planning.machine_profile import load_profile, resolve_profile, shape_of
from ..planning.model_source import own_model_cost
from .plan_knobs import add_plan_knobs, refuse_ignored
from .plan_output import (HEADER, explain, format_row, native_line, plot, provenance, shown,
                          simulated, topology_text)
from .plan_recipe import run_recipe


def build_parser():
    parser = argparse.ArgumentParser(prog="nnabla-torus-plan", description=__doc__.split("\n")[0])
    add_plan_knobs(parser)
    return parser


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
            print("\n".join(explain(prof, args.model, best, args.dataset_size, args.epochs)),
                  file=out)
    lines, entries = provenance(prof, args.model, report["model_note"], phases[-1][1],
                                args.dataset_size, args.epochs)
    print("\n".join(["# each phase's time to train is the whole run's at that phase's plan"] +
                    lines), file=out)
    report.update(entries)
    report["phases"] = [dict(start_epoch=s, **p._asdict()) for s, p in phases]
    if args.simulate:
        print("\n".join(simulated(prof, args.model, [p for _, p in phases][:args.simulate],
                                   args.max_wall, args.sim_engine)), file=out)
    return report


def run_table(args, prof, common, report, out):
    """The best plan of each GPU count and the recommendation: print them, return the report.
    """
    # a global batch above the dataset repeats images within one step: never recommended
    # unless asked for (--batch)
    dataset_caps = args.batch is None and args.dataset_size < (common["max_global_batch"]
                                                               or math.inf)
    if dataset_caps:
        common = dict(common, max_global_batch=args.dataset_size)
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
    print(f"recommendation: {gpus_text(best.gpus)}, {topology_text(best)}, "
          f"{best.local_batch} per GPU x {best.accum_steps} accumulation = global batch "
          f"{best.global_batch:,}; {best.images_per_s:,.0f} images/s, scaling efficiency "
          f"{best.scaling_efficiency:.1%}, predicted time to train {best.time_to_train_s:,.1f} s "
          f"(statistical efficiency {best.statistical_efficiency:.0%}: "
          f"{report['statistical_efficiency_source']})", file=out)
    lines, entries = provenance(prof, args.model, report["model_note"], best,
                                args.dataset_size, args.epochs)
    if result.kept:
        lines.insert(0, f"# simplest within the model's error: {result.kept}")
    above = int((result.candidates["global_batch"] > args.dataset_size).sum()) * dataset_caps
    if above:
        lines.insert(0, f"# {above:,} candidates not considered: their global batch is above the "
                        f"{args.dataset_size:,} images of --dataset-size (one step would see an "
                        f"image twice)")
    lines[:0] = [line for line in [native_line(prof, args.model, result)] if line]
    print("\n".join(lines), file=out)
    report.update(entries, kept=result.kept, above_dataset_left_out=above)
    if args.explain:
        print("\n".join(explain(prof, args.model, best, args.dataset_size, args.epochs)),
              file=out)
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
    """(profile, model name, note, report entries): ``prof`` with the model to plan: one of
    the profile's (--model; note ''), or one priced from its own cost, counted from --nnp /
    --model-fn or given by --gflops-per-image, --params and --param-arrays."""
    name, cost = own_model_cost(args.nnp, args.nnp_network, args.model_fn)
    if name is not None:
        gflops, params, arrays = cost.gflops_per_image, cost.params, len(cost.param_shapes)
        counted = (f"counted from its graph: {arrays} parameter arrays, {params:,} "
                   f"parameters ({2 * params / 1e6:.3g} MB of FP16 gradients)" +
                   (f", multiply-adds of {', '.join(cost.uncounted)} not counted"
                    if cost.uncounted else "") + "; ")
    else:
        name, counted = args.model, ""
        given = args.gflops_per_image is not None or args.params is not None
        if name in prof.models:
            if given:
                raise ValueError(f"profile {prof.name!r} has model {name!r} calibrated: leave "
                                 f"out --gflops-per-image and --params, or use another name")
            return prof, name, "", {}
        if args.gflops_per_image is None or args.params is None:
            raise ValueError(f"profile {prof.name!r} has no model {name!r}; it has "
                             f"{sorted(prof.models)}: give --gflops-per-image and --params to "
                             f"price it from its own cost (--nnp FILE or --model-fn "
                             f"MODULE:FUNCTION counts them), or calibrate it with "
                             f"tools/calibrate.py")
        gflops, params, arrays = args.gflops_per_image, args.params, args.param_arrays or 0
    ref = prof.models[model_cost.reference_model(prof, gflops) or sorted(prof.models)[0]]
    comp, note = model_cost.priced_compute(prof, gflops, 2 * params, ref.max_local_batch,
                                           arrays)
    if not arrays:
        note += ("; its parameter arrays are unknown: nnabla's per-array callback checks are "
                 "left out (--param-arrays gives them)")
    entries = {"gflops_per_image": gflops, "params": params, "param_arrays": arrays,
               "param_shapes": [list(s) for s in cost.param_shapes] if cost else None}
    return (prof._replace(models={**prof.models, name: comp}), name,
            f"model {name}: {counted}{note}", entries)


def own_data(args, prof, model, own):
    """(profile, notes): ``prof`` with its run: block's start-up, validation and input pipeline
    from --startup-s, --val-images and --loader-rate, or, for a model of the user's own
    (``own``), left out where not given; ``args.dataset_size`` resolved (ImageNet's for the
    profile's own models, which are ImageNet models)."""
    if args.dataset_size is None:
        if own:
            raise ValueError(f"model {model}: give --dataset-size (training images per epoch); "
                             f"ImageNet's {planner.IMAGENET_TRAIN_IMAGES:,} is for the "
                             f"profile's own models")
        args.dataset_size = planner.IMAGENET_TRAIN_IMAGES
    run, notes = with_own_data(run_costs(prof), prof.models[model].b_s, own, args.startup_s,
                               args.val_images, args.validate_every, args.loader_rate)
    return prof._replace(extra={**prof.extra, "run": run}), notes


def describe(prof, why, model_note, data_notes):
    """The plan's first lines: the profile and why it was used, its reshaping, the model, what
    of the run is left out."""
    lines = [f"# profile {prof.name} ({why}): {prof.hosts} hosts x "
             f"{prof.network.gpus_per_host} GPUs, inter-host "
             f"{prof.network.inter.bandwidth_Bps / 1e9:g} GB/s per host"]
    lines += [f"# reshaped: {n}" for n in prof.extra.get("shape", [])]
    lines += [f"# {model_note}"] if model_note else []
    return lines + [f"# {note}" for note in data_notes]


def run(args, out=sys.stdout):
    name, why = resolve_profile(args.profile, gpus=True)
    prof = load_profile(name, shape_of(args))
    prof, args.model, model_note, model_entries = priced_model(args, prof)   # args: resolved
    prof, data_notes = own_data(args, prof, args.model, bool(model_entries))
    head = describe(prof, why, model_note, data_notes)
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
              "model_cost": model_entries, "left_out": data_notes,
              "statistical_efficiency_source": stat.kind, "statistical_efficiency": stat.line}
    if args.schedule:
        return run_schedule(args, prof, common, report, out)
    return run_table(args, prof, dict(common, max_global_batch=stat.max_batch), report, out)


def main(argv=None):
    """Every error one line: a bad flag (argparse's usage line), a bad NNABLA_TORUS_PLAN_*
    value, a profile or recipe that cannot be read, a JSON file that cannot be written."""
    try:
        parser = build_parser()          # reads the environment twins: their errors too
        args = parser.parse_args(argv)
        refuse_ignored(parser, args)
        report = run(args, out=sys.stderr if args.json == "-" else sys.stdout)
        if args.json:
            text = json.dumps(report, indent=1, default=lambda v: np.asarray(v).tolist())
            if args.json == "-":
                print(text)
            else:
                with atomic_open(args.json, "w") as f:
                    f.write(text + "\n")
    except (ValueError, OSError) as e:
        raise SystemExit(f"nnabla-torus-plan: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
