"""``runtime.fast_dev_run``: rehearse an environment's recipe on this CPU machine (Lightning's name for it).

``fast_dev_run_overrides`` turns the merged configuration of an environment (base, ascend, gpu) into the few
substitutions that make every node of every training pipeline run in minutes on CPU, keeping the recipe itself:
network, image size, optimizer and its settings, schedule shape, boost options, loss scale, mixed precision,
evaluation and checkpointing. What it changes is the budget and the place: device target CPU, as many msrun
workers as the machine takes (at least 2 where the environment has several, a power of two for Adasum) on one
node, a local image tree, a few images per class, 2 images per worker and step, one epoch, 4 images an evaluation
and an exported model's batch, the cross-key rules satisfied (dim_reduce's trajectory, PCA components and epochs),
and every file it writes under
``data/fast_dev_run/<env>/`` (``relocated``: checkpoint folders here, the catalog's files in ``pipelines.hooks``),
so that a real run's checkpoints and results are never touched or resumed.

The rules are functions of a section's mapping and the ``Plan`` (workers, batch, steps, env) returning its
substitutions by key within the section: ``SECTION_RULES`` for the shared sections; a recipe's section takes the
rule its specification declares (``RecipeSpec.rehearsal``, given here as ``Rehearsals``), and a section of one
training without one (a batch size and a checkpoint folder: baseline, lars, a recipe of another package)
``training_budget``. Only values that differ from the configuration are returned.

Pure: standard library only (no Kedro, MindSpore or MLflow; the specifications are given, not imported);
``pipelines.hooks`` applies the result as runtime parameters before validation, so the nodes see the substituted
values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

# The MLflow tag listing the substitutions; the report pipeline skips runs carrying it (not a real result).
TAG = "fast_dev_run"
BATCH_PER_WORKER = 2  # images per worker and step in every training
STEPS_PER_EPOCH = 3  # at least: THOR's second-order and reuse steps both run, dim_reduce keeps enough weights
# One second-order step an epoch, the others reusing its inverses: both of THOR's graphs compile and run, and the
# second-order step, 44 s of gpu's ResNet-50 on 2 CPU cores, runs once
THOR_FREQUENCY = STEPS_PER_EPOCH
EVAL_IMAGES = 4  # data.step_eval_images, the evaluation batch and the exported model's fixed batch
# Memory one msrun worker of a training takes at its peak (GB): THOR's of ResNet-50 measured at 12.8 GB on CPU (about
# the same at 112 px: its graphs, not the images), the first-order trainings' well below; THOR_MEMORY_GB bounds the
# workers of a run that may train THOR, so two THOR workers are not started on a machine with less than 26 GB.
THOR_MEMORY_GB = 13
WORKER_MEMORY_GB = 6
ROOT = "data/fast_dev_run"  # everything a rehearsal writes: data/fast_dev_run/<env>/06_models/…


def relocated(path: str, env: str) -> str:
    """Where a rehearsal in ``env`` writes what a real run writes to ``path`` (a project-relative ``data/…``)."""
    parts = PurePosixPath(path).parts
    return str(PurePosixPath(ROOT, env, *(parts[1:] if parts[:1] == ("data",) else parts)))


@dataclass(frozen=True)
class Plan:
    """What every section's rule needs: the environment, the workers and the images per class."""

    env: str
    workers: int  # msrun workers of the trainings (1: no msrun)
    adasum_workers: int  # the study's adasum ranks
    cpu_workers: int  # the machine's cores

    def relocated(self, path: str) -> str:
        return relocated(path, self.env)


Rule = Callable[[Mapping[str, Any], Plan], dict[str, Any]]


def _power_of_two_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _runtime(section: Mapping, plan: Plan) -> dict:
    return {"device_target": "CPU"}  # mode kept (graph or pynative as the environment says)


def _distributed(section: Mapping, plan: Plan) -> dict:
    if plan.workers == 1 and section["worker_num"] == 1:
        return {}
    return {
        "worker_num": plan.workers,
        "local_worker_num": plan.workers,
        "node_rank": 0,
        "master_addr": "127.0.0.1",
    }


