"""An algorithm declared MPI-only in the registry (``Algorithm.mpi_only``): refused on an NCCL
backend in one line (before: an AttributeError deep in the first all-reduce), and never a
candidate of the planner for a GPU profile."""
import numpy as np
import pytest

from nnabla_torus.comm import collectives
from nnabla_torus.planning import candidates, planner
from nnabla_torus.planning.costmodel import allreduce, params
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.testing import fake_nccl

NAME = "ring_lanes"


def ring_lanes(backend, plan, buf):
    """The ring through the MPI backend's lane scheduler: methods NCCL does not have."""
    backend.run_lanes([backend.all_reduce_steps(plan.world, buf, "ring_lanes all_reduce")])


@pytest.fixture
def registered(monkeypatch):
    """``ring_lanes`` registered last (as docs/contributing.md says), with a cost (half the
    ring's) for the planner."""
    monkeypatch.setitem(collectives.REGISTRY, NAME,
                        collectives.Algorithm(ring_lanes, "world", mpi_only=True))
    names = collectives.ALGORITHM_NAMES + (NAME,)
    for module in (params, allreduce, candidates, planner):
        monkeypatch.setattr(module, "ALGORITHMS", names)
    monkeypatch.setitem(allreduce.COSTS, NAME, lambda *args: {
        phase: seconds / 2 for phase, seconds in allreduce.ring_cost(*args).items()})
    yield names
    fake_nccl.reset()


def test_an_mpi_only_algorithm_is_refused_on_nccl_in_one_line(registered, monkeypatch):
    from nnabla_torus.comm.communicator import TorusCommunicator
    for how in ("keyword", "environment"):
        with pytest.raises(ValueError) as error:
            if how == "keyword":
                TorusCommunicator(backend="fake-nccl", algorithm=NAME)
            else:
                monkeypatch.setenv("NNABLA_TORUS_ALGORITHM", NAME)
                TorusCommunicator(backend="fake-nccl")
        message = str(error.value)
        assert message == ("all-reduce algorithm 'ring_lanes' runs on the MPI backend only, not "
                           "on 'fake-nccl'; choose one of torus2d, ring, hierarchical, native "
                           "or NNABLA_TORUS_BACKEND=mpi"), message
    monkeypatch.delenv("NNABLA_TORUS_ALGORITHM")
    assert TorusCommunicator(backend="mpi", algorithm=NAME).algorithm == NAME


def test_an_mpi_only_algorithm_runs_on_mpi_and_set_algorithm_refuses_it_on_nccl(registered):
    from nnabla_torus.comm.communicator import TorusCommunicator
    import nnabla as nn
    comm = TorusCommunicator(backend="mpi", algorithm=NAME)
    comm.init()
    data = np.arange(7, dtype=np.float32)
    nd = nn.NdArray.from_numpy_array(data.copy())
    comm.all_reduce(nd, division=True)
    assert nd.data.tolist() == data.tolist() and comm.algorithm == NAME   # one rank: the input
    nccl = TorusCommunicator(backend="fake-nccl", algorithm="native")
    nccl.init()
    with pytest.raises(ValueError, match="'ring_lanes' runs on the MPI backend only"):
        nccl.set_algorithm(NAME)
    assert nccl.algorithm == "native"
    nccl.close()


def test_an_mpi_only_algorithm_is_never_planned_for_a_gpu_profile(registered):
    cpu, gpu = load_profile("cpu-2core"), load_profile("dgx-a100")
    cpu_model = "resnet18-w0.125-16px"
    on_cpu = planner.plan(cpu, cpu_model, counts=[8], algorithms=registered)
    assert NAME in {registered[a] for a in on_cpu.candidates["algorithm"]}   # MPI ranks
    for prof, model, gpus in ((gpu, "resnet50", None), (cpu, cpu_model, True)):
        result = planner.plan(prof, model, counts=[8, 16], algorithms=registered, gpus=gpus)
        picked = {registered[a] for a in result.candidates["algorithm"]}
        assert NAME not in picked and "ring" in picked, picked


def test_a_cpu_profile_of_any_name_plans_mpi_only_algorithms(registered, tmp_path):
    """The profile's ``backend`` says whether its ranks are GPUs (before: every profile but the
    one named cpu-2core was taken for GPUs, so a calibrated CPU cluster lost these)."""
    from nnabla_torus.planning.machine_profile import profile_to_dict, save_profile
    raw = profile_to_dict(load_profile("cpu-2core"))
    assert raw["backend"] == "mpi"
    for backend, planned in (("mpi", True), ("nccl", False)):
        path = tmp_path / f"my-{backend}-cluster.yaml"
        save_profile(load_profile("cpu-2core")._replace(
            name=path.stem, extra={**load_profile("cpu-2core").extra, "backend": backend}),
            str(path))
        result = planner.plan(load_profile(str(path)), "resnet18-w0.125-16px", counts=[8],
                              algorithms=registered)
        assert (NAME in {registered[a] for a in result.candidates["algorithm"]}) == planned


def test_a_profile_backend_other_than_nccl_or_mpi_is_refused_by_name():
    from nnabla_torus.planning.profile_schema import profile_from_dict, profile_to_dict
    raw = dict(profile_to_dict(load_profile("dgx-a100")), backend="cuda")
    with pytest.raises(ValueError, match="backend 'cuda': must be one of nccl, mpi"):
        profile_from_dict(raw)
