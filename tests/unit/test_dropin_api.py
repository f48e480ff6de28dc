"""The drop-in surface without MPI peers: nnabla's communicator names and method signatures
(read from the real Cython binding in nnabla's CPU wheel), the Python-callback path of
``Variable.backward``, and the SyncBN dispatch (ours, nnabla's own, nnabla's kernel on NCCL)."""
import inspect

import numpy as np
import pytest

import nnabla as nn
import nnabla.communicators as real
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla_torus as C
from nnabla_torus.comm import backward_callback, sync_bn
from nnabla_torus.comm.communicator import TorusCommunicator
from tests.unit.test_nnabla_conformance import real_signature

FACTORIES = ("MultiProcessDataParallelCommunicator", "MultiProcessDataParalellCommunicator",
             "MultiProcessCommunicator", "Comm", "Dist")
PROPERTIES = ("name", "size", "rank", "local_rank")


def test_nnabla_factory_names_are_ours():
    for name in FACTORIES:
        assert getattr(real, name) is real.MultiProcessDataParallelCommunicator, name
        assert getattr(C, name) is C.MultiProcessDataParallelCommunicator, name


def test_the_one_process_several_devices_communicator_says_what_to_use():
    with pytest.raises(NotImplementedError, match="MultiProcessCommunicator"):
        C.DataParallelCommunicator(None)


def test_every_method_of_nnabla_communicator_has_its_signature_here():
    """Same parameter names in the same order and nnabla's defaults, so every call nnabla
    accepts binds here the same way (``bcast``'s ``src`` has a default here, 0)."""
    methods = {m for m in dir(real.Communicator) if not m.startswith("_")}
    for method in sorted(methods - set(PROPERTIES)):
        ours = list(inspect.signature(getattr(TorusCommunicator, method)).parameters.values())
        theirs = real_signature(method)
        assert [p.name for p in ours[1:]] == [n for n, _, _ in theirs], method
        for param, (name, _, default) in zip(ours[1:], theirs):
            assert default is inspect.Parameter.empty or param.default == default, (method, name)
    for prop in PROPERTIES:
        assert isinstance(inspect.getattr_static(TorusCommunicator, prop), property), prop


class Recorder:
    """A Python communicator callback that records what backward told it."""

    def __init__(self, fail_at=None):
        self.events, self.fail_at = [], fail_at

    def on_start_backward(self, loss):
        self.events.append("start")

    def on_finish_function_backward(self, func):
        self.events.append(func.name)
        if func.name == self.fail_at:
            raise ValueError(f"failing in {func.name}")

    def on_finish_backward(self):
        self.events.append("end")


def graph():
    nn.clear_parameters()
    x = nn.Variable.from_numpy_array(np.ones((2, 3), np.float32))
    return F.sum(F.tanh(PF.affine(x, 4, name="fc")))


def test_backward_runs_python_callbacks_and_the_users_hook():
    assert backward_callback.install()
    loss = graph()
    loss.forward()
    seen, one, two = [], Recorder(), Recorder()
    loss.backward(communicator_callbacks=[one, two], function_post_hook=lambda f: seen.append(
        f.name))
    assert seen == ["Sum", "Tanh", "Affine"]
    assert one.events == two.events == ["start", "Sum", "Tanh", "Affine", "end"]
    single = Recorder()
    loss.backward(clear_buffer=True, communicator_callbacks=single)   # one object, not a list
    assert single.events == ["start", "Sum", "Tanh", "Affine", "end"]
    for nothing in (None, []):                                      # nnabla's own path
        loss.forward()
        loss.backward(communicator_callbacks=nothing)
    assert nn.get_parameters()["fc/affine/W"].g.any()


def test_an_error_in_a_callback_is_raised_as_it_is():
    assert backward_callback.install()
    loss = graph()
    loss.forward()
    failing = Recorder(fail_at="Tanh")
    with pytest.raises(ValueError, match="failing in Tanh"):
        loss.backward(communicator_callbacks=[failing])
    assert failing.events == ["start", "Sum", "Tanh"]   # no later callback, no end


def test_anything_else_still_meets_nnabla_s_own_checks():
    assert backward_callback.install()
    loss = graph()
    loss.forward()
    with pytest.raises(TypeError, match="Cannot convert object to "
                                        "nnabla._variable.CommunicatorBackwardCallback"):
        loss.backward(communicator_callbacks=object())
    with pytest.raises(TypeError, match=r"Argument 'comm' has incorrect type \(expected "
                                        r"nnabla.communicator.Communicator, got object\)"):
        F.sync_batch_normalization(nn.Variable((2, 3)), *[nn.Variable((1, 3))] * 4, object())


class FakeGroup:
    name = "nnabla_torus:0,1"


class FakeBackend:
    world_group = FakeGroup()
    nnabla_comm = object()

    def nnabla_communicator(self, half=False, group=None):
        return self.nnabla_comm

    def group(self, ranks):
        return self.world_group


def test_sync_bn_on_nccl_is_nnabla_s_kernel_on_the_backend_communicator(monkeypatch):
    sync_bn.install(TorusCommunicator)
    comm = TorusCommunicator(backend="nccl")
    comm.backend = FakeBackend()
    comm._groups = {"world": [0], "pair": [0]}
    calls = []
    monkeypatch.setattr(F.sync_batch_normalization, "nnabla_torus_original",
                        lambda *args: calls.append(args) or "nnabla's")
    x = nn.Variable((2, 3, 4))
    stats = [nn.Variable((1, 3, 1)) for _ in range(4)]
    assert F.sync_batch_normalization(x, *stats, comm, "pair", [1], 0.8, 1e-3, True) == "nnabla's"
    args = calls[0]
    assert args[5] is FakeBackend.nnabla_comm and args[6] == FakeGroup.name
    assert list(args[7:]) == [[1], 0.8, 1e-3, True, False]
