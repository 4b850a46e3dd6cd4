"""The fit loop: a training's epochs, from the one it starts at to ``TrainingSpec.epochs``, each run by the epoch loop.

``FitLoop.run`` seeds each epoch's data order (``data_seed + epoch``, so a resumed run sees the data an uninterrupted
one would) and hands its batches to ``epochs.EpochLoop``; the callbacks hear ``on_train_begin`` first and
``on_train_end`` once at the end, also when training raised. ``model_bridge.ModelFitLoop`` runs the epochs through
``Model.train`` instead, with the same epoch loop, callbacks and ending.
"""

from __future__ import annotations

from trainlib.data.folder import checked_batches
from trainlib.engine.epochs import EpochLoop


class FitLoop:
    """The epochs ``start_epoch`` (0-based: the epochs done) to ``epoch_loop.spec.epochs`` of one training."""

    def __init__(self, epoch_loop: EpochLoop, start_epoch: int):
        self.epoch_loop = epoch_loop
        self.spec = epoch_loop.spec
        self.callbacks = epoch_loop.callbacks
        self.start_epoch = start_epoch
        self.ended = False

    def run(self, dataset) -> None:
        """Train on ``dataset`` (batched), one call of the step per batch."""
        import mindspore.dataset as ds

        data_seed = self.spec.data_seed
        self.begin()
        try:
            for epoch in range(self.start_epoch, self.spec.epochs):
                if data_seed is not None:
                    ds.config.set_seed(data_seed + epoch)  # read when the iterator starts its pipeline
                iterator = dataset.create_tuple_iterator(num_epochs=1)
                self.epoch_loop.run(epoch, checked_batches(iterator))  # a bad image: one line naming it
        finally:
            self.end()

    def begin(self) -> None:
        self.callbacks.on_train_begin(self.spec.epochs, self.epoch_loop.steps_per_epoch, self.start_epoch)

    def end(self) -> None:
        """End the callbacks once, also when training raised."""
        if not self.ended:
            self.ended = True
            self.callbacks.on_train_end()
