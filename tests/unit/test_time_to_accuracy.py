"""tools/time_to_accuracy.py: its log parsing (tools/accuracy_report.py), the abci prediction's
invariants (tools/abci_prediction.py), the model's optimum (tools/batch_optimum.py) and the
emulated cluster's profile."""
import math

import numpy as np
import pytest

from nnabla_torus.planning import costmodel
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.planning.step_refit import StepTimeRefit
from tools import abci_prediction, accuracy_report as rep, batch_optimum
from tools.emucluster.profile import emulated_profile

LOG = """resnet18 x0.125: 176,402 parameters, 1438 training / 359 validation images, 10 classes; 4
epoch 1.00 step 23: train loss 2.2873, val top-1 0.2535 top-5 0.7103, 322 images/s
16:30:23 epoch 2.00 step 46: train loss 2.1 (epoch mean), val top-1 0.91 top-5 0.99, \
466 images/s, epoch 19 s, ETA 21 s
epoch 3.00 step 69: train loss 2.0, val top-1 0.95 top-5 0.99, 466 images/s
{"val_top1": 0.95, "steps": 69, "batch_schedule": "0:64"}
""".splitlines(keepends=True)


def test_time_and_steps_to_the_target_come_from_the_first_line_that_reaches_it(tmp_path):
    lines = [(10.0 * i, line) for i, line in enumerate(LOG)]
    r = rep.record_of("fixed 64", 1, str(tmp_path), lines, 0.90)
    assert (r["time_s"], r["steps"], r["epoch"]) == (20.0, 46, 2.0)
    assert (r["best_top1"], r["final_top1"], r["dataset"], r["params"]) == (0.95, 0.95, 1438,
                                                                            176402)
    assert rep.record_of("fixed 64", 1, str(tmp_path), lines, 0.99)["time_s"] is None


def test_quarter_epoch_validations_time_the_target_without_the_validations(tmp_path):
    """--val-every 0.25: the target is known to a quarter epoch, and the seconds each
    validation took (its line's "(0.50 s)") are not the run's."""
    lines = [(4.0, "10:00:04 epoch 0.25 step 5: train loss 2.0 (mean since epoch 0.00), val "
                   "top-1 0.5 top-5 0.9 (0.50 s), 100 images/s, part 3 s, ETA 9 s"),
             (6.0, "10:00:06 epoch 0.50 step 10: train loss 1.5 (mean since epoch 0.25), val "
                   "top-1 0.91 top-5 0.99 (0.75 s), 100 images/s, part 1 s, ETA 6 s"),
             (7.0, '{"val_top1": 0.91, "steps": 10, "batch_schedule": "0:64"}')]
    r = rep.record_of("fixed 64", 1, str(tmp_path), lines, 0.90)
    assert (r["time_s"], r["epoch"], rep.val_interval(r)) == (4.75, 0.5, 0.25)
    assert rep.fixed_epochs([r]) == {64: [0.375]}       # half its interval before the line


@pytest.mark.parametrize("phi", [1e3, 1e5, 1e8])
def test_abci_goodput_is_never_much_slower_than_sonys_schedule(phi):
    # Sony's two phases are among the goodput policy's candidates, so with any noise scale
    # its time to the same progress is at most Sony's plus the hysteresis (5 %).
    curve = (np.array([0.0, 1.0]), np.array([phi, phi]))
    r = abci_prediction.predict_abci(curve, 1.0, load_profile("abci"), restart_s=0.0, steps=50)
    assert r["goodput_s"] <= r["fixed_s"] * 1.05
    assert r["optimum_s"] <= min(r["goodput_s"], r["fixed_s"]) * (1 + 1e-9)   # the bound
    assert min(p[2] for p in r["goodput_path"]) >= 34816          # B0 is the smallest batch
    assert max(p[1] for p in r["goodput_path"]) <= 2176
    if phi == 1e8:          # efficiency ~1 everywhere: progress = 90 epochs of images
        assert r["epochs_equivalent"] == pytest.approx(90.0, rel=1e-3)


