"""ResNet / ImageNet training recipes of MindSpore as Kedro pipelines, tracked in MLflow: settings, hooks, the
pipeline registry, the command line and one folder per registered pipeline. The training itself is ``trainlib``."""

import trainlib  # noqa: F401  (sets MindSpore's CPU environment before anything loads MindSpore)

__version__ = "0.1.0"
