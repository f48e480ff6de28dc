"""The torus2d vs native-overlapped choice (NCCL across hosts, ``--algorithm planned``) re-made
from this run's own step times, once per run.

The cost model's choice (``nnabla_torus.planning.overlap_choice.choose``) runs first. After
``WARMUP_STEPS`` + ``TIMED_STEPS`` steps the other configuration runs as many; then
``overlap_choice.with_measured`` decides from both medians (means over ranks, so every rank
decides alike) and the run keeps the faster. ``choose_overlap`` and ``retime_overlap`` are the
run's side: they start the trial, log its choice and switch the communicator. Example
(``run_step.take_step`` does this)::

    trial = OverlapTrial(choice, comm.grid)      # choice.algorithm runs first
    switch = trial.observe(comm, step_seconds)   # per step: None, or the algorithm to run now
"""
import dataclasses

import numpy as np

from nnabla_torus.planning.overlap_choice import OverlapChoice, with_measured
from nnabla_torus.planning.overlap_choice import describe as describe_overlap_choice
from slotted import slotted

WARMUP_STEPS = 2   # steps after a switch not timed (graph rebuilt, NCCL groups made, caches)
TIMED_STEPS = 5    # steps timed per configuration; their median is its step time


@slotted
@dataclasses.dataclass
class OverlapTrial:
    """The choice so far (``choice.measured`` lists the configurations timed), torus2d's grid
    (to switch back to it), the algorithm running and the step seconds seen under it."""
    choice: OverlapChoice
    grid: object
    running: str = ""
    seen: list = dataclasses.field(default_factory=list)
    medians: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.running = self.running or self.choice.algorithm

    @property
    def done(self):
        return len(self.medians) == 2

    def observe(self, comm, step_s):
        """Record one step of ``step_s`` seconds (collective every WARMUP + TIMED steps); the
        algorithm to switch to now, or None."""
        if self.done:
            return None
        self.seen.append(step_s)
        if len(self.seen) < WARMUP_STEPS + TIMED_STEPS:
            return None
        local = np.array([np.median(self.seen[WARMUP_STEPS:])], np.float32)
        self.medians[self.running] = float(comm.allreduce_numpy(local)[0]) / comm.size
        self.seen = []
        if not self.done:
            self.running = "native" if self.running == "torus2d" else "torus2d"
            return self.running
        self.choice = with_measured(self.choice, self.medians)
        if self.choice.algorithm == self.running:
            return None
        self.running = self.choice.algorithm
        return self.running


def choose_overlap(run, plan):
    """On NCCL with an algorithm that cannot overlap (torus2d across hosts): the cost model's
    choice between it after backward and native overlapped, logged once per run with its
    numbers (nnabla_torus/planning/overlap_choice.py); with ``--algorithm planned`` switch to
    native when that is faster. True when the run now overlaps."""
    planning, comm, cfg = run.planning, run.parallel.comm, run.settings.cfg
    if planning.planner is None:
        return False
    if planning.overlap_trial is None:
        choice = planning.planner.overlap_choice(plan.local_batch, comm.grid.x)
        if not planning.overlap_choice_logged:
            planning.overlap_choice_logged = True
            run.settings.log(describe_overlap_choice(choice, planning.planner.prof.name) + (
                "; timing both on this run next" if cfg.algorithm == "planned" else
                f" (kept {comm.algorithm}: --algorithm {cfg.algorithm} was asked for)"))
        if cfg.algorithm != "planned":
            return False
        planning.overlap_trial = OverlapTrial(choice, comm.grid)
    if planning.overlap_trial.running != "native":
        return False
    comm.set_algorithm("native")
    return True


def retime_overlap(run, step_time):
    """Feed the overlap trial (choose_overlap) one step; switch when it says so, rebuilding
    the graph's reducer for the new algorithm; log the measured choice once it is made."""
    planning, comm = run.planning, run.parallel.comm
    trial = planning.overlap_trial
    if trial is None or trial.done:
        return
    switch = trial.observe(comm, step_time)
    if trial.done:
        run.settings.log(describe_overlap_choice(trial.choice, planning.planner.prof.name))
    if switch is not None:
        comm.set_algorithm(switch, trial.grid if switch == "torus2d" else None)
        run.net.graph_key = None      # graph_for builds the reducer of the new algorithm
