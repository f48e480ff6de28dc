"""A model the profile does not know is priced from its own cost (FLOPs counted from the nnabla
graph, scaled from a calibrated model on the same device), never another model's step time."""
import json

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import pytest

from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.planning import model_cost
from nnabla_torus.planning.machine_profile import load_profile


def test_count_cost_counts_convolution_and_affine_multiply_adds():
    nn.clear_parameters()
    x = nn.Variable((3, 5, 17, 17))
    h = PF.convolution(x, 7, (3, 3), pad=(1, 1), stride=(2, 2), name="c")    # 7 x 9 x 9 out
    h = F.relu(PF.batch_normalization(h, name="bn"))
    y = PF.affine(h, 11, name="fc")
    cost = model_cost.count_cost(y)
    conv = 7 * 9 * 9 * (5 * 3 * 3)
    fc = (7 * 9 * 9) * 11
    assert cost.forward_macs == conv + fc
    assert cost.params == 7 * 5 * 9 + 7 + 2 * 7 + (7 * 9 * 9) * 11 + 11 + 2 * 7  # + BN stats
    assert cost.gflops_per_image == pytest.approx((conv + fc) * 6 / 1e9)


def test_grouped_convolution_counts_only_its_group():
    nn.clear_parameters()
    y = PF.convolution(nn.Variable((1, 8, 6, 6)), 8, (3, 3), group=4, name="g")
    assert model_cost.count_cost(y).forward_macs == 8 * 4 * 4 * (2 * 3 * 3)


def test_a_model_is_priced_from_the_nearest_calibrated_model():
    prof = load_profile("abci")
    comp, note = model_cost.priced_compute(prof, 24.54 / 2, 2 * 11_699_112, 256)
    assert comp.b_s == pytest.approx(prof.models["resnet50"].b_s / 2)
    assert comp.a_s == prof.models["resnet50"].a_s and comp.grad_bytes == 2 * 11_699_112
    assert "priced from its own cost" in note and "resnet50" in note


def test_the_cli_prices_an_unknown_model_and_says_so(tmp_path, capsys):
    plan_cli.main(["--profile", "dgx-h100", "--hosts", "4", "--model", "resnet18",
                   "--gflops-per-image", "10.88", "--params", "11699112",
                   "--json", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert "# model resnet18: priced from its own cost: 10.9 training GFLOPs" in out
    assert "no statistical limit known" in out
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["model_note"].startswith("model resnet18: priced")
