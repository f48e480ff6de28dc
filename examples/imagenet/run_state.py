"""What a training run holds (train.py's ``run``), grouped by what it is, and who changes it.

``run_setup.set_up`` builds the RunState; ``run_setup.resume_or_start`` fills the fields that
depend on a checkpoint (they start at the defaults below); the loop's functions read and change
the groups. Every group has slots: assigning a field that does not exist raises AttributeError, so
a misspelt name fails loudly instead of adding an attribute nobody reads. Example::

    run = RunState(Settings(cfg, log, "float", None), Parallel(comm),
                   Data(train_set, val_set), Network(model, params, grads, solvers),
                   Planning(planner, batch, lr_schedule), state)
    run.progress.step += 1
    run.progress.stpe = 2        # AttributeError: 'Progress' object has no attribute 'stpe'
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from slotted import slotted

if TYPE_CHECKING:      # for the annotations only: the communicator's module starts MPI
    from monitor_series import Series
    from nnabla_torus.comm.communicator import MultiProcessDataParallelCommunicator
    from nnabla_torus.loss_scaling import DynamicLossScaling
    from nnabla_torus.overlap import BucketedAllReduce
    from nnabla_torus.planning.schedules import LearningRateSchedule
    from nnabla_torus.training import AdaptiveBatch, State
    from config import TrainConfig
    from image_lists import Dataset
    from divergence import GradientAbsSum
    from overlap_trial import OverlapTrial
    from report import EpochMeter, RankZeroLog
    from resize import ResizeAdvisor
    from solvers import SolverGroup
    from stream import TrainStream
    from training_planner import TrainingPlanner


@slotted
@dataclasses.dataclass
class Settings:
    """What the run was asked for: the config, rank 0's log, the number type ("float" or
    "half", "float" on CPU) and the device index (None on CPU); set by set_up, changed by
    nobody (resume_or_start gives ``log`` its progress bar on rank 0)."""
    cfg: TrainConfig
    log: RankZeroLog
    type_config: str
    device_id: Optional[int]


@slotted
@dataclasses.dataclass
class Parallel:
    """The communicator and what works around its all-reduce: set_up makes ``comm`` (its
    algorithm switched by plan_step's planner, choose_overlap and a resumed checkpoint);
    graph_for makes one overlap ``reducer`` per training graph (None: all-reduce after
    backward); resume_or_start makes the FP16 loss ``scaler`` (None in fp32), whose scale
    take_step moves."""
    comm: MultiProcessDataParallelCommunicator
    reducer: Optional[BucketedAllReduce] = None
    scaler: Optional[DynamicLossScaling] = None


@slotted
@dataclasses.dataclass
class Data:
    """The images: training and validation sets (set_up; ``train_set.bad`` grows with the
    undecodable images found), the training ``stream`` and its position in epochs
    (resume_or_start; take_step advances it), the indices of the bad images logged so far
    (end_of_epoch adds to them)."""
    train_set: Dataset
    val_set: Dataset
    stream: Optional[TrainStream] = None
    reported_bad: set = dataclasses.field(default_factory=set)


@slotted
@dataclasses.dataclass
class Network:
    """The model: ``model(x, test)``, its parameters by name and their gradient arrays (and the
    sum of their absolute values, the divergence check's), the solvers (set_up; take_step
    updates them, resume_or_start restores them); the record a checkpoint must match, {arch,
    width, classes, image_size, recipe} (resume_or_start); the training graph (x, t, loss,
    objective, logits) and its key (local batch, accumulation steps), rebuilt by graph_for
    when the key changes."""
    model: object
    params: dict
    grads: list
    solvers: SolverGroup
    grad_abs_sum: GradientAbsSum            # of ``grads``: the divergence check's one read
    model_meta: Optional[dict] = None
    graph: Optional[tuple] = None
    graph_key: Optional[tuple] = None


@slotted
@dataclasses.dataclass
class Planning:
    """What decides batch, learning rate, all-reduce and rank count: the planner (None with
    --plan off; plan_step replans at each new global batch), the batch control (AdaptiveBatch:
    the batch schedule or the adaptive batch, its noise scale and measured step times; take_step
    feeds it) and the learning-rate schedule (set_up); the elastic ``advisor``
    (resume_or_start, None with --plan off); whether choose_overlap has logged its choice, and
    its trial of both configurations (OverlapTrial: NCCL across hosts, --algorithm planned);
    the key of the batch prior this run reads and leaves (priors.prior_key; adaptive only)."""
    planner: Optional[TrainingPlanner]
    batch: AdaptiveBatch
    lr_schedule: LearningRateSchedule
    advisor: Optional[ResizeAdvisor] = None
    overlap_choice_logged: bool = False
    overlap_trial: Optional[OverlapTrial] = None
    prior_key: Optional[dict] = None


@slotted
@dataclasses.dataclass
class Progress:
    """How far the run is: optimizer steps, images trained on and seconds spent in steps
    (take_step; restored by resume_or_start), [epoch, global batch] at each batch change
    (plan_step), the last validation top-1 / top-5 as fractions
    (end_of_epoch; None before) and the best top-1 so far, the monitors by name (rank
    0, else None); this epoch's meter (take_step adds, end_of_epoch logs and replaces it);
    steps in a row whose all-reduced gradients were not finite, and the first of them
    (take_step; 0 and None while finite); the last checkpoint written (save); (fraction
    of the run, noise scale, its relative error) of each adaptive step (take_step; the batch
    prior the run leaves, summary)."""
    step: int = 0
    images_seen: int = 0
    train_time: float = 0.0
    history: list = dataclasses.field(default_factory=list)
    top1: Optional[float] = None
    top5: Optional[float] = None
    best_top1: Optional[float] = None
    monitors: Optional[dict[str, Series]] = None
    epoch_meter: Optional[EpochMeter] = None
    nonfinite_steps: int = 0
    first_nonfinite: Optional[int] = None
    checkpoint: Optional[str] = None
    noise_series: list = dataclasses.field(default_factory=list)
    auto_checkpoint_every: int = 0     # --checkpoint-every auto's interval, once chosen


@slotted
@dataclasses.dataclass
class RunState:
    """One training run: the groups above, each with what it holds and who changes it, and
    its checkpoints' State (set_up; resume_or_start starts it, run_checkpoint saves it)."""
    settings: Settings
    parallel: Parallel
    data: Data
    net: Network
    planning: Planning
    state: State
    progress: Progress = dataclasses.field(default_factory=Progress)
