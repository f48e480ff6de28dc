"""Print the cost model against published ResNet-50 runs: predicted / published images/s and
time to train for every run of nnabla_torus/planning/published_throughput.py, from the shipped
profiles (docs/fidelity.md is this output).

    python tools/fidelity.py          # the table (markdown)
    python tools/fidelity.py --fit    # the least-squares fit beside the shipped profile values

Predicted time to train: the run's epochs x 1,281,167 images at the predicted images/s
(training only); the published one (MLPerf: run_start to run_stop) also counts evaluation.
"""
import argparse

from nnabla_torus.planning import fidelity
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true",
                        help="print the least-squares fit beside the shipped values instead")
    args = parser.parse_args(argv)
    print(fit_report() if args.fit else table())


if __name__ == "__main__":
    main()
