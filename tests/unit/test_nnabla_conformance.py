"""The NCCL backend and fake_nccl against the real binding: nnabla's CPU wheel ships the Cython
``nnabla.communicators.Communicator`` whose methods' ``__doc__`` give their signatures.

1. every call ``backends/nccl.py`` makes on an nnabla communicator (name, argument order,
   keywords; found in its source) binds to the real signature, and the arguments it passes at
   run time have the types the real binding converts (bool, int, str, NdArray or list);
2. ``fake_nccl`` exposes exactly the real signatures (names, order, defaults) and raises where
   the real one raises on bad argument types;
3. the fake enforces the rules that broke the first GPU run: nnabla's own error for a narrowed
   view cast to another dtype, a CUDA kernel's output context, device affinity, asynchronous
   completion.
"""
import ast
import inspect
import re
import subprocess
import sys

import numpy as np
import pytest

import nnabla as nn
import nnabla.communicators as real
import nnabla.functions as F
from nnabla.ext_utils import get_extension_context
from nnabla_torus.comm.backends import nccl
from nnabla_torus.testing import fake_nccl
from nnabla_torus.comm.backends.nccl import NCCLBackend, NCCLGroup
from tests.slowdown import scaled

Fake = fake_nccl.FakeMultiProcessDataParallelCommunicator
PARAM = re.compile(r"^(?:(?P<type>[\w ]+?) )?(?P<name>\w+)(?:=(?P<default>.+))?$")
TYPES = {"bool": bool, "int": int, "size_t": int, "float": (int, float), "string": str}



@pytest.fixture(autouse=True)
def real_nnabla_functions():
    """fake_nccl gives F.identity & co. CUDA rules process-wide; give them back after a test."""
    yield
    fake_nccl.reset()

def real_signature(method):
    """[(name, cython type or None, default or inspect.Parameter.empty)] from the docstring."""
    doc = getattr(real.Communicator, method).__doc__.strip().splitlines()[0]
    inside = doc[doc.index("(") + 1:doc.rindex(")")]
    params = []
    for part in [p.strip() for p in inside.split(",")][1:]:  # drop self
        m = PARAM.match(part)
        default = inspect.Parameter.empty if m["default"] is None else eval(m["default"])
        params.append((m["name"], m["type"], default))
    return params


def as_signature(params):
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                default=d) for n, _, d in params])


def calls_in_backend():
    """{method: [(positional count, keywords)]} of ``comm.<method>(...)`` calls in nccl.py."""
    tree = ast.parse(inspect.getsource(nccl))
    methods = {m for m in dir(real.Communicator) if not m.startswith("_")}
    found = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "comm"
                and node.func.attr in methods):
            found.setdefault(node.func.attr, []).append(
                (len(node.args), tuple(k.arg for k in node.keywords)))
    return found


def test_every_call_the_backend_makes_binds_to_the_real_signature():
    calls = calls_in_backend()
    assert set(calls) == {"init", "new_group", "reduce_scatter", "all_gather", "all_reduce",
                          "bcast", "all_reduce_callback"}, calls
    for method, uses in calls.items():
        sig = as_signature(real_signature(method))
        for positional, keywords in uses:
            sig.bind(*range(positional), **{k: None for k in keywords})  # TypeError if not


def test_fake_exposes_exactly_the_real_signatures():
    methods = {m for m in dir(real.Communicator) if not m.startswith("_")}
    assert methods - set(dir(Fake)) == {"allreduce"}, "fake lacks only the deprecated allreduce"
    for method in sorted(methods - {"allreduce", "name", "size", "rank", "local_rank"}):
        fake = inspect.signature(getattr(Fake, method))
        fake_params = [(p.name, p.default) for p in list(fake.parameters.values())[1:]]
        assert fake_params == [(n, d) for n, _, d in real_signature(method)], method
    factory = inspect.signature(real.MultiProcessDataParallelCommunicator)  # (ctx)
    assert list(inspect.signature(Fake).parameters) == list(factory.parameters) == ["ctx"]
    for prop in ("name", "size", "rank", "local_rank"):
        assert isinstance(inspect.getattr_static(real.Communicator, prop), type(
            real.Communicator.rank)) and prop in dir(Fake)


