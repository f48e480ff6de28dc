"""nnabla-torus-plan --recipe: a training recipe's predicted end-to-end time beside the
figures it states as published, after an optional fit of the per-image compute (--fit-recipe).

One pass over the recipe's phases: the planner plans each phase once
(:func:`nnabla_torus.planning.planner.plan_schedule`), the forecast sums them
(:func:`nnabla_torus.planning.run_forecast.sum_phases`).
"""
from ..planning import planner, run_forecast
from ..planning.machine_profile import model_of
from .plan_knobs import DEFAULT_EPOCHS
from .plan_output import compute_source


def published_rows(prof, model, recipe, prediction, fitted_on):
    """(what, published, predicted, error) rows for the figures ``recipe.expected`` states."""
    rows, expected = [], recipe.expected
    if "time_s" in expected:
        note = " (fitted to it)" if fitted_on == recipe.name else ""
        err = prediction.timed_s / expected["time_s"] - 1
        rows.append(("time to train, start-up excluded", f"{expected['time_s']:g} s",
                     f"{prediction.timed_s:.1f} s", f"{err:+.1%}{note}"))
    if "scaling_efficiency" in expected and "scaling_gpus" in expected:
        eff = planner.predict_efficiency(prof, model, int(expected["scaling_gpus"]),
                                         recipe.local_batch)
        rows.append((f"scaling efficiency, {expected['scaling_gpus']} GPUs",
                     f"{expected['scaling_efficiency']:.2%}", f"{eff:.2%}",
                     f"{(eff - expected['scaling_efficiency']) * 100:+.2f} points"))
    if "gpus" in expected:
        gpus = max(ph.plan.gpus for ph in prediction.phases)
        rows.append(("GPUs (largest phase)", f"{expected['gpus']:g}", f"{gpus}",
                     f"{gpus - expected['gpus']:+g} (batch / local_batch)"))
    if "top1" in expected:
        rows.append(("top-1", f"{expected['top1']:.2%}", "-", "not modelled"))
    return rows


def fitted_profile(args, prof, recipe):
    """--fit-recipe: (``prof`` with the model's b_ms fitted to that recipe's published time,
    the line saying so, the report's entries)."""
    fit = run_forecast.load_recipe(args.fit_recipe)   # its own epochs: its published time's
    if "time_s" not in fit.expected:
        raise ValueError(f"--fit-recipe {fit.name} states no published expected.time_s")
    b_s = run_forecast.fit_compute(prof, args.model, fit, fit.expected["time_s"],
                                   args.dataset_size)
    comp = model_of(prof, args.model)
    step = comp.a_s + b_s * recipe.local_batch
    line = (f"# fitted b_ms = {b_s * 1e3:.4f} ms per image (profile: "
            f"{comp.b_s * 1e3:.4f}) to {fit.name}'s published "
            f"{fit.expected['time_s']:g} s:"
            f" compute {step * 1e3:.1f} ms per step of {recipe.local_batch} "
            f"({recipe.local_batch / step:.0f} images/s per GPU)")
    return (run_forecast.with_compute(prof, args.model, b_s), line,
            {"fitted_b_ms": b_s * 1e3, "fitted_on": fit.name})


def run_recipe(args, prof, out):
    """--recipe: the whole-run prediction, after an optional fit of b_ms (--fit-recipe)."""
    given = args.epochs != DEFAULT_EPOCHS
    recipe = run_forecast.load_recipe(args.recipe, args.epochs if given else None)
    report = {"recipe": recipe.name}
    lines = [f"# recipe {recipe.name} on profile {prof.name}, model {args.model}: "
             f"{recipe.epochs:g} epochs" + (" (--epochs)" if given else " (the recipe's)")]
    if args.fit_recipe:
        prof, line, fitted = fitted_profile(args, prof, recipe)
        lines.append(line)
        report.update(fitted)
    phases = planner.plan_schedule(prof, args.model, recipe.schedule, recipe.local_batch,
                                   algorithms=run_forecast.recipe_algorithms(
                                       recipe, args.algorithms.split(",")),
                                   dataset_size=args.dataset_size, epochs=recipe.epochs)
    pred = run_forecast.sum_phases(prof, recipe, phases, args.dataset_size)
    lines.append(" epoch epochs  global   gpus     grid    algorithm  steps    step_s  seconds")
    for ph in pred.phases:
        p = ph.plan
        lines.append(f"{ph.start_epoch:6g} {ph.epochs:6g} {p.global_batch:7d} {p.gpus:6d} "
                     f"{p.grid:>8s} {p.algorithm:>12s} {ph.steps:6d} {p.step_time_s:9.4f} "
                     f"{ph.seconds:8.1f}")
    lines.append("fixed costs (profile run:): " + ", ".join(
        f"{k} {v:.1f} s" for k, v in pred.fixed.items()))
    lines.append(f"# compute: {compute_source(prof, args.model)}" +
                 (" (b_ms refitted above)" if args.fit_recipe else ""))
    lines.append(f"predicted end-to-end time: {pred.total_s:.1f} s")
    rows = published_rows(prof, args.model, recipe, pred, report.get("fitted_on"))
    if rows:
        lines.append(f"{'':<34s} {'published':>10s} {'predicted':>10s}  error")
        lines += [f"{what:<34s} {pub:>10s} {got:>10s}  {err}" for what, pub, got, err in rows]
    print("\n".join(lines), file=out)
    report.update(total_s=pred.total_s, timed_s=pred.timed_s, fixed=pred.fixed,
                  published=rows, epochs=recipe.epochs,
                  compute_source=compute_source(prof, args.model),
                  phases=[dict(start_epoch=ph.start_epoch, epochs=ph.epochs, steps=ph.steps,
                               seconds=ph.seconds, **ph.plan._asdict()) for ph in pred.phases])
    return report
