"""Kedro datasets of this project."""

from .checkpoint_dataset import CheckpointDataset
from .numpy_dataset import NumpyArrayDataset

__all__ = ["CheckpointDataset", "NumpyArrayDataset"]
