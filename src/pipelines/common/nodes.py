"""Nodes every training pipeline shares: build the network, evaluate a checkpoint."""

from __future__ import annotations

import logging

import pandas as pd

from pipelines.engine.checkpoint import Checkpoint, check_compatible
from pipelines.images.folder import create_dataset
from pipelines.distributed.launch import rank_context
from pipelines.engine.evaluation import evaluate
from pipelines.models.resnet import count_parameters, create_resnet_from_config
from pipelines.engine.runtime import configure_mindspore
from pipelines.tracking import log_metrics
from pipelines.engine.loop import capture_state, restore_state

logger = logging.getLogger(__name__)


def num_classes(model: dict, class_index: dict[str, int]) -> int:
    """``model.num_classes`` when set (ImageNet recipes use 1001), else the data's class count."""
    configured = model.get("num_classes")
    if configured is None:
        return len(class_index)
    if configured < len(class_index):
        raise ValueError(f"model.num_classes is {configured} but the data has {len(class_index)} classes")
    return configured


def create_network(model: dict, class_index: dict[str, int]):
    return create_resnet_from_config(model, num_classes(model, class_index))


def network_from_checkpoint(model: dict, class_index: dict[str, int], checkpoint: Checkpoint, source: str):
    """The configured network with ``checkpoint``'s weights; a mismatch names ``source``."""
    net = create_network(model, class_index)
    check_compatible({p.name: tuple(p.shape) for p in net.get_parameters()}, checkpoint, source)
    restore_state(net, checkpoint)
    return net


def train_data(manifest: pd.DataFrame, data: dict, batch_size: int, seed: int):
    """This rank's shard of the train split (all of it with one worker), batched per rank."""
    ranks = rank_context()
    return create_dataset(
        manifest,
        "train",
        data["image_size"],
        batch_size,
        training=True,
        crop_scale=data["crop_scale"],
        rank=ranks.rank,
        rank_size=ranks.size,
        num_workers=data["num_workers"],
        seed=seed,
    )


def val_data(manifest: pd.DataFrame, data: dict):
    return create_dataset(
        manifest,
        "val",
        data["image_size"],
        data["eval_batch_size"],
        training=False,
        eval_resize_ratio=data["eval_resize_ratio"],
        num_workers=data["num_workers"],
    )


def build_network(model: dict, class_index: dict[str, int], runtime: dict) -> Checkpoint:
    """Initial weights of the configured ResNet, seeded by ``runtime.seed``."""
    configure_mindspore(runtime["device_target"], runtime["mode"], runtime["seed"])
    net = create_network(model, class_index)
    logger.info("Built %s: %d trainable parameters", model["name"], count_parameters(net))
    return capture_state(net, None, {"network": model["name"], "epoch": 0})


def evaluate_checkpoint(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    metric_prefix: str,
) -> dict:
    """Top-1/top-5 of ``checkpoint`` on the val split; logged to MLflow as ``<prefix>_top1`` etc."""
    configure_mindspore(runtime["device_target"], runtime["mode"], runtime["seed"])
    net = network_from_checkpoint(model, class_index, checkpoint, f"of {metric_prefix}")
    dataset = val_data(manifest, data)
    accuracy = evaluate(net, dataset)
    log_metrics({f"{metric_prefix}_top1": accuracy["top1"], f"{metric_prefix}_top5": accuracy["top5"]})
    logger.info(
        "%s: top-1 %.2f%%, top-5 %.2f%% on %d val images",
        metric_prefix,
        100 * accuracy["top1"],
        100 * accuracy["top5"],
        accuracy["images"],
    )
    return {
        "network": model["name"],
        "epoch": int(checkpoint.metadata.get("epoch", 0)),
        "top1": accuracy["top1"],
        "top5": accuracy["top5"],
        "val_images": int(accuracy["images"]),
    }
