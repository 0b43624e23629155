"""Each member's batches are one sequence that every process reads alike: an update takes the
next processes x update_freq batches, process r trains its slots of them, and the position is
the same on every process (the checkpoint's), whatever the number of processes."""

import numpy as np
from s2s.core.data.cache import Split
from s2s.core.training.schedule import Share, Stream, dropout_seed


class _Member:
    def __init__(self, pairs: int = 301):
        lens = np.random.default_rng(3).integers(1, 30, pairs)
        off = np.concatenate([[0], np.cumsum(lens)])
        train = Split(np.zeros(off[-1], np.int32), np.zeros(off[-1], np.int32), off, off)
        self.data = type("Data", (), {"splits": {"train": train}})()


def _updates(share: Share, updates: int, member) -> list[list[list[int]]]:
    stream = Stream(member, 120, seed=5, share=share)
    return [[b.tolist() for b in stream.update_batches()] for _ in range(updates)], stream.state()


def test_two_processes_take_the_batches_of_one_with_update_freq_2_across_epochs():
    member = _Member()
    one, one_at = _updates(Share(0, 1, 2), 40, member)  # enough updates to cross epochs
    ranks = [_updates(Share(r, 2, 1), 40, member) for r in range(2)]
    assert one_at[0] >= 1, "the updates did not cross an epoch"
    assert all(at == one_at for _, at in ranks)  # one position, the same on every process
    for u, batches in enumerate(one):
        assert batches == [ranks[0][0][u][0], ranks[1][0][u][0]]  # slot 0 on rank 0, 1 on rank 1
    four = [_updates(Share(r, 4, 1), 20, member)[0] for r in range(4)]
    two_by_two = [_updates(Share(r, 2, 2), 20, member)[0] for r in range(2)]
    for u in range(20):
        assert [four[r][u][0] for r in range(4)] == two_by_two[0][u] + two_by_two[1][u]


def test_a_stream_restored_at_a_position_continues_as_the_unbroken_one():
    member = _Member()
    whole, _ = _updates(Share(0, 1, 2), 30, member)
    stream = Stream(member, 120, seed=5, share=Share(0, 1, 2))
    for _ in range(17):
        stream.update_batches()
    resumed = Stream(member, 120, seed=5, share=Share(1, 2, 1))  # another process count
    resumed.restore(stream.state())
    rank0 = Stream(member, 120, seed=5, share=Share(0, 2, 1))
    rank0.restore(stream.state())
    for u in range(17, 30):
        assert [rank0.update_batches()[0].tolist(), resumed.update_batches()[0].tolist()] == whole[
            u
        ]


def test_a_batch_draws_its_dropout_from_its_update_and_slot_alone():
    seeds = {dropout_seed(1, u, s) for u in range(1, 50) for s in range(8)}
    assert len(seeds) == 49 * 8 and all(0 <= x < 2**63 for x in seeds)
    assert dropout_seed(1, 7, 3) == dropout_seed(1, 7, 3) != dropout_seed(2, 7, 3)
