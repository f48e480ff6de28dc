"""The checkpoint interval from the failure rate (Young/Daly) and the profile keys it reads."""
import math

import numpy as np
import pytest

from nnabla_torus.planning import checkpoint_interval as ci
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.planning.profile_schema import profile_from_dict, profile_to_dict


def test_daly_is_youngs_square_root_with_small_corrections():
    rng = np.random.default_rng(0)
    for cost, mtbf in zip(rng.uniform(0.1, 100, 50), rng.uniform(600, 1e6, 50)):
        young = math.sqrt(2 * cost * mtbf)
        daly = ci.young_daly_s(cost, mtbf)
        assert young - cost < daly < young * 1.1, (cost, mtbf)
        assert ci.young_daly_s(cost * 2, mtbf) > daly          # dearer checkpoints: rarer
        assert ci.young_daly_s(cost, mtbf * 2) > daly          # rarer failures: rarer
    assert ci.young_daly_s(10, 4) == 4                         # C >= 2M: once per MTBF
    assert ci.young_daly_s(0, 3600) == 0


def test_the_interval_scales_with_the_job_and_names_its_inputs():
    prof = load_profile("dgx-h100")
    small = ci.checkpoint_interval(prof, "resnet50", gpus=64, step_s=0.1)
    large = ci.checkpoint_interval(prof, "resnet50", gpus=4096, step_s=0.1)
    assert large.seconds == pytest.approx(small.seconds / 8, rel=0.05)   # sqrt(64)
    assert small.mtbf_s == pytest.approx(50677 * 3600 / 64)
    assert small.cost_s == pytest.approx(8 * 25557032 / 0.12e9)
    measured = ci.checkpoint_interval(prof, "resnet50", 64, 0.1, cost_s=0.5, mtbf_hours=1000)
    assert measured.cost_source == "measured" and measured.mtbf_source == "given"
    line = ci.describe(small)
    assert line.startswith(f"checkpoint every {small.steps} step(s)") and "Young/Daly" in line
    assert "profile dgx-h100 run.mtbf_hours" in line and "204 MB" in line, line
    with pytest.raises(ValueError, match="MTBF 0"):
        ci.checkpoint_interval(prof, "resnet50", 64, 0.1, mtbf_hours=0)


def test_profiles_carry_mtbf_and_checkpoint_rate_and_write_them_back():
    prof = load_profile("abci")
    run = prof.extra["run"]
    assert run["mtbf_hours"] == 50677.0 and run["checkpoint_GBps"] == 0.12
    again = profile_from_dict(profile_to_dict(prof))
    assert again.extra["run"] == run and again.extra["params"] == {"resnet50": 25557032}
    raw = profile_to_dict(prof)
    raw["run"] = {"mtbf_hours": 0}
    with pytest.raises(ValueError, match=r"run.mtbf_hours: 0 must be a number > 0"):
        profile_from_dict(raw)


def test_the_command_prints_the_plan_and_the_interval(capsys):
    assert ci.main(["--profile", "abci", "--gpus", "1088", "--batch", "34816"]) == 0
    out = capsys.readouterr().out
    assert "plan: 1088 GPUs, torus2d on 32x34, 32 x 1 per GPU, global batch 34816" in out, out
    assert "job MTBF of 46.6 h (50677 GPU-hours per GPU, profile abci" in out, out
