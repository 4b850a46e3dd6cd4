"""The project's configuration as every test reads it: ``load_config``, Kedro's own loader built as a ``kedro run``
builds it (the project's ``settings.CONFIG_LOADER_CLASS`` and ``CONFIG_LOADER_ARGS``), so environments and
``--params`` merge exactly as in a run. ``changed`` then edits one dotted key."""

from __future__ import annotations

import copy
from pathlib import Path

from kedro.framework.project import configure_project

from pipelines.hooks.config_files import project_config_loader
from trainlib.params import DistributedParams

PROJECT = Path(__file__).resolve().parents[2]
CONF = PROJECT / "conf"
MLFLOW_PATTERNS = ["mlflow*", "mlflow*/**", "**/mlflow*"]  # what kedro-mlflow adds to the loader's patterns

# Kedro's settings are the project's (its loader class and arguments, its hooks), as `kedro` configures them
configure_project("pipelines")


def load_config(
    env: str = "base", key: str = "parameters", runtime_params: dict | None = None, conf_source: Path = CONF
) -> dict:
    """The ``key`` configuration (``parameters``, ``catalog``, ``mlflow``) of environment ``env`` over base, with
    ``runtime_params`` merged as ``kedro run --params`` merges them."""
    loader = project_config_loader(conf_source, env, runtime_params)
    loader.config_patterns.setdefault("mlflow", MLFLOW_PATTERNS)
    return loader[key]


def changed(params: dict, dotted: str, value) -> dict:
    """A copy of ``params`` with the dotted key ``dotted`` set to ``value``."""
    params = copy.deepcopy(params)
    *parents, leaf = dotted.split(".")
    node = params
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return params


def distributed_params(**changes) -> DistributedParams:
    """The ``distributed`` section of conf/base with ``changes``, as the nodes receive it."""
    return DistributedParams(**load_config(runtime_params={"distributed": changes})["distributed"])
