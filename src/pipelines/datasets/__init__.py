"""Kedro datasets of this project."""

from .checkpoint_dataset import CheckpointDataset

__all__ = ["CheckpointDataset"]
