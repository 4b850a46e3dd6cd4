"""A trained network as files others can load: the network in MindIR (``mindspore.export``: what MindSpore Lite and
Ascend inference load), the description a prediction needs, and one example input. A folder of three files, swapped
in whole on save.

Two tasks: ``image_classification`` (an image recipe's ResNet for a fixed batch; the description holds the batch,
image size, resize ratio and class names by label; the example is an encoded val image) and ``fill_mask``
(thor_bert's BERT with its pre-training heads for any batch; the description holds the tokenizer, sequence length
and masked positions; the example a text with ``[MASK]``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mindir_serving.files import DESCRIPTION_FILE, EXAMPLE_FILE, FILL_MASK, IMAGE_CLASSIFICATION, MINDIR_FILE


class ModelFolderError(ValueError):
    """A model folder that is missing or lacks one of its files."""


@dataclass(frozen=True)
class ExportedModel:
    """The network's MindIR bytes, its ``description`` (``task``, ``network``, ``training`` and what the task's
    predictions need) and ``example``, an input of the data it was trained on (an encoded image, a UTF-8 text)."""

    mindir: bytes
    description: dict
    example: bytes


def class_names(class_index: Mapping[str, int], num_classes: int) -> list[str]:
    """The name of each output of a network with ``num_classes`` outputs: the class of that label, or the label
    itself for an output no class has (ImageNet's recipes train 1001 outputs for 1000 classes)."""
    by_label = {label: name for name, label in class_index.items()}
    return [by_label.get(label, str(label)) for label in range(num_classes)]


class ExportError(RuntimeError):
    """An exported network that MindSpore cannot load back and run."""


def export_network(net, inputs: Sequence, probe: Sequence, *, description: dict, example: bytes) -> ExportedModel:
    """``net`` in inference mode (BatchNorm on its moving statistics, no dropout) as MindIR for ``inputs``
    (MindSpore tensors; a dimension of ``None`` takes any size). The MindIR is loaded back and run on ``probe``
    (arrays of those shapes): an export MindSpore cannot run raises ``ExportError`` here rather than in the hands
    of whoever loads it. (That its outputs are the network's is the tests' check: comparing here would compile the
    network once more in every training.)"""
    import mindspore as ms
    from mindspore import nn

    net.set_train(False)
    with tempfile.TemporaryDirectory() as folder:
        ms.export(net, *inputs, file_name=str(Path(folder) / "network"), file_format="MINDIR")
        path = Path(folder) / MINDIR_FILE
        try:
            nn.GraphCell(ms.load(str(path)))(*(ms.Tensor(array) for array in probe))
        except (RuntimeError, ValueError, TypeError) as error:
            raise ExportError(
                f"MindSpore exported {description['network']} to MindIR but cannot run the file it wrote: "
                f"{str(error).splitlines()[0]}"
            ) from error
        mindir = path.read_bytes()
    return ExportedModel(mindir, description, example)


def export_classifier(
    net,
    *,
    image_size: int,
    eval_resize_ratio: float,
    class_index: Mapping[str, int],
    num_classes: int,
    network: str,
    training: str,
    example_image: bytes,
    batch_size: int,
) -> ExportedModel:
    """An image classifier taking batches of ``batch_size`` ``(3, image_size, image_size)`` images. A fixed batch:
    MindSpore 2.10 cannot load back a ResNet (resnet18, resnet50: measured) exported for any batch size (its BatchNorm's
    rank check becomes a ``raise`` the loader cannot infer), so predictions pad their last batch."""
    import mindspore as ms

    description = {
        "task": IMAGE_CLASSIFICATION,
        "batch_size": batch_size,
        "image_size": image_size,
        "eval_resize_ratio": eval_resize_ratio,
        "classes": class_names(class_index, num_classes),
        "network": network,
        "training": training,
    }
    import numpy as np

    images = ms.Tensor(shape=[batch_size, 3, image_size, image_size], dtype=ms.float32)
    probe = [np.random.default_rng(0).standard_normal((batch_size, 3, image_size, image_size)).astype(np.float32)]
    return export_network(net, [images], probe, description=description, example=example_image)


def export_fill_mask(
    net, *, tokenizer: str, max_seq_length: int, max_predictions: int, network: str, training: str, example_text: str
) -> ExportedModel:
    """BERT with its pre-training heads (``models.bert.BertPreTraining``) taking any batch of token ids, input
    masks and segment ids of ``max_seq_length`` and ``max_predictions`` masked positions; ``tokenizer`` its JSON."""
    import mindspore as ms

    description = {
        "task": FILL_MASK,
        "tokenizer": tokenizer,
        "max_seq_length": max_seq_length,
        "max_predictions": max_predictions,
        "network": network,
        "training": training,
    }
    import numpy as np

    sequences = [ms.Tensor(shape=[None, max_seq_length], dtype=ms.int32) for _ in range(3)]
    positions = ms.Tensor(shape=[None, max_predictions], dtype=ms.int32)
    ids = np.full((2, max_seq_length), 5, np.int32)  # a batch of 2 of the first ordinary token
    probe = [ids, np.ones_like(ids), np.zeros_like(ids), np.zeros((2, max_predictions), np.int32)]
    example = example_text.encode()
    return export_network(net, [*sequences, positions], probe, description=description, example=example)


def save_model(model: ExportedModel, folder: str | Path) -> None:
    """Write ``model`` into ``folder`` so that readers see the old folder or the whole new one: the files go to a
    sibling folder first, which then takes the old one's place."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # as a folder made by mkdir: mkdtemp's is its owner's only
    try:
        (staging / MINDIR_FILE).write_bytes(model.mindir)
        (staging / DESCRIPTION_FILE).write_text(json.dumps(model.description, indent=2))
        (staging / EXAMPLE_FILE).write_bytes(model.example)
        if folder.exists():
            retired = folder.with_name(f".{folder.name}.retired")
            shutil.rmtree(retired, ignore_errors=True)
            folder.rename(retired)
            staging.rename(folder)
            shutil.rmtree(retired)
        else:
            staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_model(folder: str | Path) -> ExportedModel:
    """The model saved in ``folder``; a missing folder or file raises ``ModelFolderError`` naming it."""
    folder = Path(folder)
    missing = [name for name in (MINDIR_FILE, DESCRIPTION_FILE, EXAMPLE_FILE) if not (folder / name).is_file()]
    if missing:
        raise ModelFolderError(
            f"{folder} is not a model folder: {', '.join(missing)} missing (a training pipeline writes one: "
            "docs/use-a-model.md)"
        )
    return ExportedModel(
        (folder / MINDIR_FILE).read_bytes(),
        json.loads((folder / DESCRIPTION_FILE).read_text()),
        (folder / EXAMPLE_FILE).read_bytes(),
    )
