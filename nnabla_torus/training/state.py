"""Checkpoint and restart for a user's own nnabla training loop under nnabla-torus-run.

A ``State`` holds what a restart needs: the parameters (an nnabla parameter dict, batch
statistics included), the solvers' states, the counters (``step``, ``epoch``,
``images_seen``, ``global_batch``; the loop advances them), a numpy Generator's state
(``rng=``) and the user's ``extras`` (JSON-able; numpy arrays come back as lists, e.g.
``AdaptiveBatch.state_dict()``). ``start(resume)`` begins a run in ``directory`` or continues
the newest intact checkpoint there, on any rank count, holding the folder's lock for the run's
life (a second live run there is refused: run_lock.py); ``save()`` writes a checkpoint
atomically on rank 0 (checkpoint_file.py), keeping the ``keep`` newest. On rank 0 the State
prints the lines the launcher reads (elastic_protocol.py): each checkpoint
(``CHECKPOINT_PREFIX`` JSON under the launcher), ``resumed from PATH: step N`` and
``progress``'s ``step N`` lines; ``stop_requested()`` tells every rank when the launcher asks
the job to stop (save, then exit ``EXIT_STOPPED``). Example (one
process; under MPI pass the nnabla-torus communicator)::

    import nnabla as nn, nnabla.parametric_functions as PF, nnabla.solvers as S, numpy as np
    from nnabla_torus.training import State

    x = nn.Variable((4, 3)); loss = nn.functions.mean(PF.affine(x, 1) ** 2)
    solver = S.Momentum(0.1); solver.set_parameters(nn.get_parameters())
    state = State(None, "/tmp/state-example", nn.get_parameters(grad_only=False),
                  {"momentum": solver}, global_batch=4)
    state.start(resume=False)               # True: continue the newest checkpoint there
    while state.step < 3:
        x.d = np.ones(x.shape); solver.zero_grad(); loss.forward(); loss.backward()
        solver.update(); state.step += 1; state.images_seen += state.global_batch
        state.progress(f"loss {float(loss.d):.4f}")
    state.save(); state.close()
"""
import atexit
import json
import os
import signal
import socket
import time

import numpy as np

from nnabla_torus.launching.elastic_protocol import CHECKPOINT_PREFIX, ENV_ELASTIC, FOLDER_IN_USE
from nnabla_torus.planning.splits import split_batch
from nnabla_torus.training.checkpoint_file import (
    CheckpointError, checkpoint_path, checkpoint_step, load_latest_checkpoint, read_checkpoint,
    remove_stale_temporaries, save_checkpoint, set_aside_earlier_run)
from nnabla_torus.training.run_lock import RunFolderBusy, RunLock

# meta keys the State keeps itself; ``extras`` may not use them
OWN_KEYS = ("step", "epoch", "images_seen", "global_batch", "ranks", "run_id", "solver_steps",
            "rng")


