"""Expected runtime failures of ``kedro run``, one table: each ends in one ``Error:`` block of at most
5 lines on stderr that names the file or key and says what to do; the traceback goes to the log
file (info.log), and to the terminal only with ``--verbose``; the MLflow run ends FAILED (KILLED
when interrupted) with the message as its ``error`` tag, or none is started when the failure
comes before any work.

Each case is a real ``kedro run`` of the project in a temporary folder, on a tiny tree, stopped by
the failure as early as it can happen.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import Watched
from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.servers import free_port
from tests.support.trees import write_image_tree

MAX_ERROR_LINES = 5
CLASSES = ("cat", "dog", "fox")


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Expected:
    texts: list[str]  # all in the Error block; the first also in the MLflow run's error tag
    status: str | None  # the MLflow run's status; None: no run was started
    traceback_logged: bool = True  # the traceback is in info.log (not for errors written for the user)
    verbose: bool = False  # run with --verbose: the traceback precedes the Error block on stderr
    # msrun tails rank 0's log to stdout (its progress), and with it the traceback of a rank 0 that fails
    rank_log_on_stdout: bool = False


# A case builds its project under the folder it is given, runs it and returns what happened and
# what must show.
Case = Callable[[Path], tuple[Path, Outcome, Expected]]


def project_on(root: Path, params: dict | None = None, data: dict | None = None) -> Path:
    """A project with the tiny parameters on a 3-class tree (or ``data`` overrides)."""
    tree = write_image_tree(root / "tree", classes=CLASSES, per_class={"train": 4, "val": 2})
    data = {**TINY_PARAMS["data"], "root": str(tree), **(data or {})}
    return make_project(root / "project", {**TINY_PARAMS, **(params or {}), "data": data})


def run(project: Path, *args: str) -> Outcome:
    result = kedro(project, "run", *args, timeout=600)
    return Outcome(result.returncode, result.stdout, result.stderr)


# ---------------------------------------------------------------- the cases


def missing_data_folder(root: Path):
    missing = root / "no_such_tree"
    project = project_on(root, data={"root": str(missing)})
    return project, run(project, "--pipelines=data"), Expected([str(missing), "does not exist", "data.root"], "FAILED")


def mistyped_default_data_folder(root: Path):
    """``data.root=/nope`` with the default source (Fashion-MNIST): named at once, and nothing written there (it used
    to write 276 MB there and train for 14 minutes, issue 53)."""
    mistyped = root / "nope"
    project = project_on(root)
    outcome = run(project, "--pipelines=data", f"--params=data.source=fashion_mnist,data.root={mistyped}")
    assert not mistyped.exists() and not mistyped.with_name("nope.partial").exists()
    return project, outcome, Expected([f"data.root {mistyped} does not exist", "data.create_root: true"], "FAILED")


def mislaid_data_folder(root: Path):
    """Split folders named otherwise than data.split_dirs says; with --verbose the traceback shows too."""
    tree = write_image_tree(root / "elsewhere", classes=CLASSES, split_dirs={"train": "training", "val": "validation"})
    project = project_on(root, data={"root": str(tree)})
    outcome = run(project, "--pipelines=data", "--verbose")
    expected = Expected([str(tree / "train"), "does not exist", "data.split_dirs"], "FAILED", verbose=True)
    return project, outcome, expected


def missing_pth(root: Path):
    missing = root / "resnet18.pth"
    project = project_on(root, {"migrate": {"state_dict": str(missing), "architecture": "resnet18"}})
    expected = Expected([str(missing), "does not exist", "torch.save(model.state_dict(), path)"], "FAILED")
    return project, run(project, "--pipelines=migrate"), expected


def corrupt_pth(root: Path):
    pytest.importorskip("torch", reason="needs the migrate extra")
    corrupt = root / "resnet18.pth"
    corrupt.write_bytes(os.urandom(3000))
    project = project_on(root, {"migrate": {"state_dict": str(corrupt), "architecture": "resnet18"}})
    expected = Expected([str(corrupt), "is not a readable PyTorch state_dict file", "migrate.state_dict"], "FAILED")
    return project, run(project, "--pipelines=migrate"), expected


def missing_checkpoint(root: Path):
    project = project_on(root)
    expected = Expected(["final.ckpt does not exist", "Rerun the nodes that write it"], "FAILED")
    return project, run(project, "--pipelines=baseline", "--nodes=baseline.evaluate"), expected


def corrupt_checkpoint(root: Path):
    project = project_on(root)
    final = project / "data/06_models/baseline/final.ckpt"
    final.parent.mkdir(parents=True)
    final.write_bytes(os.urandom(3000))
    expected = Expected(["final.ckpt is truncated or corrupt", "delete a truncated or corrupt file"], "FAILED")
    return project, run(project, "--pipelines=baseline", "--nodes=baseline.evaluate"), expected


def missing_device(root: Path):
    from trainlib.engine.runtime import device_available

    if device_available("GPU"):
        pytest.skip("this machine has a GPU")
    project = project_on(root)
    expected = Expected(
        [
            "runtime.device_target is GPU (configuration environment 'gpu')",
            "drop --env",
            'kedro run --pipelines=thor --env=gpu --params="runtime.fast_dev_run=true"',
        ],
        None,
        traceback_logged=False,
    )
    return project, run(project, "--pipelines=thor", "--env=gpu"), expected


def unknown_environment(root: Path):
    project = project_on(root)
    expected = Expected(
        ["configuration environment 'cuda' does not exist: conf/ holds ascend, base, gpu, local"],
        None,
        traceback_logged=False,
    )
    return project, run(project, "--pipelines=baseline", "--env=cuda"), expected


def loss_not_finite(root: Path):
    project = project_on(root)
    outcome = run(project, "--pipelines=baseline", "--params=baseline.lr.peak=1e36")
    return project, outcome, Expected(["training loss became nan at epoch 1", "Lower the learning rate"], "FAILED")


def failed_msrun_rank(root: Path):
    """The ranks find an image removed after ingest (data.on_bad_file: fail): the rank's own error is named."""
    project = project_on(root)
    ingest = run(project, "--pipelines=data")
    assert ingest.returncode == 0, ingest.stdout[-3000:] + ingest.stderr[-3000:]
    removed = root / "tree" / "train" / "cat"
    for image in removed.iterdir():
        image.unlink()
    workers = f"distributed.worker_num=2,distributed.local_worker_num=2,distributed.master_port={free_port()}"
    outcome = run(
        project,
        "--pipelines=baseline",
        "--from-nodes=baseline.build_network",
        f"--params={workers},data.on_bad_file=fail",
    )
    texts = ["of the msrun job failed (logs: logs/msrun/", "worker_", str(removed), "rerun the same command"]
    return project, outcome, Expected(texts, "FAILED", rank_log_on_stdout=True)


