"""A job for ``launch`` whose rank 1 raises (tests/test_distributed.py)."""

from trainlib.distributed.launch import rank_context


def fail_on_rank_1(distributed, runtime) -> int:
    if rank_context().rank == 1:
        raise ValueError("bad shard on rank 1")
    return rank_context().rank
