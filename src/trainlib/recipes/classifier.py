"""What every recipe builds the same way: the network, this rank's data, the evaluation of a checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import pandas as pd

from trainlib.data.folder import create_dataset
from trainlib.distributed.launch import rank_context
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint, check_compatible
from trainlib.engine.epochs import TrainingSpec
from trainlib.engine.evaluation import evaluate
from trainlib.engine.loop import Checkpointing, TrainingResult, train
from trainlib.engine.resume import fingerprint
from trainlib.engine.runtime import configure_mindspore
from trainlib.engine.state import capture_state, restore_network
from trainlib.engine.step import StepFactory, TrainStep
from trainlib.models.resnet import count_parameters, create_resnet
from trainlib.params import DataParams, NetworkParams, RuntimeParams
from trainlib.predict.export import ExportedModel, export_classifier
from trainlib.recipes.context import TrainingContext

logger = logging.getLogger(__name__)

# What a training's identity leaves out of its section: where its checkpoints go, how often it evaluates
NOT_TRAINING = frozenset({"checkpoint", "eval_interval", "eval_every_steps"})


def training_fingerprint(context: TrainingContext, section, *parts, exclude: Iterable[str] = ()) -> str:
    """A training's identity, which its checkpoints carry (``engine.resume.fingerprint``): the network, data and
    section (but for ``NOT_TRAINING`` and ``exclude``), the seed, the ranks, and ``parts`` (start weights, ...)."""
    settings = section.model_dump(exclude=NOT_TRAINING | set(exclude))
    runtime, workers = context.runtime, context.distributed.worker_num
    return fingerprint(context.network, context.data, settings, runtime.seed, workers, *parts)


def configure(runtime: RuntimeParams) -> None:
    """Device, execution mode and global seed of this process (``runtime`` parameters)."""
    configure_mindspore(runtime.device_target, runtime.mode, runtime.seed)


def num_classes(network: NetworkParams, class_index: dict[str, int]) -> int:
    """``network.num_classes`` when set (ImageNet recipes use 1001), else the data's class count."""
    if network.num_classes is None:
        return len(class_index)
    if network.num_classes < len(class_index):
        raise ValueError(f"network.num_classes is {network.num_classes} but the data has {len(class_index)} classes")
    return network.num_classes


def create_network(network: NetworkParams, class_index: dict[str, int], *, zero_init_last_bn_gamma: bool = False):
    """The configured ResNet, freshly initialised (MindSpore's global seed); ``zero_init_last_bn_gamma``: each
    residual block's last BatchNorm gamma starts at 0 (a recipe's setting, THOR's)."""
    return create_resnet(
        network.name,
        num_classes(network, class_index),
        conv_init=network.conv_init,
        dense_init=network.dense_init,
        zero_init_last_bn_gamma=zero_init_last_bn_gamma,
    )


def network_from_checkpoint(network: NetworkParams, class_index: dict[str, int], checkpoint: Checkpoint, source: str):
    """The configured network with ``checkpoint``'s weights; a mismatch names ``source``."""
    net = create_network(network, class_index)
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


class ImageStepFactory:
    """The base of an image recipe's ``StepFactory``: its evaluation is top-1/top-5 of the step's network; a recipe
    adds ``make_step`` (``momentum.MomentumStepFactory``, ``thor.ThorStepFactory``, ...)."""

    def make_step(self, start: Checkpoint | None, steps_per_epoch: int) -> TrainStep:
        raise NotImplementedError

    def evaluate(self, step: TrainStep, dataset) -> dict[str, float]:
        return evaluate(step.network, dataset)


