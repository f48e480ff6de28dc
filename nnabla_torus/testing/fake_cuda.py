"""The fake GPU of the fake NCCL communicator: device placement, the CUDA kernels' rules for
a few nnabla functions, enqueued work completed only by a host sync, and a record of streams.

Device rule: a process has one fake GPU (``set_device``, nnabla's local_rank). Every nnabla
function whose context names a device (``device_id`` not empty) must name this one, in forward
and backward (a global function hook), and a collective or kernel refuses an array placed on
another device. A real GPU would make the peer copy silently (nnabla's callback casts each
gradient into the communicator's context, ext .cu ~1035-1036): every rank's network would then
run on the GPU its context names, e.g. all of them on GPU 0. While a fake GPU is set, the CPU
extension's contexts keep the ``device_id`` they are asked for, as a cudnn context does.

It stands in for ``nnabla_ext.cuda`` (``set_device``, ``synchronize``, ``Event``) in a CPU
run; what it mimics and what it cannot: docs/gpu.md ("The fake NCCL communicator").
"""
import time

import numpy as np
from mpi4py import MPI

TYPE_CONFIGS = {"float": np.float32, "half": np.float16}
CUDA_LIKE = ("identity", "mul_scalar", "pow_scalar", "sum")  # nnabla functions the rules wrap
_device = [None]  # this process's fake GPU (set_device), None before
_places = {}  # address -> (bytes, device) of arrays placed on a fake device
_pending = []  # enqueued collectives: (requests, finish), completed by synchronize()
HOOK = "nnabla_torus.fake_cuda.device_rule"  # the key of the global function pre hook
_cpu_context = []  # nnabla_ext.cpu.context while set_device has replaced it
# Stream model: the CUDA stream each collective and kernel is enqueued on, and the host syncs,
# in order, as (stream, op, reads): ``reads`` the host addresses of the arrays it reads (lines
# in ext multi_process_data_parallel_communicator.cu: see NCCLBackend.overlaps_backward).
# ("legacy-default", op): reduce_scatter / all_gather, and all_reduce / reduce / bcast packed
# (stream 0 or nullptr); ("blocking", op): those in place, one array or a list (streams that
# wait for stream 0, see stream_kind); ("non-blocking", op): all_reduce_callback's
# packs (cudaStreamNonBlocking, ordered by events), reads = the gradients packed;
# ("legacy-default", "F.<name>"): the CUDA_LIKE functions, kernels on the compute stream, reads
# = their NdArray inputs; ("host-sync", what): synchronize(), Event.synchronize() and, per
# gradient, a solver's check_inf_or_nan_grad (CountedSolver). Tests read and clear it.
stream_log = []
SOLVERS = ("Sgd", "Momentum", "Nesterov", "Lars", "Adam", "AdamW")  # counted (set_device)
_solvers = {}  # nnabla.solvers factories while set_device has replaced them


def _extent(ndarray):
    """(address, bytes) of ``ndarray``'s host memory, None when it holds no data yet."""
    try:
        data = ndarray.data if ndarray.size else None
    except RuntimeError:
        return None
    return None if data is None else (data.__array_interface__["data"][0], data.nbytes)


def place(ndarray, device):
    """Tag ``ndarray`` (a whole array) as living on fake GPU ``device``."""
    extent = _extent(ndarray)
    if extent:
        _places[extent[0]] = (extent[1], int(device))


def device_of(ndarray):
    """(device or None for host memory, whether ``ndarray`` is a narrowed part of it)."""
    extent = _extent(ndarray)
    if extent is None:
        return None, False
    address, nbytes = extent
    for start, (size, device) in _places.items():
        if start <= address and address + nbytes <= start + size:
            return device, (start, size) != (address, nbytes)
    return None, False


def _process():
    """'rank r' of this process in the MPI world (for the rule's messages)."""
    return f"rank {MPI.COMM_WORLD.Get_rank()}"


