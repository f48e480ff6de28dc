"""nnabla's communicator API, as nnabla v1.39.0 documents it, on a TorusCommunicator under mpirun.

    mpirun -np 4 python tests/mpi/progs/nnabla_dropin.py   # "OK <case>" lines, "PASSED ..."

Written here from nnabla's docstrings and sources (python/src/nnabla/communicator.pyx,
nnabla-ext-cuda src/nbla/cuda/communicator/multi_process_data_parallel_communicator.cu), not
from nnabla's tests. Inputs are integer-valued (``comm_cases.values``: rank r's share is
visible in every sum), sizes 17 and 17x17, so sums are exact. Every collective runs on every
algorithm; NNABLA_TORUS_BACKEND=fake-nccl runs the same cases through the NCCL mapping.
Figures (the zeroing demo, SyncBN's largest differences) are printed as ``FIGURE`` lines.
"""
import os

import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import nnabla_torus as C
from comm_cases import BACKEND, P, RANK, check_close, expected_sum, run_cases, values

SHAPES = [(17,), (17, 17)]
NAMES = ("MultiProcessCommunicator", "MultiProcessDataParalellCommunicator",
         "MultiProcessDataParallelCommunicator", "Comm", "Dist")
ALGORITHMS = ("torus2d", "ring", "native", "hierarchical", "auto")


def arrays_of(rank, narrowed=False):
    """Rank ``rank``'s inputs: one NdArray per shape, or (``narrowed``) narrowed views of one
    array (``NdArray.narrow``), as nnabla users pass slices of a flat gradient buffer."""
    if not narrowed:
        return [nn.NdArray.from_numpy_array(values(s, k, rank)) for k, s in enumerate(SHAPES)]
    flat = np.concatenate([values(s, k, rank).ravel() for k, s in enumerate(SHAPES)])
    whole = nn.NdArray.from_numpy_array(flat)
    cut = int(np.prod(SHAPES[0]))
    return [whole.narrow(0, 0, cut), whole.narrow(0, cut, flat.size - cut)], whole


def check_sums(arrays, ranks, division, what):
    for k, (a, shape) in enumerate(zip(arrays, SHAPES)):
        want = expected_sum(shape, k, ranks) / (len(ranks) if division else 1)
        check_close(a.data.reshape(shape), want, 0 if not division else 1e-6, f"{what} [{k}]")


def check_near(got, want, what, rtol=1e-5):
    """|got - want| <= rtol * max |want| everywhere (float32 sums in another order)."""
    diff = float(np.max(np.abs(got - want)))
    assert diff <= rtol * float(np.max(np.abs(want))) + 1e-30, f"{what}: max |diff| {diff}"


# -- names ---------------------------------------------------------------------------------
def case_names():
    factories = [getattr(C, n) for n in NAMES]
    assert all(f is factories[0] for f in factories), "the aliases are one factory"
    comm = C.MultiProcessCommunicator()
    comm.init()
    assert (comm.size, comm.rank) == (P, RANK)
    assert comm.local_rank == RANK and isinstance(comm.name, str)   # one host here
    assert comm.list_groups() == {"world": list(range(P))} and comm.find_group("x") == []
    return comm


# -- collectives -----------------------------------------------------------------------------
def case_all_reduce(comm):
    """Every argument form: one NdArray, a list, narrowed views; division, inplace; a group."""
    for division in (False, True):
        for inplace in (False, True):
            what = f"all_reduce division={division} inplace={inplace}"
            single = arrays_of(RANK)[1]
            comm.all_reduce(single, division=division, inplace=inplace)
            check_close(single.data, expected_sum(SHAPES[1], 1, range(P)) /
                        (P if division else 1), 0 if not division else 1e-6, what + " single")
            listed = arrays_of(RANK)
            comm.all_reduce(listed, division, inplace)          # positional, as nnabla's
            check_sums(listed, range(P), division, what + " list")
            views, whole = arrays_of(RANK, narrowed=True)
            comm.all_reduce(views, division=division, inplace=inplace)
            check_sums(views, range(P), division, what + " narrowed")


def odd_group(comm):
    """Group "odd" (ranks 1, 3, ...; rank 0 alone at 1 rank), made once."""
    members = list(range(1, P, 2)) or [0]
    if "odd" not in comm.list_groups():
        assert comm.new_group(("odd", members)) == "odd"
    assert comm.find_group("odd") == members
    return members


