"""What a study changes in the recipes' sections (``trainlib.study.budget``): the runner trains with it, the study's
MLflow run logs it in place of the configured values, and an epoch shorter than the evaluation interval is named."""

from __future__ import annotations

import logging

from pipelines.hooks.mlflow_run import with_values
from pipelines.modular import value_at
from pipelines.study.recipe_runs import RecipePipelines
from tests.support.runner import tiny_parameters
from trainlib.params.recipe_spec import recipe_specs
from trainlib.study import runner
from trainlib.study.budget import study_budget
from trainlib.study.runner import StudyPlan, short_epochs


def test_every_section_the_study_trains_takes_the_values_its_run_logs(tmp_path):
    params = tiny_parameters(tmp_path)
    plan = StudyPlan(["baseline"], [0], epochs=7, eval_every_steps=9, directory=tmp_path)
    trainer = RecipePipelines(params, None, {}, plan)
    logged = study_budget(epochs=7, eval_every_steps=9)
    trained = {}
    for recipe in recipe_specs():
        for run, parameters in trainer.trained_with(recipe, 3, {}, str(tmp_path)):
            assert value_at(parameters, "runtime.seed") == 3
            for row in run.rows:
                trained |= {key: value_at(parameters, key) for key in logged if key.startswith(f"{row.section}.")}
    assert trained == logged  # every key the run logs is one a training takes, with that value
    assert params.baseline.epochs != 7 and logged["dim_reduce.stage2.eval_every_steps"] == 9
    assert {key.rpartition(".")[0] for key in logged} == {
        "baseline",
        "thor",
        "adasum",
        "thor_bert.thor",
        "thor_bert.control",
        "dim_reduce.stage2",
        "lars",
    }


def test_each_result_row_trains_its_own_values_in_folders_of_the_study(tmp_path):
    """thor_first_order is thor's pipeline without the preconditioner; adasum's control averages gradients on the
    same ranks; every folder a training writes is the study's."""
    params = tiny_parameters(tmp_path)
    plan = StudyPlan(["baseline"], [0], epochs=1, eval_every_steps=9, directory=tmp_path, adasum_workers=4)
    trainer = RecipePipelines(params, None, {}, plan)
    ((_, thor),) = trainer.trained_with("thor", 0, {}, "here")
    ((_, first_order),) = trainer.trained_with("thor_first_order", 0, {}, "here")
    assert (value_at(thor, "thor.precondition"), value_at(first_order, "thor.precondition")) == (True, False)
    assert value_at(thor, "thor.checkpoint.dir") == "here/thor.checkpoint"
    adasum = {run.rows[0].name: parameters for run, parameters in trainer.trained_with("adasum", 0, {}, "here")}
    assert {row: value_at(p, "adasum.combine_by_adasum") for row, p in adasum.items()} == {
        "adasum": True,
        "allreduce": False,
    }
    assert {value_at(p, "distributed.worker_num") for p in adasum.values()} == {4}
    ((_, dim_reduce),) = trainer.trained_with("dim_reduce", 0, {}, "here")
    assert value_at(dim_reduce, "dim_reduce.stage1.trajectory.dir") == "here/dim_reduce.stage1.trajectory"
    assert value_at(dim_reduce, "distributed.worker_num") == 1
    # a tuning's values reach the section; another seed, another fingerprint; the folder none
    assert trainer.configuration("thor", 0, {}) != trainer.configuration("thor", 1, {})
    assert trainer.configuration("thor", 0, {}) != trainer.configuration("thor", 0, {"thor.lr.peak": 0.5})
    ((_, tuned),) = trainer.trained_with("thor", 0, {"thor.lr.peak": 0.5}, "here")
    assert value_at(tuned, "thor.lr.peak") == 0.5


def test_the_logged_sections_carry_the_studys_values_and_leave_the_configuration_alone():
    configured = {"epochs": 5, "lr": {"peak": 0.1}, "eval_every_steps": 0}
    values = study_budget(epochs=1, eval_every_steps=20)
    assert with_values(configured, "baseline", values) == {"epochs": 1, "lr": {"peak": 0.1}, "eval_every_steps": 20}
    assert configured["epochs"] == 5
    everything = {"thor_bert": {"thor": {"epochs": 3}, "corpus": {"epochs": 3}}, "runtime": {"seed": 0}}
    assert with_values(everything, "", values) == {
        "thor_bert": {"thor": {"epochs": 1}, "corpus": {"epochs": 3}},
        "runtime": {"seed": 0},
    }
    assert with_values(5, "thor.epochs", values) == 1  # a single key (params:thor.epochs)


def test_an_epoch_shorter_than_the_interval_is_named_once_per_result_row(caplog):
    records = [{"result": "thor", "steps_per_epoch": 15}, {"result": "baseline", "steps_per_epoch": 30}]
    assert short_epochs(records, 20) == {"thor": 15}
    assert short_epochs(records, 0) == {}  # no step evaluation: nothing to warn of
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="trainlib.study.runner"):
        for _ in range(2):  # a second seed of thor, read back or trained
            runner._warn_of_short_epochs(records, 20, warned)
    assert [record.getMessage() for record in caplog.records] == [
        "study.eval_every_steps is 20, but an epoch of thor has 15 steps: its curve has a point every 20 steps "
        "across epochs and one at the training's end; set study.eval_every_steps to at most 15 for a point in every "
        "epoch"
    ]
