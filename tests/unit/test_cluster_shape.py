"""Profiles reshaped by flags (--hosts, --gpus-per-host, --inter-bandwidth, --gpu-model) without
editing a file, the racks block adapted or dropped with its reason, and the DGX profiles."""
import json

import pytest

from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.planning import planner
from nnabla_torus.planning.machine_profile import Shape, list_profiles, load_profile


def test_the_dgx_profiles_ship_with_their_published_shape():
    assert {"dgx-a100", "dgx-h100"} <= set(list_profiles())
    a100, h100 = load_profile("dgx-a100"), load_profile("dgx-h100")
    assert a100.network.gpus_per_host == h100.network.gpus_per_host == 8
    assert a100.network.inter.bandwidth_Bps == 200e9     # 8 x 200 Gb/s HDR
    assert h100.network.inter.bandwidth_Bps == 400e9     # 8 x 400 Gb/s NDR
    assert a100.network.intra.bandwidth_Bps == 300e9 and h100.network.intra.bandwidth_Bps == 450e9
    # A100 and H100 compute fitted to published runs (issue 48; before: 2470 img/s of one
    # PyTorch figure at batch 256): MLPerf v2.0's 3,399 img/s per A100 at 408 within 3 %, and
    # the H100 about 2x the A100 (MLPerf v4.0: 7,161 img/s per H100 at 400)
    comp = a100.models["resnet50"]
    assert 408 / (comp.a_s + 408 * comp.b_s) == pytest.approx(3399, rel=0.03)
    assert comp.b_s / h100.models["resnet50"].b_s == pytest.approx(2.2, abs=0.1)


def test_every_value_of_a_shipped_profile_says_where_it_comes_from():
    """Every profile written by hand: a file tools/calibrate.py wrote holds measured values
    (its calibration block says how)."""
    from nnabla_torus.planning.profile_files import list_profiles, read_profile_file
    for name in list_profiles():
        with open(read_profile_file(name)[0]) as f:
            text = f.read()
        if text.startswith("# nnabla-torus cluster profile written by tools/calibrate.py"):
            continue
        lines = [line for line in text.splitlines()
                 if ":" in line and not line.lstrip().startswith("#")]
        values = [line for line in lines
                  if line.split(":", 1)[1].split("#")[0].strip() not in ("", "{}")]
        untagged = [line for line in values
                    if "#" not in line and not line.startswith(("name", "description"))]
        # a_ms / b_ms are tagged in the comment block above them
        assert all(line.strip().startswith(("a_ms", "b_ms")) for line in untagged), \
            (name, untagged)


def test_hosts_and_gpus_per_host_reshape_a_profile():
    prof = load_profile("dgx-h100", Shape(hosts=4))
    assert prof.hosts == 4 and prof.extra["shape"] == ["hosts: 4 (--hosts; profile: 32)"]
    prof = load_profile("abci", Shape(hosts=4, gpus_per_host=8))
    assert (prof.hosts, prof.network.gpus_per_host, prof.network.slots_per_host) == (4, 8, 8)
    assert load_profile("abci").extra["shape"] == []


@pytest.mark.parametrize("hosts, per_rack, said", [
    (68, 34, None),                                    # 2 racks of 34: kept as written
    (4, None, "racks: dropped: 4 hosts fit in one rack of 34"),
    (100, 25, "racks: 4 racks of 25 hosts (34 per rack in the profile does not divide 100"),
    (101, None, "racks: dropped: no rack size from 17 to 34 divides 101 hosts"),
])
def test_racks_adapt_or_are_dropped_with_the_reason(hosts, per_rack, said):
    prof = load_profile("abci", Shape(hosts=hosts))     # before: an error saying to edit the file
    assert prof.network.hosts_per_rack == (per_rack or 0)
    notes = [n for n in prof.extra["shape"] if n.startswith("racks")]
    assert notes == ([] if said is None else [notes[0]]) and (said is None or said in notes[0])