def case_groups(comm):
    members = odd_group(comm)
    if RANK not in members:
        return
    for inplace in (False, True):
        arrays = arrays_of(RANK)
        comm.all_reduce(arrays, division=False, inplace=inplace, group="odd")
        check_sums(arrays, members, False, f"group all_reduce inplace={inplace}")


def case_reduce(comm):
    """Only ``dst`` (a position in the group) receives the sum; the others keep their data."""
    members = odd_group(comm)
    for group, ranks in (("world", list(range(P))), ("odd", members)):
        if RANK not in ranks:
            continue
        for dst in range(len(ranks)):
            for division, inplace in ((False, False), (True, True)):
                arrays = arrays_of(RANK)
                comm.reduce(arrays, dst, division=division, inplace=inplace, group=group)
                what = f"reduce dst={dst} group={group} division={division}"
                if ranks.index(RANK) == dst:
                    check_sums(arrays, ranks, division, what)
                else:
                    for k, (a, s) in enumerate(zip(arrays, SHAPES)):
                        check_close(a.data, values(s, k, RANK), 0, what + " (not dst)")
        single = arrays_of(RANK)[0]
        comm.reduce(single, dst=0, group=group)   # one NdArray, keywords
        if ranks.index(RANK) == 0:
            check_close(single.data, expected_sum(SHAPES[0], 0, ranks), 0, "reduce single")


def case_bcast(comm):
    for src in range(P):
        for inplace in (False, True):
            arrays = arrays_of(RANK)
            comm.bcast(arrays, src, inplace=inplace)
            for k, (a, s) in enumerate(zip(arrays, SHAPES)):
                check_close(a.data, values(s, k, src), 0, f"bcast src={src} inplace={inplace}")


def case_gather_scatter(comm):
    for group, ranks in (("world", list(range(P))), ("odd", odd_group(comm))):
        if RANK not in ranks:
            continue
        mine = nn.NdArray.from_numpy_array(values((17,), 0, RANK))
        outs = [nn.NdArray((17,)) for _ in ranks]
        comm.all_gather(mine, outs, group=group)
        for r, out in zip(ranks, outs):
            check_close(out.data, values((17,), 0, r), 0, f"all_gather {group}")
        ins = [nn.NdArray.from_numpy_array(values((17,), k, RANK)) for k in range(len(ranks))]
        out = nn.NdArray((17,))
        comm.reduce_scatter(ins, out, division=False, group=group)
        check_close(out.data, expected_sum((17,), ranks.index(RANK), ranks), 0,
                    f"reduce_scatter {group}")


def case_context_parameters(comm):
    """The deprecated allreduce() sums the gradients of the first added parameters."""
    nn.clear_parameters()
    with nn.parameter_scope("ctxp"):
        params = {k: nn.parameter.get_parameter_or_create(f"p{k}", s, need_grad=True)
                  for k, s in enumerate(SHAPES)}
    for k, v in params.items():
        v.g = values(SHAPES[k], k, RANK)
    comm.add_context_and_parameters((nn.get_current_context(), params))
    comm.allreduce(division=False, inplace=False)
    check_sums([v.grad for v in params.values()], range(P), False, "allreduce")
    comm.clear_context_parameters()
    try:
        comm.allreduce()
    except RuntimeError as e:
        assert "add_context_and_parameters" in str(e), e
    else:
        raise AssertionError("allreduce after clear_context_parameters did not raise")
    nn.clear_parameters()


# -- zeroing rule ------------------------------------------------------------------------------
def case_zeroing(comm):
    """zero()-ed on every rank: untouched, still zeroing; zero()-ed on some: summed."""
    for inplace in (False, True):
        for division in (False, True):
            everywhere = nn.NdArray((17,))
            everywhere.zero()
            somewhere = nn.NdArray.from_numpy_array(values((17, 17), 1, RANK))
            if RANK % 2 == 0:
                somewhere.zero()
            live = arrays_of(RANK)[0]
            comm.all_reduce([everywhere, somewhere, live], division=division, inplace=inplace)
            what = f"zeroing inplace={inplace} division={division}"
            assert everywhere.zeroing, what + ": zero()-ed on every rank lost its mark"
            check_close(everywhere.data, np.zeros(17), 0, what)
            assert P == 1 or not somewhere.zeroing or all(r % 2 == 0 for r in range(P)), what
            odd = [r for r in range(P) if r % 2]
            want = expected_sum((17, 17), 1, odd) if odd else np.zeros((17, 17))
            check_close(somewhere.data, want / (P if division else 1), 1e-6, what + " some")
            check_close(live.data, expected_sum((17,), 0, range(P)) / (P if division else 1),
                        1e-6, what + " live")


