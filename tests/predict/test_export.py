"""A trained classifier's MindIR export and the loaded classifier: same outputs as the network, same pixels as the
evaluation, the folder swapped in whole, bad images named and the others still classified."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pipelines  # noqa: F401  (the CPU defaults before MindSpore loads)
from mindir_serving.classifier import MindirClassifier, padded, prediction_columns
from tests.support.trees import write_image_tree
from trainlib.data.folder import create_dataset, scan_image_tree
from trainlib.models.resnet import create_resnet
from trainlib.predict.export import (
    DESCRIPTION_FILE,
    EXAMPLE_FILE,
    MINDIR_FILE,
    ExportError,
    ModelFolderError,
    class_names,
    export_classifier,
    export_network,
    load_model,
    save_model,
)

CLASSES = ("cat", "dog", "fox")
IMAGE_SIZE = 16
RATIO = 0.875


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = write_image_tree(tmp_path_factory.mktemp("tree"), classes=CLASSES, per_class={"train": 1, "val": 3})
    manifest = scan_image_tree(root, {"train": "train", "val": "val"}).manifest
    return root, manifest


@pytest.fixture(scope="module")
def exported(tree, tmp_path_factory):
    """A random resnet_narrow (4 outputs for 3 classes, as ImageNet's 1001 for 1000) exported for batches of 4 and
    saved."""
    import mindspore as ms

    ms.set_seed(0)
    net = create_resnet("resnet_narrow", 4)
    _, manifest = tree
    example = open(manifest["path"].iloc[0], "rb").read()
    model = export_classifier(
        net,
        image_size=IMAGE_SIZE,
        eval_resize_ratio=RATIO,
        class_index={name: label for label, name in enumerate(CLASSES)},
        num_classes=4,
        network="resnet_narrow",
        training="baseline",
        example_image=example,
        batch_size=4,
    )
    folder = tmp_path_factory.mktemp("model") / "model"
    save_model(model, folder)
    return net, model, folder


def val_batch(manifest: pd.DataFrame):
    """The val images as the evaluation reads them: one batch of pixels and labels."""
    dataset = create_dataset(manifest, "val", IMAGE_SIZE, 64, training=False, eval_resize_ratio=RATIO)
    images, labels = next(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))
    return images, labels


def test_class_names_name_every_output_and_outputs_without_a_class_by_label():
    assert class_names({"dog": 1, "cat": 0}, 3) == ["cat", "dog", "2"]


def test_the_loaded_model_sees_the_evaluations_pixels_and_gives_the_networks_outputs(tree, exported):
    import mindspore as ms

    _, manifest = tree
    net, model, folder = exported
    classifier = MindirClassifier.from_folder(folder)
    val = manifest[manifest["split"] == "val"].sort_values(["label", "path"])
    pixels, _ = val_batch(manifest)
    ours = np.stack([classifier.pixels(open(path, "rb").read()) for path in val["path"]])
    np.testing.assert_array_equal(ours, pixels)  # the evaluation's decode, resize, crop and normalisation
    net.set_train(False)
    first = pixels[:4]  # the exported batch
    np.testing.assert_allclose(classifier.logits(first), net(ms.Tensor(first)).asnumpy(), rtol=1e-5, atol=1e-5)
    assert classifier.description == model.description
    assert model.description["classes"] == [*CLASSES, "3"]


def test_predict_ranks_like_the_evaluation_and_names_an_image_it_cannot_decode(tree, exported):
    import mindspore as ms

    _, manifest = tree
    net, _, folder = exported
    classifier = MindirClassifier.from_folder(folder)
    val = manifest[manifest["split"] == "val"]
    images = [open(path, "rb").read() for path in val["path"]]
    # batches of the exported 4: the last of the 9 images goes in a batch padded with 3 zero images
    predictions = classifier.predict([images[0], b"not an image", *images[1:]], top_k=2)
    assert list(predictions.columns) == prediction_columns(2)
    assert len(predictions) == len(images) + 1
    bad = predictions.iloc[1]
    assert bad["error"] == "not an image: the file starts with no JPEG, PNG or BMP signature"
    assert bad["class_1"] is None and bad["probability_1"] is None
    good = predictions.drop(index=1)
    assert (good["error"] == "").all()
    assert (good["probability_1"] >= good["probability_2"]).all() and (good["probability_1"] <= 1).all()
    net.set_train(False)
    logits = net(ms.Tensor(np.stack([classifier.pixels(image) for image in images]))).asnumpy()  # the network's
    expected = [classifier.classes[i] for i in np.argsort(-logits, axis=1)[:, 0]]
    assert list(good["class_1"]) == expected


def test_an_export_mindspore_cannot_run_fails_the_export_not_its_user():
    import mindspore as ms

    net = create_resnet("resnet18", 2)  # for any batch size, MindSpore 2.10 cannot load a resnet18's export back
    any_batch = ms.Tensor(shape=[None, 3, IMAGE_SIZE, IMAGE_SIZE], dtype=ms.float32)
    probe = [np.zeros((2, 3, IMAGE_SIZE, IMAGE_SIZE), np.float32)]
    with pytest.raises(ExportError, match="MindSpore exported resnet18 to MindIR but cannot run the file it wrote"):
        export_network(net, [any_batch], probe, description={"network": "resnet18"}, example=b"")


def test_a_batch_is_padded_with_zero_rows_to_the_exported_size():
    batch = padded(np.ones((3, 3, 2, 2), np.float32), 4)
    assert batch.shape == (4, 3, 2, 2) and (batch[:3] == 1).all() and (batch[3] == 0).all()
    assert padded(batch, 4) is batch


def test_a_new_save_replaces_the_whole_folder_and_a_partial_folder_is_named(exported, tmp_path):
    _, model, _ = exported
    folder = tmp_path / "model"
    save_model(model, folder)
    umask = os.umask(0)
    os.umask(umask)
    assert folder.stat().st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes a folder, not mkdtemp's owner-only
    (folder / "stale").write_text("from an older export")
    save_model(model, folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([MINDIR_FILE, DESCRIPTION_FILE, EXAMPLE_FILE])
    assert load_model(folder) == model
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging or retired folder left
    (folder / MINDIR_FILE).unlink()
    with pytest.raises(ModelFolderError, match=f"{folder}.*{MINDIR_FILE} missing"):
        load_model(folder)


def test_the_mlflow_model_is_logged_registered_and_loaded_by_alias_and_run_id(tree, exported, tmp_path):
    import mlflow
    from mlflow.pyfunc.scoring_server import predictions_to_json

    from pipelines.tracking.models import (
        ModelUriError,
        load_model,
        log_model,
        model_classes,
        model_uri,
        predictor,
        requirements,
    )
    from tests.support.runner import empty_store, process_state_kept
    from tests.support.standalone import strict_json

    _, manifest = tree
    _, _, folder = exported
    images = [open(path, "rb").read() for path in manifest[manifest["split"] == "val"]["path"]]
    expected = MindirClassifier.from_folder(folder).predict(images, top_k=2)
    assert log_model(folder) is None  # outside a run: nothing to log to
    with process_state_kept(tmp_path):
        shutil.copy(empty_store(), tmp_path / "mlflow.db")
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        with mlflow.start_run() as run:
            log_model(folder, registered_name="baseline")
        client = mlflow.MlflowClient()
        (version,) = client.search_model_versions("name = 'baseline'")
        assert version.run_id == run.info.run_id
        client.set_registered_model_alias("baseline", "champion", version.version)
        for reference in ("models:/baseline@champion", run.info.run_id):  # models:/baseline/1 resolves as MLflow does
            model = load_model(reference)
            assert model_classes(model) == [*CLASSES, "3"]
            pd.testing.assert_frame_equal(predictor(model, top_k=2)(images), expected)
        # the input example MLflow keeps beside the model is the export's example image
        assert model.metadata.get_input_schema().input_names() == ["image"]
        # what the REST server writes for a batch with an empty file: strict JSON, the missing values null
        reply = io.StringIO()
        predictions_to_json(predictor(model, top_k=2)([b"", images[0]]), reply)
        answer = strict_json(reply.getvalue())["predictions"]
        assert answer[0] == {**dict.fromkeys(prediction_columns(2), None), "error": "empty file", "warning": ""}
        assert answer[1]["class_1"] == expected["class_1"].iloc[0] and answer[1]["error"] == ""
        # its requirements: what its code imports, pinned
        listed = Path(mlflow.pyfunc.get_model_dependencies("models:/baseline@champion")).read_text().split()
        assert listed == requirements("image_classification")
        assert [line.split("==")[0] for line in listed] == ["mindspore", "mlflow", "numpy", "pandas", "pillow"]
    assert model_uri("runs:/abc/model") == "runs:/abc/model"
    with pytest.raises(ModelUriError, match="predict.model 'baseline' names no model: give models:/<name>@<alias>"):
        model_uri("baseline")


@pytest.mark.slow  # a process of its own: the slow tier
def test_the_registered_model_loads_and_predicts_in_a_python_without_this_project(exported, tmp_path):
    """docs/use-a-model.md's way to use a registered model elsewhere: downloaded by its alias, then loaded and run by
    a Python that has the model's requirements and not this project (tests/support/standalone.py), on an image file
    and on the model's own input example; both answer what the loaded classifier answers."""
    import mlflow

    from pipelines.tracking.models import log_model
    from tests.support.runner import empty_store, process_state_kept
    from tests.support.standalone import page_snippet, run_without_the_project

    _, model, folder = exported
    with process_state_kept(tmp_path):
        shutil.copy(empty_store(), tmp_path / "mlflow.db")
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        with mlflow.start_run():
            log_model(folder, registered_name="baseline")
        mlflow.MlflowClient().set_registered_model_alias("baseline", "champion", "1")
        exec(page_snippet("download_artifacts"), {})
    (tmp_path / "photo.jpg").write_bytes(model.example)  # the page's image file: the model's example image
    use = page_snippet('load_model("baseline-model")')
    example = "\nprint(model.predict(model.input_example).to_json(orient='split'))"
    printed = run_without_the_project(f"{use}\nprint(answer.to_json(orient='split')){example}", tmp_path)
    expected = MindirClassifier.from_folder(folder).predict([model.example], top_k=5)
    assert [json.loads(line) for line in printed.splitlines()[-2:]] == [
        json.loads(expected[prediction_columns(3)].to_json(orient="split")),
        json.loads(expected.to_json(orient="split")),
    ]


def encoded(image, file_format: str) -> bytes:
    """A PIL ``image`` as the bytes of a ``file_format`` file."""
    import io

    buffer = io.BytesIO()
    image.save(buffer, file_format)
    return buffer.getvalue()


def test_an_unreadable_file_is_named_by_what_is_wrong_with_it(exported, tmp_path, monkeypatch):
    """Real broken files, as a user's folder holds them, each with its reason; none is written anywhere (MindSpore
    copies a GIF or a cut JPEG it refuses into the working directory); a complete JPEG with garbled data is named by
    Pillow's message; and a grayscale image is classified on the pixels of its RGB conversion, as the
    evaluation's decode reads it."""
    from PIL import Image

    _, _, folder = exported
    classifier = MindirClassifier.from_folder(folder)
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    jpeg, png = encoded(photo, "JPEG"), encoded(photo, "PNG")
    files = {
        "empty.jpg": b"",
        "cut.jpg": jpeg[: len(jpeg) // 2],
        "notes.jpg": b"shopping list: milk, eggs\n",
        "cut.png": png[: len(png) // 2],
        "animation.gif": encoded(photo, "GIF"),
        "photo.jpg": jpeg,
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    working = tmp_path / "cwd"
    working.mkdir()
    monkeypatch.chdir(working)
    predictions = classifier.predict([(tmp_path / name).read_bytes() for name in files], top_k=2)
    assert list(predictions["error"]) == [
        "empty file",
        "truncated JPEG: the file ends before its end-of-image marker",
        "not an image: the file starts with no JPEG, PNG or BMP signature",
        "truncated PNG: the file ends before its IEND chunk",
        "GIF image: the model reads JPEG, PNG or BMP",
        "",
    ]
    assert predictions["class_1"].iloc[-1] in classifier.classes
    assert list(working.iterdir()) == []
    # a complete JPEG whose data does not decode: refused by Pillow's decode, before MindSpore's (``decoding``)
    garbled = jpeg[:200] + b"\xff\xc4" + b"\x13" * 50 + jpeg[252:]
    (reason,) = classifier.predict([garbled], top_k=2)["error"]
    assert reason == "corrupt JPEG: broken data stream when reading image file"
    gray = photo.convert("L")
    np.testing.assert_array_equal(
        classifier.pixels(encoded(gray, "PNG")), classifier.pixels(encoded(gray.convert("RGB"), "PNG"))
    )
    assert classifier.predict([encoded(gray, "PNG")], top_k=1)["error"].iloc[0] == ""


def test_the_shipped_package_imports_only_the_models_requirements():
    """Every module of ``mindir_serving`` (logged inside each model) imports the standard library, itself and the
    model's requirements only, and a model's requirements are exactly the distributions its code imports."""
    import ast
    import importlib.metadata
    import sys

    import mindir_serving
    from mindir_serving.pyfunc import REQUIREMENTS

    imported = set()
    for path in Path(mindir_serving.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                imported.add(node.module.split(".")[0])
    required = set(REQUIREMENTS["fill_mask"])
    distributions = importlib.metadata.packages_distributions()  # PIL -> pillow; mlflow -> mlflow, mlflow-tracing, …
    outside = {
        next((d.lower() for d in distributions[name] if d.lower() in required), distributions[name][0].lower())
        for name in imported - set(sys.stdlib_module_names) - {"mindir_serving"}
    }
    assert outside == required
    assert set(REQUIREMENTS["image_classification"]) == outside - {"tokenizers"}  # BERT's tokenizer: BERT's only


def test_a_model_logged_before_its_code_shipped_with_it_still_loads_here(exported, tmp_path, monkeypatch):
    """A model logged before issue 43 runs a models-from-code file that imports the pyfunc from
    ``pipelines.tracking.models``: in this project's environment it loads and answers as a model logged today."""
    import mlflow

    from pipelines.tracking import models
    from tests.support.runner import empty_store, process_state_kept

    _, model, folder = exported
    earlier = tmp_path / "pyfunc_model.py"
    earlier.write_text(
        "import mlflow\n\nfrom pipelines.tracking.models import MindsporeModel\n\n"
        "mlflow.models.set_model(MindsporeModel())\n"
    )
    monkeypatch.setattr(models, "MODEL_CODE", earlier)
    with process_state_kept(tmp_path):
        shutil.copy(empty_store(), tmp_path / "mlflow.db")
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        with mlflow.start_run() as run:
            models.log_model(folder)
        loaded = models.load_model(run.info.run_id)
    expected = MindirClassifier.from_folder(folder).predict([model.example], top_k=2)
    pd.testing.assert_frame_equal(models.predictor(loaded, top_k=2)([model.example]), expected)
