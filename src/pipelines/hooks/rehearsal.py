"""``runtime.fast_dev_run`` applied to a run: ``trainlib.fast_dev_run``'s substitutions for this machine, given to
Kedro's configuration loader as runtime parameters, and the catalog's files moved under
``data/fast_dev_run/<env>/``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kedro.config import AbstractConfigLoader
from omegaconf import OmegaConf

from pipelines.hooks.command_line import requested_pipelines
from pipelines.hooks.config_files import leaf_items
from trainlib import fast_dev_run
from trainlib.data.fashion_mnist import CLASS_NAMES
from trainlib.params.recipe_spec import rehearsals

logger = logging.getLogger(__name__)

# The image tree a rehearsal reads: fast_dev_run replaces a root that is not there by the CPU default tree, also one
# that --params gave
TREE_KEYS = ("data.root", "data.source")


def rehearsal_substitutions(
    raw_params: dict, *, env: str, project: Path, base_params: dict, pipelines: list[str] | None
) -> fast_dev_run.Substitutions:
    """``trainlib.fast_dev_run``'s substitutions of ``raw_params`` (``env``'s merged parameters) for this machine's
    cores and memory, image trees found relative to ``project``, the CPU default tree as ``base_params`` (the base
    environment's parameters) configures it."""

    def classes_in(root: str, train_dir: str) -> int | None:
        path = Path(root) if Path(root).is_absolute() else project / root
        if not path.is_dir():
            return None
        train = path / train_dir
        return sum(p.is_dir() and not p.name.startswith(".") for p in train.iterdir()) if train.is_dir() else 0

    data = base_params["data"]
    default_data = {
        "source": data["source"],
        "root": data["root"],
        "split_dirs": {"train": data["split_dirs"]["train"], "val": data["split_dirs"]["val"]},
    }
    return fast_dev_run.fast_dev_run_overrides(
        raw_params,
        env=env,
        cpu_workers=len(os.sched_getaffinity(0)),
        memory_gb=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9,
        pipelines=pipelines,
        default_data=default_data,
        classes_in=classes_in,
        default_classes=len(CLASS_NAMES),
        recipes=rehearsals(),
    )


def rehearse_on_cpu(
    loader: AbstractConfigLoader, env: str, raw_params: dict, base_params: dict, project: Path
) -> fast_dev_run.Substitutions:
    """The substitutions of ``trainlib.fast_dev_run`` for this machine, applied as runtime parameters of
    ``loader`` (the user's ``--params`` win) and logged in one line.

    Applied through ``loader.runtime_params``, the public attribute of Kedro's config loader that holds
    ``--params``: OmegaConfigLoader merges it into the parameters on every ``loader["parameters"]``, and
    ``KedroContext.params`` (which builds the catalog's ``params:`` datasets the nodes read) reads them from
    there, so validation, MLflow's params and every node see the substituted values.
    """
    given = dict(leaf_items(loader.runtime_params or {}))
    substitutions = rehearsal_substitutions(
        raw_params, env=env, project=project, base_params=base_params, pipelines=requested_pipelines()
    )
    for key in [k for k in substitutions.values if k in given and k not in TREE_KEYS]:
        del substitutions.values[key]  # set by --params: the user's value stands
    loader.runtime_params = OmegaConf.to_container(OmegaConf.merge(loader.runtime_params or {}, substitutions.nested()))
    # The catalog's files (final checkpoints, histories, reports, the manifest) move under data/fast_dev_run/<env>/
    # too. A key set on the loader is returned as it is (OmegaConfigLoader.__getitem__), and KedroContext builds
    # the catalog from loader["catalog"].
    loader["catalog"] = {
        name: {**entry, "filepath": fast_dev_run.relocated(entry["filepath"], env)}
        if isinstance(entry, dict) and str(entry.get("filepath", "")).startswith("data/")
        else entry
        for name, entry in loader["catalog"].items()
    }
    logger.info("fast_dev_run: %s", substitutions.summary())
    return substitutions