@pytest.mark.parametrize("hosts, per_host", [(2, 2), (4, 2), (3, 1)])
def test_emulated_profile_keeps_the_machines_compute_and_shapes_the_link(hosts, per_host):
    # All emulated hosts share this machine: the compute of hosts x per_host ranks must be
    # what the base profile predicts for that many ranks on its one host.
    base = load_profile("cpu-2core")
    prof = emulated_profile(base, hosts, per_host, "20mbit")
    comp, ranks = prof.models["resnet18-w0.125-16px"], hosts * per_host
    one_host = costmodel.compute_time(base.models["resnet18-w0.125-16px"], ranks, 16, ranks)
    assert costmodel.compute_time(comp, ranks, 16, per_host) == pytest.approx(one_host)
    assert prof.network.inter.bandwidth_Bps == 20e6 / 8 and prof.hosts == hosts
    assert prof.network.gpus_per_host == per_host


def test_a_slow_emulated_link_makes_larger_batches_faster_and_a_fast_one_does_not():
    base = load_profile("cpu-2core")
    name = "resnet18-w0.125-16px"

    def images_per_s(rate, batch):
        prof = emulated_profile(base, 2, 2, rate)
        comp = prof.models[name]._replace(max_local_batch=32)
        local = min(32, batch // 4)
        return batch / min(float(costmodel.step_time(prof.network, comp, a, 4, local,
                                                     batch // 4 // local))
                           for a in costmodel.ALGORITHMS)

    assert images_per_s("20mbit", 128) > 1.5 * images_per_s("20mbit", 64)
    assert images_per_s("1gbit", 128) < 1.2 * images_per_s("1gbit", 64)


def test_the_verdict_says_whether_larger_batches_bought_throughput(tmp_path):
    def record(policy, batch, images_per_s):
        folder = tmp_path / f"{policy.replace(' ', '-')}-{images_per_s}"
        folder.mkdir()
        (folder / "global_batch.series.txt").write_text(f"1 {batch}\n2 {batch}\n")
        lines = [(1.0, LOG[2].replace("466 images/s", f"{images_per_s} images/s")),
                 (2.0, '{"val_top1": 0.91, "steps": 2, "batch_schedule": "0:%d", '
                       '"images_per_sec": %d, "ranks": 4}\n' % (batch, images_per_s))]
        return rep.record_of(policy, 1, str(folder), lines, 0.90)

    _, verdict = rep.summarise([record("fixed 64", 64, 120), record("fixed 256", 256, 340),
                                record(rep.ADAPTIVE, 64, 125)], 0.90)
    assert any(line.endswith("larger batches buy 2.83x") for line in verdict), verdict
    _, verdict = rep.summarise([record("fixed 64", 64, 400), record("fixed 256", 256, 410),
                                record(rep.ADAPTIVE, 64, 400)], 0.90)
    assert any("buy nothing (1.02x)" in line for line in verdict), verdict


def test_a_seed_that_never_reaches_the_target_counts_as_never_not_as_missing(tmp_path):
    def record(policy, seed, seconds, top1=0.91):
        folder = tmp_path / f"{policy.replace(' ', '-')}-{seed}"
        folder.mkdir()
        (folder / "global_batch.series.txt").write_text("1 256\n2 256\n")
        lines = [(seconds, LOG[2].replace("0.91", str(top1))),
                 (seconds + 1, '{"val_top1": %s, "steps": 2, "batch_schedule": "0:256", '
                               '"images_per_sec": 400, "ranks": 4}\n' % top1)]
        return rep.record_of(policy, seed, str(folder), lines, 0.90)

    # runs/bound-emu (emulated cluster, 5 seeds): adaptive reached 90 % in 3 seeds, at 35.0,
    # 36.2 and 37.3 s; left out, the other two made its median 36.2 s and the verdict PASS
    fixed = [record("fixed 256", s, t) for s, t in enumerate([34.9, 30.5, 33.1, 34.1, 37.1])]
    adaptive = [record(rep.ADAPTIVE, s, t) for s, t in enumerate([37.3, 36.2, 35.0])] + [
        record(rep.ADAPTIVE, s, 40.0, top1=0.88) for s in (3, 4)]
    stats, verdict = rep.summarise(fixed + adaptive, 0.90)
    assert stats[rep.ADAPTIVE]["time_s"] == (37.3, 35.0, float("inf"))
    assert stats[rep.ADAPTIVE]["reached"] == 3
    assert (verdict[0].startswith("time to 90%: adaptive (goodput) median 37.3 s")
            and "FAIL" in verdict[0])
    assert "37.3 [35.0-never]" in rep.table(stats, 0.90, "0,1,2,3,4")
    # a policy that never reaches the target is never the best other policy
    stats, verdict = rep.summarise([record("fixed 512", 9, 99.0, top1=0.85)] + fixed + adaptive,
                                   0.90)
    assert "best other policy fixed 256" in verdict[0]


def test_per_seed_ratios_pair_each_seed_within_its_own_measurement(tmp_path):
    def record(measurement, policy, seed, seconds):
        folder = tmp_path / measurement / f"{policy.replace(' ', '-')}-{seed}"
        folder.mkdir(parents=True)
        (folder / "global_batch.series.txt").write_text("1 256\n")
        top1 = 0.91 if seconds else 0.88
        lines = [(seconds or 99.0, LOG[2].replace("0.91", str(top1))),
                 (100.0, '{"val_top1": %s, "steps": 2, "batch_schedule": "0:256", '
                         '"images_per_sec": 400, "ranks": 4}\n' % top1)]
        return rep.record_of(policy, seed, str(folder), lines, 0.90)

    # two measurements on the same seeds on machines of different speed (runs/tta-emu-r5 and
    # -r6 shared theirs): pairing across them would mix the machines
    records = ([record("night", "fixed 256", s, t) for s, t in [(1, 60.0), (2, 50.0)]] +
               [record("night", rep.ADAPTIVE, s, t) for s, t in [(1, 66.0), (2, 45.0)]] +
               [record("day", "fixed 256", s, t) for s, t in [(1, 40.0), (2, 40.0), (3, 0)]] +
               [record("day", rep.ADAPTIVE, s, t) for s, t in [(1, 40.0), (2, 0), (3, 0)]])
    assert sorted(rep.paired_ratios(records, rep.ADAPTIVE, "fixed 256")) == [
        (1, 1.0), (1, 1.1), (2, 0.9), (2, float("inf"))]    # seed 3: neither reached: out
    line = rep.paired_verdict(records, rep.ADAPTIVE, "fixed 256")
    assert line.startswith(f"per seed, time to the target of {rep.ADAPTIVE} / fixed 256: median "
                           "1.05, 87.5% interval 0.90-never over 4 seeds (2 of them at most 1): "
                           "no difference shown"), line
    _, verdict = rep.summarise(records, 0.90)
    assert line in verdict
    # the sign test's interval: n = 25 takes the 8th and 18th values (95.7 %)
    assert rep.median_interval(list(range(25))) == (12, 7, 17, pytest.approx(0.9567, abs=1e-4))
    behind = ([record("x", "fixed 256", s, 40.0) for s in range(5, 11)] +
              [record("x", rep.ADAPTIVE, s, 50.0) for s in range(5, 11)])
    assert "median 1.25, 96.9% interval 1.25-1.25 over 6 seeds (0 of them at most 1): behind" in \
        rep.paired_verdict(behind, rep.ADAPTIVE, "fixed 256")
    # a recipe slower than the best fixed batch is paired too: "never behind the recipe"
    recipe = behind + [record("x", f"{rep.RECIPE} 0:64", s, 80.0) for s in range(5, 11)]
    assert (f"per seed, time to the target of {rep.ADAPTIVE} / {rep.RECIPE} 0:64: median 0.62, "
            "96.9% interval 0.62-0.62 over 6 seeds (6 of them at most 1): ahead"
            ) in "\n".join(rep.summarise(recipe, 0.90)[1])


def test_report_pools_measurements_and_names_a_folder_without_one(tmp_path, capsys):
    import json

    from tools import time_to_accuracy as tta
    for name, seconds in (("a", 40.0), ("b", 50.0)):
        folder = tmp_path / name
        records = []
        for policy, t in (("fixed 256", 40.0), (rep.ADAPTIVE, seconds)):
            run = folder / f"{policy.replace(' ', '-')}-1"
            run.mkdir(parents=True)
            (run / "global_batch.series.txt").write_text("1 256\n")
            lines = [(1.0, LOG[0]), (t, LOG[2]),
                     (t + 1, '{"val_top1": 0.91, "steps": 2, "batch_schedule": '
                             '"0:256", "images_per_sec": 400, "ranks": 4}\n')]
            records.append(rep.record_of(policy, 1, str(run), lines, 0.90))
        (folder / "measured.json").write_text(json.dumps({"where": "here", "target": 0.90,
                                                          "records": records}))
    out = tmp_path / "pooled"
    assert tta.main(["report", "--pool", f"{tmp_path / 'a'},{tmp_path / 'b'}", "--out",
                     str(out)]) == 0
    text = (out / "measured.md").read_text()
    assert text.startswith(f"here (pooled: {tmp_path / 'a'}, {tmp_path / 'b'})")
    assert "median 1.12, 50.0% interval 1.00-1.25 over 2 seeds" in text    # seed 1 twice
    assert json.loads((out / "report.json").read_text())["target"] == 0.90
    assert not (out / "measured.json").exists()       # a report is not a measurement
    # the times were taken at the measurement's target: another target is refused, not relabelled
    with pytest.raises(SystemExit, match=r"a/measured.json was measured to 90%, not 82%: "
                                         r"give its task \(-C\) or --target 0.9, or neither"):
        tta.main(["report", "-C", "clusters-mlp", "--out", str(tmp_path / "a")])
    # with neither, a measurement is read at its own target; pooled, all must share one
    saved = json.loads((tmp_path / "a" / "measured.json").read_text())
    other = tmp_path / "at-82"
    other.mkdir()
    (other / "measured.json").write_text(json.dumps(dict(saved, target=0.82)))
    assert tta.main(["report", "--out", str(other)]) == 0
    assert json.loads((other / "report.json").read_text())["target"] == 0.82
    assert "time to 82%" in (other / "measured.md").read_text()
    with pytest.raises(SystemExit, match=r"taken to different targets \(90% in .*, 82% in "):
        tta.main(["report", "--pool", f"{tmp_path / 'a'},{other}", "--out",
                  str(tmp_path / "mixed")])
    with pytest.raises(SystemExit, match=f"cannot read {tmp_path / 'c'}/measured.json"):
        tta.main(["report", "--pool", str(tmp_path / "c"), "--out", str(out)])


def test_a_report_never_rewrites_the_measurements(tmp_path):
    """`report --pool A,B --out A` once replaced A's records by the pool's (each repeat counted
    B again: adaptive's median 45.0 -> 50.0 s); now refused, and no report touches measured.json."""
    import json

    from tools import time_to_accuracy as tta
    for name, seconds in (("a", 40.0), ("b", 50.0)):
        run = tmp_path / name / "adaptive-1"
        run.mkdir(parents=True)
        (run / "global_batch.series.txt").write_text("1 256\n")
        lines = [(1.0, LOG[0]), (seconds, LOG[2]), (seconds + 1, '{"val_top1": 0.91, "steps": 2, '
                 '"batch_schedule": "0:256", "images_per_sec": 400, "ranks": 4}\n')]
        record = rep.record_of(rep.ADAPTIVE, 1, str(run), lines, 0.90)
        (tmp_path / name / "measured.json").write_text(json.dumps({"where": "here",
                                                                   "records": [record]}))
    a, b = tmp_path / "a", tmp_path / "b"
    measured = (a / "measured.json").read_bytes()
    for _ in range(2):
        with pytest.raises(SystemExit, match=rf"^time_to_accuracy.py report: --out {a}/ is one "
                                             rf"of --pool's folders; give the pool a folder of "
                                             rf"its own, e.g. --out {a}-pooled$"):
            tta.main(["report", "--pool", f"{a},{b}", "--out", f"{a}/"])
    with pytest.raises(SystemExit, match="efficiency: --out"):
        tta.main(["efficiency", "--pool", f"{b},{a}", "--out", str(a)])
    assert tta.main(["report", "--out", str(a)]) == 0
    assert (a / "measured.json").read_bytes() == measured
    stats = json.loads((a / "report.json").read_text())["stats"]
    assert stats[rep.ADAPTIVE]["time_s"][0] == 40.0


def epoch_record(tmp_path, policy, batch, seed, epoch, noise=None):
    """The record of a run at ``batch`` that saw 90 % at ``epoch``, with a noise-scale series
    ``noise`` (its file's text) when given."""
    folder = tmp_path / f"{policy.replace(' ', '-')}-{seed}"
    folder.mkdir()
    (folder / "global_batch.series.txt").write_text(f"1 {batch}\n")
    if noise:
        (folder / "noise_scale.series.txt").write_text(noise)
    before = [epoch - k for k in range(math.ceil(epoch) - 1, 0, -1)]   # validations 1 apart
    lines = [(e, LOG[1].replace("epoch 1.00", f"epoch {e:.2f}")) for e in before]
    lines += [(9.0, LOG[2].replace("epoch 2.00 step 46", f"epoch {epoch:.2f} step 2")),
             (10.0, '{"val_top1": 0.91, "steps": 2, "batch_schedule": "0:%d", '
                    '"images_per_sec": 400, "ranks": 4}\n' % batch)]
    return rep.record_of(policy, seed, str(folder), lines, 0.90)


def test_the_efficiency_model_is_checked_on_the_fixed_batches(tmp_path):
    def record(*args):
        return epoch_record(tmp_path, *args)

    # runs/tta-emu-q4 in short: 64 saw 90 % at epoch 6 (5.5 on average), 256 at 9 (8.5)
    records = ([record("fixed 64", 64, s, 6) for s in range(3)] +
               [record("fixed 256", 256, s, 9) for s in range(3)] +
               [record(rep.ADAPTIVE, 64, s, 7, "1 150\n2 250\n3 9999\n") for s in range(2)])
    line = rep.efficiency_lines(records, 0.90)[0]
    # 200 [200-200]: step 3's 9999 comes after 90 %
    assert line == ("efficiency model: fixed 64 and fixed 256 reached 90% after 5.5 and 8.5 "
                    "epochs (means, half a validation interval before the validation that saw "
                    "it), as E(B) predicts at phi = 288; the adaptive runs measured B_simple "
                    "200 [200-200] (each run's median up to the target)")
    assert line in rep.summarise(records, 0.90)[1]
    # the larger batch saved no steps (phi 0), or cost no images (inf)
    assert rep.implied_phi(64, 256, 0.25) == 0.0 and rep.implied_phi(64, 256, 1.0) == float("inf")


def test_abci_prediction_on_the_published_prior():
    done, phi = abci_prediction.published_curve(91)
    assert phi[0] == 34816 and phi[-1] == 69632          # Mikami et al.'s batches as phi
    r = abci_prediction.predict_abci((done, phi), 1.0, load_profile("abci"), restart_s=30.0,
                                     steps=50)
    assert r["goodput_s"] <= r["fixed_s"] * 1.05


def saved_run(phi, sync_s):
    """A batch_prior.json of 4 ranks: constant ``phi``; 10 ms + 1 ms/sample compute, ``sync_s``."""
    refit = StepTimeRefit(4, min_steps=1, warmup_steps=0)
    for local in (16, 32):
        refit.observe(local, 1, 0.01 + 0.001 * local + sync_s, sync_s)
    return {"noise_scale": [[0.0, phi, 0.2], [1.0, phi, 0.2]], "step_times": refit.state()}


@pytest.mark.parametrize("phi, sync_s, best", [(50.0, 0.0, 64), (1e6, 1.0, 1024)])
def test_model_optimum_bounds_every_fixed_batch(phi, sync_s, best):
    # No sync and a small noise scale: nothing gains on B0, whose efficiency is 1. A huge
    # noise scale and a 1 s sync: the largest batch is best (efficiency ~1 everywhere).
    times = batch_optimum.schedule_times(saved_run(phi, sync_s), 64, 10000, 32, (0.5, 1.0))
    fixed = {k: v for k, v in times.items() if k != "optimum"}
    assert min(fixed, key=lambda k: fixed[k][0]) == f"fixed {best}"
    for seconds in fixed.values():
        assert all(o <= s * (1 + 1e-9) for o, s in zip(times["optimum"], seconds))
    assert times["optimum"][0] == pytest.approx(fixed[f"fixed {best}"][0])
    lines = batch_optimum.describe(times, (0.5, 1.0))
    assert lines[2].startswith("| optimum | ") and "(best fixed)" in lines[3]


def test_a_task_brings_its_recipe_target_and_fixed_batches():
    from tools import time_to_accuracy as tta
    args = tta.build_parser().parse_args(["measure", "-C", "clusters-mlp", "--fixed", "64,1024"])
    assert tta.task_target(args) == 0.82                          # the recipe's expected block
    assert list(tta.task_policies(args)) == ["recipe 0:64", "fixed 64", "fixed 1024",
                                             rep.ADAPTIVE, rep.ADAPTIVE_PRIOR]
    assert tta.task_policies(args)["fixed 1024"] == ["--batch-schedule", "0:1024"]
    digits = tta.build_parser().parse_args(["measure"])
    assert digits.task == "digits-cpu" and tta.task_target(digits) == tta.DEFAULT_TARGET
    assert tta.task_policies(digits) is tta.POLICIES
    given = tta.build_parser().parse_args(["measure", "-C", "shapes-cpu", "--target", "0.5"])
    assert tta.task_target(given) == 0.5


GOOD = {"policy": "fixed 64", "seed": 1, "dir": "run", "dataset": 1438, "params": 176402,
        "time_s": 10.0, "steps": 20, "epoch": 2.0, "best_top1": 0.95, "final_top1": 0.95,
        "wall_s": 12.0, "images_per_s": 400.0, "ranks": 4, "total_steps": 40,
        "batch_schedule": "0:64", "profile": "", "ranks_per_host": 4,
        "val": [[5.0, 1.0, 10, 0.5], [10.0, 2.0, 20, 0.95]]}


@pytest.mark.parametrize("saved, message", [
    ([1, 2], "holds a JSON list, not an object"),
    ({"target": 0.9}, "has records = None, not a list of runs"),
    ({"records": 5}, "has records = 5, not a list of runs"),
    ({"records": [[1, 2]]}, "record 0 is a JSON list, not an object"),
    ({"records": [{k: v for k, v in GOOD.items() if k != "policy"}]}, "record 0 has no 'policy'"),
    ({"records": [GOOD, dict(GOOD, time_s="fast")]},
     "record 1 has time_s = 'fast', not a finite int or float or null"),
    ({"records": [dict(GOOD, seed=True)]}, "record 0 has seed = True, not a finite int"),
    ({"records": [dict(GOOD, best_top1=math.nan)]},
     "record 0 has best_top1 = nan, not a finite int or float"),
    ({"target": "0.9", "records": [GOOD]}, "has target = '0.9', not a top-1 in (0, 1]"),
    ({"target": 90, "records": [GOOD]}, "has target = 90, not a top-1 in (0, 1]"),
    ({"records": [dict(GOOD, val=[[1, 2]])]},
     "record 0 has a val entry that is not [seconds, epoch, step, top-1]"),
])
def test_malformed_measurements_are_one_line(tmp_path, saved, message):
    """Each was a traceback (AttributeError, KeyError, TypeError, IndexError, ValueError)."""
    import json

    from tools import time_to_accuracy as tta
    (tmp_path / "measured.json").write_text(json.dumps(saved))
    for command in ("report", "efficiency"):
        with pytest.raises(SystemExit) as caught:
            tta.main([command, "--out", str(tmp_path)])
        assert str(caught.value) == (f"time_to_accuracy.py {command}: {tmp_path}/measured.json "
                                     f"{message}: it is not what `measure` writes; measure "
                                     f"again or move the file out")


def test_a_damaged_run_folder_or_too_few_batches_is_one_line(tmp_path):
    import json

    from tools import time_to_accuracy as tta
    run = tmp_path / "run"
    run.mkdir()
    (run / "global_batch.series.txt").write_text("one two\n")
    (tmp_path / "measured.json").write_text(json.dumps({"records": [dict(GOOD, dir=str(run))]}))
    with pytest.raises(SystemExit, match=rf"^time_to_accuracy.py report: cannot read {run}/"
                                         r"global_batch.series.txt \(could not convert .*\): "
                                         r"train.py writes 'step value' lines; measure the run "
                                         r"again or move it out$"):
        tta.main(["report", "--out", str(tmp_path)])
    (run / "global_batch.series.txt").write_text("1 64\n")
    with pytest.raises(SystemExit, match=rf"^time_to_accuracy.py report: --before {tmp_path}/x: "
                                         rf"cannot read {tmp_path}/x/stdout.log \(No such file"):
        tta.main(["report", "--out", str(tmp_path), "--before", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match=r"^time_to_accuracy.py efficiency: efficiency check: "
                                         r"fixed runs that all reached the target at 1 batch"):
        tta.main(["efficiency", "--out", str(tmp_path)])
    # a run folder moved away: no batches known, not a TypeError
    records = [dict(GOOD, dir=str(run)), dict(GOOD, dir=str(tmp_path / "moved"))]
    (tmp_path / "measured.json").write_text(json.dumps({"records": records}))
    assert tta.main(["report", "--out", str(tmp_path)]) == 0
    assert "| fixed 64 | 10.0 [10.0-10.0] |" in (tmp_path / "measured.md").read_text()


@pytest.mark.parametrize("text, message", [
    (None, "cannot be read (No such file or directory)"),
    ("{", "is not JSON (Expecting property name"),
    ('{"noise_scale": []}', "has no key with data.images and machine"),
    ('{"key": {"data": {"images": "many"}, "machine": "m"}}',
     "has images 'many' and machine 'm', not a count >= 1 and a name"),
    ('{"key": {"data": {"images": 100}, "machine": "m"}, "noise_scale": []}',
     "is not usable: @ has no trusted noise-scale estimate"),
    ('{"key": {"data": {"images": 100}, "machine": "m"}, "noise_scale": [[0.1, 100, 0.1]], '
     '"step_times": null}', "has no step times (a run that never refitted them)"),
])
def test_optimum_on_a_missing_or_malformed_prior_is_one_line(tmp_path, text, message):
    from tools import time_to_accuracy as tta
    path = tmp_path / "batch_prior.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as caught:
        tta.main(["optimum", "--prior", str(path)])
    line = str(caught.value)
    assert line.startswith(f"time_to_accuracy.py optimum: --prior {path} "
                           f"{message.replace('@', str(path))}"), line
    assert line.endswith("; give the batch_prior.json of an adaptive run (its --output-dir)")
