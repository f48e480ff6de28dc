"""AdaptiveBatch (nnabla_torus/training/adaptive.py) in a loop on a stand-in communicator and
clock: the batch grows on exact norms of a known noise scale and measured step times, its own
all-reduces stay out of the norms, it says when the batch cannot move, and its state_dict
carries a run through a checkpoint to the same decisions."""

import numpy as np
import pytest

from nnabla_torus.planning.schedules import BatchSchedule
from nnabla_torus.training import AdaptiveBatch, adaptive

PHI, GRAD_SQ = 2000.0, 1.0     # tr(S) / |G|^2 of the stand-in gradients, in samples


class Comm:
    """Ranks that all see the same gradients: the all-reduce of a step adds the squared norms
    of a noise scale PHI (|G_b|^2 = G^2 + tr(S) / b), as the real one does with
    ``track_sqnorms``; ``allreduce_numpy`` sums over identical ranks and, like every tracked
    all-reduce, adds norms of its own (here absurd ones)."""

    def __init__(self, size):
        self.size, self.rank, self.track_sqnorms = size, 0, False
        self.norms = np.zeros(2)
        self.exchanges = 0

    def gradient_all_reduce(self, local_samples, global_batch):
        trace = PHI * GRAD_SQ
        self.norms += [GRAD_SQ + trace / local_samples, GRAD_SQ + trace / global_batch]

    def allreduce_numpy(self, array):
        self.exchanges += 1
        self.norms += 1e6
        array *= self.size
        return array

    def pop_sqnorms(self):
        values, self.norms = tuple(self.norms), np.zeros(2)
        return values


class Clock:
    """time.time() of the loop: the test moves it by each step's seconds."""
    now = 1000.0

    def time(self):
        return self.now


def step_seconds(plan):
    """A machine with a large fixed cost a step: 40 ms + accum x (1 ms + 0.1 ms a sample)."""
    return 0.040 + plan.accum_steps * (0.001 + 0.0001 * plan.local_batch)


def train(batch, comm, clock, steps, start=0):
    """The user's loop; returns the global batch of each step."""
    batches = []
    for step in range(start, start + steps):
        plan = batch.plan(step / 100)
        batch.begin_step()
        comm.gradient_all_reduce(plan.local_batch * plan.accum_steps, plan.global_batch)
        clock.now += step_seconds(plan)
        batch.end_step()
        batches.append(plan.global_batch)
    return batches


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(adaptive, "time", fake)
    return fake


def test_the_batch_grows_on_the_measured_noise_scale_and_step_times(clock):
    comm = Comm(4)
    batch = AdaptiveBatch(comm, max_local_batch=32, min_batch=32, max_batch=1024,
                          base_batch=32)
    assert comm.track_sqnorms and batch.fixed is None
    batches = train(batch, comm, clock, 40)
    # B0 until 2 warm-up + 5 measured steps (exchanged at once), then larger: phi = 2000
    assert batches[:7] == [32] * 7 and max(batches) > 32, batches
    assert batch.noise_scale[0] == pytest.approx(PHI)          # the 1e6 of the exchanges: out
    assert 1 <= comm.exchanges <= 40 // 10 + 3
    plan = batch.plan(0.4)
    assert plan.global_batch == 4 * plan.local_batch * plan.accum_steps
    assert plan.lr_factor == plan.global_batch / 32             # linear from base_batch
    notes = " ".join(batch.pop_notes())
    assert "throughput from measured step times" in notes or "change" in plan.reason


def test_the_state_dict_is_numbers_and_arrays_and_resumes_the_same_decisions(clock):
    def fresh():
        comm = Comm(4)
        return comm, AdaptiveBatch(comm, 32, min_batch=32, max_batch=1024, base_batch=32)

    comm, whole = fresh()
    first = train(whole, comm, clock, 12)
    state = whole.state_dict()
    assert all(isinstance(v, (int, float, np.ndarray)) for v in state.values()), state
    rest = train(whole, comm, clock, 20, start=12)
    clock.now = 1000.0
    comm, resumed = fresh()
    lines = resumed.load_state_dict(state)
    assert any("continues after" in line for line in lines), lines
    assert resumed.controller.current.global_batch == first[-1]
    assert train(resumed, comm, clock, 20, start=12) == rest


def test_a_state_of_another_rank_count_keeps_its_global_batch_split_anew(clock):
    comm = Comm(4)
    batch = AdaptiveBatch(comm, 32, min_batch=32, max_batch=1024, base_batch=32)
    assert train(batch, comm, clock, 12)[-1] == 128                    # 4 ranks x 32
    other = AdaptiveBatch(Comm(2), 32, min_batch=32, max_batch=1024, base_batch=32)
    lines = other.load_state_dict(batch.state_dict())
    assert lines[0] == ("resize: global batch 128 as 2 ranks x 32 x 2 accumulation (was 32 x 1 "
                        "per rank)"), lines
    assert "measured on 4 ranks, this run has 2" in lines[-1]
    plan = other.plan(0.12)
    assert (plan.global_batch, plan.local_batch, plan.accum_steps) == (128, 32, 2)


@pytest.mark.parametrize("size, bounds, refit_steps, why", [
    (1, (32, 1024), 5, "one rank measures no gradient noise scale"),
    (4, (64, 64), 5, "it is the only global batch in [min_batch, max_batch] on 4 rank(s)"),
    (4, (32, 1024), 0, "nothing prices a larger batch (no throughput= and refit_steps=0)"),
])
def test_it_says_first_when_the_batch_cannot_move(clock, size, bounds, refit_steps, why):
    comm = Comm(size)
    batch = AdaptiveBatch(comm, 32, min_batch=bounds[0], max_batch=bounds[1],
                          refit_steps=refit_steps)
    assert batch.fixed.startswith(f"adaptive batch: fixed at B0 = {bounds[0]}: ") and why in \
        batch.fixed, batch.fixed
    assert batch.pop_notes()[0] == batch.fixed
    assert set(train(batch, comm, clock, 30)) == {bounds[0]}


def test_a_schedule_is_followed_without_measuring(clock):
    comm = Comm(4)
    batch = AdaptiveBatch(comm, 32, schedule=BatchSchedule.parse("0:128,0.2:256"),
                          base_batch=128, refit_steps=0)
    assert batch.noise is None and not comm.track_sqnorms and batch.fixed is None
    batches = train(batch, comm, clock, 30)
    assert batches[:20] == [128] * 20 and batches[20:] == [256] * 10
    assert comm.exchanges == 0 and batch.state_dict() == {
        "ranks": 4, "global_batch": 256, "local_batch": 32, "accum_steps": 2, "lr_factor": 2.0}


def test_end_step_without_begin_step_says_which_call_is_missing(clock):
    batch = AdaptiveBatch(Comm(2), 32, min_batch=32)
    batch.plan(0.0)
    with pytest.raises(RuntimeError, match=r"end_step\(\) without begin_step\(\): call "):
        batch.end_step()
