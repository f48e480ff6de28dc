"""What nnabla adds per step (costmodel/framework.py): the per-gradient 1-byte all-reduce of its
callback, the finiteness check per array, and an input pipeline that costs only beyond the step."""
import doctest

import pytest

from nnabla_torus.planning import costmodel
from nnabla_torus.planning.costmodel import framework
from nnabla_torus.planning.machine_profile import load_profile


def test_docstring_example():
    result = doctest.testmod(framework)
    assert result.failed == 0 and result.attempted > 0


def test_callback_sync_is_grad_arrays_one_byte_all_reduces_and_nothing_on_one_rank():
    prof = load_profile("abci")
    comp, net = prof.models["resnet50"], prof.network
    one_byte = float(costmodel.allreduce_time(net, "native", 8, 1))
    assert float(framework.callback_sync_s(net, comp, 8)) == pytest.approx(161 * one_byte)
    assert float(framework.callback_sync_s(net, comp, 1)) == 0.0
    more = framework.callback_sync_s(net, comp, [8, 64, 2176])
    assert list(more) == sorted(more)          # more ranks, more doubling steps


def test_the_input_pipeline_costs_only_what_it_takes_beyond_the_step():
    prof = load_profile("abci")
    comp, net = prof.models["resnet50"], prof.network
    fast = framework.framework_terms(net, comp, 8, 32, 0.030, loader_images_per_s=10_000)
    slow = framework.framework_terms(net, comp, 8, 32, 0.030, loader_images_per_s=1_000)
    assert float(fast["input_wait"]) == 0.0
    assert float(slow["input_wait"]) == pytest.approx(4 * 32 / 1_000 - 0.030)  # 4 GPUs a host
    none = framework.framework_terms(net, comp, 8, 32, 0.030)
    assert float(none["input_wait"]) == 0.0 and float(none["finite_check"]) == 0.0