class State:
    """The state of one training run in ``directory`` (see the module docstring).

    ``comm``: the nnabla-torus communicator (None: one process); ``params``: name ->
    nn.Variable; ``solvers``: name -> nnabla solver; ``rng``: a numpy Generator whose state
    is kept, or None; ``global_batch``: images per optimizer step (restored; ``split`` gives
    this rank count's share); ``keep``: checkpoints kept; ``run_files``: glob patterns of the
    other files the run writes into ``directory`` (set aside with its checkpoints when a new
    run starts there); ``announce``: print ``CHECKPOINT_PREFIX`` lines (default: under
    nnabla-torus-run); ``log``: where rank 0's lines go (default print).
    """

    def __init__(self, comm, directory, params, solvers=None, rng=None, global_batch=None,
                 keep=3, run_files=(), announce=None, log=None):
        self.comm, self.directory, self.params = comm, directory, params
        self.solvers, self.rng, self.keep, self.run_files = solvers or {}, rng, keep, run_files
        self.announce = os.environ.get(ENV_ELASTIC) == "1" if announce is None else announce
        self.rank = comm.rank if comm is not None else 0
        self.size = comm.size if comm is not None else 1
        self.log = (log or (lambda text: print(text, flush=True))) if self.rank == 0 \
            else (lambda text: None)
        self.step, self.epoch, self.images_seen, self.global_batch = 0, 0.0, 0, global_batch
        self.extras = {}
        self.run_id = None       # rank 0's start time, host and pid; kept across restarts
        self.saved_ranks = self.size    # ranks that wrote the restored checkpoint
        self.checkpoint = None   # the last checkpoint written or restored
        self.lock = None         # rank 0's hold on ``directory`` (run_lock.py), from start
        self.stop_signals = []   # SIGUSR1s received (the launcher's Ctrl-C), from start

    def start(self, resume, check=None):
        """Begin the run (every rank): take ``directory``'s lock (RunFolderBusy on every
        rank while another live run holds it); with ``resume``, restore the newest intact
        checkpoint (rank 0 chooses, every rank reads that one) and return its meta; without,
        set an earlier run's files aside and return None. ``check(meta, path, arrays)`` may
        raise ValueError to refuse a checkpoint before anything is restored."""
        busy = None
        if self.rank == 0:
            try:
                self.lock = RunLock.acquire(self.directory, self.log)
                atexit.register(self.close)
            except RunFolderBusy as e:
                busy = e
        if self.broadcast_int(busy is not None):
            raise busy or RunFolderBusy(f"rank {self.rank}: rank 0 found {self.directory} "
                                        f"{FOLDER_IN_USE} (its line names it)")
        if self.announce:        # the launcher's Ctrl-C or SIGTERM: stop_requested() says so
            signal.signal(signal.SIGUSR1, lambda signum, frame: self.stop_signals.append(signum))
        if self.rank == 0:
            remove_stale_temporaries(self.directory, self.log)
            if not resume:
                set_aside_earlier_run(self.directory, self.run_files, self.log)
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}-{os.getpid()}"
        if not resume:
            return None
        arrays, meta, path = self.load_agreed()
        if check is not None:
            check(meta, path, arrays)
        self.restore(arrays, meta)
        self.checkpoint = path
        self.log(f"resumed from {path}: step {self.step}, epoch {self.epoch:.3f}, run "
                 f"{meta.get('run_id') or 'of an earlier version (no run id)'}")
        return meta

    def load_agreed(self):
        """(arrays, meta, path) of the checkpoint rank 0 finds newest and intact, on every rank.

        On a shared file system that lags, ranks could see different newest files and then
        issue mismatched collectives: rank 0 chooses, every other rank reads exactly that
        file. Raises on every rank when rank 0 finds none or any rank cannot read its choice.
        """
        found, error = None, None
        if self.rank == 0:
            try:
                found = load_latest_checkpoint(self.directory, log=self.log)
            except (FileNotFoundError, CheckpointError) as e:
                error = e
        step = self.broadcast_int(checkpoint_step(found[2]) if found else -1)
        if step < 0:
            raise error or CheckpointError(f"--resume: rank 0 found no intact checkpoint in "
                                           f"{self.directory} (its log says why)")
        path = checkpoint_path(self.directory, step)
        if self.rank != 0:
            try:
                found = (*read_checkpoint(path), path)
            except (OSError, CheckpointError) as e:
                error = e
        failed = self.sum(error is not None)
        if failed:
            raise CheckpointError(f"--resume: {int(failed)} rank(s) could not read {path}, the "
                                  f"newest intact checkpoint on rank 0" +
                                  (f" ({error})" if error else "") + "; make --output-dir the "
                                  "same shared folder on every host, or wait until every "
                                  "host sees it")
        return found

    def restore(self, arrays, meta):
        """Set parameters, solver states, counters, RNG and extras from a checkpoint."""
        wrong = [name for name, var in self.params.items()
                 if arrays.get(f"param/{name}", np.empty(0)).shape != var.shape]
        if wrong:
            saved = arrays.get(f"param/{wrong[0]}")
            raise ValueError(f"--resume: the checkpoint's parameters do not fit this model "
                             f"(first: {wrong[0]}, {'missing' if saved is None else saved.shape}"
                             f" there, {self.params[wrong[0]].shape} here); resume with that "
                             f"run's model, or start a new run in another output folder")
        for name, var in self.params.items():
            var.d = arrays[f"param/{name}"]
        load_solver_arrays(self.solvers, arrays, meta["solver_steps"])
        self.step, self.epoch = meta["step"], meta.get("epoch", 0.0)
        self.images_seen = meta.get("images_seen", 0)
        self.global_batch = meta.get("global_batch", self.global_batch)
        self.saved_ranks = meta.get("ranks", self.size)
        self.run_id = meta.get("run_id") or self.run_id
        if self.rng is not None and meta.get("rng"):
            self.rng.bit_generator.state = meta["rng"]
        self.extras = {k: v for k, v in meta.items() if k not in OWN_KEYS}

    def save(self):
        """Write a checkpoint of the state now (rank 0; other ranks return None) and, under
        the launcher, announce it; returns its path."""
        if self.rank != 0:
            return None
        if self.lock is None:
            raise RuntimeError(f"State.save() before State.start(resume): start the run in "
                               f"{self.directory} first (it takes the folder's lock)")
        clash = sorted(set(self.extras) & set(OWN_KEYS))
        if clash:
            raise ValueError(f"State.extras may not use the State's own keys {clash}; rename "
                             f"them")
        start = time.perf_counter()
        arrays = {f"param/{k}": v.d.copy() for k, v in self.params.items()}
        solver_arrays, solver_steps = get_solver_arrays(self.solvers)
        arrays.update(solver_arrays)
        meta = dict(self.extras, step=self.step, epoch=self.epoch, images_seen=self.images_seen,
                    global_batch=self.global_batch, ranks=self.size, run_id=self.run_id,
                    solver_steps=solver_steps,
                    rng=self.rng.bit_generator.state if self.rng is not None else None)
        self.checkpoint = save_checkpoint(self.directory, self.step, arrays, meta, self.keep)
        self.lock.touch()
        if self.announce:
            print(CHECKPOINT_PREFIX + json.dumps({"step": self.step, "path": self.checkpoint,
                                                  "seconds": round(time.perf_counter() - start,
                                                                   4)}), flush=True)
        return self.checkpoint

    def progress(self, text=""):
        """Print ``step N: epoch E, global batch B[, text]`` on rank 0 (the launcher's
        progress and batch line)."""
        batch = f", global batch {self.global_batch}" if self.global_batch else ""
        if self.lock is not None:
            self.lock.touch()
        self.log(f"step {self.step}: epoch {self.epoch:.3f}{batch}" + (f", {text}" if text else ""))

    def stop_requested(self):
        """True on every rank once any rank got the launcher's stop (its Ctrl-C or SIGTERM
        reaches the ranks as SIGUSR1). Call it on every rank once a step (under the launcher
        one small all-reduce; else False at no cost); then ``save()`` and exit with
        ``EXIT_STOPPED`` (76), which the launcher reads as stopped, not failed."""
        return bool(self.announce) and self.sum(len(self.stop_signals)) > 0

    def split(self, max_local_batch):
        """(local batch, accumulation steps) that make ``global_batch`` on this rank count, or
        the nearest global batch that does (splits.split_batch)."""
        return split_batch(self.global_batch, self.size, max_local_batch)

    def close(self):
        """End the run's hold on ``directory`` (call at the end; safe to repeat; also run at
        the process's exit)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def broadcast_int(self, value):
        """Rank 0's integer ``value`` on every rank (two float32 halves: exact to 2**44)."""
        if self.comm is None:
            return value
        import nnabla as nn
        sent = nn.NdArray.from_numpy_array(np.array(divmod(value, 1 << 20), np.float32))
        self.comm.bcast([sent], src=0, inplace=True)
        high, low = (int(v) for v in sent.data)
        return high * (1 << 20) + low

    def sum(self, value):
        """The sum of ``value`` over the ranks."""
        if self.comm is None:
            return value
        return self.comm.allreduce_numpy(np.array([value], np.float32))[0]


def get_solver_arrays(solvers):
    """Solver states of ``solvers`` (name -> nnabla solver) as (``solver/<name>/<param>/<key>``
    -> ndarray, ``<name>/<param>`` -> step count t)."""
    arrays, steps = {}, {}
    for group, solver in solvers.items():
        for name, state in solver.get_states().items():
            steps[f"{group}/{name}"] = state.t
            for key, var in state.pstate.items():
                arrays[f"solver/{group}/{name}/{key}"] = var.d.copy()
    return arrays, steps


def load_solver_arrays(solvers, arrays, steps):
    """Set the states of ``solvers`` from :func:`get_solver_arrays`'s (arrays, steps)."""
    for group, solver in solvers.items():
        states = solver.get_states()
        for name, state in states.items():
            state.t = steps[f"{group}/{name}"]
            for key, var in state.pstate.items():
                var.d = arrays[f"solver/{group}/{name}/{key}"]
        solver.set_states(states)
