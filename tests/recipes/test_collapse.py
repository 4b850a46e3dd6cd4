"""A BERT training that falls back to the most frequent token's accuracy is reported as collapsed, with the step
since which it has been there (``recipes.language_model.CollapseWatch``), and the comparison prints that accuracy
beside both trainings."""

from __future__ import annotations

import logging
import typing
from types import SimpleNamespace

import pytest

from trainlib.metrics import STEP_KEY, VAL_MLM_ACCURACY, VAL_STEP_MLM_ACCURACY
from trainlib.params import BertControlTraining
from trainlib.recipes.language_model import (
    COLLAPSE_STEP,
    COLLAPSED,
    MOST_FREQUENT_TOKEN_ACCURACY,
    CollapseWatch,
    compare_trainings,
    control_optimizer,
)
from trainlib.text.examples import MostFrequentToken

MOST_FREQUENT = MostFrequentToken(token_id=11, token="the", accuracy=0.05, subset_accuracy=0.06)


def watch_over(epoch_accuracies, step_accuracies, steps_per_epoch=100) -> tuple[CollapseWatch, list[dict]]:
    """The watch after epochs with these held-out accuracies and, every 50 steps, these subset accuracies."""
    watch = CollapseWatch(MOST_FREQUENT, "thor_bert thor")
    watch.on_train_begin(len(epoch_accuracies), steps_per_epoch, 0)
    rows, steps = [], iter(step_accuracies)
    for epoch, accuracy in enumerate(epoch_accuracies):
        for step in (epoch * steps_per_epoch + 50, (epoch + 1) * steps_per_epoch):
            watch.on_step_evaluation({STEP_KEY: step, VAL_STEP_MLM_ACCURACY: next(steps)})
        watch.on_evaluation(epoch, {"mlm_accuracy": accuracy})
        rows.append(watch.epoch_metrics(epoch))
    return watch, rows


def test_a_training_back_at_the_most_frequent_token_accuracy_is_collapsed_since_the_first_step_it_stayed_there(
    caplog,
):
    # learns (0.12 on the subset, whose most frequent token scores 0.06), falls back at step 150 and stays (0.064 is
    # within the half-point margin), the epoch evaluations agree (0.05 is the token's accuracy on all examples)
    watch, rows = watch_over([0.11, 0.05], [0.08, 0.12, 0.064, 0.02])
    assert rows[0] == {MOST_FREQUENT_TOKEN_ACCURACY: 0.05, COLLAPSED: 0.0}
    assert rows[1] == {MOST_FREQUENT_TOKEN_ACCURACY: 0.05, COLLAPSED: 1.0, COLLAPSE_STEP: 150.0}
    with caplog.at_level(logging.WARNING):
        watch.on_train_end()
    assert (
        "thor_bert thor collapsed: its held-out masked-LM accuracy has been at most 0.5 points above always "
        "predicting the most frequent token 'the' (id 11), 5.00%, since step 150" in caplog.text
    )


def test_a_training_that_recovers_or_stays_above_the_most_frequent_token_accuracy_is_not_collapsed(caplog):
    watch, rows = watch_over([0.05, 0.09], [0.02, 0.05, 0.07, 0.1])  # below at first, above by the end
    assert rows[-1] == {MOST_FREQUENT_TOKEN_ACCURACY: 0.05, COLLAPSED: 0.0}
    assert watch.summary() == {MOST_FREQUENT_TOKEN_ACCURACY: 0.05, COLLAPSED: 0.0}
    with caplog.at_level(logging.WARNING):
        watch.on_train_end()
    assert "collapsed" not in caplog.text


def test_a_diverged_evaluation_counts_as_collapsed():
    watch, _ = watch_over([float("nan")], [0.2, float("nan")])
    assert watch.summary()[COLLAPSE_STEP] == 100.0


def test_a_resumed_training_counts_the_evaluations_of_its_earlier_epochs():
    watch = CollapseWatch(MOST_FREQUENT, "thor_bert control")
    watch.on_resume(None, [{"epoch": 1, VAL_MLM_ACCURACY: 0.04}])
    watch.on_train_begin(2, 100, 1)
    watch.on_evaluation(1, {"mlm_accuracy": 0.052})
    assert watch.epoch_metrics(1)[COLLAPSE_STEP] == 100.0


@pytest.mark.parametrize(("optimizer", "name"), [("adamweightdecay", "AdamWeightDecay"), ("lamb", "Lamb")])
def test_the_comparison_names_the_trainings_by_optimizer_and_the_token_by_its_text_and_says_it_is_one_run(
    caplog, optimizer, name
):
    def report(accuracy):
        return {"mlm_accuracy": accuracy, "mlm_loss": 6.0, "nsp_accuracy": 0.5, "examples": 300}

    thor, control = SimpleNamespace(epochs=1), SimpleNamespace(epochs=2, optimizer=optimizer)
    with caplog.at_level(logging.INFO):
        table = compare_trainings(report(0.052), report(0.2), thor, control, MOST_FREQUENT, seed=42)
    assert list(table["training"]) == ["thor", "control", "most frequent token 'the' (id 11)"]
    assert list(table["optimizer"][:2]) == ["THOR", name]
    assert list(table["mlm_accuracy"]) == [0.052, 0.2, 0.05]
    assert list(table["collapsed"][:2]) == [True, False]
    assert list(table["seed"][:2]) == [42, 42]
    assert (
        f"THOR 5.20% (1 epoch), {name} (control) 20.00% (2 epochs), most frequent token 'the' (id 11) 5.00%; "
        f"THOR - {name} -14.80 points on 300 held-out examples; collapsed to the most frequent token's accuracy: "
        "THOR. One run each (seed 42): no interval; the study trains both over seeds for one (kedro run "
        '--pipelines=study --params="study.recipes=[thor_bert]", docs/study.md)'
    ) in caplog.text
    assert table["mlm_accuracy_minus_control"].iloc[0] == pytest.approx(-0.148)


def test_every_control_optimizer_the_parameters_offer_has_its_mindspore_class():
    choices = typing.get_args(BertControlTraining.model_fields["optimizer"].annotation)
    assert {choice: control_optimizer(SimpleNamespace(optimizer=choice)).__name__ for choice in choices} == {
        "adamweightdecay": "AdamWeightDecay",
        "lamb": "Lamb",
    }
