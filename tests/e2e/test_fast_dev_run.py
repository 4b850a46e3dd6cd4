"""``runtime.fast_dev_run``: every training pipeline of every environment runs on this CPU machine with the
environment's own recipe, a few batches per stage, in real ``kedro run`` processes.

Processes are shared to keep the slow tier short: per environment one ``kedro run`` of baseline, adasum and
dim_reduce together (2 msrun workers), one of thor and one of the study (a run that may train THOR starts the
workers memory takes: ResNet-50's THOR needs about 13 GB a worker; and Kedro 1.7 cannot validate the study's
``params:dim_reduce`` and dim_reduce's ``params:dim_reduce.pca`` in one run: "intermediate key 'dim_reduce' is not
a dictionary").
"""

from __future__ import annotations

import socket
import time

import pytest

from pipelines.engine.runtime import device_available
from pipelines.fast_dev_run import TAG
from tests.support.projects import kedro, make_project, runs
from tests.support.trees import write_image_tree

TOGETHER = ("baseline,adasum,dim_reduce", "thor", "study")
# thor_bert rehearses each environment's BERT: BERT-base's and BERT-large's THOR exceed this machine's 23 GB (README,
# "Rehearse a target on CPU"), so the slow tier rehearses base's
BERT_ENVS = ("base",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_image_tree(
        tmp_path_factory.mktemp("tree"), classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 2}
    )


@pytest.mark.parametrize("env", ["base", "ascend", "gpu"])
def test_every_training_pipeline_rehearses_the_environment_on_cpu(tmp_path, tree, env, capsys):
    project = make_project(tmp_path / "project", {})
    for pipelines in (*TOGETHER, "thor_bert") if env in BERT_ENVS else TOGETHER:
        params = f"runtime.fast_dev_run=true,data.root={tree},distributed.master_port={free_port()}"
        started = time.monotonic()
        result = kedro(project, "run", f"--pipelines={pipelines}", f"--env={env}", f"--params={params}", timeout=1500)
        with capsys.disabled():
            print(f"\nfast_dev_run --env={env} --pipelines={pipelines}: {time.monotonic() - started:.0f} s wall")
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
        assert "fast_dev_run:" in result.stdout + result.stderr
        if pipelines == "thor_bert":  # its closing link opens the chart of the language model's key
            link = next(line for line in result.stdout.splitlines() if line.startswith("MLflow: compare the runs at"))
            assert "mlm_accuracy" in link and "top1" not in link

    client, found = runs(project)
    ran = {name for run in found for name in run.data.tags.get("pipeline", "").split("+")}  # adasum+dim_reduce+…
    assert ran >= {"baseline", "adasum", "dim_reduce", "thor", "study", *(["thor_bert"] if env in BERT_ENVS else [])}
    for run in found:
        if run.data.tags.get("mlflow.parentRunId"):
            continue  # dim_reduce's and the study's trainings: their parent carries the tags
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.runName"].startswith("fast_dev_run ")
        listed = run.data.tags[TAG]
        assert "study.seeds=[0]" in listed and f"fast_dev_run/{env}/" in listed
        if run.data.tags["pipeline"] == "thor_bert":
            assert "thor_bert.corpus.max_documents=4" in listed
            assert run.data.params["thor_bert.network.hidden_size"] == "64"  # base's tiny BERT, kept
            continue
        if env != "base":
            assert "runtime.device_target=CPU" in listed
            if "adasum" in run.data.tags["pipeline"].split("+"):
                assert "distributed.worker_num=2" in listed  # Adasum's exchange between 2 ranks
            assert run.data.params["model.name"] == "resnet50" and run.data.params["data.image_size"] == "224"


def test_a_recipe_environment_without_fast_dev_run_is_still_refused(tmp_path, tree):
    if device_available("Ascend"):
        pytest.skip("this machine has an Ascend device")
    project = make_project(tmp_path / "project", {})
    result = kedro(project, "run", "--pipelines=dim_reduce", "--env=ascend", f"--params=data.root={tree}")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "runtime.device_target is Ascend" in errors[0], result.stderr[-2000:]
