"""``mindspore.Model.train`` driven by the engine: the same rows, callbacks and checkpoints as ``loop.train``.

MindSpore's own optimizers that need its ``Model`` (``nn.thor`` through ``ModelThor``, boost's Adasum)
train through ``Model.train``. A recipe returns a ``ModelTrainStep`` from its ``make_step``; ``loop.train``
then runs the epochs here, where ``EpochCallbacks`` (a MindSpore callback) feeds each step's loss and each
epoch's end to the engine's ``EpochRunner``.
"""

from __future__ import annotations

from collections.abc import Callable

from mindspore.train import Callback as MindsporeCallback

from trainlib.engine.epochs import EpochRunner
from trainlib.engine.progress import announce_compile
from trainlib.engine.step import TrainStep


class ModelTrainStep(TrainStep):
    """A training step run by ``Model.train``: ``build_model()`` returns the ``mindspore.train.Model`` (or
    ``ModelThor``) over ``network`` and ``optimizer``; it is called in ``prepare``, after the optimizer
    state is restored.

    ``sink_mode``: MindSpore's dataset sink mode (``sink_size`` one epoch). The engine does not call the
    step per batch; ``capture``/``restore`` and ``lr`` work as for any step.
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

    def train_epochs(self, dataset, runner: EpochRunner, start_epoch: int) -> None:
        """Run ``self.model.train`` from ``start_epoch`` to the runner's last epoch, one sink per epoch."""
        import mindspore.dataset as ds

        if runner.spec.data_seed is not None:
            ds.config.set_seed(runner.spec.data_seed + start_epoch)  # one shuffle stream for all epochs of model.train
        bridge = EpochCallbacks(runner, start_epoch)
        if start_epoch < runner.spec.epochs:
            announce_compile(self.model)  # Model.train compiles its graphs when it starts
        try:
            self.model.train(
                runner.spec.epochs,
                dataset,
                callbacks=[bridge],
                sink_size=runner.steps_per_epoch,
                dataset_sink_mode=self.sink_mode,
                initial_epoch=start_epoch,
            )
        finally:
            runner.train_end()  # Model.train skips its train end when it raised


class EpochCallbacks(MindsporeCallback):
    """Passes ``Model.train``'s step and epoch events to an ``EpochRunner``.

    The loss of an epoch is the mean of the losses MindSpore reported to callbacks that epoch (``ModelThor``
    reports its second-order steps and the last of each run of reuse steps; in sink mode one per epoch).
    """

    def __init__(self, runner: EpochRunner, start_epoch: int):
        super().__init__()
        self.runner = runner
        self.start_epoch = start_epoch

    def on_train_begin(self, run_context) -> None:
        self.runner.train_begin(self.start_epoch)

    def on_train_epoch_begin(self, run_context) -> None:
        params = run_context.original_args()
        self.epoch = params.cur_epoch_num - 1
        self.first_step = params.cur_step_num
        self.runner.epoch_begin(self.epoch)

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        outputs = params.net_outputs
        # the loss only: with drop_overflow_update=False an overflow shows as a non-finite loss next
        loss = outputs[0] if isinstance(outputs, tuple | list) else outputs
        self.runner.step_end(self.epoch, params.cur_step_num - self.first_step - 1, loss)

    def on_train_epoch_end(self, run_context) -> None:
        self.runner.epoch_end(self.epoch)

    def on_train_end(self, run_context) -> None:
        self.runner.train_end()