def zeroing_demo(comm):
    """nnabla's rule through a solver: Momentum with weight decay, a parameter no rank reached."""
    nn.clear_parameters()
    w = nn.parameter.get_parameter_or_create("demo/w", (1,), need_grad=True)
    w.d = 1.0
    solver = S.Momentum(lr=0.1, momentum=0.9)
    solver.set_parameters({"w": w})
    solver.zero_grad()
    comm.all_reduce([w.grad], division=True)
    solver.weight_decay(0.5)
    solver.update()
    if RANK == 0:
        print(f"FIGURE zeroing demo: {P} ranks, w 1.0 -> {float(w.d[0]):.4f} after "
              f"zero_grad, all_reduce, weight_decay(0.5), Momentum update", flush=True)
    check_close(w.d, np.ones(1), 0, "a zeroing gradient: no decay, no update")
    nn.clear_parameters()


# -- all_reduce_callback -----------------------------------------------------------------------
def small_net(x, scale=1.0):
    """Two affine layers and one weight used twice (shared), plus a parameter never used."""
    h = F.tanh(PF.affine(x, 5, name="a"))
    with nn.parameter_scope("shared"):
        h = PF.affine(h, 5, name="s")
        h = F.relu(PF.affine(h, 5, name="s"))
    nn.parameter.get_parameter_or_create("unused", (3,), need_grad=True)
    return F.mean(PF.affine(h, 2, name="out") ** 2) * scale


def case_callback(comm):
    rng = np.random.RandomState(7)
    for pack_size, division, scale in ((7, False, 1.0), (10 ** 6, True, 2.0)):
        nn.clear_parameters()
        nn.seed(3)
        x = nn.Variable((4, 6))
        data = rng.randint(-3, 4, size=(P,) + x.shape).astype(np.float32)
        x.d = data[RANK]
        loss = small_net(x)
        params = nn.get_parameters(grad_only=False)
        comm.bcast([v.data for v in params.values()], 0)   # the same model on every rank
        grads = [v.grad for v in params.values()]
        # the reference: each rank's gradients, summed after backward
        want = {}
        for r in range(P):
            x.d = data[r]
            loss.forward()
            for v in params.values():
                v.grad.zero()
            loss.backward()
            for k, v in params.items():
                want[k] = want.get(k, 0) + v.g.astype(np.float64) * scale
        x.d = data[RANK]
        callback = comm.all_reduce_callback(grads, pack_size, division=division,
                                            scale_grad=scale)
        for _ in range(2):   # a second backward with the same callback
            loss.forward()
            for v in params.values():
                v.grad.zero()
            loss.backward(clear_buffer=True, communicator_callbacks=[callback])
            what = f"all_reduce_callback pack_size={pack_size} division={division}"
            for k, v in params.items():
                if k == "unused":
                    assert v.grad.zeroing, what + ": a parameter no rank reached lost its mark"
                    continue
                if k.startswith("shared/") and BACKEND != "mpi" and pack_size < 10 ** 6:
                    # nnabla's own callback (the NCCL backend passes it through) packs a
                    # gradient at each use (ext multi_process_data_parallel_communicator.cu
                    # ~1019-1030); a pack of the first use may be unpacked (~1130-1135) after
                    # a later use added to the gradient, losing that part. The fake models
                    # that earliest schedule; the MPI backend's own callback has no such loss.
                    continue
                check_near(v.g, want[k] / (P if division else 1), f"{what} {k}")
    nn.clear_parameters()


