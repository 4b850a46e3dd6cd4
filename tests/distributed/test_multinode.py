"""Two msrun nodes on one machine, each in a network namespace of its own joined by a veth pair.

msrun starts its scheduler on every node whose own addresses include ``master_addr``, so two ``kedro run``s on one
host with ``127.0.0.1`` both start one and fail. Here node 0 owns ``10.<a>.<b>.1`` in its namespace and node 1
``10.<a>.<b>.2`` in its own: as on two machines, only node 0 starts the scheduler. Each node has its own project
folder (its own ``data/``, MLflow store and checkpoints) and reads the same image tree, as on a cluster with the
data copied to every node. Needs root (``ip netns``); skipped where that is not permitted, except under CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.netns import Node, two_hosts
from tests.support.projects import TINY_PARAMS, kedro, make_project
from tests.support.trees import write_image_tree
from trainlib.engine.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow

FINAL = "data/06_models/baseline/final.ckpt"
PORT = 8131
CHECKPOINTS = {"every_epochs": 1, "keep_last": 2}  # a node killed between two epochs is one behind


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Node, Node]]:
    with two_hosts() as nodes:
        yield nodes


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multinode")
    return write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})


def node_projects(root: Path, tree: Path, master: Node, local_workers: int, epochs: int) -> list[Path]:
    """One project folder per node, the same configuration but for ``node_rank``."""
    projects = []
    for rank in (0, 1):
        params = {
            **TINY_PARAMS,
            "data": {**TINY_PARAMS["data"], "root": str(tree)},
            "baseline": {**TINY_PARAMS["baseline"], "epochs": epochs, "checkpoint": CHECKPOINTS},
            "distributed": {
                "worker_num": 2 * local_workers,
                "local_worker_num": local_workers,
                "master_addr": master.address,
                "master_port": PORT,
                "node_rank": rank,
                "cluster_timeout_s": 120,
            },
        }
        projects.append(make_project(root / f"node{rank}", params))
    return projects


def start_node(project: Path, node: Node, watched: bool = False) -> subprocess.Popen:
    """``kedro run --pipelines=baseline`` in ``node``'s namespace; output in ``<project>/output.txt``, or on the
    process's ``stdout`` pipe when ``watched``."""
    env = {**os.environ, "COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.Popen(
        ["ip", "netns", "exec", node.namespace, sys.executable, "-m", "kedro", "run", "--pipelines=baseline"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE if watched else (project / "output.txt").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_nodes(projects: list[Path], hosts: tuple[Node, Node]) -> list[int]:
    processes = [start_node(project, node) for project, node in zip(projects, hosts, strict=True)]
    return [process.wait(timeout=600) for process in processes]


def output(project: Path) -> str:
    return (project / "output.txt").read_text()


def max_abs_difference(a: Path, b: Path) -> float:
    first, second = load_checkpoint(a).network_params(), load_checkpoint(b).network_params()
    assert first.keys() == second.keys()
    return max(float(np.abs(first[name] - second[name]).max()) for name in first)


def one_node_reference(root: Path, tree: Path, workers: int, epochs: int) -> Path:
    """The same training on ``workers`` msrun workers of this one node (loopback)."""
    params = {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree)},
        "baseline": {**TINY_PARAMS["baseline"], "epochs": epochs, "checkpoint": CHECKPOINTS},
        "distributed": {"worker_num": workers, "local_worker_num": workers, "master_port": PORT + 1},
    }
    project = make_project(root / f"one_node_{workers}", params)
    result = kedro(project, "run", "--pipelines=baseline")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return project / FINAL


def test_two_nodes_of_two_workers_reach_the_weights_of_one_node_of_four(tmp_path, tree, hosts):
    # two workers a node: the global ranks span the nodes (node_rank * local_worker_num + local rank); one worker a
    # node is the killed-node test's topology
    local_workers = 2
    projects = node_projects(tmp_path, tree, hosts[0], local_workers, epochs=2)
    codes = run_nodes(projects, hosts)
    assert codes == [0, 0], output(projects[0])[-3000:] + output(projects[1])[-3000:]
    assert f"Launching {local_workers} of {2 * local_workers} workers on node 0" in output(projects[0])
    assert "The trainable weights are identical on all" in output(projects[0])
    reference = one_node_reference(tmp_path, tree, 2 * local_workers, epochs=2)
    difference = max_abs_difference(projects[0] / FINAL, reference)
    print(f"2 nodes x {local_workers} vs 1 node x {2 * local_workers}: max abs weight difference {difference:g}")
    assert difference == 0.0


def test_a_killed_node_stops_the_other_with_one_error_and_both_resume(tmp_path, tree, hosts):
    epochs = 6  # node 0 cannot pass epoch 3's next all-reduce without node 1; the rerun trains epochs 3-6
    projects = node_projects(tmp_path, tree, hosts[0], 1, epochs=epochs)
    node0 = start_node(projects[0], hosts[0], watched=True)
    node1 = start_node(projects[1], hosts[1])
    # node 0 shows its rank's progress (node 1's goes to its msrun log): kill node 1 once epoch 3 runs
    shown = []
    for line in node0.stdout:
        shown.append(line)
        if f"epoch 3/{epochs} step" in line:
            break
    else:
        pytest.fail("node 0 ended before epoch 3:\n" + "".join(shown)[-3000:])
    node1.send_signal(signal.SIGKILL)
    node1.wait()
    text = "".join(shown) + node0.stdout.read()  # to the end: node 0 stops once node 1 is found missing
    assert node0.wait(timeout=300) != 0
    errors = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, text[-3000:]
    assert errors[0].startswith("Error: node 1 of the msrun job stopped answering (rank 1 timed out)"), text[-6000:]

    codes = run_nodes(projects, hosts)
    assert codes == [0, 0], output(projects[0])[-3000:] + output(projects[1])[-3000:]
    assert "Resuming from" in output(projects[0])
    assert f"epoch 1/{epochs} step" not in output(projects[0])
    assert "The trainable weights are identical on all 2 ranks" in output(projects[0])
