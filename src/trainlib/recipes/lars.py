"""The LARS recipe on the engine: the Momentum recipe's step and loop with ``optim.lars.LARS`` in place of
Momentum (MLPerf's ResNet-50 optimizer; ``params.lars``)."""

from __future__ import annotations

from collections.abc import Sequence

from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.optim.lars import create_lars
from trainlib.params.lars import LarsParams
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.momentum import MomentumStepFactory, train_momentum


class LarsStepFactory(MomentumStepFactory):
    """The Momentum recipe's steps with LARS as the optimizer (the same state: ``moments``, ``global_step``)."""

    training: LarsParams

    def create_optimizer(self, net, lr_per_step):
        return create_lars(net, lr_per_step, self.training)  # the section is LARS's settings


def train_lars(
    context: TrainingContext, start: Checkpoint, lars: LarsParams, *, callbacks: Sequence[Callback] = ()
) -> TrainingResult:
    """``lars.epochs`` epochs of its whole schedule from ``start``'s weights, each weight's step scaled by its
    layer's trust ratio; BatchNorm parameters and biases as plain Momentum."""
    return train_momentum(context, start, lars, name="lars", callbacks=callbacks, factory=LarsStepFactory)