def train_classifier(
    context: TrainingContext,
    section,
    factory: StepFactory,
    *,
    name: str,
    start: Checkpoint,
    fingerprint: str,
    epochs: int,
    schedule_epochs: int | None = None,
    continue_from_start: bool = False,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """An image recipe's ``section`` on the engine (``engine.loop.train``) with ``factory``'s steps, up to epoch
    ``epochs``: this rank's shard of the train split in batches of ``section.batch_size``, evaluated on val every
    ``section.eval_interval`` epochs (a section without it: after the last) and on the step subset
    (``step_val_data``) every ``section.eval_every_steps`` steps, resumable checkpoints in ``section.checkpoint.dir``,
    ``name`` the training's name in their metadata."""
    manifest, data, runtime = context.manifest, context.data, context.runtime
    spec = TrainingSpec(
        epochs=epochs,
        batch_size=section.batch_size,
        examples_per_step=section.batch_size * context.distributed.worker_num,
        schedule_epochs=schedule_epochs,
        eval_interval=getattr(section, "eval_interval", 0),
        data_seed=runtime.seed,
        eval_every_steps=section.eval_every_steps,
    )
    validation = val_data(manifest, data)
    training = train_data(manifest, data, section.batch_size, runtime.seed)
    return train(
        spec,
        training,
        factory,
        start=start,
        fingerprint=fingerprint,
        checkpoints=Checkpointing.of(section.checkpoint),
        validation=validation,
        step_validation=step_val_data(manifest, data) if section.eval_every_steps else None,
        callbacks=callbacks,
        continue_from_start=continue_from_start,
        metadata={"network": context.network.name, "training": name},
    )


def build_network(
    network: NetworkParams, class_index: dict[str, int], runtime: RuntimeParams, *, zero_init_last_bn_gamma: bool
) -> Checkpoint:
    """Initial weights of the configured ResNet, seeded by ``runtime.seed`` (``create_network``)."""
    configure(runtime)
    net = create_network(network, class_index, zero_init_last_bn_gamma=zero_init_last_bn_gamma)
    logger.info("Built %s: %d trainable parameters", network.name, count_parameters(net))
    return capture_state(net, None, {"network": network.name, "epoch": 0})


def evaluate_checkpoint(context: TrainingContext, checkpoint: Checkpoint) -> dict:
    """Top-1/top-5 (fractions) of ``checkpoint`` on ``context``'s val split in this process, as a report; messages
    name it by the training that wrote it (its metadata ``training``: ``baseline``, ``stage2``, …)."""
    manifest, class_index, network, data = context.manifest, context.class_index, context.network, context.data
    runtime = context.runtime
    label = str(checkpoint.metadata.get("training", "checkpoint"))
    configure(runtime)
    net = network_from_checkpoint(network, class_index, checkpoint, f"of {label}")
    accuracy = evaluate(net, val_data(manifest, data))
    logger.info(
        "%s: top-1 %.2f%%, top-5 %.2f%% on %d val images",
        label,
        100 * accuracy["top1"],
        100 * accuracy["top5"],
        accuracy["images"],
    )
    return {
        "network": network.name,
        "epoch": int(checkpoint.metadata.get("epoch", 0)),
        "top1": accuracy["top1"],
        "top5": accuracy["top5"],
        "val_images": int(accuracy["images"]),
    }


def export_checkpoint(context: TrainingContext, checkpoint: Checkpoint, batch_size: int) -> ExportedModel:
    """``checkpoint``'s network as MindIR with what predicting needs (``predict.export``): the data's image size and
    resize ratio, the class names by label, and the first val image of the manifest as an example input; its fixed
    batch ``batch_size`` (``model.export_batch_size``)."""
    network, class_index, data = context.network, context.class_index, context.data
    configure(context.runtime)
    label = str(checkpoint.metadata.get("training", "checkpoint"))
    net = network_from_checkpoint(network, class_index, checkpoint, f"of {label}")
    val = context.manifest[context.manifest["split"] == "val"]
    if val.empty:
        raise ValueError("the manifest has no 'val' images to take the model's example input from")
    with open(val["path"].iloc[0], "rb") as image:
        example_image = image.read()
    return export_classifier(
        net,
        image_size=data.image_size,
        eval_resize_ratio=data.eval_resize_ratio,
        class_index=class_index,
        num_classes=num_classes(network, class_index),
        network=network.name,
        training=label,
        example_image=example_image,
        batch_size=batch_size,
    )
