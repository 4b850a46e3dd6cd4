"""The project's configuration as the tests read it: the merged parameter files of an environment, changed one
dotted key at a time."""

from __future__ import annotations

import copy
from pathlib import Path

from kedro.config import OmegaConfigLoader

from pipelines import settings
from pipelines.params import DistributedParams

CONF = Path(__file__).resolve().parents[2] / "conf"


def load_config(env: str, key: str) -> dict:
    loader = OmegaConfigLoader(
        conf_source=str(CONF),
        env=env,
        config_patterns={"mlflow": ["mlflow*", "mlflow*/**"]},  # as kedro-mlflow registers it
        **{k: v for k, v in settings.CONFIG_LOADER_ARGS.items() if k != "default_run_env"},
    )
    return loader[key]


def load_params(env: str) -> dict:
    return load_config(env, "parameters")


def changed(params: dict, dotted: str, value) -> dict:
    params = copy.deepcopy(params)
    *parents, leaf = dotted.split(".")
    node = params
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return params


def distributed_params(**changes) -> DistributedParams:
    """The ``distributed`` section of conf/base with ``changes``, as the nodes receive it."""
    return DistributedParams(**{**load_params("base")["distributed"], **changes})
