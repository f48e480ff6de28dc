"""What nnabla-torus-run reads in a job's output as it comes, for the figures of a restart.

A :class:`JobWatch` is handed every line of one job (``run_once(..., watch=...)``): it keeps
the step the job reached, the checkpoints it announced (``CHECKPOINT_PREFIX``), the step it
resumed from, its global batch, and when the first sign of a failure came. ``on_resume`` is
called once, at the job's resume line or first step line: a relaunch's "training again".
"""
import json
import time

from .elastic_protocol import BATCH_LINE, CHECKPOINT_PREFIX, RESUMED_LINE, STEP_LINE

# Beginnings of the lines that say a job is failing (failures.RULES reads them in full):
# the communicator's, mpirun's and srun's reports and a script's error line.
FAILURE_SIGNS = ("nnabla_torus: rank", "noticed that process rank", "lost communication with",
                 "srun: error", "CANCELLED AT", ": error: ")


class JobWatch:
    """The figures of one job: ``step`` (the highest step a line named), ``checkpoint`` (the
    newest announced, a dict with step, path, seconds), ``resumed`` (the step it resumed
    from), ``batch`` (the global batch last named), ``failed_at`` (time.monotonic() of the
    first failure sign), ``unread`` (the first checkpoint line it could not read)."""

    def __init__(self, on_resume=None, clock=time.monotonic):
        self.step = self.checkpoint = self.resumed = self.batch = self.failed_at = None
        self.checkpoint_seconds = []
        self.unread = None           # the first checkpoint line that is not the protocol's
        self.on_resume, self.clock = on_resume, clock

    def __call__(self, line):
        if line.startswith(CHECKPOINT_PREFIX):
            try:
                announced = json.loads(line[len(CHECKPOINT_PREFIX):])
                announced["step"] = int(announced["step"])
                seconds = float(announced.get("seconds", "nan"))
            except (ValueError, KeyError, TypeError, AttributeError):
                self.unread = self.unread or line.strip()
                return
            self.checkpoint = announced
            if seconds == seconds:                           # not NaN: the line gave it
                self.checkpoint_seconds.append(seconds)
            return
        resumed = RESUMED_LINE.search(line)
        if resumed and self.resumed is None:
            self.resumed = self.step = int(resumed.group(1))
            self._training()
            return
        if self.failed_at is None and any(sign in line for sign in FAILURE_SIGNS):
            self.failed_at = self.clock()
        step, batch = STEP_LINE.search(line), BATCH_LINE.search(line)
        if step:
            self.step = max(self.step or 0, int(step.group(1)))
            self._training()
        if batch:
            self.batch = int(batch.group(1))

    def _training(self):
        if self.on_resume is not None:
            self.on_resume(self)
            self.on_resume = None
