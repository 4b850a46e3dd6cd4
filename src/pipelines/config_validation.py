"""Checks every pipeline's parameters before any work starts.

``conf/base/parameters*.yml`` is the schema: a key it lacks is a typo, and a value must have
the type of the base value (ints pass for floats; ``null`` only where ``NULLABLE`` allows).
Choices, ranges and cross-key rules follow. Every problem is reported at once, each with the key
and the file (or ``--params``) it came from.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from pipelines.boost.options import FREEZE_TYPES, GRAD_CENTRALIZATION_MODES, boost_problems
from pipelines.images.folder import BAD_FILE_POLICIES, VERIFY_MODES
from pipelines.distributed.launch import validate_distributed
from pipelines.porting.layouts import TORCHVISION_ARCHITECTURES
from pipelines.reporting.compare import RECIPES
from pipelines.models.resnet import CONV_INITS, DENSE_INITS, RESNET_LAYOUTS
from pipelines.engine.runtime import DEVICE_TARGETS
from pipelines.optim.schedules import LR_SCHEDULES

NULLABLE = (
    "thor.block_size",
    "thor.trace_rule",
    "data.max_per_class.*",
    "model.num_classes",
    "dim_reduce.collect.n_files",
    "dim_reduce.stage1.trajectory.every_steps",
    "dim_reduce.stage1.trajectory.every_epochs",
    "report.run_ids.*",
)
LIST_WHEN_SET = ("thor.trace_rule",)  # null in base, [skip, stop] when set
STRING_WHEN_SET = ("report.run_ids.*",)  # null in base, an MLflow run id when set
CHOICES = {
    "runtime.device_target": DEVICE_TARGETS,
    "migrate.architecture": TORCHVISION_ARCHITECTURES,
    "runtime.mode": ("graph", "pynative"),
    "data.source": ("fashion_mnist", "folder"),
    "data.verify": VERIFY_MODES,
    "data.on_bad_file": BAD_FILE_POLICIES,
    "model.name": tuple(RESNET_LAYOUTS),
    "model.conv_init": CONV_INITS,
    "model.dense_init": DENSE_INITS,
    "*.lr.schedule": LR_SCHEDULES,
    "dim_reduce.stage2.implementation": ("own", "mindspore_boost"),
    "thor.implementation": ("own", "mindspore"),
    "adasum.implementation": ("own", "mindspore_boost"),
    "adasum.exchange": ("auto", "allgather", "allreduce"),  # lib/adasum.py EXCHANGES (which loads MindSpore)
    "boost.grad_centralization": GRAD_CENTRALIZATION_MODES,
    "boost.freeze_type": FREEZE_TYPES,
    "thor.mindspore.amp_level": ("O0", "O1", "O2", "O3"),
}


def _positive(v) -> bool:
    return v > 0


def _non_negative(v) -> bool:
    return v >= 0


def _fraction(v) -> bool:
    return 0 <= v < 1


RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "migrate.num_classes": (_positive, "must be > 0"),
    "migrate.parity.batch_size": (lambda v: v >= 2, "must be >= 2 (training-mode BatchNorm needs two values)"),
    "migrate.parity.image_size": (_positive, "must be > 0"),
    "migrate.parity.lr": (_positive, "must be > 0"),
    "migrate.parity.*_tolerance": (_positive, "must be > 0"),
    "migrate.parity.step_noise_factor": (_positive, "must be > 0"),
    "*batch_size": (_positive, "must be > 0"),
    "*.epochs": (_positive, "must be > 0"),
    "*.schedule_epochs": (_positive, "must be > 0"),
    "*.lr.lr_max": (_positive, "must be > 0"),
    "*.lr.lr_init": (_non_negative, "must be >= 0"),
    "*.lr.lr_end": (_non_negative, "must be >= 0"),
    "*.lr.warmup_epochs": (_non_negative, "must be >= 0"),
    "*.lr.reference_devices": (_positive, "must be > 0"),
    "*loss_scale": (_positive, "must be > 0"),
    "*.momentum": (_fraction, "must be in [0, 1)"),
    "*weight_decay": (_non_negative, "must be >= 0"),
    "*label_smoothing": (_fraction, "must be in [0, 1)"),
    "*.every_epochs": (_positive, "must be > 0"),
    "*.every_steps": (_positive, "must be > 0"),
    "*.keep_last": (_positive, "must be > 0"),
    "*.eval_interval": (_non_negative, "must be >= 0"),
    "data.image_size": (_positive, "must be > 0"),
    "data.num_workers": (_positive, "must be > 0"),
    "data.max_per_class.*": (_positive, "must be > 0"),
    "data.eval_resize_ratio": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "distributed.worker_num": (_positive, "must be > 0"),
    "distributed.local_worker_num": (_positive, "must be > 0"),
    "distributed.master_port": (lambda v: 1024 <= v <= 65535, "must be a port in 1024..65535"),
    "distributed.node_rank": (_non_negative, "must be >= 0"),
    "distributed.cluster_timeout_s": (_positive, "must be > 0"),
    "model.num_classes": (_positive, "must be > 0"),
    "dim_reduce.pca.n_components": (_positive, "must be > 0"),
    "dim_reduce.collect.n_files": (_positive, "must be > 0"),
    "dim_reduce.stage1.trajectory.start_epoch": (_positive, "must be >= 1"),
    "dim_reduce.stage2.max_trials": (_positive, "must be > 0"),
    "dim_reduce.stage2.rho": (lambda v: 0 < v < 1, "must be in (0, 1)"),
    "dim_reduce.stage2.sigma": (lambda v: 0 < v < 1, "must be in (0, 1)"),
    "dim_reduce.stage2.gamma": (_fraction, "must be in [0, 1)"),
    "dim_reduce.stage2.alpha": (_non_negative, "must be >= 0"),
    "thor.frequency": (lambda v: v >= 2, "must be >= 2 (1 would recompute the inverses every step)"),
    "thor.block_size": (_positive, "must be > 0"),
    "thor.lr.lr_init": (_positive, "must be > 0"),
    "thor.lr.lr_end_epoch": (_positive, "must be > 0"),
    "thor.damping.damping_init": (_positive, "must be > 0"),
    "boost.freeze_param_groups": (lambda v: v >= 2, "must be >= 2 (a single group freezes nothing)"),
    "boost.freeze_p": (_fraction, "must be in [0, 1)"),
    "boost.grad_accumulation_steps": (_positive, "must be >= 1 (1: no accumulation)"),
    "report.target_top1": (lambda v: 0 < v <= 1, "must be in (0, 1] (a fraction, not a percentage)"),
}


class ParameterError(ValueError):
    """Parameters that are unknown, mistyped or out of range."""


def _leaves(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, path + ".")
        else:
            yield path, value


def _matches(path: str, patterns) -> str | None:
    return next((p for p in patterns if fnmatch.fnmatchcase(path, p)), None)


def base_schema(conf_source: str | Path) -> dict:
    """``conf/base/parameters*.yml`` merged: the schema every run's parameters are checked against."""
    merged: dict = {}
    for path in sorted((Path(conf_source) / "base").glob("parameters*.yml")):
        merged.update(yaml.safe_load(path.read_text()) or {})
    return merged


