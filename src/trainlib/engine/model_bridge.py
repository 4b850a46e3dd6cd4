"""``mindspore.Model.train`` driven by the engine: the same rows, callbacks and checkpoints as ``loop.train``.

MindSpore's own optimizers that need its ``Model`` (``nn.thor`` through ``ModelThor``, boost's Adasum)
train through ``Model.train``. A recipe returns a ``ModelTrainStep`` from its ``make_step``; ``loop.train``
then runs the epochs with ``ModelFitLoop``, where ``EpochCallbacks`` (a MindSpore callback) feeds the start and end
of the training and of each epoch, and each step's loss, to the engine's fit and epoch loops.
"""

from __future__ import annotations

from collections.abc import Callable

from mindspore.train import Callback as MindsporeCallback

from trainlib.engine.epochs import EpochLoop
from trainlib.engine.fit import FitLoop
from trainlib.engine.progress import announce_compile
from trainlib.engine.step import TrainStep


class ModelTrainStep(TrainStep):
    """A training step run by ``Model.train``: ``build_model()`` returns the ``mindspore.train.Model`` (or
    ``ModelThor``) over ``network`` and ``optimizer``; it is called in ``prepare``, after the optimizer
    state is restored.

    ``sink_mode``: MindSpore's dataset sink mode (``sink_size`` one epoch). The engine does not call the
    step per batch (``ModelFitLoop`` runs ``model.train``); ``capture``/``restore`` and ``lr`` work as for any step.
    """

    def __init__(
        self,
        build_model: Callable[[], object],
        network,
        optimizer,
        lr_per_step=None,
        loss_scale: float = 1.0,
        sink_mode: bool = True,
    ):
        super().__init__(self._not_per_batch, network, optimizer, lr_per_step, loss_scale)
        self.build_model = build_model
        self.model = None
        self.sink_mode = sink_mode

    def prepare(self) -> None:
        self.model = self.build_model()

    @staticmethod
    def _not_per_batch(images, labels):
        raise TypeError("a ModelTrainStep is run by Model.train through engine.loop.train, not per batch")


class ModelFitLoop(FitLoop):
    """The fit loop of a ``ModelTrainStep``: its ``model.train`` runs the epochs, one sink per epoch."""

    def run(self, dataset) -> None:
        """Run ``model.train`` on ``dataset`` from ``start_epoch`` to the last epoch."""
        import mindspore.dataset as ds

        step: ModelTrainStep = self.epoch_loop.step
        if self.spec.data_seed is not None:
            ds.config.set_seed(self.spec.data_seed + self.start_epoch)  # one shuffle stream for all of model.train
        bridge = EpochCallbacks(self)
        if self.start_epoch < self.spec.epochs:
            announce_compile(step.model)  # Model.train compiles its graphs when it starts
        try:
            step.model.train(
                self.spec.epochs,
                dataset,
                callbacks=[bridge],
                sink_size=self.epoch_loop.steps_per_epoch,
                dataset_sink_mode=step.sink_mode,
                initial_epoch=self.start_epoch,
            )
        finally:
            self.end()  # Model.train skips its train end when it raised


class EpochCallbacks(MindsporeCallback):
    """Passes ``Model.train``'s training, epoch and step events to a ``ModelFitLoop`` and its ``EpochLoop``.

    The loss of an epoch is the mean of the losses MindSpore reported to callbacks that epoch (``ModelThor``
    reports its second-order steps and the last of each run of reuse steps; in sink mode one per epoch).
    """

    def __init__(self, fit_loop: ModelFitLoop):
        super().__init__()
        self.fit_loop = fit_loop
        self.epoch_loop: EpochLoop = fit_loop.epoch_loop

    def on_train_begin(self, run_context) -> None:
        self.fit_loop.begin()

    def on_train_epoch_begin(self, run_context) -> None:
        params = run_context.original_args()
        self.epoch = params.cur_epoch_num - 1
        self.first_step = params.cur_step_num
        self.epoch_loop.begin(self.epoch)

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        outputs = params.net_outputs
        # the loss only: with drop_overflow_update=False an overflow shows as a non-finite loss next
        loss = outputs[0] if isinstance(outputs, tuple | list) else outputs
        self.epoch_loop.step_done(self.epoch, params.cur_step_num - self.first_step - 1, loss)

    def on_train_epoch_end(self, run_context) -> None:
        self.epoch_loop.end(self.epoch)

    def on_train_end(self, run_context) -> None:
        self.fit_loop.end()
