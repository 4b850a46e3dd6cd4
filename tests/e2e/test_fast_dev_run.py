"""``runtime.fast_dev_run``: every training pipeline of every environment runs on this CPU machine with the
environment's own recipe, a few batches per stage, in real ``kedro run`` processes.

A rehearsal whose nodes would read exactly the parameters of the same pipelines' rehearsal in an environment listed
before it (``ENVS``; after the substitutions, the environment's own folder aside) is that rehearsal again, and is
skipped: ascend's and gpu's baseline, adasum and dim_reduce recipes are the same ResNet-50 recipe once the device is
CPU. The comparison is computed from the environments' parameter files, so it is the same whichever tests run, in
whichever order or worker, and a recipe that comes to differ is rehearsed again.

Processes are shared to keep the slow tier short: per environment one ``kedro run`` (one test) of baseline, adasum
and dim_reduce together (2 msrun workers), one of thor and one of the study (a run that may train THOR starts the
workers memory takes: ResNet-50's THOR needs about 13 GB a worker; and Kedro 1.7 cannot validate the study's
``params:dim_reduce`` and dim_reduce's ``params:dim_reduce.pca`` in one run: "intermediate key 'dim_reduce' is not
a dictionary"). ascend's and gpu's are marked ``large_memory``: one at a time, beside two other slow tests.
"""

from __future__ import annotations

import json
import time

import pytest
from omegaconf import OmegaConf

from pipelines.hooks.rehearsal import rehearsal_substitutions
from pipelines.pipeline_registry import register_pipelines
from tests.support.config import load_config
from tests.support.processes import assert_no_worker_left
from tests.support.projects import kedro, make_project, runs
from tests.support.servers import free_port
from tests.support.trees import write_image_tree
from tests.support.views import charted, linked_view
from trainlib.engine.runtime import device_available
from trainlib.fast_dev_run import ROOT, TAG
from trainlib.params.recipe_spec import recipe_pipelines

# THOR's first, every environment's: ResNet-50's THOR compiles on one core, and scripts/test.sh --all runs the other
# slow tests beside it
TOGETHER = ("thor", "study", "baseline,adasum,dim_reduce")
# thor_bert rehearses each environment's BERT: BERT-base's and BERT-large's THOR exceed this machine's 23 GB
# (docs/configuration.md#fast_dev_run), so the slow tier rehearses base's
BERT_ENVS = ("base",)
# ResNet-50's rehearsals take 11 to 13 GB: one at a time (one xdist group), beside two other slow tests
LARGE_MEMORY_ENVS = ("ascend", "gpu")
# Their study rehearses the study's nodes on the environment's parameters with the baseline alone: its THOR training
# is the thor rehearsal's (the same nodes and parameters, ResNet-50's THOR graph compiled again for 1-2 minutes), and
# the study's own code, the same in every environment, is rehearsed with THOR in base's
ENV_STUDY_RECIPES = "[baseline]"
ENVS = ("base", *LARGE_MEMORY_ENVS)
# The recipes rehearsed in fewer environments, with the ones they are: LARS in base's with the first-order trainings
# (ResNet-50's LARS graphs would add minutes of compiling per environment to the slow tier; its operators' backends
# are audited on every target in the fast tier, tests/pipelines/test_runs.py::test_lars_pipeline)
FEWER_ENVS = {"thor_bert": BERT_ENVS, "lars": ("base",)}
REHEARSALS = [
    pytest.param(env, pipelines + (",lars" if env == "base" and pipelines == TOGETHER[-1] else ""),
                 marks=[pytest.mark.large_memory] if env in LARGE_MEMORY_ENVS else [])
    for pipelines in (*TOGETHER, "thor_bert")
    for env in ENVS
    if env in FEWER_ENVS.get(pipelines, ENVS)
]  # fmt: skip


def lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def rehearsed_parameters(env: str, pipelines: str, tree, project) -> str:
    """The parameters the nodes of ``kedro run --pipelines=<pipelines> --env=<env>`` read in a rehearsal on
    ``tree`` (every ``params:`` input, after fast_dev_run's substitutions, as the project's hooks apply them), with
    ``env``'s own folder written ``<env>``: equal strings, equal trainings."""
    names = pipelines.split(",")
    given = {"runtime": {"fast_dev_run": True}, "data": {"root": str(tree)}}
    raw = load_config(env, runtime_params=given)
    substitutions = rehearsal_substitutions(
        raw, env=env, project=project, base_params=load_config("base"), pipelines=names
    )
    effective = load_config(env, runtime_params=OmegaConf.to_container(OmegaConf.merge(given, substitutions.nested())))
    registry = register_pipelines()
    keys = sorted({i.removeprefix("params:") for n in names for i in registry[n].inputs() if i.startswith("params:")})
    text = json.dumps({key: lookup(effective, key) for key in keys}, sort_keys=True)
    return text.replace(f"{ROOT}/{env}/", f"{ROOT}/<env>/")


