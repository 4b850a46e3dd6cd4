"""What a study changes in the recipes' sections (``trainlib.study.budget``): the runner trains with it, the study's
MLflow run logs it in place of the configured values, and an epoch shorter than the evaluation interval is named."""

from __future__ import annotations

import logging

from pipelines.hooks.mlflow_run import with_values
from tests.support.runner import tiny_parameters
from trainlib.study import runner
from trainlib.study.budget import study_budget
from trainlib.study.runner import StudyInputs, StudyPlan, short_epochs


def test_every_section_the_study_trains_takes_the_values_its_run_logs(tmp_path):
    params = tiny_parameters(tmp_path)
    inputs = StudyInputs(
        None, params.baseline, params.thor, params.dim_reduce, params.adasum, params.boost, params.thor_bert
    )
    plan = StudyPlan(["baseline"], [0], epochs=7, eval_every_steps=9, directory=tmp_path)
    trained = {
        "baseline": runner._baseline(inputs, plan),
        "thor": runner._thor(inputs, plan, precondition=True),
        "adasum": runner._adasum(inputs, plan),
        "thor_bert.thor": runner._bert(params.thor_bert.thor, plan),
        "thor_bert.control": runner._bert(params.thor_bert.control, plan),
    }
    logged = study_budget(epochs=7, eval_every_steps=9)
    for key, value in logged.items():
        section, _, name = key.rpartition(".")
        if section in trained:
            assert getattr(trained[section], name) == value, key
    assert params.baseline.epochs != 7 and logged["dim_reduce.stage2.eval_every_steps"] == 9
    assert {key.rpartition(".")[0] for key in logged} == {*trained, "dim_reduce.stage2"}


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
    records = [{"recipe": "thor", "steps_per_epoch": 15}, {"recipe": "baseline", "steps_per_epoch": 30}]
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
