"""ResNet / ImageNet training recipes of MindSpore as Kedro pipelines, tracked in MLflow."""

from pipelines.engine.runtime import apply_cpu_defaults

apply_cpu_defaults()

__version__ = "0.1.0"
