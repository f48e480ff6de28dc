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


def test_issue33_nnabla_s_per_gradient_mpi_check_is_counted_for_native():
    """nnabla's callback makes one blocking 1-byte MPI_Allreduce per gradient array per
    backward (ext .cu 1025-1030): A x T_k on the native-overlapped step (the old model: 0).
    Enough of them flip a choice the model used to give native."""
    net = Network(NVLINK, Link(50e-6, 12.5e9), 0.0, 4, 4, 0, {})
    without = choose(net, RESNET50, 256, 32)
    with_checks = choose(net, RESNET50._replace(grad_arrays=161), 256, 32)
    t_k = float(allreduce_time(net, "native", 256, 1))
    assert without.checks_s == 0 and with_checks.checks_s == pytest.approx(161 * t_k)
    assert with_checks.native_step_s == pytest.approx(without.native_step_s + 161 * t_k)
    assert with_checks.torus_step_s == without.torus_step_s
    assert "per-gradient MPI checks" in describe(with_checks, "x")


def test_issue33_the_choice_is_re_made_from_measured_step_times():
    """The run's median step times replace the predictions; with one configuration measured,
    the other's prediction carries the model's error on the one that ran."""
    from nnabla_torus.planning.overlap_choice import with_measured
    net = Network(NVLINK, EDR, 0.0, 4, 4, 0, {})
    predicted = choose(net, RESNET50, 16, 32)
    assert predicted.algorithm == "native" and predicted.measured == ()
    # native ran 2x slower than predicted: torus2d is assumed 2x slower too
    ran = with_measured(predicted, {"native": 2 * predicted.native_step_s})
    assert ran.torus_step_s == pytest.approx(2 * predicted.torus_step_s)
    assert ran.algorithm == predicted.algorithm and ran.measured == ("native",)
    # both measured: the measurements decide, whatever the model said
    both = with_measured(predicted, {"native": 0.120, "torus2d": 0.100})
    assert both.algorithm == "torus2d" and both.measured == ("native", "torus2d")
    assert "from the run's measured step times" in describe(both, "abci")
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        with_measured(predicted, {"native": 0.0})
    with pytest.raises(ValueError, match="'torus2d' and/or 'native'"):
        with_measured(predicted, {"ring": 0.1})
