"""``runtime.fast_dev_run``: rehearse an environment's recipe on this CPU machine (Lightning's name for it).

``fast_dev_run_overrides`` turns the merged configuration of an environment (base, ascend, gpu) into the few
substitutions that make every node of every training pipeline run in minutes on CPU, keeping the recipe itself:
network, image size, optimizer and its settings, schedule shape, boost options, loss scale, mixed precision,
evaluation and checkpointing. What it changes is the budget and the place: device target CPU, as many msrun
workers as the machine takes (at least 2 where the environment has several, a power of two for Adasum) on one
node, a local image tree, a few images per class, 2 images per worker and step, one or two epochs, the cross-key
rules satisfied (dim_reduce's trajectory, PCA components and epochs), and every file it writes under
``data/fast_dev_run/<env>/`` (``relocated``: checkpoint folders here, the catalog's files in ``pipelines.hooks``),
so that a real run's checkpoints and results are never touched or resumed.

The rules are a table, ``SECTION_RULES``: a function of a section's mapping and the ``Plan`` (workers, batch,
steps, env) returning its substitutions by key within the section. A section of one training (a batch size and a
checkpoint folder: baseline, lars, a recipe of another package) needs no entry: it takes ``_training``; a section
with rules of its own (``thor_bert``) adds one. Only values that differ from the configuration are returned.

Pure: standard library only (no Kedro, MindSpore or MLflow); ``pipelines.hooks`` applies the result as runtime
parameters before validation, so the nodes see the substituted values.
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
EVAL_IMAGES = 4  # data.step_eval_images and the evaluation batch
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


def _training(section: Mapping, plan: Plan, epochs: int | None = 1) -> dict:
    """A training's budget: 1 epoch (or ``epochs``), 2 images per worker, evaluated and checkpointed each epoch
    in a folder of its own."""
    values = {
        "batch_size": BATCH_PER_WORKER,
        "checkpoint.dir": plan.relocated(section["checkpoint"]["dir"]),
        "checkpoint.every_epochs": 1,
    }
    if epochs is not None:
        values["epochs"] = epochs
    if "eval_interval" in section:
        values["eval_interval"] = 1
    if section.get("eval_every_steps"):
        values["eval_every_steps"] = 2
    return values


def _trains(section) -> bool:
    """A section of one training: what ``_training`` rehearses."""
    return isinstance(section, Mapping) and "batch_size" in section and "checkpoint" in section


def _adasum(section: Mapping, plan: Plan) -> dict:
    # mindspore.boost's Adasum needs 16 Ascend devices: the project's own Adasum runs the same combination on CPU
    return {**_training(section, plan), "implementation": "trainlib"}


def _thor(section: Mapping, plan: Plan) -> dict:
    return {
        **_training(section, plan),
        "implementation": "trainlib",  # MindSpore's nn.thor kernels exist only on Ascend and GPU
        "frequency": THOR_FREQUENCY,
    }


def _dim_reduce(section: Mapping, plan: Plan) -> dict:
    stage1 = section["stage1"]
    # stage 1 stops before its schedule ends when the recipe's does (70 of 90 epochs)
    schedule_epochs = 3 if stage1["epochs"] < stage1["schedule_epochs"] else 2
    values = {f"stage1.{k}": v for k, v in _training(stage1, plan, 2).items()}
    values |= {
        "stage1.schedule_epochs": schedule_epochs,
        "stage1.trajectory.dir": plan.relocated(stage1["trajectory"]["dir"]),
        "stage1.trajectory.start_epoch": 1,
        "stage1.trajectory.every_steps": 1,  # 2 epochs of >= 3 steps: >= 6 weight files
        "stage1.trajectory.every_epochs": None,
        "collect.n_files": 4,
        "pca.n_components": 3,
        "stage2.implementation": "trainlib",  # boost's DimReduce runs outside msrun, on one worker only
    }
    values |= {f"stage2.{k}": v for k, v in _training(section["stage2"], plan).items()}
    values["control.checkpoint.dir"] = plan.relocated(section["control"]["checkpoint"]["dir"])
    return values


def _study(section: Mapping, plan: Plan) -> dict:
    return {
        "seeds": [0],
        "epochs": 1,
        "eval_every_steps": 2,
        "adasum_workers": plan.adasum_workers,
        "dir": plan.relocated(section["dir"]),
    }


BERT_DOCUMENTS = 4  # corpus documents a rehearsal reads: examples for a few steps of the env's sequence length


def _thor_bert(section: Mapping, plan: Plan) -> dict:
    """The env's BERT (network, sequence length, schedules' shape, THOR and baseline settings) on the first few
    documents for one epoch of a few steps; Lamb, which MindSpore runs on Ascend and GPU only, becomes the script's
    AdamWeightDecay."""
    values = {
        "corpus.max_documents": BERT_DOCUMENTS,
        "eval_batch_size": BATCH_PER_WORKER,
        "step_eval_examples": EVAL_IMAGES,
        "thor.frequency": THOR_FREQUENCY,
    }
    for training in ("thor", "control"):
        values |= {f"{training}.{k}": v for k, v in _training(section[training], plan).items()}
    if section["control"]["optimizer"] == "lamb":
        values["control.optimizer"] = "adamweightdecay"
    return values


def _tracking(section: Mapping, plan: Plan) -> dict:
    return {"artifact_max_mb": 0}  # checkpoints and reports stay on disk: nothing is stored as a result


# section -> its rule, where it needs one of its own; any other section that trains (a batch size and a checkpoint
# folder: baseline, lars, another package's recipe) takes ``_training``, so that no training escapes the rehearsal
SECTION_RULES: dict[str, Rule] = {
    "runtime": _runtime,
    "distributed": _distributed,
    "data": _data,
    "adasum": _adasum,
    "thor": _thor,
    "dim_reduce": _dim_reduce,
    "study": _study,
    "thor_bert": _thor_bert,
    "tracking": _tracking,
}


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
) -> Substitutions:
    """The substitutions that rehearse ``raw_params`` (an environment's merged configuration) on this CPU machine.

    ``cpu_workers``: the machine's cores; ``memory_gb`` its memory; msrun workers: as many as both take (at least 2
    where the environment has several and memory allows), fewer where ``pipelines`` (the run's, ``None``: unknown)
    may train THOR (``THOR_MEMORY_GB`` each), one where they may run the study. ``default_data``: the CPU default tree's
    ``source``, ``root`` and ``split_dirs`` (conf/base's data section), used when ``data.root`` does not exist.
    ``classes_in(root, train_dir)``: the class folders of a tree's train split, ``None`` when ``root`` does not
    exist; ``default_classes``: the default tree's classes before it is written out.
    """
    workers_in_env = raw_params["distributed"]["worker_num"]
    # thor, thor_bert; a run of the study trains on one worker below, whatever its recipes
    thor_may_run = pipelines is None or any(name.startswith("thor") for name in pipelines)
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
    for name in [*SECTION_RULES, *(name for name in raw_params if name not in SECTION_RULES)]:
        section = raw_params.get(name)
        rule = SECTION_RULES.get(name, _training if _trains(section) else None)
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
    study_adasum_runs = (pipelines is None or "study" in pipelines) and "adasum" in raw_params.get("study", {}).get(
        "recipes", []
    )
    ranks = max(plan.workers, plan.adasum_workers if study_adasum_runs else 1)
    per_class = max(1, math.ceil(STEPS_PER_EPOCH * ranks * BATCH_PER_WORKER / max(classes, 1)))
    wanted["data.max_per_class.train"] = per_class
    wanted["data.max_per_class.val"] = max(1, math.ceil(EVAL_IMAGES / max(classes, 1)))

    for key, value in wanted.items():
        if _get(raw_params, key) != value:
            result.values[key] = value
    return result
