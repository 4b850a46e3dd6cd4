"""``thor`` pipeline: THOR second-order training (this project's preconditioner + Momentum, or MindSpore's
``nn.thor`` on Ascend/GPU), as the image training template under the namespace ``thor``: ``thor.build_network``
(each block's last BatchNorm gamma at 0, ``thor.zero_init_last_bn_gamma``) -> ``thor.train`` -> ``thor.evaluate``.
The final checkpoint holds the weights and, under ``optimizer.``, the momenta, A/G statistics, inverses and counters."""

from kedro.pipeline import Pipeline

from pipelines.training.pipeline import training_pipeline


def create_pipeline(**kwargs) -> Pipeline:
    return training_pipeline("thor")