# -- SyncBN ------------------------------------------------------------------------------------
def case_sync_bn(comm):
    """F/PF.sync_batch_normalization with our communicator == batch_normalization over the
    concatenated batch of all ranks: forward, backward, running statistics. Rank r holds
    r + 1 samples (unequal shares)."""
    counts = [r + 1 for r in range(P)]
    lo = sum(counts[:RANK])
    worst = {"forward": 0.0, "backward": 0.0, "forward, relative": 0.0,
             "backward, relative": 0.0}   # relative: to 1 + the largest |reference value|
    rng = np.random.RandomState(11)
    for axes, shape in (([1], (3, 5, 4)), ([3], (5, 4, 3))):
        channels = shape[axes[0] - 1]
        full = (rng.randn(sum(counts), *shape) * 3 + 1).astype(np.float32)
        dy = rng.randn(*full.shape).astype(np.float32)
        for batch_stat in (True, False):
            for form in ("F", "PF"):
                nn.clear_parameters()
                param_shape = [1, 1, 1, 1]
                param_shape[axes[0]] = channels
                rm0 = rng.rand(*param_shape).astype(np.float32)
                rv0 = rng.rand(*param_shape).astype(np.float32) + 0.5
                gamma0 = rng.rand(*param_shape).astype(np.float32) + 0.5
                beta0 = rng.randn(*param_shape).astype(np.float32)

                def build(x, sync):
                    if form == "PF":
                        init = {"beta": beta0, "gamma": gamma0, "mean": rm0, "var": rv0}
                        with nn.parameter_scope("sync" if sync else "ref"):
                            if sync:
                                y = PF.sync_batch_normalization(
                                    x, comm, group="world", axes=axes, decay_rate=0.8,
                                    eps=1e-3, batch_stat=batch_stat, param_init=init)
                            else:
                                y = PF.batch_normalization(
                                    x, axes=axes, decay_rate=0.8, eps=1e-3,
                                    batch_stat=batch_stat, param_init=init)
                            p = nn.get_parameters(grad_only=False)
                        return y, [p["bn/" + n] for n in ("beta", "gamma", "mean", "var")]
                    v = [nn.Variable.from_numpy_array(a, need_grad=n < 2)
                         for n, a in enumerate((beta0, gamma0, rm0, rv0))]
                    if sync:
                        y = F.sync_batch_normalization(x, *v, comm, "world", axes, 0.8, 1e-3,
                                                       batch_stat)
                    else:
                        y = F.batch_normalization(x, *v, axes=axes, decay_rate=0.8, eps=1e-3,
                                                  batch_stat=batch_stat)
                    return y, v

                xs = nn.Variable.from_numpy_array(full[lo:lo + counts[RANK]], need_grad=True)
                ys, vs = build(xs, True)
                for v in [xs] + vs:
                    v.grad.zero()
                ys.forward()
                ys.backward(dy[lo:lo + counts[RANK]])
                share = [vs[0].g.copy(), vs[1].g.copy()]
                comm.all_reduce([vs[0].grad, vs[1].grad])   # the data-parallel gradient sum
                xr = nn.Variable.from_numpy_array(full, need_grad=True)
                yr, vr = build(xr, False)
                for v in [xr] + vr:
                    v.grad.zero()
                yr.forward()
                yr.backward(dy)
                what = f"sync_bn {form} axes={axes} batch_stat={batch_stat}"
                sl = slice(lo, lo + counts[RANK])
                pairs = {"forward": [(ys.d, yr.d[sl]), (vs[2].d, vr[2].d), (vs[3].d, vr[3].d)],
                         "backward": [(xs.g, xr.g[sl]), (vs[0].g, vr[0].g),
                                      (vs[1].g, vr[1].g)]}
                for kind, items in pairs.items():
                    for got, want in items:
                        diff = float(np.max(np.abs(got - want)))
                        scale = 1 + float(np.max(np.abs(want)))
                        worst[kind] = max(worst[kind], diff)
                        worst[kind + ", relative"] = max(worst[kind + ", relative"], diff / scale)
                        assert diff <= 1e-4 * scale, f"{what} {kind}: max |diff| {diff}"
                assert all(np.isfinite(s).all() for s in share), what
    diffs = world_max(worst)
    if RANK == 0:
        print(f"FIGURE sync_bn {P} ranks: max |ours - one-process batch_normalization| "
              f"forward (y, running mean/var) {diffs['forward']:.3g} "
              f"(relative {diffs['forward, relative']:.2g}), backward (dx, dbeta, dgamma) "
              f"{diffs['backward']:.3g} (relative {diffs['backward, relative']:.2g})", flush=True)
    nn.clear_parameters()


def world_max(values_by_kind):
    return {k: MPI.COMM_WORLD.allreduce(v, op=MPI.MAX) for k, v in values_by_kind.items()}


