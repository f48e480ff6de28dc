"""What nnabla-torus-plan shows of a plan: the table's rows, the terms of ``--explain``, the
PNG of ``--plot`` and the lines of ``--simulate``'s re-ranking.
"""
from ..comm.collectives import registry_entry
from ..comm.topology import parse_grid
from ..files import atomic_path
from ..planning import costmodel, goodput, planner
from ..planning.costmodel import ALGORITHMS
from ..planning.fixed_costs import run_costs
from ..planning.candidates import gpus_text
from ..planning.machine_profile import model_of

# (Plan field, column title, value format, scale); every title is the full name, no legend
# needed. --explain prints the step time and time to train in the same units and digits.
COLUMNS = [("gpus", "GPUs", "{:d}", 1), ("grid", "grid", "{}", 1),
           ("algorithm", "algorithm", "{}", 1), ("local_batch", "per-GPU batch", "{:d}", 1),
           ("accum_steps", "accumulation", "{:d}", 1),
           ("global_batch", "global batch", "{:,d}", 1),
           ("step_time_s", "step time (ms)", "{:.3f}", 1e3),
           ("images_per_s", "images/s", "{:,.0f}", 1),
           ("scaling_efficiency", "scaling efficiency", "{:.1%}", 1),
           ("statistical_efficiency", "statistical efficiency", "{:.1%}", 1),
           ("time_to_train_s", "time to train (s)", "{:,.1f}", 1)]
WIDTHS = [max(len(title), 10) for _, title, _, _ in COLUMNS]
HEADER = "  ".join(title.rjust(w) for (_, title, _, _), w in zip(COLUMNS, WIDTHS))


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


def compute_source(prof, model):
    """Where the profile's compute of ``model`` comes from, and whether it is assumed."""
    calibration = (prof.extra or {}).get("calibration") or {}
    if "compute_source" in calibration:
        return calibration["compute_source"]
    if "step_mdape" in calibration:
        return "measured on the profile's machine by tools/calibrate.py"
    return "the profile's values, source not stated in the profile (*assumed*)"


def provenance(prof, model, model_note, best, dataset_size, epochs):
    """(lines, report entries): what the plan's time to train includes, where its compute comes
    from, and the model error its recommendation respects."""
    comp = model_of(prof, model)
    error = goodput.model_error_of(prof)
    source = model_note or f"model {model}: {compute_source(prof, model)}"
    includes = (f"{epochs:g} epochs of {dataset_size:,} images at the predicted images/s "
                f"({best.training_s:,.1f} s) + start-up, validation and input stalls "
                f"({best.fixed_s:,.1f} s; --explain gives each)")
    lines = [f"# time to train: {includes}",
             f"# compute: {source}; a {comp.a_s * 1e3:.3f} ms + b {comp.b_s * 1e3:.4g} ms per "
             f"image, gamma {comp.gamma:g}; model error {error:.1%}"]
    return lines, {"epochs": epochs, "dataset_size": dataset_size,
                   "time_to_train_includes": includes, "model_note": source,
                   "model_error": error}


def native_line(prof, model, result):
    """A line on nnabla's native all-reduce (through its callback): the path train.py then
    takes when it is recommended, else why not ('' when no native candidate has the
    recommendation's GPUs and batch, or on one GPU)."""
    best, cols = result.best, result.candidates
    comp = model_of(prof, model)
    if best.algorithm == "native":
        sync = float(costmodel.callback_sync_s(prof.network, comp, best.gpus)) * 1e3
        return (f"# native: nnabla's own all_reduce_callback, overlapped with backward (the path "
                f"nnabla itself uses most); train.py runs it with no overlap trial; its "
                f"{comp.grad_arrays} one-byte MPI all-reduces cost {sync:.2f} ms a step"
                if best.gpus > 1 and comp.grad_arrays else "")
    same = ((cols["algorithm"] == ALGORITHMS.index("native")) & (cols["gpus"] == best.gpus)
            & (cols["local_batch"] == best.local_batch)
            & (cols["accum_steps"] == best.accum_steps))
    if not same.any():
        return ""
    i = int(same.nonzero()[0][0])
    sync = float(costmodel.callback_sync_s(prof.network, comp, best.gpus)) * 1e3
    slower = cols["time_to_train_s"][i] / best.time_to_train_s - 1
    return (f"# native (nnabla's all_reduce_callback, overlapped with backward) on the same GPUs "
            f"and batch: {slower:.1%} slower by the model, beyond its error; its "
            f"{comp.grad_arrays} one-byte MPI all-reduces cost {sync:.1f} ms a step")


def topology_text(plan):
    """``"ring on grid 4x2"``; on one GPU there is no all-reduce to name."""
    return "no all-reduce" if plan.gpus == 1 else f"{plan.algorithm} on grid {plan.grid}"