def test_inter_bandwidth_moves_the_spine_with_it_and_gpu_model_the_compute():
    prof = load_profile("abci", Shape(inter_GBps=50, gpu_model="a100"))
    assert prof.network.inter.bandwidth_Bps == prof.network.spine.bandwidth_Bps == 50e9
    assert prof.models == load_profile("dgx-a100").models
    assert prof.network.reduce_s_per_byte == load_profile("dgx-a100").network.reduce_s_per_byte


def test_a_bigger_cluster_plans_more_gpus_and_the_plan_says_how_it_was_shaped(capsys, tmp_path):
    small = planner.plan(load_profile("dgx-h100", Shape(hosts=2)), "resnet50",
                         max_global_batch=65536).best
    assert small.gpus <= 16
    plan_cli.main(["--profile", "dgx-a100", "--hosts", "16", "--model", "resnet50",
                   "--json", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert ("# profile dgx-a100 (named by --profile / NNABLA_TORUS_PROFILE): 16 hosts x 8 GPUs"
            in out)
    assert "# reshaped: hosts: 16 (--hosts; profile: 32)" in out
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["recommendation"]["gpus"] <= 128 and report["reshaped"]


def test_the_environment_twins_reshape_too(monkeypatch):
    monkeypatch.setenv("NNABLA_TORUS_HOSTS", "3")
    monkeypatch.setenv("NNABLA_TORUS_GPU_MODEL", "h100")
    args = plan_cli.build_parser().parse_args([])
    assert (args.shape_hosts, args.shape_gpu_model) == (3, "h100")


def test_the_shape_settings_have_one_rule_in_every_tool(tmp_path, monkeypatch, capsys):
    """0 or unset is the profile's value for --hosts and its twin NNABLA_TORUS_HOSTS in
    nnabla-torus-plan, nnabla-torus-run and train.py alike (it was a traceback in the plan and a
    refusal in the launcher); past the bounds every tool refuses in one line (--hosts 1000000
    planned for minutes, growing memory); a malformed profile with --hosts is one line naming
    the file (the reshape ran before the check: AttributeError)."""
    from nnabla_torus.launching import elastic
    from nnabla_torus.planning.profile_reshape import MAX_HOSTS, shape_of
    import config
    monkeypatch.setenv("NNABLA_TORUS_HOSTS", "0")
    assert shape_of(plan_cli.build_parser().parse_args(["--profile", "abci"])).hosts is None
    assert shape_of(elastic.build_parser().parse_args(["--", "x.py"])).hosts is None
    assert config.parse_config([]).hosts == 0
    monkeypatch.delenv("NNABLA_TORUS_HOSTS")
    for parse in (plan_cli.build_parser().parse_args, elastic.build_parser().parse_args,
                  config.parse_config):
        with pytest.raises(SystemExit):
            parse(["--hosts", str(MAX_HOSTS + 1), "--", "x.py"] if parse is not
                  config.parse_config else ["--hosts", str(MAX_HOSTS + 1)])
        assert f"must be an integer >= 0 and <= {MAX_HOSTS}" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    for text in ("name: x\nhosts: 2\nlinks: [1, 2]\nmodels: {}\n", "- a\n- b\n"):
        bad.write_text(text)
        with pytest.raises(ValueError, match=rf"^{bad}: "):
            load_profile(str(bad), Shape(hosts=2, inter_GBps=3.0))


def test_every_error_of_the_plan_is_one_line(monkeypatch):
    """A bad environment twin was a ValueError traceback (build_parser ran outside the error
    handling)."""
    for name, value in (("NNABLA_TORUS_PLAN_BATCH", "x"), ("NNABLA_TORUS_HOSTS", "-1")):
        monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit, match=rf"^nnabla-torus-plan: environment variable "
                                             rf"{name}='{value}' is not a valid value"):
            plan_cli.main(["--profile", "abci", "--model", "resnet50", "--batch", "256"])
        monkeypatch.delenv(name)