def case_sync_bn_group_and_stats(comm):
    """``group``: statistics over the group's members only; ``output_stat=True``: the batch
    mean and (biased) variance of the members' concatenated batch."""
    members = odd_group(comm)
    if RANK not in members:
        return
    rng = np.random.RandomState(5)
    full = (rng.randn(2 * P, 3, 4) * 2 + 1).astype(np.float32)
    mine = full[2 * RANK:2 * RANK + 2]
    together = np.concatenate([full[2 * r:2 * r + 2] for r in members])
    v = [nn.Variable.from_numpy_array(a) for a in
         (np.zeros((1, 3, 1)), np.ones((1, 3, 1)), np.zeros((1, 3, 1)), np.ones((1, 3, 1)))]
    y, mean, var = F.sync_batch_normalization(nn.Variable.from_numpy_array(mine), *v, comm,
                                              group="odd", axes=[1], output_stat=True)
    F.sink(y, mean, var).forward()
    check_near(mean.d.ravel(), together.mean(axis=(0, 2)), "group sync_bn mean", 1e-5)
    check_near(var.d.ravel(), together.var(axis=(0, 2)), "group sync_bn variance", 1e-5)
    want = (mine - together.mean(axis=(0, 2), keepdims=True)) / np.sqrt(
        together.var(axis=(0, 2), keepdims=True) + 1e-5)
    check_near(y.d, want, "group sync_bn output", 1e-5)


def case_sync_bn_recompute(comm):
    """nnabla's recomputation (``Variable.recompute``: the output is cleared after forward and
    recomputed in backward) gives the same gradients and updates the running mean once."""
    x_data = values((4, 3, 5), 0, RANK)
    results = []
    for recompute in (False, True):
        nn.clear_parameters()
        x = nn.Variable.from_numpy_array(x_data, need_grad=True)
        h = PF.sync_batch_normalization(x, comm, decay_rate=0.5)
        h.recompute = recompute
        loss = F.sum(F.mul2(h, h))   # mul2 needs h in backward: a cleared h is recomputed
        loss.forward(clear_no_need_grad=True)
        x.grad.zero()
        loss.backward(clear_buffer=True)
        results.append((x.g.copy(), nn.get_parameters(grad_only=False)["bn/mean"].d.copy()))
    assert np.array_equal(results[0][0], results[1][0]), "same dx with recomputation"
    assert np.array_equal(results[0][1], results[1][1]), "running mean updated once"
    nn.clear_parameters()


def case_sync_bn_first_class(comm):
    """The CPU function as nnabla's own (issue 33): ``parent.name`` and ``info.args`` of
    nnabla's SyncBatchNormalization; a direct ``Function.recompute`` gives the same outputs
    and leaves the running statistics as forward left them (nnabla's test helper
    ``recomputation_test``, ``nbla_test_utils.py`` ~355-395)."""
    x = nn.Variable.from_numpy_array(values((4, 3, 5), 0, RANK))
    v = [nn.Variable.from_numpy_array(a) for a in
         (np.zeros((1, 3, 1)), np.ones((1, 3, 1)), np.zeros((1, 3, 1)), np.ones((1, 3, 1)))]
    y = F.sync_batch_normalization(x, *v, comm, "world", [1], 0.5, 1e-5, True)
    f = y.parent
    assert f.name == "SyncBatchNormalization", f.name
    assert f.info.type_name == "SyncBatchNormalization", f.info.type_name
    assert f.info.args == {"comm": "<Communicator>", "group": "world", "axes": [1],
                           "decay_rate": 0.5, "eps": 1e-5, "batch_stat": True}, f.info.args
    f.forward([x, *v], [y])
    after_forward = [a.d.copy() for a in v[2:]], y.d.copy()
    y.data.clear()
    f.recompute([x, *v], [y])
    for got, want in zip([a.d for a in v[2:]], after_forward[0]):
        assert np.array_equal(got, want), "recompute updated the running statistics"
    assert np.array_equal(y.d, after_forward[1]), "recompute changed the output"
    y2 = F.relu(x)   # nnabla's own functions keep their names
    assert y2.parent.name == "ReLU", y2.parent.name


