"""Collectives used inside compiled training steps."""

from __future__ import annotations

from mindspore import nn, ops


class MeanOverRanks(nn.Cell):
    """A tensor averaged over the data-parallel ranks (AllReduce's sum over ``rank_size``); itself with one rank.

    ``rank_size`` is static: with one rank the compiled graph holds no collective at all.
    """

    def __init__(self, rank_size: int):
        super().__init__(auto_prefix=False)
        self.rank_size = rank_size
        self.all_reduce = ops.AllReduce() if rank_size > 1 else None

    def construct(self, value):
        if self.rank_size > 1:
            return self.all_reduce(value) / self.rank_size
        return value
