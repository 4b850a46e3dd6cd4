"""The dim_reduce recipe on the engine: stage 1, the trajectory's PCA, stage 2 in that subspace, a control.

Recipe (MindSpore's dimension-reduce training tutorial, after the DLDR paper): Momentum for ``stage1.epochs`` of
a ``stage1.schedule_epochs``-epoch lr schedule, keeping the trainable weights every K steps or epochs from
``trajectory.start_epoch``; the top-k principal directions of the last N kept weights (``optim.dim_reduce.pca``);
then ``stage2.epochs`` of P-BFGS in that subspace (``optim.dim_reduce.pbfgs``), and, for comparison, the same
number of Momentum epochs continued from stage 1 (the control).

One module per training, each through ``engine.loop.train``: ``stage1`` (stage 1 and the control with
``recipes.momentum``, the trajectory's selection and PCA), ``stage2`` (P-BFGS), ``mindspore_stage2``
(``implementation: mindspore_builtin``: ``mindspore.boost``'s own DimReduce through ``engine.model_bridge``, in a
process of its own, as boost's configuration is a process-wide singleton). Epochs count from the start of
stage 1: stage 2 and the control continue at ``stage1.epochs + 1``. ``comparison``: the three evaluations side by side.
"""

from trainlib.recipes.dim_reduce.comparison import compare_runs
from trainlib.recipes.dim_reduce.mindspore_stage2 import train_stage2_builtin
from trainlib.recipes.dim_reduce.stage1 import collect_trajectory, train_control, train_stage1, trajectory_pca
from trainlib.recipes.dim_reduce.stage2 import STEP_TIMESTAMP, step_metrics, train_stage2

__all__ = [
    "STEP_TIMESTAMP",
    "compare_runs",
    "collect_trajectory",
    "train_control",
    "train_stage1",
    "step_metrics",
    "train_stage2",
    "train_stage2_builtin",
    "trajectory_pca",
]
