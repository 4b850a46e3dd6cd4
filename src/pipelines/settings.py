"""Kedro project settings."""

from kedro.config import OmegaConfigLoader
from omegaconf.resolvers import oc

from .cli import quiet_start
from .hooks import (
    ArtifactHooks,
    CheckpointHooks,
    ConfigurationHooks,
    CredentialHooks,
    MlflowRunHooks,
    ModelHooks,
    NodeErrorHooks,
    NodeParamsMlflowHook,
    OutageHooks,
    RunNameHooks,
    SignalHooks,
    TrainingRunHooks,
)

# `kedro` calls it first (pyproject's kedro.init entry point); here for sessions started from Python
quiet_start()

# One hook per job (pipelines.hooks). The MLflow run's hooks read the configuration the first one validated, so
# they are given it. Where the order matters it is set by tryfirst/trylast against kedro-mlflow's hooks, not by
# this tuple: the configuration is checked first, the run named before kedro-mlflow starts it and tagged after.
configuration = ConfigurationHooks()
HOOKS = (
    configuration,
    # registered before CredentialHooks so that, both tryfirst, it opens the storage after CredentialHooks has warned
    # of a password in --params and masked the run's parameters (pluggy calls the later registered first)
    OutageHooks(configuration),
    CredentialHooks(),
    RunNameHooks(configuration),
    MlflowRunHooks(configuration),
    SignalHooks(),
    CheckpointHooks(),
    ArtifactHooks(),
    ModelHooks(),
    NodeErrorHooks(),
    TrainingRunHooks(),
    # kedro-mlflow's hook, logging a node's parameters in one batch: in place of the one its plugin registers
    # (disabled below). Last here, it is still called before the hooks above that set no tryfirst/trylast, as the
    # plugin's was (pluggy calls the hooks registered last first; Kedro registers these before the plugins').
    NodeParamsMlflowHook(),
)
DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow",)  # the name in its installed metadata, which Kedro matches

CONFIG_LOADER_CLASS = OmegaConfigLoader
# Environments override base key by key: conf/ascend/parameters.yml may set only
# runtime.device_target and keep every other runtime key from conf/base/.
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    "merge_strategy": {"parameters": "soft", "catalog": "soft", "mlflow": "soft"},
    # Kedro reads environment variables in credentials only; mlflow.yml's tracking URI honours MLFLOW_TRACKING_URI
    "custom_resolvers": {"oc.env": oc.env},
}
