"""Resume a checkpoint written by N ranks on M ranks: same global batch, same data position.

Parameters, solver states, the loss scale, the noise-scale estimator and the controller's plan
come back unchanged; what depends on the world size is redone here: the saved global batch is
split anew over M ranks (``controller.resplit``), and the rest of the epoch is resharded so
that every later optimizer step uses exactly the images the N-rank run would have used
(``epoch_order``; several resizes in one epoch chain through the loader state's ``segments``).
``ResizeAdvisor`` asks the planner, at each new global batch, whether another rank count pays
for the rest of the phase: the decision ``nnabla-torus-run`` acts on (train.py --elastic 1).
The rules and their tests: docs/elastic.md#resuming-on-another-rank-count.
"""
import math

import numpy as np

from nnabla_torus.launching import elastic
from nnabla_torus.planning import planner
from nnabla_torus.planning.controller import resplit  # noqa: F401  (tests)
from nnabla_torus.knobs import env_value
from nnabla_torus.planning.schedules import BatchSchedule
from nnabla_torus.comm.topology import parse_grid

from training_planner import local_batch_choices


def epoch_order(num_images, seed, epoch, segments, size, step_images):
    """(order, left, per_rank) of epoch ``epoch`` on ``size`` ranks after ``segments``.

    ``order``: image indices whose contiguous split over ``size`` ranks gives each rank its
    shard (None: the seeded permutation, no resize this epoch). ``left``: fraction of the epoch
    still ahead when this world began. ``per_rank``: images per rank that cover ``left`` (the
    epoch ends when a rank's position reaches it; padding beyond it is not counted).
    """
    if not segments:
        return None, 1.0, math.ceil(num_images / size)
    order = np.random.default_rng([seed, epoch]).permutation(num_images)
    per_rank, left = math.ceil(num_images / segments[0][0]), 1.0
    worlds = [s[0] for s in segments[1:]] + [size]
    ks = [s[2] for s in segments[1:]] + [step_images]
    for (old, position, k, start, batch), new, new_k in zip(segments, worlds, ks):
        # Each old rank's rows as its loader (begun at ``start`` with ``batch``) would have
        # read them to the epoch's end, padding included (data.shard_plan's rule).
        loader_steps = math.ceil((math.ceil(len(order) / old) - start) / batch)
        shards = [order[len(order) * r // old: len(order) * (r + 1) // old] for r in range(old)]
        steps = math.ceil((per_rank - position) / k)
        rows = [np.resize(np.resize(s[start:] if len(s) > start else s,
                                    loader_steps * batch)[position - start:], steps * k)
                for s in shards]
        stream = np.stack(rows).reshape(old, steps, k).transpose(1, 0, 2).ravel()
        chunk = new * new_k
        stream = np.resize(stream, math.ceil(len(stream) / chunk) * chunk)
        order = stream.reshape(-1, new, new_k).transpose(1, 0, 2).ravel()
        left *= (per_rank - position) / per_rank
        per_rank = (per_rank - position) * old / new
    return order, left, per_rank


class EpochLayout:
    """The current epoch's order on this world size, for the training stream (see module doc).

    ``fraction(position)``: share of the epoch done when every rank has read ``position``
    images of its shard; ``per_rank``: position at which the epoch ends.
    """

    def __init__(self, num_images, seed, size, state=None):
        self.num_images, self.seed, self.size = num_images, seed, size
        state = state or {}
        self.start(state.get("epoch", 0), state.get("segments", []), state.get("step_images"))

    def start(self, epoch, segments=(), step_images=None):
        self.epoch, self.segments, self.step_images = epoch, list(segments), step_images
        self.order, self.left, self.per_rank = epoch_order(
            self.num_images, self.seed, epoch, self.segments, self.size, step_images)

    def fraction(self, position):
        return (1.0 - self.left) + self.left * min(position, self.per_rank) / self.per_rank

    def state(self):
        """What the checkpoint keeps of the layout (nothing without a resize this epoch)."""
        return {"segments": self.segments, "step_images": self.step_images} \
            if self.segments else {}


def resized_loader_state(state, old_size, old_step_images, new_plan):
    """The loader state that continues ``state`` (saved by ``old_size`` ranks) on a new world.

    The old world becomes one more segment of the epoch; the new one starts at image 0 of its
    resharded order with ``new_plan``'s per-rank batch. The state does not depend on the new
    world's size: ``EpochLayout`` reshards the segments over it when the loader starts.
    """
    if state is None:
        return None
    position = state["start_image"] + state["consumed_steps"] * state["batch_size"]
    new_k = new_plan.local_batch * new_plan.accum_steps
    fresh = {"epoch": state["epoch"], "start_image": 0, "batch_size": new_plan.local_batch,
             "consumed_steps": 0}
    if position == 0 and not state.get("segments"):
        return fresh                                   # at an epoch start: nothing to reshard
    segments = state.get("segments", []) + [[old_size, position, old_step_images,
                                             state["start_image"], state["batch_size"]]]
    return dict(fresh, segments=segments, step_images=new_k)


def fit_grid(grid, size):
    """(grid text or "", message): ``grid`` ("XxY") if it fits ``size`` ranks, else "" (the
    planner or the communicator chooses) and a message saying so."""
    if not grid or parse_grid(grid).size == size:
        return grid, ""
    return "", (f"resize: grid {grid} does not fit {size} ranks: falling back to the planner's "
                f"(or the communicator's default) grid")


class ResizeAdvisor:
    """Asks the planner, at each new global batch, which rank count the rest of the phase pays.

    The launcher (``nnabla-torus-run``) passes its slots, restart cost and an optional fixed
    rank schedule through the environment (``nnabla_torus.launching.elastic.ENV_*``); without it the
    profile's machine and its restart cost are assumed, and the decision is only logged.
    """

    def __init__(self, run_planner, batch_schedule, adaptive, epochs, dataset_size, size):
        self.run_planner, self.size = run_planner, size
        self.batch_schedule, self.adaptive = batch_schedule, adaptive
        self.epochs, self.dataset_size = epochs, dataset_size
        fixed = env_value(elastic.ENV_RANKS)
        self.fixed = BatchSchedule.parse(fixed) if fixed else None
        self.slots = env_value(elastic.ENV_SLOTS, None, int)
        self.cost = env_value(elastic.ENV_COST, None, float)
        self.decided = None      # (global batch, fixed count) of the latest decision

    def due(self, plan, epoch):
        """True when a decision is needed: a new global batch, or the fixed schedule moved."""
        return self._key(plan, epoch) != self.decided

    def _key(self, plan, epoch):
        return plan.global_batch, self.fixed.batch(epoch) if self.fixed else None

    def phase_end(self, epoch):
        """Epoch at which the current phase ends (the run's end in adaptive mode)."""
        starts = [] if self.adaptive else [s for s, _ in self.batch_schedule.phases]
        starts += [s for s, _ in self.fixed.phases] if self.fixed else []
        return min([s for s in starts if s > epoch] + [self.epochs])

    def decide(self, plan, epoch):
        """(ranks, ResizeDecision, note) for the rest of the phase (:func:`elastic.decide`);
        ranks fit the slots and batch."""
        rp = self.run_planner
        self.decided = self._key(plan, epoch)
        images = (self.phase_end(epoch) - epoch) * self.dataset_size
        cost = elastic.restart_cost(rp.prof, self.cost)
        try:
            d, note = elastic.decide(
                rp.prof, rp.model, plan.global_batch, self.size, images, cost, slots=self.slots,
                fixed=self.decided[1], local_batches=local_batch_choices(
                    rp.prof.models[rp.model].max_local_batch), **rp.common)
        except planner.UnsplittableBatch as e:   # no other count realises this exact batch
            return self.size, planner.ResizeDecision(
                self.size, None, False, 0.0, cost, math.inf,
                f"keep {self.size} rank(s) at global batch {plan.global_batch}: {e}"), ""
        ranks, fit = elastic.fit_ranks(d.gpus, self.slots or d.gpus, plan.global_batch)
        return ranks, d, "; ".join(n for n in (note, fit) if n)


def elastic_request(advisor, plan, epoch, acting, log):
    """The launcher request for ``plan`` at ``epoch`` (dict), or None to go on as launched.

    Without --elastic (``acting`` False) only a resize is logged, what nnabla-torus-run would
    do here; a decision to keep the ranks is logged in elastic runs only.
    """
    ranks, decision, note = advisor.decide(plan, epoch)
    move = decision.resize and ranks != advisor.size
    verb = "requesting a relaunch on" if acting else "nnabla-torus-run would relaunch on"
    if acting or move:
        log("elastic: " + (f"{verb} {ranks} ranks: " if move else "") + decision.reason
            + (f" ({note})" if note else ""))
    if not (acting and move):
        return None
    return {"ranks": ranks, "epoch": epoch, "global_batch": plan.global_batch,
            "reason": decision.reason, "gain_s": decision.gain_s,
            "restart_cost_s": decision.restart_cost_s}