def interrupted(root: Path):
    """Ctrl-C (SIGINT to the process group) once the training reports its first steps (the stop inside the graph
    compiler, which must wait until the compiler returns, is tests/test_signals.py's)."""
    project = project_on(root, {"baseline": {**TINY_PARAMS["baseline"], "epochs": 500, "eval_interval": 0}})
    stderr = root / "stderr.txt"
    run = Watched.kedro_run(project, "--pipelines=baseline", stderr=stderr)
    run.wait_for("epoch 1/500 step")  # training, past the first compilation
    run.signal_group(signal.SIGINT)
    returncode = run.finish(timeout=120)
    assert returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM)
    assert not (project / "rank_0").exists()  # no analyze_fail.ir of an interrupted compilation
    outcome = Outcome(returncode, run.output, stderr.read_text())
    expected = Expected(["interrupted (SIG", "rerun the same command to resume"], "KILLED", traceback_logged=False)
    return project, outcome, expected


CASES: list[Case] = [
    missing_data_folder,
    mistyped_default_data_folder,
    mislaid_data_folder,
    missing_pth,
    corrupt_pth,
    missing_checkpoint,
    corrupt_checkpoint,
    missing_device,
    unknown_environment,
    loss_not_finite,
    pytest.param(failed_msrun_rank, marks=pytest.mark.slow),
    interrupted,
]


def case_id(case) -> str:
    return case.__name__


def error_block(stderr: str) -> list[str]:
    """The lines of stderr from the last one that starts with ``Error:``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Error: ")]
    assert starts, f"no Error: line on stderr:\n{stderr[-3000:]}"
    return lines[starts[-1] :]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_runtime_failure_is_one_short_error_naming_the_file_or_key(tmp_path, case):
    project, outcome, expected = case(tmp_path)
    assert outcome.returncode != 0, outcome.stdout[-3000:]
    block = error_block(outcome.stderr)
    assert len(block) <= MAX_ERROR_LINES, "\n".join(block)
    if expected.verbose:
        assert outcome.stderr.index("Traceback (most recent call last)") < outcome.stderr.index("Error: ")
        assert "rerun with --verbose" not in outcome.stderr
    else:  # the block is all there is on stderr
        assert block == [line for line in outcome.stderr.splitlines() if line.strip()], outcome.stderr
    shown = "\n".join(block)
    for text in expected.texts:
        assert text in shown, f"{text!r} not in:\n{shown}"
    # one instruction: Kedro's own advice to rerun with --from-nodes is not shown
    assert '--from-nodes "' not in outcome.stdout + outcome.stderr
    assert "Traceback" not in outcome.stdout or expected.rank_log_on_stdout
    log = (project / "info.log").read_text() if (project / "info.log").exists() else ""
    if expected.traceback_logged:
        assert "Traceback (most recent call last)" in log and "kedro run failed: " in log
    _, found = runs(project)
    if expected.status is None:
        assert found == [], "an MLflow run was started before the failure"
        return
    failed = [r for r in found if "mlflow.parentRunId" not in r.data.tags][0]  # the newest run
    assert failed.info.status == expected.status
    assert expected.texts[0] in failed.data.tags["error"]
