"""The failures a collective raises on every rank that sees them (why and when:
docs/communicator.md#errors-and-failures): a peer that never arrives (``CollectiveTimeout``),
a dead rank (``RankLost``), one that left its script (``RankGone``)."""


class CollectiveTimeout(RuntimeError):
    """A peer did not take part in a collective within the timeout."""


class RankLost(RuntimeError):
    """A rank of the job died (the MPI library reported it failed) during ``what``."""

    def __init__(self, rank, lost, what):
        self.rank, self.lost, self.what = rank, list(lost), what
        super().__init__(f"rank {rank}: lost rank(s) {self.lost} during {what}")


class RankGone(RuntimeError):
    """A rank this one waits for has left its script (exited without dying) during ``what``."""

    def __init__(self, rank, gone, what):
        self.rank, self.gone, self.what = rank, list(gone), what
        super().__init__(f"rank {rank}: rank(s) {self.gone} left the script (sys.exit, an "
                         f"early return or an error handled there) while this rank waits for "
                         f"them in {what}; they will not arrive")
