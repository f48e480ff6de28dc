"""Resume: every rank loads the checkpoint rank 0 chose, even when it sees a newer one."""
import numpy as np
import pytest

from nnabla_torus.training import State
from nnabla_torus.training.checkpoint_file import CheckpointError, save_checkpoint


class RankOneComm:
    """Rank 1 of 2: rank 0 broadcasts ``chosen_step``; ``other_failures`` ranks fail to read."""

    rank, size = 1, 2

    def __init__(self, chosen_step, other_failures=0):
        self.chosen_step, self.other_failures = chosen_step, other_failures

    def bcast(self, arrays, src, inplace):
        arrays[0].data = np.array(divmod(self.chosen_step, 1 << 20), np.float32)

    def allreduce_numpy(self, array):
        array += self.other_failures
        return array


def load_agreed_checkpoint(directory, comm, log):
    return State(comm, directory, {}, log=log).load_agreed()


def test_other_ranks_load_rank_zeros_choice(tmp_path):
    for step in (10, 20):
        save_checkpoint(str(tmp_path), step, {"w": np.full(2, step)}, {"step": step})
    # This rank already sees step 20 but rank 0 (lagging view) chose 10: load 10.
    arrays, meta, path = load_agreed_checkpoint(str(tmp_path), RankOneComm(10), print)
    assert meta["step"] == 10 and path.endswith("ckpt-000000010.npz.chk")
    big = (1 << 24) + 3                             # beyond float32's exact integers
    save_checkpoint(str(tmp_path), big, {"w": np.zeros(2)}, {"step": big}, keep=10)
    assert load_agreed_checkpoint(str(tmp_path), RankOneComm(big), print)[1]["step"] == big


def test_unreadable_choice_fails_on_every_rank(tmp_path):
    save_checkpoint(str(tmp_path), 10, {"w": np.zeros(2)}, {"step": 10})
    with pytest.raises(CheckpointError, match=r"1 rank\(s\) could not read .*ckpt-000000030"):
        load_agreed_checkpoint(str(tmp_path), RankOneComm(30), print)
    with pytest.raises(CheckpointError, match="1 rank"):    # another rank failed: this one too
        load_agreed_checkpoint(str(tmp_path), RankOneComm(10, other_failures=1), print)
    with pytest.raises(CheckpointError, match="rank 0 found no intact checkpoint"):
        load_agreed_checkpoint(str(tmp_path), RankOneComm(-1), print)