def format_row(plan):
    values = plan._asdict()
    if plan.gpus == 1:                   # scored as a ring of one: nothing is all-reduced
        values.update(algorithm="none", grid="-")
    return "  ".join(fmt.format(values[name] * scale).rjust(w)     # a text's scale is 1
                     for (name, _, fmt, scale), w in zip(COLUMNS, WIDTHS))


def shown(per_gpus, best, rows):
    """The table rows: all, or GPU counts that are powers of two plus the recommendation."""
    if rows == "all":
        return per_gpus
    return [p for p in per_gpus if p.gpus & (p.gpus - 1) == 0 or p.gpus == best.gpus]


def _term(name, value_s, indent=2):
    """One --explain line: a term in milliseconds, as the table's step time."""
    return f"{' ' * indent}{name:<{40 - indent}s} {value_s * 1e3:10.3f} ms"


def step_lines(prof, model, plan):
    """--explain's lines of ``plan``'s step time: terms indented by two spaces sum to it (the
    all-reduce's phases, by four, sum to the all-reduce), then its scaling efficiency."""
    comp, net, run = model_of(prof, model), prof.network, run_costs(prof)
    b, s = plan.local_batch, plan.accum_steps
    terms = {k: float(v) for k, v in planner.step_terms(
        net, comp, run, plan.algorithm, plan.gpus, b, s, parse_grid(plan.grid).x).items()}
    keys = list(terms)
    phases = keys[1:keys.index("allreduce")]   # step_terms: compute, phases, allreduce, ...
    added = [k for k in keys if k not in ["compute", "allreduce", "total"] + phases]
    t_c, t_n = terms["compute"], terms["allreduce"]
    lines = [f"step time of {gpus_text(plan.gpus)}, {topology_text(plan)}, {b} x {s} per "
             f"GPU, {comp.grad_bytes / 1e6:.3g} MB of gradients in {comp.grad_arrays or '?'} "
             f"arrays (the terms sum to it):",
             _term(f"compute, {s} x {b} images", s * t_c),
             _term("all-reduce" + (" (one GPU: none)" if plan.gpus == 1 else ""), t_n)]
    lines += [_term(k, terms[k], 4) for k in phases if plan.gpus > 1]
    if comp.gamma != 1:
        hidden = float(costmodel.overlap(t_c, t_n, comp.gamma)) - t_c - t_n
        lines.append(_term(f"overlap of compute and all-reduce (gamma {comp.gamma:g})", hidden))
    lines += [_term(k, terms[k]) for k in added]
    lines.append(_term("step time", terms["total"]))
    one = float(planner.one_gpu_step_s(net, comp, run, b, s))
    lines.append(f"scaling efficiency: one GPU's step {one * 1e3:.3f} ms / "
                 f"{terms['total'] * 1e3:.3f} ms = {one / terms['total']:.1%}")
    return lines


def train_lines(prof, plan, dataset_size, epochs):
    """--explain's lines of ``plan``'s time to train: terms indented by two spaces sum to it."""
    fixed = planner.run_fixed_seconds(run_costs(prof), prof.network.gpus_per_host, plan.gpus,
                                      plan.global_batch, dataset_size, epochs)
    lines = ["time to train (the terms sum to it):",
             f"  {'training: ' + f'{epochs:g} epochs of {dataset_size:,} images':<38s} "
             f"{plan.training_s:10,.1f} s"]
    lines += [f"  {name.replace('_', ' '):<38s} {float(v):10,.1f} s" for name, v in fixed.items()]
    return lines + [f"  {'time to train':<38s} {plan.time_to_train_s:10,.1f} s"]


def explain(prof, model, plan, dataset_size, epochs):
    """Lines giving each term of ``plan``'s row: its step time (ms) and scaling efficiency, the
    grid's links, its time to train (s); each sum is the table's value to its last digit."""
    lines = step_lines(prof, model, plan)
    net = prof.network
    if registry_entry(plan.algorithm).layout != "world" and plan.gpus > 1:
        x = parse_grid(plan.grid).x
        y = plan.gpus // x
        for rows, label in ((True, "row phases"), (False, "column phases")):
            crosses, flows = costmodel.grid_links(x, y, net.gpus_per_host, rows)
            line = f"  {label}: " + (f"cross hosts, {int(flows)} flow(s) out of a host"
                                     if crosses else "inside each host")
            if net.hosts_per_rack:
                crosses, flows = costmodel.rack_links(net, x, y, rows)
                line += (f"; cross the spine, {int(flows)} flow(s) out of a rack" if crosses
                         else "; inside each rack")
            lines.append(line)
    return lines + train_lines(prof, plan, dataset_size, epochs)


def plot(path, result):
    """PNG: step time and scaling efficiency per GPU count, one line per algorithm.

    Drawn at the recommendation's per-GPU batch and accumulation (best grid per GPU count).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols, best = result.candidates, result.best
    same_batch = ((cols["local_batch"] == best.local_batch)
                  & (cols["accum_steps"] == best.accum_steps))
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
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=100)
    plt.close(fig)
