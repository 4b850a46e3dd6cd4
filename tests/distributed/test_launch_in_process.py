"""The launcher's in-process parts (no msrun; the fast tier): the node layout, msrun's command line, and how a
failed job is told from the files its processes leave.

A killed node shows on the node left in three ways, whichever MindSpore reaches first: the scheduler's log line, a
cluster error raised on a rank, or a rank exiting without a Python error. Seen in the two-node kill test
(tests/distributed/test_multinode.py): all three, depending on where the kill fell in a step.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.support.config import distributed_params
from trainlib.distributed.launch import _failure_message, _Job, msrun_command, msrun_environment
from trainlib.params import DistributedParams

pytestmark = pytest.mark.fast

SCHEDULER_LINE = (
    "[ERROR] DISTRIBUTED(20242,7f153909e6c0,python):2026-11-25-17:55:22.501.741 "
    "[mindspore/ccsrc/cluster/topology/meta_server_node.cc:548] UpdateTopoState] The node: {rank} is timed out. "
    "It may exit with exception, please check this node's log.\n"
)
CLUSTER_ERROR = (
    "Traceback (most recent call last):\n  ...\nRuntimeError: The total number of timed out node is 1. Timed out "
    "node list is: [const vector]{{{rank}}}, worker {rank} is the first one timed out, please check its log.\n"
)
OTHER_ERROR = "Traceback (most recent call last):\n  ...\nRuntimeError: Failed to send data to the peer.\n"


@pytest.mark.parametrize(
    ("distributed", "key"),
    [
        ({"worker_num": 2, "local_worker_num": 4, "node_rank": 0}, "distributed.local_worker_num"),
        ({"worker_num": 6, "local_worker_num": 4, "node_rank": 0}, "distributed.worker_num"),
        ({"worker_num": 16, "local_worker_num": 8, "node_rank": 2}, "distributed.node_rank"),
    ],
)
def test_inconsistent_worker_counts_are_named(distributed, key):
    with pytest.raises(ValidationError) as error:
        distributed_params(**distributed)
    (problem,) = error.value.errors()
    assert [k for k, _ in problem["ctx"]["problems"]] == [key]


def test_the_scheduler_retry_interval_reaches_msrun_and_its_workers(monkeypatch):
    monkeypatch.setenv("MS_RETRY_INTERVAL_UPPER", "9")  # the configuration decides, not a leftover variable
    environment = msrun_environment(distributed_params(scheduler_retry_interval_s=[2, 4]))
    assert (environment["MS_RETRY_INTERVAL_LOWER"], environment["MS_RETRY_INTERVAL_UPPER"]) == ("2", "4")
    assert environment["PATH"].split(":")[0] == str(Path(sys.executable).parent)  # msrun starts the bare `python`
    assert msrun_environment(distributed_params(scheduler_retry_interval_s=None))["MS_RETRY_INTERVAL_UPPER"] == "9"
    with pytest.raises(ValidationError) as error:
        distributed_params(scheduler_retry_interval_s=[5, 3])
    (problem,) = error.value.errors()
    assert problem["ctx"]["problems"] == [("distributed.scheduler_retry_interval_s", "is [5, 3]: give [lower, upper]")]


def test_two_nodes_of_eight_are_valid_and_launch_their_own_workers(tmp_path):
    distributed = distributed_params(
        worker_num=16, local_worker_num=8, master_addr="10.0.0.1", master_port=8118, node_rank=1
    )
    assert distributed.nodes == 2
    command = msrun_command(distributed, tmp_path)
    assert command[0] == "msrun"
    for flag in ("--worker_num=16", "--local_worker_num=8", "--master_addr=10.0.0.1", "--node_rank=1"):
        assert flag in command
    assert command[-4:] == ["python", "-m", "trainlib.distributed.worker", str(tmp_path)]


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def job(tmp_path: Path, *, scheduler: str = "", errors: dict[int, str] | None = None, dead: tuple = ()) -> _Job:
    for rank in dead:
        (tmp_path / f"rank_{rank}.pid").write_text(str(dead_pid()))
    for rank, text in (errors or {}).items():
        (tmp_path / f"rank_{rank}.pid").write_text(str(dead_pid()))
        (tmp_path / f"rank_{rank}.error").write_text(text)
    if scheduler:
        (tmp_path / "scheduler.log").write_text("[INFO] starting\n" + scheduler)
    return _Job(tmp_path)


def two_nodes(local_worker_num: int = 1) -> DistributedParams:
    return distributed_params(worker_num=2 * local_worker_num, local_worker_num=local_worker_num, node_rank=0)


@pytest.mark.parametrize(
    "evidence",
    [
        {"scheduler": SCHEDULER_LINE.format(rank=1), "dead": (0,)},
        {"scheduler": SCHEDULER_LINE.format(rank=1), "errors": {0: OTHER_ERROR}},
        {"errors": {0: CLUSTER_ERROR.format(rank=1)}},
    ],
    ids=["scheduler-log-and-a-rank-gone", "scheduler-log-and-another-error", "cluster-error-alone"],
)
def test_a_node_that_stopped_answering_is_named_however_the_rank_left_ended(tmp_path, evidence):
    dead = list(evidence.get("dead", ()))
    message = _failure_message(job(tmp_path, **evidence), -9, dead, two_nodes())
    assert message.startswith("node 1 of the msrun job stopped answering (rank 1 timed out)"), message
    assert f"Rank 0 here stopped with it (logs: {tmp_path}/worker_0.log)" in message


def test_ranks_of_another_node_are_told_by_node(tmp_path):
    scheduler = SCHEDULER_LINE.format(rank=2) + SCHEDULER_LINE.format(rank=3)
    message = _failure_message(job(tmp_path, scheduler=scheduler, dead=(0,)), -9, [0], two_nodes(2))
    assert message.startswith("node 1 of the msrun job stopped answering (rank 2, 3 timed out)"), message


def test_a_rank_of_this_node_that_timed_out_is_its_own_failure(tmp_path):
    # the scheduler also times out a local rank the out-of-memory killer took: that rank, not a node, is at fault
    message = _failure_message(job(tmp_path, scheduler=SCHEDULER_LINE.format(rank=1), dead=(1,)), -9, [1], two_nodes(2))
    assert message.startswith("rank 1 of the msrun job was killed without a Python error"), message


def test_a_python_error_is_told_with_its_text(tmp_path):
    message = _failure_message(job(tmp_path, errors={1: OTHER_ERROR}), 1, [], two_nodes(2))
    assert message.startswith(f"rank 1 of the msrun job failed (logs: {tmp_path}/worker_1.log):\n"), message
    assert message.endswith("RuntimeError: Failed to send data to the peer."), message
