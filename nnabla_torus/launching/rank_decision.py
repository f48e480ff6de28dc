"""Decide the rank count of each launch: the planner's resize rule within the slots that exist.

:func:`decide` is the one "resize now?" rule, asked by nnabla-torus-run and by train.py
(examples/imagenet/resize.py); :func:`fit_ranks` caps a count at the slots and at a split of
the global batch; :func:`launch_sequence` is the launches a batch schedule leads to (--dry-run).
"""
from ..planning import planner
from ..planning.run_forecast import run_costs
from ..planning.schedules import BatchSchedule
from .launcher_log import log


def restart_cost(prof, given=None):
    """Seconds per restart: ``given`` (--restart-cost), else the profile's ``run.restart_s``."""
    if given is not None:
        return float(given)
    return run_costs(prof)["restart_s"]


def fit_ranks(wanted, slots, global_batch=None):
    """(ranks, message): ``wanted`` capped at the ``slots`` that exist, and then the largest
    count that splits ``global_batch`` exactly (a count no batch split fits falls back)."""
    ranks, notes = wanted, []
    if wanted > slots:
        ranks = slots
        notes.append(f"wanted {wanted} ranks but only {slots} slots exist: using {slots}")
    if global_batch and global_batch % ranks:
        fit = max(p for p in range(1, ranks + 1) if global_batch % p == 0)
        notes.append(f"global batch {global_batch} does not split over {ranks} ranks: "
                     f"falling back to {fit}")
        ranks = fit
    return ranks, "; ".join(notes)


def phase_images(schedule, start, epochs, dataset_size):
    """Images in the phase of ``schedule`` that starts at epoch ``start`` (to ``epochs``)."""
    later = [s for s, _ in schedule.phases if s > start]
    return (min(later + [epochs]) - start) * dataset_size


def decide(prof, model, global_batch, current, images, restart_cost_s, slots=None, fixed=None,
           **plan_args):
    """(ResizeDecision, note): the one "resize now?" rule, for nnabla-torus-run and train.py.

    :func:`planner.plan_resize` for the rest of a batch phase (``images`` left at
    ``global_batch``, ``current`` ranks, None at the first launch) within the ``slots`` that
    exist (None: the profile's). A ``fixed`` count above the slots is capped to them; when the
    planner's count is the cap, it plans again without it and the note says if it wants more.
    ``plan_args``: local_batches, dataset_size, epochs. Raises planner.UnsplittableBatch.
    """
    note = ""
    if fixed is not None and slots and fixed > slots:
        fixed, note = fit_ranks(fixed, slots)
    d = planner.plan_resize(prof, model, global_batch, current, images, restart_cost_s,
                            max_gpus=slots, fixed_gpus=fixed, **plan_args)
    if fixed is None and slots and d.gpus == slots:        # at the cap: would it want more?
        wanted = planner.plan_resize(prof, model, global_batch, current, images,
                                     restart_cost_s, **plan_args).gpus
        if wanted > slots:
            note = (f"the planner wants {wanted} ranks but only {slots} slots "
                    f"exist: planning within them")
    return d, note


def decide_phase(args, prof, global_batch, current, images, epoch):
    """:func:`decide` for the launcher's flags at ``epoch``; ValueError naming the flag to
    change when no rank count splits the phase's batch."""
    fixed = BatchSchedule.parse(args.ranks_schedule).batch(epoch) if args.ranks_schedule \
        else None
    try:
        return decide(prof, args.model, global_batch, current, images,
                      restart_cost(prof, args.restart_cost), slots=args.total_slots,
                      fixed=fixed, dataset_size=args.dataset_size, epochs=args.epochs,
                      local_batches=[args.local_batch] if args.local_batch else None)
    except planner.UnsplittableBatch as e:
        raise ValueError(f"epoch {epoch:g}: {e}; give that phase of --schedule one of them"
                         + (" (or another --ranks-schedule)" if fixed is not None else "")
                         ) from None


def launch_sequence(args, prof):
    """[(epoch, ranks, decision)] of the launches the schedule leads to (for --dry-run)."""
    schedule = BatchSchedule.parse(args.schedule)
    starts = sorted({s for s, _ in schedule.phases} |
                    ({s for s, _ in BatchSchedule.parse(args.ranks_schedule).phases}
                     if args.ranks_schedule else set()))
    launches, current = [], None
    for start in starts:
        if start >= args.epochs:
            break
        batch = schedule.batch(start)
        end = min([s for s in starts if s > start] + [args.epochs])
        d, note = decide_phase(args, prof, batch, current, (end - start) * args.dataset_size, start)
        ranks, fit = fit_ranks(d.gpus, args.total_slots, batch)
        note = "; ".join(n for n in (note, fit) if n)
        log(f"epoch {start:g}: {d.reason}" + (f" ({note})" if note else ""))
        if current is None or (d.resize and ranks != current):
            launches.append((start, ranks, d))
            current = ranks
    return launches