def check_device(ndarray, device, what):
    """Refuse an array of another fake GPU: a narrowed one with nnabla's own error (it cannot
    cast a child array across devices), a whole one by the device rule (module doc)."""
    where, narrowed = device_of(ndarray)
    if where is None or where == device:
        return
    if narrowed:
        raise RuntimeError(f"runtime error in {what} (fake device rule): cast of child-arrays is "
                           f"not permitted (a narrowed array on fake GPU {where} used on fake "
                           f"GPU {device})")
    raise RuntimeError(f"fake device rule: {what} on fake GPU {device} ({_process()}) was given "
                       f"an array of fake GPU {where}; keep every array of a rank on its GPU, "
                       f"comm.local_rank")


BARE = ("", "CpuArray")  # array classes of nnabla's bare contexts: the default (nn.Context's
#                          device "0" included) and a Python function's C++ side
_default = []  # nnabla's default context while set_device has put this process's device in it


def kernel_device(ctx):
    """The fake GPU a function of context ``ctx`` runs on: the device_id a context of the CPU
    extension names; else (none named, or one of nnabla's bare contexts) this process's."""
    if ctx.device_id and ctx.array_class not in BARE:
        return int(ctx.device_id)
    return 0 if _device[0] is None else _device[0]


def _device_rule(func):
    """Global function pre hook: ``func`` must run on this process's fake GPU. (A Python
    function's C++ side has nnabla's bare ``nn.Context()`` whatever its own: BARE.)"""
    device = kernel_device(func.context)
    if _device[0] is not None and device != _device[0]:
        raise RuntimeError(f"fake device rule: {func.info.type_name} runs on fake GPU {device} "
                           f"in the process of fake GPU {_device[0]} ({_process()}): build the "
                           f"graph in a context with device_id=str(comm.local_rank)")


def _like_cuda(name, function):
    """``function`` with the CUDA kernel's rules: device of the context, outputs cast to T."""
    def run(*args, **kwargs):
        import nnabla as nn
        ctx = nn.get_current_context()
        dtype = TYPE_CONFIGS.get(ctx.backend[0].split(":")[-1], np.float32)
        device = kernel_device(ctx)
        if not ctx.array_class:  # nnabla's bare default context names no array class
            ctx = nn.Context(list(ctx.backend), "CpuCachedArray", str(device))
        if _device[0] is not None and device != _device[0]:
            raise RuntimeError(f"fake device rule: F.{name} runs on fake GPU {device} in the "
                               f"process of fake GPU {_device[0]} ({_process()})")
        for a in list(args) + list(kwargs.get("outputs") or []):
            if isinstance(a, nn.NdArray):
                check_device(a, device, f"F.{name}")
        for out in kwargs.get("outputs") or []:
            out.cast(dtype, ctx)  # raises nnabla's own error for a narrowed view of another dtype
        reads = [_extent(a) for a in args if isinstance(a, nn.NdArray)]
        stream_log.append(("legacy-default", f"F.{name}", tuple(e[0] for e in reads if e)))
        return function(*args, **kwargs)
    run.fake_cuda, run.original = True, function
    return run


def current_device():
    """This process's fake GPU (``set_device``), None before."""
    return _device[0]


class CountedSolver:
    """An nnabla solver whose ``check_inf_or_nan_grad`` logs the host syncs it makes on a GPU:
    one per parameter whose gradient is not zeroing (nnabla ``src/nbla/solver.cpp`` ~310-323
    loops over them, each a blocking thrust reduction, ext
    ``include/nbla/cuda/solver/mixed_precision_training.cuh`` ~70-80). Everything else is the
    solver's own."""

    def __init__(self, solver):
        object.__setattr__(self, "solver", solver)

    def __getattr__(self, name):
        return getattr(self.solver, name)

    def check_inf_or_nan_grad(self):
        for v in self.solver.get_parameters().values():
            if not v.grad.zeroing:
                stream_log.append(("host-sync", "check_inf_or_nan_grad", ()))
        return self.solver.check_inf_or_nan_grad()


def _counted(factory):
    def make(*args, **kwargs):
        return CountedSolver(factory(*args, **kwargs))
    make.original = factory
    return make


def _context_keeping_device(context):
    """nnabla_ext.cpu.context that keeps ``device_id`` (the CPU one drops it)."""
    def keep(type_config="float", **kw):
        ctx = context(type_config=type_config, **kw)
        if kw.get("device_id") not in (None, ""):
            ctx.device_id = str(kw["device_id"])
        return ctx
    keep.original = context
    return keep


