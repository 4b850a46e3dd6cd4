"""The recipe's training: the project's Momentum steps and loop with MindSpore's Momentum in its Nesterov form."""

from __future__ import annotations

from collections.abc import Sequence

from mindspore import nn

from nesterov_recipe.spec import NesterovParams
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.optim.momentum import decay_groups
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.momentum import MomentumStepFactory, train_momentum


class NesterovStepFactory(MomentumStepFactory):
    """The Momentum recipe's steps with the Nesterov form of MindSpore's Momentum as the optimizer."""

    training: NesterovParams

    def create_optimizer(self, net, lr_per_step):
        section = self.training
        return nn.Momentum(
            decay_groups(net, section.weight_decay),
            learning_rate=lr_per_step,
            momentum=section.momentum,
            loss_scale=section.loss_scale,
            use_nesterov=True,
        )


def train_nesterov(
    context: TrainingContext, start: Checkpoint, section: NesterovParams, *, callbacks: Sequence[Callback] = ()
) -> TrainingResult:
    """``section.epochs`` epochs of its whole schedule from ``start``'s weights."""
    return train_momentum(context, start, section, name="nesterov", callbacks=callbacks, factory=NesterovStepFactory)