def same_rehearsal_before(env: str, pipelines: str, tree, project) -> str | None:
    """The environment listed before ``env`` (``ENVS``) whose rehearsal of ``pipelines`` reads the same parameters,
    or ``None``: decided from the parameter files alone, whichever rehearsals this session runs."""
    own = rehearsed_parameters(env, pipelines, tree, project)
    earlier = ENVS[: ENVS.index(env)]
    return next((other for other in earlier if rehearsed_parameters(other, pipelines, tree, project) == own), None)


@pytest.fixture(scope="session")  # one tree for every rehearsal
def tree(tmp_path_factory):
    return write_image_tree(
        tmp_path_factory.mktemp("tree"), classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 2}
    )


def test_the_rehearsals_cover_every_training_pipeline_of_every_environment():
    rehearsed = {(p.values[0], name) for p in REHEARSALS for name in p.values[1].split(",")}
    training = {*recipe_pipelines(), "study"}  # every recipe's pipeline, this package's or another's
    assert training <= set(register_pipelines())
    expected = {(env, name) for env in ENVS for name in training}
    assert rehearsed == {(env, name) for env, name in expected if env in FEWER_ENVS.get(name, ENVS)}


@pytest.mark.parametrize(("env", "pipelines"), REHEARSALS)
def test_the_pipelines_rehearse_the_environment_on_cpu(tmp_path, tree, env, pipelines, capsys):
    project = make_project(tmp_path / "project", {})
    same = same_rehearsal_before(env, pipelines, tree, project)
    if same is not None:
        pytest.skip(f"fast_dev_run --env={env} --pipelines={pipelines}: the same training as --env={same}'s")
    params = f"runtime.fast_dev_run=true,data.root={tree},distributed.master_port={free_port()}"
    if pipelines == "study" and env in LARGE_MEMORY_ENVS:
        params += f",study.recipes={ENV_STUDY_RECIPES}"
    started = time.monotonic()
    result = kedro(project, "run", f"--pipelines={pipelines}", f"--env={env}", f"--params={params}", timeout=1500)
    with capsys.disabled():
        print(f"\nfast_dev_run --env={env} --pipelines={pipelines}: {time.monotonic() - started:.0f} s wall")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "fast_dev_run:" in result.stdout + result.stderr
    if pipelines == "thor_bert":  # its closing link opens the chart of the language model's key
        link = next(line for line in result.stdout.splitlines() if line.startswith("MLflow: compare the runs at"))
        charts = charted(linked_view(f"sqlite:///{project / 'mlflow.db'}", link))
        assert charts and set(charts) <= {"val/step_mlm_accuracy", "val/mlm_accuracy"}

    client, found = runs(project)
    ran = {name for run in found for name in run.data.tags.get("pipeline", "").split("+")}  # adasum+dim_reduce+…
    assert ran >= set(pipelines.split(","))
    if env != "base" and pipelines == "baseline,adasum,dim_reduce":
        assert_data_parallel(client, found, result.stdout + result.stderr, project)
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
            assert run.data.params["network.name"] == "resnet50" and run.data.params["data.image_size"] == "224"


def assert_data_parallel(client, found, output: str, project) -> None:
    """baseline, adasum and dim_reduce's three trainings each on 2 msrun workers: identical replicas, the metrics of
    each training logged once (by rank 0, not by each rank) into the run's one MLflow run (dim_reduce's into one
    child run per training), Adasum applied across the ranks, and no worker outliving the run."""
    assert output.count("Launching 2 of 2 workers on node 0") == 5  # baseline, adasum, stage1, stage2, control
    worker_logs = "".join(log.read_text() for log in (project / "logs/msrun").glob("*/*.log"))
    assert "Adasum of the weight deltas across 2 ranks" in worker_logs
    (parent,) = [run for run in found if not run.data.tags.get("mlflow.parentRunId")]
    children = {run.data.tags["training"]: run for run in found if run.data.tags.get("mlflow.parentRunId")}
    assert set(children) == {"stage1", "stage2", "control"}
    # the parent holds baseline's and adasum's trainings, a child each of dim_reduce's: one value a training
    for run, trainings in [(parent, 2), *((child, 1) for child in children.values())]:
        for key in ("distributed/replica_max_abs_diff", "final/top1"):
            history = client.get_metric_history(run.info.run_id, key)
            assert len(history) == trainings, (run.data.tags.get("training", "parent"), key, history)
        replicas = client.get_metric_history(run.info.run_id, "distributed/replica_max_abs_diff")
        assert {metric.value for metric in replicas} == {0.0}
    assert_no_worker_left(project)


def test_a_recipe_environment_without_fast_dev_run_is_still_refused(tmp_path, tree):
    if device_available("Ascend"):
        pytest.skip("this machine has an Ascend device")
    project = make_project(tmp_path / "project", {})
    # --pipeline, as older Kedro documentation writes it: the same run as --pipelines, without Kedro's deprecation
    result = kedro(project, "run", "--pipeline=dim_reduce", "--env=ascend", f"--params=data.root={tree}")
    assert result.returncode != 0
    assert "deprecated" not in (result.stdout + result.stderr).lower(), result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "runtime.device_target is Ascend" in errors[0], result.stderr[-2000:]