def parameter_sources(conf_source: str | Path, env: str, runtime_params: dict | None) -> dict[str, str]:
    """The file (or ``--params``) that last set each parameter key, in Kedro's merge order."""
    sources: dict[str, str] = {}
    for folder in dict.fromkeys(("base", env)):
        for path in sorted((Path(conf_source) / folder).glob("parameters*.yml")):
            for key, _ in _leaves(yaml.safe_load(path.read_text()) or {}):
                sources[key] = str(path)
    for key, _ in _leaves(runtime_params or {}):
        sources[key] = "--params"
    return sources


def _type_problem(path: str, value: Any, base: Any) -> str | None:
    if value is None:
        return None if base is None or _matches(path, NULLABLE) else "must not be null"
    if base is None and _matches(path, LIST_WHEN_SET):
        ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value)
        return None if ok else f"must be null or a list of two numbers, got {value!r}"
    if base is None and _matches(path, STRING_WHEN_SET):
        return None if isinstance(value, str) else f"must be null or a string, got {value!r}"
    if base is None:
        return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer or null"
    if isinstance(base, bool):
        return None if isinstance(value, bool) else "must be true or false"
    if isinstance(base, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"must be a number, got {value!r}"
    if isinstance(base, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else f"must be an integer, got {value!r}"
    if isinstance(base, list):
        return None if isinstance(value, list) else f"must be a list, got {value!r}"
    if isinstance(base, str):
        return None if isinstance(value, str) else f"must be a string, got {value!r}"
    return None


def _adasum_checks(adasum: dict, device_target: str, distributed: dict) -> Iterator[tuple[str, str]]:
    workers = distributed["worker_num"]
    if adasum["implementation"] == "mindspore_boost":
        if device_target != "Ascend" or workers < 16:
            yield (
                "adasum.implementation",
                f"is mindspore_boost, which MindSpore runs on Ascend with 16 devices or more (Send/Receive between "
                f"8-device servers); this run has {workers} {device_target} worker(s): use own",
            )


def _cross_checks(params: dict) -> Iterator[tuple[str, str]]:
    yield from validate_distributed(params["distributed"])
    if "adasum" in params:
        yield from _adasum_checks(params["adasum"], params["runtime"]["device_target"], params["distributed"])
    boost = params.get("boost")
    if boost:
        yield from boost_problems(boost, params["runtime"]["device_target"], params["runtime"]["mode"])
    thor = params.get("thor")
    if thor and thor["implementation"] == "mindspore" and params["runtime"]["device_target"] == "CPU":
        yield (
            "thor.implementation",
            (
                "is mindspore, whose kernels (ThorIm2Col, CholeskyTrsm, UpdateThorGradient) exist only on Ascend and "
                "GPU, but runtime.device_target is CPU; use thor.implementation: own (this project's THOR, every "
                "backend), or run on Ascend/GPU (--env=ascend, --env=gpu)"
            ),
        )
    report = params.get("report")
    if report:
        unknown = [name for name in report["recipes"] if name not in RECIPES]
        if unknown or not report["recipes"]:
            yield "report.recipes", f"is {report['recipes']!r}; name one or more of {', '.join(RECIPES)}"
    dim_reduce = params.get("dim_reduce")
    if not dim_reduce:
        return
    if dim_reduce["stage2"]["implementation"] == "mindspore_boost" and params["distributed"]["worker_num"] > 1:
        yield (
            "dim_reduce.stage2.implementation",
            "is mindspore_boost, which runs in one process of its own, outside msrun; with distributed.worker_num "
            f"{params['distributed']['worker_num']} use own (P-BFGS averages gradients and losses across the ranks)",
        )
    stage1, n_files = dim_reduce["stage1"], dim_reduce["collect"]["n_files"]
    k = dim_reduce["pca"]["n_components"]
    if n_files is not None and k >= n_files:
        yield "dim_reduce.pca.n_components", f"is {k} but must be below dim_reduce.collect.n_files ({n_files})"
    if stage1["epochs"] > stage1["schedule_epochs"]:
        yield "dim_reduce.stage1.epochs", f"is {stage1['epochs']}, beyond schedule_epochs {stage1['schedule_epochs']}"
    if stage1["trajectory"]["start_epoch"] > stage1["epochs"]:
        yield "dim_reduce.stage1.trajectory.start_epoch", f"is after the last stage-1 epoch ({stage1['epochs']})"


def validate_parameters(params: dict, base: dict, sources: dict[str, str]) -> None:
    """Raise ``ParameterError`` listing every problem with its key and source file."""
    base_leaves = dict(_leaves(base))
    base_sections = {path.rsplit(".", 1)[0] for path in base_leaves if "." in path}
    problems: list[tuple[str, str]] = []
    for path, value in _leaves(params):
        if path not in base_leaves and path not in base_sections:
            problems.append((path, "is not a known parameter (typo?)"))
            continue
        problem = _type_problem(path, value, base_leaves.get(path))
        if problem is None and value is not None:
            choice = _matches(path, CHOICES)
            rule = _matches(path, RANGES)
            if choice and value not in CHOICES[choice]:
                problem = f"is {value!r}; choose one of {', '.join(map(str, CHOICES[choice]))}"
            elif rule and isinstance(value, int | float) and not RANGES[rule][0](value):
                problem = f"is {value!r} but {RANGES[rule][1]}"
        if problem:
            problems.append((path, problem))
    if not problems:
        problems.extend(_cross_checks(params))
    if problems:
        lines = [f"  {path} {problem} ({sources.get(path, 'unknown source')})" for path, problem in problems]
        raise ParameterError("invalid parameters:\n" + "\n".join(lines))
