"""What every training reads besides its own section: built once where the inputs arrive (a node, the study) and
passed down, instead of six arguments on every recipe function. ``TrainingContext`` for the image recipes,
``LanguageModelContext`` for BERT's."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from trainlib.params import BertNetworkParams, DataParams, DistributedParams, NetworkParams, RuntimeParams


@dataclass(frozen=True)
class TrainingContext:
    """The data (the manifest and its class index) and the shared sections of a training. Frozen: a training that
    needs another seed or another rank layout makes its own copy (``with_seed``, ``with_workers``)."""

    manifest: pd.DataFrame
    class_index: dict[str, int]
    network: NetworkParams
    data: DataParams
    runtime: RuntimeParams
    distributed: DistributedParams | None  # None: this process alone (an evaluation)

    def with_seed(self, seed: int) -> TrainingContext:
        """The same training with ``runtime.seed`` ``seed`` (initial weights, data order, augmentation)."""
        return replace(self, runtime=self.runtime.model_copy(update={"seed": seed}))

    def with_workers(self, workers: int) -> TrainingContext:
        """The same training on ``workers`` msrun workers of this one node."""
        return replace(
            self, distributed=self.distributed.model_copy(update={"worker_num": workers, "local_worker_num": workers})
        )


@dataclass(frozen=True)
class LanguageModelContext:
    """What every BERT training reads besides its own section: the train and held-out examples (column name ->
    array, ``text.examples.COLUMNS``), the tokenizer's pieces (each at its id: the size of the network's vocabulary,
    and the text a log names a token by), the network section, runtime and distributed. Frozen; a training on
    another seed makes its own copy (``with_seed``)."""

    train_examples: dict[str, np.ndarray]
    held_out_examples: dict[str, np.ndarray]
    vocabulary: tuple[str, ...]
    network: BertNetworkParams
    eval_batch_size: int
    step_eval_examples: int | None
    runtime: RuntimeParams
    distributed: DistributedParams

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def with_seed(self, seed: int) -> LanguageModelContext:
        """The same training with ``runtime.seed`` ``seed`` (initial weights, data order)."""
        return replace(self, runtime=self.runtime.model_copy(update={"seed": seed}))
