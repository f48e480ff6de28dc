"""The per-run choice between torus2d after backward and native overlapped (issue 19):
two profiles, each one's winner, and the step formulas recomputed from the cost model."""
import pytest

from nnabla_torus.planning.costmodel import Compute, Link, Network, allreduce_time, compute_time
from nnabla_torus.planning.overlap_choice import BACKWARD_SHARE, choose, describe

# Hosts of 4 GPUs on NVLink, one 100 Gbit/s NIC each (ABCI-like links, not measured).
NVLINK, EDR = Link(2e-6, 150e9), Link(5e-6, 12.5e9)
RESNET50 = Compute(0.02, 0.002, 1.0, 64, 102_228_128, 0)   # ~84 ms at 32 per GPU (assumed)


def test_long_backward_native_overlapped_wins():
    """16 GPUs, ResNet-50-sized gradients: the backward (~56 ms) hides all of native's
    all-reduce, while the torus's, though shorter, comes on top of the step."""
    net = Network(NVLINK, EDR, 0.0, 4, 4, 0, {})
    choice = choose(net, RESNET50, 16, 32)
    t_c = float(compute_time(RESNET50, 16, 32, 4))
    native = float(allreduce_time(net, "native", 16, RESNET50.grad_bytes))
    torus = float(allreduce_time(net, "torus2d", 16, RESNET50.grad_bytes))
    assert choice.algorithm == "native"
    assert native < BACKWARD_SHARE * t_c                     # fully hidden
    assert choice.native_step_s == pytest.approx(t_c)
    assert choice.torus_step_s == pytest.approx(t_c + torus)
    assert choice.backward_s == pytest.approx(BACKWARD_SHARE * t_c)


def test_short_backward_many_hosts_torus_after_backward_wins():
    """2,048 GPUs, a small model (1.3 ms of compute, 1 MB of gradients) on a high-latency
    network: native's 2(p-1) latency steps cost far more than the backward could hide, the
    torus's 2(X+Y-2) do not."""
    net = Network(NVLINK, Link(50e-6, 12.5e9), 0.0, 4, 4, 0, {})
    small = Compute(0.001, 0.00001, 1.0, 64, 1_000_000, 0)
    choice = choose(net, small, 2048, 32)
    assert choice.algorithm == "torus2d"
    assert choice.native_s > choice.torus_s + choice.backward_s
    assert choice.native_step_s == pytest.approx(choice.compute_s + choice.native_s
                                                 - choice.backward_s)
    line = describe(choice, "high-latency")
    assert "torus2d after backward" in line and "'high-latency'" in line
    assert f"native {1e3 * choice.native_s:.1f} ms" in line


def test_partly_hidden_all_reduce_counts_what_backward_cannot_hide():
    """Native longer than backward: the step is compute + native - backward."""
    net = Network(NVLINK, Link(5e-6, 1.25e9), 0.0, 4, 4, 0, {})   # 10 Gbit/s NICs
    choice = choose(net, RESNET50, 16, 32)
    assert choice.native_s > choice.backward_s
    assert choice.native_step_s == pytest.approx(choice.compute_s + choice.native_s
                                                 - choice.backward_s)
    assert choice.algorithm == ("native" if choice.native_step_s < choice.torus_step_s
                                else "torus2d")
