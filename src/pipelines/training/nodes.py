"""Nodes of the image training template: the initial weights, a recipe's whole training, the evaluation of a
checkpoint. Each image recipe (baseline, adasum, thor) instantiates them under its own namespace; dim_reduce's
stages build and evaluate with them. Each node reads the manifest, the class index and the shared sections it needs
from the catalog itself, so any node reruns alone (``kedro run --nodes=baseline.evaluate``) and logs what it read.
Tracking: the run the node runs in (the ``kedro run``'s, or a training's child run, ``hooks.training_runs``)
receives the per-epoch rows and the final figures."""

from __future__ import annotations

import pandas as pd

from pipelines import tracking
from trainlib.distributed.launch import on_every_rank
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.metrics import history_table, step_history_table
from trainlib.params import (
    BoostParams,
    DataParams,
    DistributedParams,
    ImageRecipe,
    ModelParams,
    NetworkParams,
    RuntimeParams,
    TargetParams,
)
from trainlib.predict.export import ExportedModel
from trainlib.recipes import classifier
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.registry import check_launch, train_recipe


def training_context(
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams | None = None,
) -> TrainingContext:
    """What a training's nodes read besides their own section, in one value (``TrainingContext``): the data
    pipeline's manifest and class index and the shared sections, as each node receives them from the catalog.
    Without ``distributed``, this process alone (an evaluation, an export)."""
    return TrainingContext(manifest, class_index, network, data, runtime, distributed)


def build_network(
    class_index: dict[str, int], network: NetworkParams, runtime: RuntimeParams, zero_init_last_bn_gamma: bool
) -> Checkpoint:
    """Initial weights of the configured ResNet, seeded by ``runtime.seed``; the recipe's own
    ``zero_init_last_bn_gamma`` (THOR's recipes: each residual block's last BatchNorm gamma starts at 0)."""
    return classifier.build_network(network, class_index, runtime, zero_init_last_bn_gamma=zero_init_last_bn_gamma)


def train(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    recipe: ImageRecipe,
    boost: BoostParams,
    target: TargetParams,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame]:
    """The recipe's whole training from the initial weights (``recipes.registry``: Momentum, Adasum or THOR by
    its section; mindspore.boost's options in ``boost`` apply to the Momentum baseline): the final checkpoint and
    the per-epoch and step histories; the run gets when it first reached ``target.top1`` (``target/epochs``, …). With
    ``distributed.worker_num`` above 1 it trains
    on that many msrun workers; a rerun resumes from the newest checkpoint in ``<recipe>.checkpoint.dir``."""
    check_launch(recipe, distributed)
    context = training_context(manifest, class_index, network, data, runtime, distributed)
    result = on_every_rank(train_recipe, context, initial_weights, recipe, boost=boost, callbacks=callbacks(target))
    return training_outputs(result)


def callbacks(target: TargetParams) -> list:
    """What a training logs to its run: each epoch's row, and when it first reached ``target.top1``."""
    return [tracking.EpochMetrics(), tracking.TimeToTarget(target.top1)]


def training_outputs(result: TrainingResult) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame]:
    """A training node's outputs: the final checkpoint, the history table and the step-history table (the
    evaluations every ``eval_every_steps`` steps: what time to target is read on); its end-of-training figures
    (``distributed/replica_max_abs_diff``) go to the run."""
    tracking.log_metrics(result.summary)
    result.release()  # the node is done with the trained step: a study trains on in this process
    return (
        result.checkpoint,
        history_table(result.history),
        step_history_table(result.step_history, result.steps_per_epoch),
    )


def evaluate(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    data: DataParams,
    runtime: RuntimeParams,
) -> dict:
    """Top-1/top-5 of the checkpoint on val, in this process (``baseline: top-1 …``, named by the training that
    wrote it), logged as ``final/top1``, ``final/top5``."""
    report = classifier.evaluate_checkpoint(training_context(manifest, class_index, network, data, runtime), checkpoint)
    tracking.log_final(report)
    return report


def export_model(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    data: DataParams,
    runtime: RuntimeParams,
    model: ModelParams,
) -> ExportedModel:
    """The training's final network as MindIR with its description and an example image, into ``model``, of
    ``model.export_batch_size`` images a batch; the project's ``ModelHooks`` log that folder to the training's MLflow
    run as its model (docs/use-a-model.md)."""
    context = training_context(manifest, class_index, network, data, runtime)
    return classifier.export_checkpoint(context, checkpoint, model.export_batch_size)
