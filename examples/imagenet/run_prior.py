"""The run's batch prior (--batch-prior): found and shared at set-up, left for later runs at
the end.

An adaptive run starts its batch-size controller from a prior (an earlier run's noise scale
and step times, or the published figures: nnabla_torus/planning/priors.py) under the key of
its model, data, rank count and machine; at its end rank 0 writes its own as the prior of
later runs. Example::

    key, prior = batch_prior(cfg, comm, planner, n_params, train_set, log)   # every rank
    leave_prior(run, comm.settings.cache_dir, output_dir, log)                    # rank 0
"""
import os

from nnabla_torus.planning import efficiency_fit, priors


def data_name(cfg, train_set):
    """The dataset's name in a prior's key and in the published figures: the embedded set's
    (``digits``, --dataset), ``imagenet`` (1,000 classes), else the data folder."""
    if not cfg.data_dir:
        return cfg.dataset
    return "imagenet" if train_set.num_classes == 1000 else os.path.abspath(cfg.data_dir)


def batch_prior(cfg, comm, planner, n_params, train_set, log):
    """(key, Prior or None) of --batch-prior: rank 0 reads it (its own disk) and sends it to
    every rank, so every controller decides alike (AdaptiveBatch takes its step times). An
    --efficiency-fit of another task (the key's model and data) is refused here."""
    from nnabla_torus.comm.communicator import MPI
    machine = (f"{planner.prof.name if planner else 'no planner'} "
               f"{len(comm.hosts.hosts)}x{comm.hosts.ranks_per_host or 0}")
    key = priors.prior_key(
        {"arch": cfg.arch, "width": cfg.width, "image_size": cfg.image_size,
         "parameters": n_params},
        {"data": data_name(cfg, train_set), "images": len(train_set),
         "classes": train_set.num_classes}, comm.size, machine)
    if cfg.efficiency_fit:        # every rank: each raises the same line
        path = os.path.expanduser(cfg.efficiency_fit)
        efficiency_fit.check_task(efficiency_fit.load(path), efficiency_fit.task_of(key), path)
    found = None
    if comm.rank == 0:
        found = priors.find(cfg.batch_prior, comm.settings.cache_dir, key, cfg.arch,
                            data_name(cfg, train_set))
    spec, line = MPI.COMM_WORLD.bcast(found, root=0)
    log(line)
    return key, priors.from_spec(spec, cfg.epochs)


def leave_prior(run, cache_dir, output_dir, log):
    """Write this adaptive run's noise scale and step times as the batch prior of later runs:
    batch_prior.json in ``output_dir`` and the key's file in the cache (rank 0; a failure
    to write is a line, not an error)."""
    refit = run.planning.batch.refit
    series, key = run.progress.noise_series, run.planning.prior_key
    for path in (os.path.join(output_dir, "batch_prior.json"), None):
        try:
            written = priors.save(cache_dir, key, series, refit and refit.state(),
                                  os.path.abspath(output_dir), path=path)
        except OSError as e:
            log(f"batch prior: not written ({e}); set NNABLA_TORUS_CACHE_DIR to a writable "
                f"folder")
            continue
        log(f"batch prior: written to {written}")
