"""trainlib.fast_dev_run: the substitutions that rehearse an environment's recipe on CPU (pure, milliseconds)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.support.config import load_config
from trainlib.fast_dev_run import TAG, fast_dev_run_overrides, relocated
from trainlib.params import validate_parameters
from trainlib.params.recipe_spec import rehearsals

DEFAULT_DATA = {
    "source": "fashion_mnist",
    "root": "data/01_raw/fashion_mnist",
    "split_dirs": {"train": "train", "val": "val"},
}


def merged_params(env: str, *extras: dict | None) -> dict:
    """base, then ``env``, then ``extras`` as --params (a later one winning, as fast_dev_run's substitutions win over
    the user's), merged by Kedro's own loader."""
    runtime_params = OmegaConf.to_container(OmegaConf.merge(*(extra or {} for extra in extras))) if extras else None
    return load_config(env, runtime_params=runtime_params)


def overrides(env: str, *, trees: dict[str, int] | None = None, cpu_workers: int = 2, extra: dict | None = None):
    trees = {"/local/tree": 3} if trees is None else trees
    return fast_dev_run_overrides(
        merged_params(env, extra),
        env=env,
        cpu_workers=cpu_workers,
        default_data=DEFAULT_DATA,
        classes_in=lambda root, train: trees.get(root),
        default_classes=10,
        recipes=rehearsals(),
    )


def ascend_overrides(extra: dict, *, pipelines, memory_gb: float, cpu_workers: int = 2, classes: int | None = 3):
    """The substitutions for a run of ``pipelines`` in ascend's configuration with ``extra``, on a machine of
    ``cpu_workers`` cores and ``memory_gb``, its tree holding ``classes`` classes (``None``: no tree)."""
    return fast_dev_run_overrides(
        merged_params("ascend", extra),
        env="ascend",
        cpu_workers=cpu_workers,
        memory_gb=memory_gb,
        pipelines=pipelines,
        default_data=DEFAULT_DATA,
        classes_in=lambda root, train: classes,
        default_classes=10,
        recipes=rehearsals(),
    )


@pytest.mark.parametrize("env", ["base", "ascend", "gpu"])
@pytest.mark.parametrize("root", ["/local/tree", "/data/imagenet"])
def test_the_substituted_configuration_is_valid_and_runs_on_cpu(env, root):
    extra = {"runtime": {"fast_dev_run": True}, "data": {"root": root}}
    substitutions = overrides(env, extra=extra)
    params = validate_parameters(merged_params(env, extra, substitutions.nested()))
    assert params.runtime.device_target == "CPU"
    assert params.distributed.node_rank == 0 and params.distributed.nodes == 1
    assert params.thor.implementation == "trainlib" and params.adasum.implementation == "trainlib"
    assert params.dim_reduce.stage2.implementation == "trainlib"
    for training in (params.baseline, params.adasum, params.thor, params.dim_reduce.stage1, params.dim_reduce.stage2):
        assert training.batch_size == 2
        assert training.checkpoint.dir.startswith(f"data/fast_dev_run/{env}/06_models/")
    assert params.dim_reduce.control.checkpoint.dir.startswith(f"data/fast_dev_run/{env}/06_models/")
    assert params.study.dir.startswith(f"data/fast_dev_run/{env}/07_model_output/")
    assert params.study.seeds == [0] and params.study.epochs == 1
    assert params.model.export_batch_size == 4  # each export's MindIR runs 4 images, not 16


@pytest.mark.parametrize("env", ["ascend", "gpu"])
def test_the_recipe_is_kept(env):
    extra = {"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}}
    original = validate_parameters(merged_params(env, {**extra, "runtime": {**merged_params(env)["runtime"]}}))
    params = validate_parameters(merged_params(env, extra, overrides(env, extra=extra).nested()))
    assert params.network == original.network  # resnet50, 1001 classes
    assert params.data.image_size == original.data.image_size == 224
    assert params.data.crop_scale == original.data.crop_scale
    assert params.boost == original.boost
    assert params.runtime.mode == original.runtime.mode
    for name in ("baseline", "adasum"):
        kept, was = getattr(params, name), getattr(original, name)
        assert (kept.lr, kept.momentum, kept.weight_decay, kept.loss_scale, kept.label_smoothing) == (
            was.lr,
            was.momentum,
            was.weight_decay,
            was.loss_scale,
            was.label_smoothing,
        )
    assert (params.thor.lr, params.thor.damping, params.thor.block_size, params.thor.loss_scale) == (
        original.thor.lr,
        original.thor.damping,
        original.thor.block_size,
        original.thor.loss_scale,
    )
    assert params.dim_reduce.stage1.lr == original.dim_reduce.stage1.lr


def test_workers_the_machine_takes_at_least_two_a_power_of_two():
    ascend = {"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}}
    assert overrides("ascend", cpu_workers=2, extra=ascend).values["distributed.worker_num"] == 2
    assert overrides("ascend", cpu_workers=1, extra=ascend).values["distributed.worker_num"] == 2
    assert overrides("ascend", cpu_workers=6, extra=ascend).values["distributed.worker_num"] == 4
    assert "distributed.worker_num" not in overrides("ascend", cpu_workers=64, extra=ascend).values  # the env's 8
    base = overrides("base", extra={"runtime": {"fast_dev_run": True}})
    assert "distributed.worker_num" not in base.values  # one worker stays one


def test_a_missing_root_falls_back_to_the_cpu_default_tree_and_says_so():
    substitutions = overrides("ascend", extra={"runtime": {"fast_dev_run": True}})  # /data/imagenet: absent
    assert substitutions.values["data.root"] == DEFAULT_DATA["root"]
    assert substitutions.values["data.source"] == "fashion_mnist"
    assert "data.root=data/01_raw/fashion_mnist (/data/imagenet does not exist: the CPU default tree)" in (
        substitutions.summary()
    )
    given = overrides("ascend", extra={"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}})
    assert "data.root" not in given.values and "data.source" not in given.values
    # base's source writes Fashion-MNIST under the root: a tree of the user's is read as a folder
    base = overrides("base", extra={"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}})
    assert base.values["data.source"] == "folder"


def test_enough_images_for_three_steps_on_every_rank():
    extra = {"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}}
    three = overrides("ascend", trees={"/local/tree": 3}, extra=extra).values
    assert three["data.max_per_class.train"] * 3 >= 3 * 2 * 2  # steps x ranks x batch
    thousand = overrides("ascend", trees={"/local/tree": 1000}, extra=extra).values
    assert thousand["data.max_per_class.train"] == 1 and thousand["data.max_per_class.val"] == 1


def test_dim_reduce_rules_are_satisfied_by_the_rehearsal_itself():
    extra = {"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}}
    values = overrides("ascend", extra=extra).values
    # 1 epoch from epoch 1, a file every step of >= 3 steps: >= 3 files, as many as collect.n_files takes
    assert values["dim_reduce.stage1.trajectory.start_epoch"] <= values["dim_reduce.stage1.epochs"] == 1
    assert values["dim_reduce.pca.n_components"] < values["dim_reduce.collect.n_files"] <= 3
    assert values["dim_reduce.stage1.schedule_epochs"] > values["dim_reduce.stage1.epochs"]  # stops early, as 70/90


def test_only_changes_are_listed_and_the_summary_is_one_line():
    substitutions = overrides("base", extra={"runtime": {"fast_dev_run": True}})
    assert "runtime.device_target" not in substitutions.values  # base is CPU already
    assert "network.name" not in substitutions.values
    line = substitutions.summary()
    assert "\n" not in line and line.startswith("data.eval_batch_size=4") and "study.seeds=[0]" in line
    assert TAG == "fast_dev_run"


def test_the_thor_implementation_of_mindspore_is_replaced_on_cpu():
    extra = {
        "runtime": {"fast_dev_run": True},
        "data": {"root": "/local/tree"},
        "thor": {"implementation": "mindspore_builtin"},
    }
    values = overrides("gpu", extra=extra).values
    assert values["thor.implementation"] == "trainlib" and values["thor.frequency"] == 3  # a second-order step an epoch


def test_everything_a_rehearsal_writes_lies_under_its_own_folder():
    assert relocated("data/06_models/baseline/epochs", "ascend") == "data/fast_dev_run/ascend/06_models/baseline/epochs"
    assert relocated("data/07_model_output/study", "gpu") == "data/fast_dev_run/gpu/07_model_output/study"
    assert relocated("checkpoints/mine", "base") == "data/fast_dev_run/base/checkpoints/mine"


def test_a_run_that_may_train_thor_starts_only_the_workers_memory_takes():
    extra = {"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}}

    def workers(memory_gb, pipelines):
        return ascend_overrides(extra, pipelines=pipelines, memory_gb=memory_gb).values["distributed.worker_num"]

    assert workers(23, ["baseline", "adasum", "dim_reduce"]) == 2
    assert workers(23, ["thor"]) == 1  # ResNet-50 THOR: 12.8 GB a worker
    assert workers(23, ["study"]) == 1  # study.recipes has thor
    assert workers(23, None) == 1
    assert workers(64, ["thor"]) == 2


def test_a_run_that_may_run_the_study_trains_on_one_worker():
    """The study trains in its own process on one device, and refuses more: ascend's study without THOR, which
    memory would give 2 workers, failed its rehearsal."""
    extra = {"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}, "study": {"recipes": ["baseline"]}}
    for pipelines in (["study"], ["study", "baseline"]):
        found = ascend_overrides(extra, pipelines=pipelines, memory_gb=64)
        assert found.values["distributed.worker_num"] == 1, pipelines


@pytest.mark.parametrize("env", ["base", "ascend", "gpu"])
def test_thor_bert_keeps_the_envs_bert_on_a_few_documents(env):
    extra = {"runtime": {"fast_dev_run": True}}
    substitutions = overrides(env, extra=extra)
    params = validate_parameters(merged_params(env, extra, substitutions.nested()))
    configured = validate_parameters(merged_params(env)).thor_bert
    bert = params.thor_bert
    assert bert.network == configured.network and bert.examples == configured.examples  # the env's BERT, as set
    assert bert.corpus.max_documents == 4 and bert.thor.frequency == 3
    assert bert.control.optimizer == "adamweightdecay"  # Lamb has no CPU kernel (ascend and gpu configure it)
    for training in (bert.thor, bert.control):
        assert training.epochs == 1 and training.batch_size == 2
        assert training.checkpoint.dir.startswith(f"data/fast_dev_run/{env}/")
    assert bert.thor.lr == configured.thor.lr and bert.control.lr == configured.control.lr  # schedule shapes kept
    # a run of thor_bert may train THOR: the workers are bounded by THOR's memory, as for thor
    small = ascend_overrides(extra, pipelines=["thor_bert"], memory_gb=23, cpu_workers=8, classes=None)
    assert small.values["distributed.worker_num"] == 1


def test_a_run_with_one_worker_reads_images_for_three_steps_not_for_the_studys_adasum_ranks():
    extra = {"runtime": {"fast_dev_run": True}, "data": {"root": "/local/tree"}}

    def per_class(pipelines, recipes):
        found = ascend_overrides({**extra, "study": {"recipes": recipes}}, pipelines=pipelines, memory_gb=23)
        return found.values["data.max_per_class.train"]

    assert per_class(["thor"], ["baseline", "thor"]) * 3 == 3 * 1 * 2  # 3 steps x 1 worker x batch 2
    assert per_class(["study"], ["adasum"]) * 3 == 3 * 2 * 2  # the study's adasum trains on 2 ranks
