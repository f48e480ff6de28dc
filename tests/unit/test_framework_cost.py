"""What nnabla adds per step (costmodel/framework.py, fixed_costs.input_wait_s): the
per-gradient 1-byte host MPI all-reduce of its callback (native only), the example's one
finiteness check a step, and an input pipeline that costs only beyond the step."""
import doctest

import pytest

from nnabla_torus.planning import costmodel
from nnabla_torus.planning.costmodel import framework
from nnabla_torus.planning.fixed_costs import input_wait_s
from nnabla_torus.planning.machine_profile import load_profile


def test_docstring_example():
    result = doctest.testmod(framework)
    assert result.failed == 0 and result.attempted > 0


def test_callback_sync_is_grad_arrays_one_byte_all_reduces_and_nothing_on_one_rank():
    prof = load_profile("abci")
    comp, net = prof.models["resnet50"], prof.network
    # inside a host (4 V100s: 2 doubling steps) the host's MPI latency, not NVLink's NCCL step
    assert float(framework.callback_sync_s(net, comp, 4)) == pytest.approx(
        161 * 2 * 0.46e-6, rel=1e-3)
    # across hosts: 2 steps inside, 1 across (the inter link's latency)
    assert float(framework.callback_sync_s(net, comp, 8)) == pytest.approx(
        161 * (2 * 0.46e-6 + net.inter.latency_s), rel=1e-3)
    assert float(framework.callback_sync_s(net, comp, 1)) == 0.0
    # a profile without host_mpi_latency_us prices the steps inside a host at the intra link's
    bare = net._replace(host_mpi_latency_s=0.0)
    one_byte = float(costmodel.allreduce_time(bare, "native", 8, 1))
    assert float(framework.callback_sync_s(bare, comp, 8)) == pytest.approx(161 * one_byte)
    more = framework.callback_sync_s(net, comp, [8, 64, 2176])
    assert list(more) == sorted(more)          # more ranks, more doubling steps


def test_native_overlaps_backward_and_pays_the_callback_the_check_is_on_every_algorithm():
    prof = load_profile("abci")
    comp, net = prof.models["resnet50"], prof.network
    native = costmodel.step_terms(net, comp, "native", 8, 32)
    torus = costmodel.step_terms(net, comp, "torus2d", 8, 32, grid_x=4)
    assert "callback_sync" in native and "callback_sync" not in torus
    assert float(torus["finite_check"]) == pytest.approx(10e-6)   # one fused check a step
    assert float(native["total"]) == pytest.approx(float(
        native["compute"] + native["allreduce"] + native["finite_check"] +
        native["callback_sync"] + native["overlap_with_backward"]))
    assert -float(native["overlap_with_backward"]) == pytest.approx(float(native["allreduce"]))


def test_the_input_pipeline_costs_only_what_it_takes_beyond_the_step():
    assert float(input_wait_s({"loader_images_per_s": 10_000}, 128, 0.030)) == 0.0
    assert float(input_wait_s({"loader_images_per_s": 1_000}, 128, 0.030)) == \
        pytest.approx(0.128 - 0.030)
    assert float(input_wait_s({}, 128, 0.030)) == 0.0
