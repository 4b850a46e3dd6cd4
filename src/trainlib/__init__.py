"""The training library: MindSpore networks, optimizers (THOR, P-BFGS, Adasum), one training engine, image and
text data, PCA, distributed launch and study statistics. It imports neither Kedro nor MLflow: the Kedro project
(``pipelines``) wires it into pipelines and tracks it in MLflow."""

from trainlib.engine.runtime import apply_cpu_defaults
from trainlib.redaction import redact_log_records

apply_cpu_defaults()
redact_log_records()  # a password or token never reaches a log line, whoever logs it
