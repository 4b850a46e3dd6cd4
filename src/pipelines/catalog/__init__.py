"""Kedro datasets of this project."""

from .checkpoint_dataset import CheckpointDataset
from .csv_dataset import CSVDataset
from .model_dataset import ModelDataset
from .npz_dataset import NpzArraysDataset
from .numpy_dataset import NumpyArrayDataset

__all__ = ["CheckpointDataset", "CSVDataset", "ModelDataset", "NpzArraysDataset", "NumpyArrayDataset"]