def check_types(method, args, kwargs):
    """Raise TypeError where the real binding's conversions would (typed parameters)."""
    params = real_signature(method)
    bound = as_signature(params).bind(*args, **kwargs)
    for name, ctype, _ in params:
        if name in bound.arguments and ctype:
            value = bound.arguments[name]
            if not isinstance(value, TYPES[ctype]) or (ctype != "bool" and isinstance(value, bool)):
                raise TypeError(f"{method}: {name} must be {ctype}, got {type(value).__name__}")
        elif name in bound.arguments and name in ("data", "ndarray", "ndarray_list"):
            value = bound.arguments[name]
            for a in value if isinstance(value, list) else [value]:
                assert isinstance(a, nn.NdArray), (method, name, type(a))


class Recorder:
    """Stands in for an nnabla communicator: checks and records each call's arguments."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, method):
        def call(*args, **kwargs):
            check_types(method, args, kwargs)
            self.calls.append(method)
        return call


def test_the_backends_runtime_arguments_have_the_real_types():
    be = NCCLBackend(None, timeout=30, fake_device=fake_nccl)
    try:
        rec = be._comms[np.dtype(np.float32)] = Recorder()
        grp = NCCLGroup("nnabla_torus:0,1", [0, 1], 0, be.world)
        for n in (16, 17):
            buf = be.buffer_of(nn.NdArray.from_numpy_array(np.ones(n, np.float32)))
            be.reduce_scatter(grp, buf)
            be.all_gather(grp, buf)
            be.all_reduce(grp, buf)
            be.bcast(grp, buf, 1)
            be.all_gather_into(grp, be.sub(buf, 0, 3), be.empty(np.float32, 6))
        be.all_reduce_callback([nn.NdArray((3,))], 1024, False, grp, 1.0, False)
        # the group's nnabla new_group at its first call (issue 33: made on first use), typed
        # against the real binding like the rest
        assert rec.calls == ["new_group"] + ["reduce_scatter", "all_gather", "all_reduce",
                                             "bcast", "all_gather"] * 2 + [
                                                 "all_reduce_callback"], rec.calls
    finally:
        be._comms.clear()
        be.close()


# Calls the real binding refuses while converting its arguments (before it touches the C++
# communicator, so a bare ``Communicator()`` raises them on CPU too).
BAD_TYPES = [("bcast", "x, '0'"), ("reduce", "x, '1'"), ("all_reduce", "x, group=0"),
             ("reduce_scatter", "[x], x, group=0"), ("all_gather", "x, [x], group=1")]
# The fake's words for them: a root as the binding says it ("an integer is required"), a group
# more plainly than its "expected bytes, int found".
FAKE_TYPE_ERRORS = {"bcast": "an integer is required", "reduce": "an integer is required",
                    "all_reduce": "expected str for group, got int",
                    "reduce_scatter": "expected str for group, got int",
                    "all_gather": "expected str for group, got int"}


@pytest.mark.slow
def test_fake_raises_where_the_real_binding_raises_on_types():
    probe = ("import numpy as np, nnabla as nn, nnabla.communicators as C\n"
             "c = C.Communicator(); x = nn.NdArray.from_numpy_array(np.ones(3, np.float32))\n")
    for method, args in BAD_TYPES:  # a child each: a call that passed would use a null pointer
        code = probe + f"try:\n    c.{method}({args})\nexcept TypeError as e:\n    print('TE', e)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=scaled(120))
        assert "TE " in done.stdout, (method, args, done.stdout, done.stderr[-500:])
    comm = Fake(get_extension_context("cpu"))
    comm.init()
    x = nn.NdArray.from_numpy_array(np.ones(3, np.float32))  # noqa: F841  (used by eval)
    for method, args in BAD_TYPES:
        with pytest.raises(TypeError, match=re.escape(FAKE_TYPE_ERRORS[method])):
            eval(f"comm.{method}({args})")


def test_fake_rule_narrowed_view_cast_is_nnablas_own_error():
    """The real CPU error (no fake involved) that the CUDA kernels hit for any dtype mismatch."""
    half = nn.NdArray.from_numpy_array(np.zeros(8, np.float16))
    full = nn.NdArray.from_numpy_array(np.ones(8, np.float32))
    with pytest.raises(RuntimeError, match="cast of child-arrays is not permitted"):
        half.narrow(0, 2, 4).copy_from(full.narrow(0, 2, 4))


def test_fake_rules_kernel_context_device_affinity_and_async():
    comm = Fake(get_extension_context("cpu", type_config="float"))
    comm.init()  # sets fake GPU 0 and gives F.identity & co. the CUDA kernels' rules
    assert getattr(F.identity, "fake_cuda", False)
    buf = nn.NdArray.from_numpy_array(np.zeros(8, np.float16))
    fake_nccl.place(buf, 0)
    src = nn.NdArray.from_numpy_array(np.ones(4, np.float16))
    with nn.context_scope(get_extension_context("cpu", type_config="float", device_id="0")):
        with pytest.raises(RuntimeError, match="cast of child-arrays is not permitted"):
            buf.narrow(0, 0, 4).copy_from(src)  # IdentityCuda<float> into a float16 view
    other = nn.NdArray.from_numpy_array(np.zeros(8, np.float32))
    fake_nccl.place(other, 1)
    with nn.context_scope(get_extension_context("cpu", type_config="float", device_id="0")):
        with pytest.raises(RuntimeError, match="on fake GPU 1 used on fake GPU 0"):
            F.identity(src, outputs=[other.narrow(0, 0, 4)])
    with pytest.raises(RuntimeError, match="on fake GPU 1 used on fake GPU 0"):
        comm.all_reduce(other.narrow(0, 2, 2), inplace=True)
    x = nn.NdArray.from_numpy_array(np.full(4, 3.0, np.float32))
    comm.all_reduce(x, inplace=True, division=True)
    x.data[...] = 5.0  # the device has not run the collective yet: the result is not there
    fake_nccl.synchronize()
    assert np.array_equal(x.data, np.full(4, 3.0, np.float32))


def test_fake_device_rule_refuses_a_graph_on_another_gpu():
    """Issue 47 finding 1: a rank whose GPU is 1 running its network in a context of GPU 0
    (what gpu_cases did on every rank but the SyncBN case) fails on the fake, in forward and in
    backward; the same graph on the rank's own GPU runs, and an array of GPU 0 given to a
    collective of GPU 1 is refused."""
    import nnabla.parametric_functions as PF
    comm = Fake(get_extension_context("cpu", type_config="float"))
    comm.init()
    fake_nccl.set_device(1)               # as local_rank 1's init() would
    comm.ctx.device_id = "1"
    for device, fails in (("0", True), ("1", False), (None, False)):
        kw = {} if device is None else {"device_id": device}
        ctx = get_extension_context("cpu", type_config="float", **kw)
        assert ctx.device_id == (device or "")   # the fake keeps the device a context names

        def train(ctx=ctx, name=f"net{device}"):
            with nn.context_scope(ctx), nn.parameter_scope(name):
                x = nn.Variable.from_numpy_array(np.ones((2, 3), np.float32))
                y = PF.affine(x, 4)                  # Affine: the function hook
                y.forward()
                y.backward()
                F.sum(y.data)                        # F.sum: a wrapped kernel
        if fails:
            with pytest.raises(Exception) as raised:
                train()
            chain = f"{raised.value!r} {raised.value.__cause__!r}"
            assert "fake device rule: Affine runs on fake GPU 0" in chain, chain
            with pytest.raises(RuntimeError, match="F.sum runs on fake GPU 0"):
                with nn.context_scope(ctx):
                    F.sum(nn.NdArray.from_numpy_array(np.ones(3, np.float32)))
        else:
            train()
    other = nn.NdArray.from_numpy_array(np.zeros(8, np.float32))
    fake_nccl.place(other, 0)
    with pytest.raises(RuntimeError, match="was given an array of fake GPU 0"):
        comm.all_reduce(other, inplace=True)


def test_issue47_one_ndarray_in_place_runs_on_the_communicators_own_streams():
    """nnabla's Python all_reduce / bcast wrap one NdArray in a list (communicator.pyx
    ~241-250, ~361-370): in place, it runs on the communicator's blocking streams like a list;
    packed, on the legacy default stream. The fake said stream 0 for one NdArray."""
    comm = Fake(get_extension_context("cpu", type_config="float"))
    comm.init()
    fake_nccl.stream_log.clear()
    for data, inplace in ((nn.NdArray.from_numpy_array(np.ones(4, np.float32)), True),
                          ([nn.NdArray.from_numpy_array(np.ones(4, np.float32))], True),
                          (nn.NdArray.from_numpy_array(np.ones(4, np.float32)), False)):
        comm.all_reduce(data, inplace=inplace)
        comm.bcast(data, 0, inplace=inplace)
    fake_nccl.synchronize()
    kinds = [e[0] for e in fake_nccl.stream_log if e[0] != "host-sync"]
    assert kinds == ["blocking"] * 4 + ["legacy-default"] * 2, fake_nccl.stream_log
