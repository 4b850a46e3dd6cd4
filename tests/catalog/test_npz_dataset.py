"""NpzArraysDataset: named arrays round trip; a truncated file is named in the error; nothing half-written stays."""

from __future__ import annotations

import numpy as np
import pytest
from kedro.io import DatasetError

from pipelines.catalog import NpzArraysDataset


def test_round_trip_keeps_names_dtypes_and_values(tmp_path):
    arrays = {"input_ids": np.arange(12, dtype=np.int32).reshape(3, 4), "weights": np.ones(3, np.float32)}
    dataset = NpzArraysDataset(filepath=str(tmp_path / "examples" / "train.npz"))
    dataset.save(arrays)
    loaded = dataset.load()
    assert loaded.keys() == arrays.keys()
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded[name], array)
    assert [p.name for p in (tmp_path / "examples").iterdir()] == ["train.npz"]  # no temporary left


def test_a_truncated_file_is_named(tmp_path):
    path = tmp_path / "train.npz"
    NpzArraysDataset(filepath=str(path)).save({"a": np.arange(1000)})
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match="train.npz is missing, truncated"):
        NpzArraysDataset(filepath=str(path)).load()