def set_device(device_id):
    """Make this process's fake GPU ``device_id``, give nnabla's functions the CUDA rules and
    the device rule (module doc)."""
    import nnabla as nn
    import nnabla.functions as F
    import nnabla_ext.cpu
    previous, _device[0] = _device[0], int(device_id)
    for name in CUDA_LIKE:
        function = getattr(F, name)
        if not getattr(function, "fake_cuda", False):
            setattr(F, name, _like_cuda(name, function))
    nn.set_function_pre_hook(HOOK, _device_rule)
    default = nn.get_current_context()
    # Again on this device (a second communicator's init(), maybe inside a user's
    # context_scope, where nnabla refuses set_default_context): nothing to change.
    again = bool(_default) and previous == _device[0]
    if not again and (_default or default.array_class in BARE):
        # nnabla's bare default names device "0", which a function built in it resolves to
        # (with a real array class): it is this process's device, as a CPU context's is
        _default[:1] = _default[:1] or [default]
        nn.set_default_context(nn.Context(list(default.backend), "CpuCachedArray",
                                          str(_device[0])))
    import nnabla.solvers as S
    for name in SOLVERS if not _solvers else ():
        _solvers[name] = getattr(S, name)
        setattr(S, name, _counted(_solvers[name]))
    if not _cpu_context:
        _cpu_context.append(nnabla_ext.cpu.context)
        nnabla_ext.cpu.context = _context_keeping_device(nnabla_ext.cpu.context)


def reset():
    """Give nnabla's functions back, forget placements and enqueued work (tests)."""
    import nnabla as nn
    import nnabla.functions as F
    import nnabla_ext.cpu
    for name in CUDA_LIKE:
        function = getattr(F, name)
        setattr(F, name, getattr(function, "original", function))
    if _device[0] is not None:
        nn.unset_function_pre_hook(HOOK)
    if _cpu_context:
        nnabla_ext.cpu.context = _cpu_context.pop()
    if _default:
        nn.set_default_context(_default.pop())
    import nnabla.solvers as S
    for name, factory in _solvers.items():
        setattr(S, name, factory)
    _solvers.clear()
    _device[0] = None
    _places.clear()
    _pending.clear()


def synchronize(device_id="0"):
    """Complete every enqueued collective (cudaDeviceSynchronize); spins while a peer is missing."""
    stream_log.append(("host-sync", "synchronize", ()))
    complete()


def complete():
    """Finish the enqueued collectives in order, waiting for their peers."""
    while _pending:
        requests, finish = _pending.pop(0)
        try:
            while not MPI.Request.Testall(requests):
                time.sleep(1e-4)
        except MPI.Exception:  # a dead peer: NCCL's kernels would spin, so does the fake
            while True:
                time.sleep(1.0)
        finish()


class Event:
    """``nnabla_ext.cuda.init.Event`` on the fake GPU: ``record()`` then ``synchronize()`` waits
    for the work enqueued so far (here: all of it), with the GIL released as nnabla's does."""

    def __init__(self, device_id):
        self.device_id = int(device_id)

    def record(self):
        pass

    def synchronize(self):
        stream_log.append(("host-sync", "event", ()))
        complete()


def stream_kind(inplace):
    """The stream nnabla enqueues all_reduce / reduce / bcast on. Its Python binding wraps one
    NdArray in a list (communicator.pyx ~241-250, ~361-370), so every call is the list form:
    in place, round-robin over the communicator's streams from plain cudaStreamCreate (ext .cu
    ~432-435, ~739-748: "blocking", ordered with stream 0); packed, nullptr (the legacy
    default stream)."""
    return "blocking" if inplace else "legacy-default"


def enqueue(requests, finish, stream, op, reads=()):
    """Record ``op`` on ``stream`` (reading the arrays at host addresses ``reads``);
    ``finish()`` runs once ``requests`` complete, at a host sync."""
    stream_log.append((stream, op, tuple(reads)))
    _pending.append((requests, finish))
