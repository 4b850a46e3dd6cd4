"""What every recipe builds the same way: the network, this rank's data, the evaluation of a checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pandas as pd

from pipelines.data.folder import create_dataset
from pipelines.distributed.launch import rank_context
from pipelines.engine.checkpoint import Checkpoint, check_compatible
from pipelines.engine.evaluation import evaluate
from pipelines.engine.runtime import configure_mindspore
from pipelines.engine.state import capture_state, restore_network
from pipelines.models.resnet import count_parameters, create_resnet
from pipelines.params import DataParams, ModelParams, RuntimeParams

logger = logging.getLogger(__name__)


def configure(runtime: RuntimeParams) -> None:
    """Device, execution mode and global seed of this process (``runtime`` parameters)."""
    configure_mindspore(runtime.device_target, runtime.mode, runtime.seed)


def num_classes(model: ModelParams, class_index: dict[str, int]) -> int:
    """``model.num_classes`` when set (ImageNet recipes use 1001), else the data's class count."""
    if model.num_classes is None:
        return len(class_index)
    if model.num_classes < len(class_index):
        raise ValueError(f"model.num_classes is {model.num_classes} but the data has {len(class_index)} classes")
    return model.num_classes


def create_network(model: ModelParams, class_index: dict[str, int]):
    """The configured ResNet, freshly initialised (MindSpore's global seed)."""
    return create_resnet(
        model.name,
        num_classes(model, class_index),
        conv_init=model.conv_init,
        dense_init=model.dense_init,
        zero_init_last_bn_gamma=model.zero_init_last_bn_gamma,
    )


def network_from_checkpoint(model: ModelParams, class_index: dict[str, int], checkpoint: Checkpoint, source: str):
    """The configured network with ``checkpoint``'s weights; a mismatch names ``source``."""
    net = create_network(model, class_index)
    check_compatible({p.name: tuple(p.shape) for p in net.get_parameters()}, checkpoint, source)
    restore_network(net, checkpoint)
    return net


def train_data(manifest: pd.DataFrame, data: DataParams, batch_size: int, seed: int):
    """This rank's shard of the train split (all of it with one worker), ``batch_size`` images per rank."""
    ranks = rank_context()
    return create_dataset(
        manifest,
        "train",
        data.image_size,
        batch_size,
        training=True,
        crop_scale=tuple(data.crop_scale),
        rank=ranks.rank,
        rank_size=ranks.size,
        num_workers=data.num_workers,
        seed=seed,
        cache_dir=data.cache_dir,
        on_bad_file=data.on_bad_file,
    )


def val_data(manifest: pd.DataFrame, data: DataParams):
    """The whole val split, batched by ``data.eval_batch_size``."""
    return create_dataset(
        manifest,
        "val",
        data.image_size,
        data.eval_batch_size,
        training=False,
        eval_resize_ratio=data.eval_resize_ratio,
        num_workers=data.num_workers,
        cache_dir=data.cache_dir,
        on_bad_file=data.on_bad_file,
    )


def step_val_data(manifest: pd.DataFrame, data: DataParams):
    """The val subset of the evaluation every K steps: ``data.step_eval_images`` images (None: all) drawn with
    ``data.subset_seed``, so every recipe and seed of a study is scored on the same images."""
    val = manifest[manifest["split"] == "val"]
    size = data.step_eval_images
    if size is not None and size < len(val):
        val = val.sample(n=size, random_state=data.subset_seed).sort_index()
    return val_data(pd.concat([manifest[manifest["split"] != "val"], val]), data)


def step_evaluation(
    manifest: pd.DataFrame, data: DataParams, every_steps: int, evaluate_on: Callable | None = None
) -> Callable | None:
    """The engine's ``evaluate_steps``: ``evaluate_on(step)`` rebound to the step subset (``step_val_data``),
    default top-1/top-5 of ``step.network``; None when ``every_steps`` is 0 (nothing is built)."""
    if not every_steps:
        return None
    subset = step_val_data(manifest, data)
    if evaluate_on is None:
        return lambda step: evaluate(step.network, subset)
    return lambda step: evaluate_on(step, subset)


def build_network(model: ModelParams, class_index: dict[str, int], runtime: RuntimeParams) -> Checkpoint:
    """Initial weights of the configured ResNet, seeded by ``runtime.seed``."""
    configure(runtime)
    net = create_network(model, class_index)
    logger.info("Built %s: %d trainable parameters", model.name, count_parameters(net))
    return capture_state(net, None, {"network": model.name, "epoch": 0})


def evaluate_checkpoint(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    label: str,
) -> dict:
    """Top-1/top-5 (fractions) of ``checkpoint`` on the val split, as a report; ``label`` names it in messages."""
    configure(runtime)
    net = network_from_checkpoint(model, class_index, checkpoint, f"of {label}")
    accuracy = evaluate(net, val_data(manifest, data))
    logger.info(
        "%s: top-1 %.2f%%, top-5 %.2f%% on %d val images",
        label,
        100 * accuracy["top1"],
        100 * accuracy["top5"],
        accuracy["images"],
    )
    return {
        "network": model.name,
        "epoch": int(checkpoint.metadata.get("epoch", 0)),
        "top1": accuracy["top1"],
        "top5": accuracy["top5"],
        "val_images": int(accuracy["images"]),
    }
