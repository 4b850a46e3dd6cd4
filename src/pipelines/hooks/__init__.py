"""The project's Kedro hooks, one class per job (``settings.HOOKS`` lists them):

- ``ConfigurationHooks`` (``configuration``): before anything starts, the environment exists, a
  ``runtime.fast_dev_run`` rehearsal gets its substitutions, every parameter is valid (each problem named with
  its key and file), the device exists; its ``RunConfiguration`` is what the run's MLflow hooks read;
- ``RunNameHooks`` (``mlflow_run``): the run's name given to kedro-mlflow before it starts the run, so that its
  start line names the run as it is named;
- ``MlflowRunHooks`` (``mlflow_run``): the MLflow run's name and tags, the nodes' parameters as the
  configuration's values, orphaned runs ended KILLED, the hand-off to msrun's rank 0, failure tags, the
  closing links;
- ``OutageHooks`` (``outages``): the tuning storage opened before the MLflow run starts (one line for a wrong
  password or an unreachable database); a run stopped by the tracking server's outage records it without waiting
  again;
- ``CredentialHooks`` (``credentials``): ``study.tuning.credentials`` from conf/local/credentials.yml into the
  environment, each value masked wherever the run records text;
- ``SignalHooks`` (``signals``): SIGINT and SIGTERM stop the run in order (``trainlib.signals``);
- ``CheckpointHooks`` (``checkpoints``): a training's periodic checkpoints go once its final one is stored;
- ``ArtifactHooks`` (``artifacts``): catalog datasets marked ``mlflow_artifact`` go into the MLflow run;
- ``ModelHooks`` (``models``): model folders marked ``mlflow_model`` become the run's MLflow model (registered
  with ``model.register``);
- ``NodeErrorHooks`` (``errors``): a failing node's name goes with its error, for the command's ``Error:`` block;
- ``TrainingRunHooks`` (``training_runs``): the nodes of one of a pipeline's several trainings run in its MLflow
  child run;
- ``NodeParamsMlflowHook`` (``node_params``): kedro-mlflow's own hook, in its place, sending each node's
  parameters in one batch instead of one request per parameter; its base ``ExperimentMlflowHook``
  (``experiment``): a run whose MLflow experiment another machine created at the same moment sets up again and
  joins it.

The helpers ``config_files`` (the configuration as Kedro's loader reads it), ``rehearsal`` (fast_dev_run applied to
a run) and ``command_line`` (what the command line asked for) serve them. Every MLflow call goes through
``pipelines.tracking``.
"""

from pipelines.hooks.artifacts import ArtifactHooks
from pipelines.hooks.checkpoints import CheckpointHooks
from pipelines.hooks.configuration import ConfigurationHooks, RunConfiguration
from pipelines.hooks.credentials import CredentialHooks
from pipelines.hooks.errors import NodeErrorHooks
from pipelines.hooks.experiment import ExperimentMlflowHook
from pipelines.hooks.mlflow_run import MlflowRunHooks, RunNameHooks
from pipelines.hooks.models import ModelHooks
from pipelines.hooks.node_params import NodeParamsMlflowHook
from pipelines.hooks.outages import OutageHooks
from pipelines.hooks.signals import SignalHooks
from pipelines.hooks.training_runs import TrainingRunHooks

__all__ = [
    "ArtifactHooks",
    "CheckpointHooks",
    "ConfigurationHooks",
    "CredentialHooks",
    "ExperimentMlflowHook",
    "MlflowRunHooks",
    "ModelHooks",
    "NodeErrorHooks",
    "NodeParamsMlflowHook",
    "RunNameHooks",
    "OutageHooks",
    "RunConfiguration",
    "SignalHooks",
    "TrainingRunHooks",
]
