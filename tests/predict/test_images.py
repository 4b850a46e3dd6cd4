"""Which images a prediction reads, how it scores the labelled ones, and that a file it cannot read is named."""

from __future__ import annotations

import pandas as pd
import pytest

from mindir_serving.classifier import prediction_columns
from tests.support.trees import write_image_tree
from trainlib.predict.images import ImageSourceError, accuracy, bad_images, classify, list_images

CLASSES = ("cat", "dog")


def test_a_folder_gives_every_image_below_it_labelled_by_a_class_folder(tmp_path):
    write_image_tree(tmp_path / "tree", classes=CLASSES, per_class={"val": 2})
    (tmp_path / "tree/val/unsorted").mkdir()
    write_image_tree(tmp_path / "loose", classes=("x",), per_class={"val": 1})
    (tmp_path / "loose/val/x/x_val_000.png").rename(tmp_path / "tree/val/unsorted/photo.png")
    (tmp_path / "tree/val/notes.txt").write_text("not an image")
    images = list_images(tmp_path / "tree", split="val", classes=CLASSES)
    assert list(images.columns) == ["path", "class_name"]
    assert [path.split("tree/")[1] for path in images["path"]] == [
        "val/cat/cat_val_000.png",
        "val/cat/cat_val_001.png",
        "val/dog/dog_val_000.png",
        "val/dog/dog_val_001.png",
        "val/unsorted/photo.png",
    ]
    assert list(images["class_name"]) == ["cat", "cat", "dog", "dog", ""]


def test_a_manifest_gives_the_rows_of_its_split(tmp_path):
    manifest = pd.DataFrame(
        {"path": ["a.png", "b.png", "c.png"], "class_name": ["cat", "dog", "cat"], "split": ["train", "val", "val"]}
    )
    manifest.to_csv(tmp_path / "manifest.csv", index=False)
    images = list_images(tmp_path / "manifest.csv", split="val", classes=CLASSES)
    assert images.to_dict("list") == {"path": ["b.png", "c.png"], "class_name": ["dog", "cat"]}
    with pytest.raises(ImageSourceError, match=r"manifest.csv has no 'test' rows: set predict.split to one of"):
        list_images(tmp_path / "manifest.csv", split="test", classes=CLASSES)


def test_a_missing_or_empty_source_is_named(tmp_path):
    with pytest.raises(ImageSourceError, match=r"predict.images .*nowhere is neither a folder nor a manifest CSV"):
        list_images(tmp_path / "nowhere", split="val", classes=CLASSES)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageSourceError, match=r"predict.images .*empty holds no image"):
        list_images(tmp_path / "empty", split="val", classes=CLASSES)


def fake_predictions(images: list[bytes]) -> pd.DataFrame:
    """Stands in for the model in these table checks only: class ``dog`` first, for every image sent."""
    rows = [{"class_1": "dog", "class_2": "cat", "probability_1": 0.9, "probability_2": 0.1, "error": ""}] * len(images)
    return pd.DataFrame(rows, columns=prediction_columns(2))


def test_a_file_that_cannot_be_read_is_named_and_the_others_are_classified(tmp_path):
    (tmp_path / "a.png").write_bytes(b"a")
    images = pd.DataFrame({"path": [str(tmp_path / "a.png"), str(tmp_path / "gone.png")], "class_name": ["dog", ""]})
    sent = []
    predictions = classify(images, lambda contents: sent.append(contents) or fake_predictions(contents))
    assert sent == [[b"a", b""]]
    assert list(predictions["path"]) == list(images["path"])
    assert predictions["error"].iloc[0] == "" and predictions["error"].iloc[1].startswith("cannot read the file")
    assert bad_images(predictions).to_dict("list") == {
        "path": [str(tmp_path / "gone.png")],
        "error": [predictions["error"].iloc[1]],
        "warning": [""],
    }


def test_accuracy_counts_only_classified_images_of_a_known_class():
    predictions = pd.DataFrame(
        {
            "path": ["1", "2", "3", "4", "5"],
            "class_name": ["dog", "cat", "cat", "", "dog"],
            "class_1": ["dog", "dog", "cat", "cat", None],
            "class_2": ["cat", "fox", "dog", "dog", None],
            "error": ["", "", "", "", "cannot read the file"],
        }
    )
    assert accuracy(predictions) == {"top1": 2 / 3, "top2": 2 / 3, "images": 3}
    assert accuracy(predictions.drop(columns="class_2")) == {"top1": 2 / 3, "images": 3}  # one class per image
    assert accuracy(predictions.assign(class_name="")) == {}
