"""The traffic model of benchmarks/adasum_traffic.py against ring-algorithm costs worked out by hand."""

from __future__ import annotations

import pytest

from benchmarks.adasum_traffic import communication_bytes_per_step


def test_a_rank_count_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(ValueError, match="got 3 ranks"):
        communication_bytes_per_step([10], 3)


def test_traffic_two_ranks_equals_plain_allreduce_plus_scalars():
    sizes = [1000, 24, 7]  # 1031 elements, padded to 1032 for 2 ranks
    traffic = communication_bytes_per_step(sizes, 2, "allgather", stat_count=50)
    assert traffic["allreduce"] == 1031 * 4
    # Half swap (516) + assembly of the partner's half (516); 3 stats per tensor and padding segment.
    assert traffic["adasum_exchange"] == traffic["adasum_allgather"] == 516 * 4
    assert traffic["adasum_scalars"] == 3 * 4 * 4
    assert traffic["batchnorm"] == 50 * 4
    assert traffic["adasum"] == (1032 + 12 + 50) * 4


def test_traffic_four_ranks_on_cpu_swaps_by_allreduce():
    traffic = communication_bytes_per_step([4000], 4, "allreduce")
    assert traffic["allreduce"] == 2 * 4000 * 3 / 4 * 4
    assert traffic["adasum_exchange"] == (4000 + 2000) * 4  # AllReduce over a pair of 4000, then 2000
    assert traffic["adasum_allgather"] == 3 * 1000 * 4
    assert communication_bytes_per_step([4000], 4, "allgather")["adasum_exchange"] == (2000 + 1000) * 4
    assert communication_bytes_per_step([4000], 1)["adasum"] == 0
