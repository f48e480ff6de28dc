"""Print the cost model against published ResNet-50 runs: predicted / published images/s and
time to train for every run of nnabla_torus/planning/published_throughput.py, from the shipped
profiles (docs/fidelity.md is this output).

    python tools/research/fidelity.py          # the table (markdown)
    python tools/research/fidelity.py --fit    # the least-squares fit beside the shipped
                                               # profile values
    python tools/research/fidelity.py --sony   # Sony's v1 and v2 on abci, term by term, before
                                               # and after one calibration of ABCI (b_ms fitted
                                               # to v1's 224 s)

Predicted time to train: the run's epochs x 1,281,167 images at the predicted images/s
(training only); the published one (MLPerf: run_start to run_stop) also counts evaluation.
"""
import argparse

from nnabla_torus.comm.topology import parse_grid
from nnabla_torus.planning import costmodel, fidelity, run_forecast
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.planning.published_throughput import RUNS, runs

HEADER = ("| role | profile | run | GPUs | per-GPU batch | images/s published | predicted | "
          "error | epochs | time to train published (s) | predicted (s) | error |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def _pct(value):
    return "-" if value is None else f"{value:+.1%}"


def row(run):
    """One markdown row: the run predicted from its shipped profile against the published."""
    p = fidelity.predict(run)
    time_error = p.time_s / run.time_s - 1 if run.time_s and p.time_s else None
    published_s = f"{run.time_s:,.0f}" if run.time_s else "-"
    predicted_s = f"{p.time_s:,.0f}" if run.time_s and p.time_s else "-"
    note = f" ({run.note})" if run.note else ""
    return (f"| {run.role} | {run.profile} | {run.system}{note} | "
            f"{run.nodes * run.gpus_per_node:,} | {run.local_batch} | {run.images_per_s:,.0f} | "
            f"{p.images_per_s:,.0f} | {_pct(p.images_per_s / run.images_per_s - 1)} | "
            f"{run.epochs or '-'} | {published_s} | {predicted_s} | {_pct(time_error)} |")


def table():
    """The markdown table of every run, then one summary line per role."""
    lines = [HEADER] + [row(r) for r in RUNS]
    for role in ("fit", "check"):
        errors = [abs(e) for e in fidelity.errors(role=role).values()]
        lines.append(f"\n{role}: {len(errors)} runs, images/s error median "
                     f"{sorted(errors)[len(errors) // 2]:.1%}, largest {max(errors):.1%}")
    return "\n".join(lines)


def fit_report():
    """The fit beside the shipped values (the profiles hold it rounded)."""
    result = fidelity.fit()
    lines = [f"a_ms {result.a_s * 1e3:.3f}, gamma {result.gamma:g} (every GPU)"]
    for name, b_s in sorted(result.b_s.items()):
        comp = load_profile(name).models[fidelity.MODEL]
        lines.append(f"{name}: b_ms fitted {b_s * 1e3:.4f}, shipped {comp.b_s * 1e3:.4f}; "
                     f"a_ms shipped {comp.a_s * 1e3:.3f}; gamma shipped {comp.gamma:g}; "
                     f"{len(runs(name, 'fit'))} fitting runs")
    return "\n".join(lines)


def step_rows(prof, phase):
    """{term: ms} of one phase's step on ``prof`` (costmodel.step_terms, the phase's plan)."""
    plan = phase.plan
    terms = costmodel.step_terms(prof.network, prof.models[fidelity.MODEL], plan.algorithm,
                                 plan.gpus, plan.local_batch, plan.accum_steps,
                                 parse_grid(plan.grid).x)
    keep = ("compute", "allreduce", "overlap_with_backward", "callback_sync", "finite_check")
    rows = {k: float(terms[k]) * 1e3 for k in keep if k in terms}
    rows["input wait"] = (plan.step_time_s - float(terms["total"])) * 1e3
    rows["step"] = plan.step_time_s * 1e3
    return rows


def sony_report():
    """Sony's v1 and v2 on abci: each phase's step by term as shipped and after one calibration
    of ABCI (b_ms fitted to v1's published 224 s), and the run's time against the published."""
    prof = load_profile("abci")
    v1, v2 = run_forecast.load_recipe("sony-224s"), run_forecast.load_recipe("sony-122s")
    b_s = run_forecast.fit_compute(prof, fidelity.MODEL, v1, v1.expected["time_s"])
    fitted = run_forecast.with_compute(prof, fidelity.MODEL, b_s)
    shipped_run = run_forecast.predict_run(prof, fidelity.MODEL, v1)
    fitted_run = run_forecast.predict_run(fitted, fidelity.MODEL, v1)
    lines = [f"calibration: b_ms {prof.models[fidelity.MODEL].b_s * 1e3:.4f} (fitted to "
             f"NVIDIA's MXNet runs) -> {b_s * 1e3:.4f} (fitted to v1's 224 s)",
             "| phase (GPUs, grid, algorithm) | term | shipped (ms) | calibrated (ms) |",
             "| --- | --- | --- | --- |"]
    for before, after in zip(shipped_run.phases, fitted_run.phases):
        head = (f"epoch {before.start_epoch:g}: {before.plan.gpus:,} GPUs, {before.plan.grid} / "
                f"{after.plan.grid}, {before.plan.algorithm}")
        b_rows, a_rows = step_rows(prof, before), step_rows(fitted, after)
        lines += [f"| {head} | {k} | {v:.1f} | {a_rows[k]:.1f} |" for k, v in b_rows.items()]
    for what, run in (("shipped", shipped_run), ("calibrated", fitted_run)):
        lines.append(f"\n{what}: steps {sum(p.steps for p in run.phases):,}, "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in run.fixed.items())
                     + f"; time without start-up {run.timed_s:.1f} s against v1's 224 s")
    v2_run = run_forecast.predict_run(fitted, fidelity.MODEL, v2)
    lines.append(f"\nv2 (v1's schedule and GPUs kept, *assumed*), calibrated: "
                 f"{v2_run.timed_s:.1f} s against 122 s ({v2_run.timed_s / 122 - 1:+.1%})")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true",
                        help="print the least-squares fit beside the shipped values instead")
    parser.add_argument("--sony", action="store_true",
                        help="print Sony's v1 and v2 on abci term by term instead")
    args = parser.parse_args(argv)
    print(fit_report() if args.fit else sony_report() if args.sony else table())


if __name__ == "__main__":
    main()
