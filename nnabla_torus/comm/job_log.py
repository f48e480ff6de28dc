"""The library's log lines: once per job (rank 0) unless they differ per rank, notes once per
process. ``init()`` installs the filter; a script may add it to its own logger too."""
import logging

INFO, WARNING = logging.INFO, logging.WARNING

logger = logging.getLogger("nnabla_torus")
_notes_said = set()  # notes are logged once per process


class OnRankZero(logging.Filter):
    """Let log records through on rank 0 only (one copy per job), unless a record says it
    differs per rank: ``logger.warning(text, extra={"every_rank": True})``."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def filter(self, record):
        return self.rank == 0 or getattr(record, "every_rank", False)


def log_once_per_job(rank, names=("nnabla_torus", "nnabla_torus.planning.controller")):
    """Add an ``OnRankZero`` filter to the loggers ``names`` (once); ``init()`` does this for
    the library's loggers, a script may pass its own logger's name."""
    for name in names:
        log = logging.getLogger(name)
        if not any(isinstance(f, OnRankZero) for f in log.filters):
            log.addFilter(OnRankZero(rank))


def note(text, level=INFO):
    """Log ``text`` the first time this process says it: at INFO what the library chose (it
    shows where the script logs INFO, as nnabla's own set-up does), at WARNING a problem the
    user should fix."""
    if text not in _notes_said:
        _notes_said.add(text)
        logger.log(level, text)