def case_sync_bn_saved():
    """With ``SYNC_BN_NNP_DIR``: rank 0 saves a conv -> SyncBN (batch_stat=True) -> ReLU graph
    to sync_bn.nnp (as BatchNormalization), its input x.bin and the output a one-process
    batch normalization of that batch gives (want.npy), for nnabla_cli infer to run."""
    folder = os.environ.get("SYNC_BN_NNP_DIR")
    if not folder:
        return
    comm = C.MultiProcessCommunicator()
    comm.init()
    rng = np.random.RandomState(7)
    x_data = rng.randn(3, 2, 5, 5).astype(np.float32)
    nn.clear_parameters()
    x = nn.Variable.from_numpy_array(x_data)
    h = PF.convolution(x, 4, (3, 3), pad=(1, 1), name="conv")
    y = F.relu(PF.sync_batch_normalization(h, comm, eps=1e-3, name="bn"))
    y.forward()
    if RANK == 0:
        from nnabla.utils import save
        save.save(os.path.join(folder, "sync_bn.nnp"), {
            "networks": [{"name": "net", "batch_size": 3, "outputs": {"y": y},
                          "names": {"x": x}}],
            "executors": [{"name": "runtime", "network": "net", "data": ["x"],
                           "output": ["y"]}]})
        x_data.tofile(os.path.join(folder, "x.bin"))
        params = {k.split("/")[-1]: v for k, v in nn.get_parameters(grad_only=False).items()
                  if k.startswith("bn")}
        conv = h.d   # the convolution of x alone (no statistics involved)
        mean, var = conv.mean(axis=(0, 2, 3), keepdims=True), conv.var(axis=(0, 2, 3),
                                                                      keepdims=True)
        want = (conv - mean) / np.sqrt(var + 1e-3) * params["gamma"].d + params["beta"].d
        np.save(os.path.join(folder, "want.npy"), np.maximum(want, 0))
    nn.clear_parameters()


def case_sync_bn_foreign_comm():
    """Anything but our communicator still goes to nnabla's own function (and its check)."""
    x = nn.Variable((2, 3, 4, 4))
    v = [nn.Variable((1, 3, 1, 1)) for _ in range(4)]
    try:
        F.sync_batch_normalization(x, *v, object())
    except TypeError as e:
        assert "Communicator" in str(e), e
    else:
        raise AssertionError("nnabla's own sync_batch_normalization accepted an object")


def case_bad_input(comm):
    """Wrong arguments of the new calls: the same clear error on every rank, no hang."""
    def raises(call, kind, text):
        try:
            call()
        except kind as e:
            assert text in str(e), (text, str(e))
        else:
            raise AssertionError(f"no {kind.__name__} for {text!r}")
    a = arrays_of(RANK)
    raises(lambda: comm.reduce(a, P), ValueError, f"reduce destination {P} is not a position")
    raises(lambda: comm.reduce(a, -1, group="world"), ValueError, "use 0..")
    raises(lambda: comm.all_reduce_callback(a, 0), ValueError, "pack_size=0 must be an integer")
    raises(lambda: comm.all_reduce_callback(a, 8, group="nope"), ValueError,
           "unknown group 'nope'")
    raises(lambda: comm.add_context_and_parameters({}), TypeError, "needs a tuple (ctx,")
    raises(lambda: comm.allreduce(), RuntimeError, "add_context_and_parameters")


def cases():
    """(name, function) pairs; the first makes the communicator the others use."""
    made = []

    def with_comm(case):
        return lambda: case(made[0])
    out = [("names and properties", lambda: made.append(case_names()))]
    for algorithm in ALGORITHMS:
        out += [(f"{algorithm}: set", with_comm(lambda comm, a=algorithm: comm.set_algorithm(a))),
                (f"{algorithm}: all_reduce forms", with_comm(case_all_reduce)),
                (f"{algorithm}: zeroing rule", with_comm(case_zeroing)),
                (f"{algorithm}: reduce", with_comm(case_reduce))]
    out += [("groups", with_comm(case_groups)), ("bcast", with_comm(case_bcast)),
            ("all_gather and reduce_scatter", with_comm(case_gather_scatter)),
            ("allreduce and context parameters", with_comm(case_context_parameters)),
            ("zeroing demo", with_comm(zeroing_demo)),
            ("bad input", with_comm(case_bad_input)),
            ("all_reduce_callback", with_comm(case_callback)),
            ("sync_batch_normalization", with_comm(case_sync_bn)),
            ("sync_batch_normalization group and output_stat",
             with_comm(case_sync_bn_group_and_stats)),
            ("sync_batch_normalization recompute", with_comm(case_sync_bn_recompute)),
            ("sync_batch_normalization first-class", with_comm(case_sync_bn_first_class)),
            ("sync_batch_normalization saved", case_sync_bn_saved),
            ("sync_batch_normalization foreign comm", case_sync_bn_foreign_comm)]
    return out


def main():
    """Every case, or (DROPIN_ONLY=text) the communicator's set-up and the cases whose name
    holds the text."""
    only = os.environ.get("DROPIN_ONLY")
    run_cases([(name, case) for k, (name, case) in enumerate(cases())
               if not only or k == 0 or only in name or name.endswith(": set")],
              f"nnabla_dropin on {P} ranks")


if __name__ == "__main__":
    main()
