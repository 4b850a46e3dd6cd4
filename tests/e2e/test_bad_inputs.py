"""Bad input to a real kedro run: named, and nothing written is damaged."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.support.config import load_config
from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.training import GivenSteps, build
from tests.support.trees import write_image_tree
from trainlib.data.folder import BadImageError, DataLayoutError, create_dataset, scan_image_tree
from trainlib.engine.checkpoint import Checkpoint, CheckpointError, save_checkpoint
from trainlib.engine.epochs import NonFiniteLossError, TrainingSpec
from trainlib.engine.loop import Checkpointing, train
from trainlib.engine.resume import find_resume_checkpoint
from trainlib.engine.step import TrainStep
from trainlib.params import DataParams

SPLITS = {"train": "train", "val": "val"}


CLASSES = ("ant", "bee", "cat")


PROJECT = Path(__file__).resolve().parents[2]


# A case writes its inputs under the folder it is given and returns the action (which must fail
# and return the error text) and the pieces of text that error must hold.
Case = Callable[[Path], tuple[Callable[[], str], list[str]]]


def raised(error_type: type[Exception], action: Callable[[], object]) -> str:
    with pytest.raises(error_type) as error:
        action()
    return str(error.value)


def tree(root: Path) -> Path:
    return write_image_tree(root / "tree", classes=CLASSES, per_class={"train": 6, "val": 2})


def build_manifest_node(image_root: Path) -> Callable[[], object]:
    from pipelines.data.nodes import build_manifest

    data = load_config()["data"]
    return lambda: build_manifest(
        DataParams(**{**data, "source": "folder", "root": str(image_root), "on_bad_file": "fail"})
    )


def kedro_project(root: Path, params: dict) -> Path:
    """A project on a tiny tree with ``params`` in conf/local, holding the outputs of an earlier run."""
    data_params = {**TINY_PARAMS["data"], "root": str(tree(root)), **params.pop("data", {})}
    project = make_project(root / "project", {**TINY_PARAMS, "data": data_params, **params})
    save_checkpoint(Checkpoint({"w": np.arange(4, dtype=np.float32)}), project / "data/06_models/baseline/final.ckpt")
    (project / "data/08_reporting").mkdir(parents=True)
    (project / "data/08_reporting/baseline_eval.json").write_text('{"top1": 0.5}')
    return project


def kedro_fails(project: Path, *args: str) -> Callable[[], str]:
    def action() -> str:
        result = kedro(project, "run", *args, timeout=300)
        assert result.returncode != 0, result.stdout[-2000:]
        # rich wraps long log lines; the message is asserted on the text without line breaks
        return " ".join((result.stdout + result.stderr).split())

    return action


def missing_data_folder(root: Path):
    missing = root / "no_such_tree"
    project = kedro_project(root, {"data": {"root": str(missing)}})
    run = kedro_fails(project, "--pipelines=baseline")

    def action():
        message = run()
        assert [r.info.status for r in runs(project)[1]] == ["FAILED"]
        return message

    return action, [str(missing), "does not exist"]


def empty_class_folder(root: Path):
    empty = tree(root) / "train" / "dog"
    empty.mkdir()
    return lambda: raised(DataLayoutError, build_manifest_node(root / "tree")), [str(empty), "no usable image"]


def corrupt_image(root: Path):
    corrupt = tree(root) / "train" / "bee" / "corrupt.png"
    corrupt.write_bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes())
    expected = [str(corrupt.resolve()), "cannot be decoded", "on_bad_file"]
    return lambda: raised(BadImageError, build_manifest_node(root / "tree")), expected


def non_image_file(root: Path):
    foreign = tree(root) / "val" / "cat" / "notes.txt"
    foreign.write_text("not an image\n")
    expected = [str(foreign.resolve()), "not an image file"]
    return lambda: raised(BadImageError, build_manifest_node(root / "tree")), expected


def val_class_absent_from_train(root: Path):
    write_image_tree(tree(root), classes=("zebra",), per_class={"val": 1})
    expected = ["zebra", "absent from", str(root / "tree" / "val")]
    return lambda: raised(DataLayoutError, build_manifest_node(root / "tree")), expected


def wrong_folder_layout(root: Path):
    image_root = tree(root)
    (image_root / "train" / "ant" / "ant_train_000.png").rename(image_root / "train" / "loose.png")
    expected = ["loose.png", "one folder per class"]
    return lambda: raised(DataLayoutError, build_manifest_node(image_root)), expected


def parameters_refused(project: Path, *args: str) -> Callable[[], str]:
    """``kedro run`` stopped by the parameter check, before any MLflow run exists."""
    run = kedro_fails(project, *args)

    def action() -> str:
        message = run()
        assert runs(project)[1] == [], "an MLflow run was started before the parameters were checked"
        return message

    return action


def unknown_parameter_key(root: Path):
    project = kedro_project(root, {"baseline": {**TINY_PARAMS["baseline"], "epochz": 3}})
    source = Path("conf") / "local" / "parameters.yml"
    expected = [f"baseline.epochz is not a known parameter; did you mean baseline.epochs? ({source})"]
    return parameters_refused(project, "--pipelines=baseline"), expected


def wrong_type(root: Path):
    project = kedro_project(root, {"baseline": {**TINY_PARAMS["baseline"], "batch_size": "sixty-four"}})
    source = Path("conf") / "local" / "parameters.yml"
    expected = [f"baseline.batch_size is 'sixty-four' but must be an integer ({source})"]
    return parameters_refused(project, "--pipelines=baseline"), expected


def bad_choice_and_range_together(root: Path):
    project = kedro_project(root, {"network": {"name": "resnet_narow"}, "baseline": {"momentum": 1.5}})
    source = Path("conf") / "local" / "parameters.yml"
    expected = [
        "Error: invalid parameters:",
        f"network.name is 'resnet_narow'; choose one of resnet18, resnet34, resnet50, resnet101, resnet_narrow "
        f"({source})",
        f"baseline.momentum is 1.5 but must be < 1 ({source})",
        "baseline.lr.peak is -1 but must be > 0 (--params)",
    ]
    return parameters_refused(project, "--pipelines=baseline", "--params=baseline.lr.peak=-1"), expected


def n_components_too_large(root: Path):
    project = kedro_project(root, {"dim_reduce": {"pca": {"n_components": 50}, "collect": {"n_files": 40}}})
    source = Path("conf") / "local" / "parameters.yml"
    expected = [f"dim_reduce.pca.n_components is 50 but must be below dim_reduce.collect.n_files (40) ({source})"]
    return parameters_refused(project, "--pipelines=dim_reduce"), expected


def checkpoints_of_a_different_network(root: Path):
    from pipelines.dim_reduce.nodes import collect_trajectory
    from trainlib.models.resnet import create_resnet

    five_classes = create_resnet("resnet_narrow", 5)
    paths = []
    for step in (10, 20, 30):
        paths.append(root / "trajectory" / f"traj_{step:06d}.ckpt")
        trainable = {p.name: p.asnumpy().copy() for p in five_classes.trainable_params()}
        save_checkpoint(Checkpoint(trainable, {"global_step": step}), paths[-1])
    index = pd.DataFrame({"path": [str(p) for p in paths], "epoch": 1, "step": 1, "global_step": [10, 20, 30]})
    from trainlib.params import DimReduceParams, NetworkParams

    base = load_config()["dim_reduce"]
    dim_reduce = DimReduceParams(**{**base, "collect": {"n_files": None}, "pca": {"n_components": 2}})
    network = load_config()["network"]
    network = NetworkParams(**{**network, "name": "resnet_narrow"})
    three_classes = {name: label for label, name in enumerate(CLASSES)}

    def action():
        return raised(
            CheckpointError,
            lambda: collect_trajectory(index, three_classes, network, dim_reduce.collect, dim_reduce.pca),
        )

    return action, [f"checkpoint {paths[0]} does not match the network", "fc.bias has shape (5,) instead of (3,)"]


def truncated_checkpoint(root: Path):
    folder = root / "epochs"
    for epoch in (1, 2):
        save_checkpoint(
            Checkpoint({"w": np.ones(256, np.float32)}, {"epoch": epoch}), folder / f"epoch_{epoch:04d}.ckpt"
        )
    newest = folder / "epoch_0002.ckpt"
    newest.write_bytes(newest.read_bytes()[:300])

    def action():
        return raised(CheckpointError, lambda: find_resume_checkpoint(folder, "epoch", "any", stop_epoch=5))

    return action, [f"checkpoint {newest} is truncated or corrupt"]


def nan_loss(root: Path):
    manifest = scan_image_tree(tree(root), SPLITS).manifest
    dataset = create_dataset(manifest, "train", 12, 4, training=True, num_workers=1)
    steps = dataset.get_dataset_size()
    # a sane first epoch, then an lr that blows the weights up
    lr = np.concatenate([np.full(steps, 0.01), np.full(steps, 1e30)]).astype(np.float32)
    net, optimizer, cell = build(0, lr, loss_scale=1.0)
    checkpoints = Checkpointing(root / "epochs", every_epochs=1, keep_last=2)

    def run(epochs: int):
        spec = TrainingSpec(epochs=epochs, batch_size=4, examples_per_step=4, schedule_epochs=2)
        steps = GivenSteps(lambda start, steps_per_epoch: TrainStep(cell, net, optimizer, lr))
        return train(spec, dataset, steps, fingerprint="nan", checkpoints=checkpoints)

    run(1)  # writes epoch_0001.ckpt, the last good checkpoint

    def action():
        message = raised(NonFiniteLossError, lambda: run(2))
        assert sorted(p.name for p in (root / "epochs").iterdir()) == ["epoch_0001.ckpt"]
        return message

    return action, ["training loss became nan at epoch 2, step ", "the last good checkpoint is kept"]


CASES: dict[str, Case] = {
    "missing data folder": missing_data_folder,
    "empty class folder": empty_class_folder,
    "corrupt image": corrupt_image,
    "non-image file among images": non_image_file,
    "val class absent from train": val_class_absent_from_train,
    "wrong folder layout": wrong_folder_layout,
    "unknown parameter key": unknown_parameter_key,
    "wrong type": wrong_type,
    "bad choice and range together": bad_choice_and_range_together,
    "n_components too large": n_components_too_large,
    "checkpoints of a different network": checkpoints_of_a_different_network,
    "truncated checkpoint": truncated_checkpoint,
    "NaN loss": nan_loss,
}


def file_hashes(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_named_and_nothing_written_is_damaged(tmp_path, case):
    action, expected = case(tmp_path)
    before = file_hashes(tmp_path)
    message = action()
    after = file_hashes(tmp_path)
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message[-3000:]}"
    damaged = {path for path, digest in before.items() if after.get(path) != digest}
    assert not damaged, f"changed or removed: {sorted(damaged)}"
    leftovers = [path for path in set(after) - set(before) if ".tmp" in Path(path).name]
    assert not leftovers, f"temporary files left behind: {leftovers}"