def _data(section: Mapping, plan: Plan) -> dict:
    # root, source and split_dirs are decided in fast_dev_run_overrides (they need the file system)
    return {
        "num_workers": max(1, min(section["num_workers"], plan.cpu_workers // plan.workers)),
        "eval_batch_size": min(section["eval_batch_size"], EVAL_IMAGES),
        "step_eval_images": EVAL_IMAGES,
    }


def training_budget(section: Mapping, plan: Plan) -> dict:
    """A training's budget: 1 epoch, 2 images per worker, evaluated and checkpointed each epoch in a folder of its
    own."""
    values = {
        "batch_size": BATCH_PER_WORKER,
        "checkpoint.dir": plan.relocated(section["checkpoint"]["dir"]),
        "checkpoint.every_epochs": 1,
        "epochs": 1,
    }
    if "eval_interval" in section:
        values["eval_interval"] = 1
    if section.get("eval_every_steps"):
        values["eval_every_steps"] = 2
    return values


def _trains(section) -> bool:
    """A section of one training: what ``training_budget`` rehearses."""
    return isinstance(section, Mapping) and "batch_size" in section and "checkpoint" in section


def nested_training_budgets(section: Mapping, plan: Plan) -> dict:
    """``training_budget`` of every training a section holds (``thor_bert.thor``, ``thor_bert.control``), by key."""
    return {
        f"{name}.{key}": value
        for name, training in section.items()
        if _trains(training)
        for key, value in training_budget(training, plan).items()
    }


def _study(section: Mapping, plan: Plan) -> dict:
    return {
        "seeds": [0],
        "epochs": 1,
        "eval_every_steps": 2,
        "adasum_workers": plan.adasum_workers,
        "dir": plan.relocated(section["dir"]),
    }


def _model(section: Mapping, plan: Plan) -> dict:
    # each export runs its MindIR at this batch twice (the load-back probe, MLflow's check of the input example, padded
    # to it): 16 ResNet-50 images at 224 px each time on CPU; the network and image size stay the environment's
    return {"export_batch_size": min(section["export_batch_size"], EVAL_IMAGES)}


def _tracking(section: Mapping, plan: Plan) -> dict:
    return {"artifact_max_mb": 0}  # checkpoints and reports stay on disk: nothing is stored as a result


# the shared sections' rules; a recipe's section takes its specification's (``Rehearsals.rules``)
SECTION_RULES: dict[str, Rule] = {
    "runtime": _runtime,
    "distributed": _distributed,
    "data": _data,
    "study": _study,
    "model": _model,
    "tracking": _tracking,
}


@dataclass(frozen=True)
class Rehearsals:
    """What the recipes' specifications say of their rehearsal (``params.recipe_spec.rehearsals``): ``rules``, the
    rule of each recipe section that has one of its own; ``several_ranks``, the recipes the study trains on several
    ranks; ``second_order_pipelines``, the pipelines that may train THOR (``THOR_MEMORY_GB`` a worker)."""

    rules: Mapping[str, Rule] = field(default_factory=dict)
    several_ranks: frozenset[str] = frozenset()
    second_order_pipelines: frozenset[str] = frozenset()


@dataclass
class Substitutions:
    """The dotted keys ``fast_dev_run_overrides`` changes, their new values, and why where it is not obvious."""

    values: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """``k=v, …`` of every substitution (the log line and the MLflow tag)."""
        return ", ".join(
            f"{key}={_text(value)}" + (f" ({self.reasons[key]})" if key in self.reasons else "")
            for key, value in self.values.items()
        )

    def nested(self) -> dict:
        """The substitutions as a nested mapping, the shape of Kedro's ``--params``."""
        tree: dict = {}
        for key, value in self.values.items():
            *parents, leaf = key.split(".")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return tree


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(_text, value)) + "]"
    return str(value)


def _get(tree: Mapping, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


_MISSING = object()


def fast_dev_run_overrides(
    raw_params: Mapping[str, Any],
    *,
    env: str,
    cpu_workers: int,
    memory_gb: float = math.inf,
    pipelines: Collection[str] | None = None,
    default_data: Mapping[str, Any],
    classes_in: Callable[[str, str], int | None],
    default_classes: int,
    recipes: Rehearsals,
) -> Substitutions:
    """The substitutions that rehearse ``raw_params`` (an environment's merged configuration) on this CPU machine.

    ``cpu_workers``: the machine's cores; ``memory_gb`` its memory; msrun workers: as many as both take (at least 2
    where the environment has several and memory allows), fewer where ``pipelines`` (the run's, ``None``: unknown)
    may train THOR (``THOR_MEMORY_GB`` each), one where they may run the study. ``default_data``: the CPU default tree's
    ``source``, ``root`` and ``split_dirs`` (conf/base's data section), used when ``data.root`` does not exist.
    ``classes_in(root, train_dir)``: the class folders of a tree's train split, ``None`` when ``root`` does not
    exist; ``default_classes``: the default tree's classes before it is written out. ``recipes``: the recipes'
    rules, and which of them train on several ranks or may train THOR.
    """
    workers_in_env = raw_params["distributed"]["worker_num"]
    # a run of the study trains on one worker below, whatever its recipes
    thor_may_run = pipelines is None or bool(recipes.second_order_pipelines.intersection(pipelines))
    fit = int(min(memory_gb / (THOR_MEMORY_GB if thor_may_run else WORKER_MEMORY_GB), 1 << 16))
    workers = 1 if workers_in_env == 1 else _power_of_two_at_most(max(2, min(workers_in_env, cpu_workers)))
    workers = max(1, min(workers, _power_of_two_at_most(fit)))
    if pipelines is not None and "study" in pipelines:
        workers = 1  # the study trains in its own process, on one device (its adasum: study.adasum_workers ranks)
    study_adasum = raw_params.get("study", {}).get("adasum_workers", 2)
    plan = Plan(
        env=env,
        workers=workers,
        adasum_workers=_power_of_two_at_most(max(2, min(study_adasum, max(cpu_workers, 2)))),
        cpu_workers=cpu_workers,
    )
    result = Substitutions()
    wanted: dict[str, Any] = {}
    rules = {**SECTION_RULES, **recipes.rules}
    for name in [*rules, *(name for name in raw_params if name not in rules)]:
        section = raw_params.get(name)
        rule = rules.get(name, training_budget if _trains(section) else None)
        if section is not None and rule is not None:
            wanted |= {f"{name}.{key}": value for key, value in rule(section, plan).items()}

    # the image tree: the one given when it exists, else the CPU default tree, saying so
    data = raw_params["data"]
    classes = classes_in(data["root"], data["split_dirs"]["train"])
    if classes is None:
        wanted |= {
            "data.source": default_data["source"],
            "data.root": default_data["root"],
            "data.split_dirs.train": default_data["split_dirs"]["train"],
            "data.split_dirs.val": default_data["split_dirs"]["val"],
        }
        result.reasons["data.root"] = f"{data['root']} does not exist: the CPU default tree"
        classes = classes_in(default_data["root"], default_data["split_dirs"]["train"]) or default_classes
    elif data["source"] != "folder" and data["root"] != default_data["root"]:
        wanted["data.source"] = "folder"  # a tree of the user's, read as it is
    # enough images for STEPS_PER_EPOCH steps of every training, on the most ranks any of them uses
    study_recipes = raw_params.get("study", {}).get("recipes", [])
    study_adasum_runs = (pipelines is None or "study" in pipelines) and bool(
        recipes.several_ranks.intersection(study_recipes)
    )
    ranks = max(plan.workers, plan.adasum_workers if study_adasum_runs else 1)
    per_class = max(1, math.ceil(STEPS_PER_EPOCH * ranks * BATCH_PER_WORKER / max(classes, 1)))
    wanted["data.max_per_class.train"] = per_class
    wanted["data.max_per_class.val"] = max(1, math.ceil(EVAL_IMAGES / max(classes, 1)))

    for key, value in wanted.items():
        if _get(raw_params, key) != value:
            result.values[key] = value
    return result
