"""``ArtifactHooks``: catalog datasets as MLflow artifacts, up to a size.

A catalog entry marks its file as an artifact in its metadata::

    "{recipe}.{training}.final_checkpoint":
      type: pipelines.catalog.CheckpointDataset
      filepath: data/06_models/{recipe}/{training}.ckpt
      metadata:
        mlflow_artifact:
          folder: checkpoints      # the artifact folder
          training: "{training}"   # optional: the training's child run holds it (tracking.trainings)

After each save, the file goes into the run's artifacts if it is at most ``tracking.artifact_max_mb``; a larger
one stays where it is, and the run gets three tags instead, ``artifact/<folder>/<file name>/path`` (absolute),
``…/bytes`` and ``…/sha256``, enough to find the file again and check it is the one this run wrote.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from kedro.framework.hooks import hook_impl

from pipelines.tracking.trainings import training_run
from pipelines.tracking.writer import log_artifact, set_tags
from trainlib.params import TrackingParams

logger = logging.getLogger(__name__)

METADATA_KEY = "mlflow_artifact"
BYTES_PER_MB = 1_000_000
TAG_PREFIX = "artifact"
_HASH_CHUNK = 1 << 20


def declared_file(catalog, dataset_name: str, key: str) -> tuple[Path, dict] | None:
    """The file (or folder) of the catalog dataset ``dataset_name`` and what its metadata declares under ``key``
    (``mlflow_artifact``, ``mlflow_model``), or None when it declares nothing there."""
    if catalog is None or dataset_name not in catalog:
        return None
    spec = (getattr(catalog.get(dataset_name), "metadata", None) or {}).get(key)
    if not spec:
        return None
    # the file as the catalog's entry names it, from which Kedro built the dataset: its resolved configuration (a
    # dataset factory's with the name's placeholders filled in), the path made absolute under the project
    return Path(catalog.config_resolver.resolve_pattern(dataset_name)["filepath"]), spec


def in_training_run(training: str | None):
    """The child run of ``training`` (``tracking.trainings``) when one is named, else the active run as it is."""
    return training_run(training) if training else nullcontext()


@dataclass(frozen=True)
class Artifact:
    """A saved file to log: where it is, its artifact folder, and the child run (training) that holds it."""

    file: Path
    folder: str
    training: str | None = None

    @classmethod
    def of(cls, catalog, dataset_name: str) -> Artifact | None:
        """The artifact the catalog dataset ``dataset_name``'s metadata declares, or None."""
        declared = declared_file(catalog, dataset_name, METADATA_KEY)
        if declared is None:
            return None
        file, spec = declared
        return cls(file, spec["folder"], spec.get("training"))

    @property
    def tag_key(self) -> str:
        return f"{TAG_PREFIX}/{self.folder}/{self.file.name}"


def sha256(path: Path) -> str:
    """Hex sha256 of the file ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def log(artifact: Artifact, max_bytes: float) -> None:
    """Copy ``artifact`` into the active run (its child run ``training``), or tag its path, size and sha256
    when the file is larger than ``max_bytes``. A folder (a dataset saved as several files, e.g. a mapping of
    figures) logs each of its files, and nothing when it holds none or is not there."""
    if artifact.file.is_dir() or not artifact.file.exists():
        files = sorted(path for path in artifact.file.iterdir() if path.is_file()) if artifact.file.is_dir() else []
        for file in files:
            log(replace(artifact, file=file), max_bytes)
        return
    size = artifact.file.stat().st_size
    with in_training_run(artifact.training):
        if size <= max_bytes:
            log_artifact(artifact.file, artifact.folder)
            return
        logger.info(
            "%s is %.1f MB, above tracking.artifact_max_mb (%g): logged its path, size and sha256 as tags of the "
            "MLflow run instead of the file",
            artifact.file,
            size / BYTES_PER_MB,
            max_bytes / BYTES_PER_MB,
        )
        set_tags(
            {
                f"{artifact.tag_key}/path": str(artifact.file.resolve()),
                f"{artifact.tag_key}/bytes": str(size),
                f"{artifact.tag_key}/sha256": sha256(artifact.file),
            }
        )


class ArtifactHooks:
    """Logs each saved catalog dataset that declares ``mlflow_artifact`` (see the module docstring)."""

    def __init__(self) -> None:
        self._catalog = None
        self._max_bytes = 0.0

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog = catalog
        self._max_bytes = TrackingParams.model_validate(catalog.load("params:tracking")).artifact_max_mb * BYTES_PER_MB

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data, node) -> None:
        artifact = Artifact.of(self._catalog, dataset_name)
        if artifact is not None:
            log(artifact, self._max_bytes)
