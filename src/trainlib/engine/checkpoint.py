"""Checkpoints on disk: safetensors files written atomically, loaded with clear errors.

A ``Checkpoint`` is plain data (name -> numpy array, plus metadata), so it can travel between
Kedro nodes as a catalog dataset and be inspected without building a network.

Every checkpoint is written in one format, safetensors (the ``safetensors`` package; MindSpore's own
``format="safetensors"`` wraps it but has no room for our metadata): a JSON header (names, dtypes, shapes, offsets,
and our metadata as one JSON string under ``METADATA_KEY``), then the raw arrays. Unlike MindSpore's ``.ckpt`` (one
protobuf message, read whole, then parsed; protobuf documents a 2 GB limit, and thor_bert's 3.66 GB checkpoint failed
with ``DecodeError``) it has no size limit, is written without a copy and read into one copy 2.5-10x faster, and its
metadata is read from the header alone (a resume's look through a folder). One format for all, as it costs nothing at
the usual sizes (docs/results.md#checkpoints). Names keep ``.ckpt`` (``.safetensors`` is accepted too), so the
catalog's paths, the ``epoch_NNNN.ckpt`` files and the MLflow artifacts are unchanged; the loader tells the formats
apart by content, so the ``.ckpt`` files MindSpore wrote before 2026-11-26 still load.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainlib.atomic_write import NoSpaceError, atomic_path, no_space_error, remove_abandoned_temporaries

METADATA_TYPES = (int, float, bool, str)
# Metadata travels as one JSON string (safetensors' header holds strings only; MindSpore's .ckpt would have turned
# numeric extras into parameters): the entry of that name in the safetensors header, a string entry in a .ckpt.
METADATA_KEY = "__metadata__"
# MindSpore's .ckpt stores 0-d arrays as shape (1,); it kept their names in the metadata to restore the shape.
SCALARS_KEY = "__scalars__"
OPTIMIZER_PREFIX = "optimizer."
SUFFIXES = (".ckpt", ".safetensors")


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt or does not fit the network."""


class CheckpointMemoryError(CheckpointError):
    """An intact checkpoint file whose arrays do not fit in the available memory (a load reads every array; MindSpore
    reads a ``.ckpt`` whole before parsing it)."""


@dataclass
class Checkpoint:
    params: dict[str, np.ndarray]
    metadata: dict[str, int | float | bool | str] = field(default_factory=dict)

    def network_params(self) -> dict[str, np.ndarray]:
        """The network's own parameters (optimizer state left out)."""
        return {k: v for k, v in self.params.items() if not k.startswith(OPTIMIZER_PREFIX)}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """Optimizer state (moments, step, lr), under the optimizer's own parameter names."""
        return {k.removeprefix(OPTIMIZER_PREFIX): v for k, v in self.params.items() if k.startswith(OPTIMIZER_PREFIX)}


class CheckpointSpaceError(NoSpaceError):
    """The disk holding a checkpoint's folder is full; the message names the folder and the space needed."""


def _space_error(path: Path, needed_bytes: int) -> NoSpaceError:
    return no_space_error(
        path,
        needed_bytes,
        "a checkpoint of this training",
        " (or point the training's checkpoint.dir at a larger disk), then rerun the same command: it resumes from the "
        "last checkpoint written",
        CheckpointSpaceError,
    )


def _no_space(error: BaseException) -> bool:
    """Whether ``error`` is a full disk: an ``OSError`` of ``ENOSPC``, or safetensors' error around one."""
    if isinstance(error, OSError):
        return error.errno == errno.ENOSPC
    return "No space left on device" in str(error) or "StorageFull" in str(error)


def _arrays(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """The parameters as C-contiguous numeric arrays (0-d ones stay 0-d), without copying those that already are."""
    arrays = {}
    for name, value in checkpoint.params.items():
        array = np.asarray(value)
        if array.dtype.kind not in "biufc":
            raise CheckpointError(f"checkpoint parameter {name} must be a numeric array, got dtype {array.dtype}")
        arrays[name] = array if array.flags.c_contiguous else array.copy(order="C")
    return arrays


def save_checkpoint(checkpoint: Checkpoint, path: str | Path) -> None:
    """Write ``checkpoint`` to ``path`` (safetensors, any size) so that readers see either the old file or the whole
    new one."""
    from safetensors.numpy import save_file

    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise CheckpointError(f"checkpoint path {path} must end in .ckpt or .safetensors")
    bad_meta = {k: type(v).__name__ for k, v in checkpoint.metadata.items() if not isinstance(v, METADATA_TYPES)}
    if bad_meta:
        raise CheckpointError(f"checkpoint metadata must be int/float/bool/str, got {bad_meta}")
    arrays = _arrays(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_temporaries(path.parent)
    tmp = atomic_path(path)
    try:
        save_file(arrays, tmp, metadata={METADATA_KEY: json.dumps(checkpoint.metadata)})
        os.replace(tmp, path)
    except Exception as error:  # OSError, or safetensors' SafetensorError around one
        if _no_space(error):
            raise _space_error(path, sum(array.nbytes for array in arrays.values())) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)


def available_memory() -> int | None:
    """Bytes the kernel can give a process now without swapping (``MemAvailable``: free memory plus the page cache
    it can reclaim); ``None`` where ``/proc/meminfo`` does not say."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    found = [int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")]
    return found[0] if found else None


@contextmanager
def _reclaimable_cache_counted() -> Iterator[None]:
    """MindSpore 2.10 refuses a ``.ckpt`` larger than the *free* pages (``SC_AVPHYS_PAGES``), which leave out the
    page cache: right after a training wrote a large checkpoint, the cache holds it and an 862 MB file was refused
    on a 23 GB machine with 13 GB of cache. Its check is given ``available_memory`` instead while it reads."""
    from mindspore.train import serialization

    own = getattr(serialization, "_get_available_memory", None)
    if own is None or available_memory() is None:
        yield
        return
    serialization._get_available_memory = available_memory
    try:
        yield
    finally:
        serialization._get_available_memory = own


def _out_of_memory(error: BaseException) -> bool:
    """MindSpore's two ways of saying a ``.ckpt`` does not fit in memory: its refusal before reading
    (``_CheckpointProtobufSizeError``) and the ``ValueError`` it raises from a ``MemoryError`` while parsing."""
    return any(
        isinstance(e, MemoryError) or type(e).__name__ == "_CheckpointProtobufSizeError"
        for e in (error, error.__cause__)
    )


def is_safetensors(path: str | Path) -> bool:
    """Whether the file at ``path`` begins as a safetensors file does (an 8-byte header length, then the JSON
    header's ``{``); a MindSpore ``.ckpt`` (protobuf: a field tag, a length, a parameter's name) never does."""
    with Path(path).open("rb") as file:
        head = file.read(9)
    return len(head) == 9 and head[8:9] == b"{"


def _fits_in_memory(path: Path) -> None:
    """Raise ``CheckpointMemoryError`` when the arrays of the safetensors file ``path`` (about its size) exceed the
    memory available now (``MemAvailable``, the reclaimable page cache counted: the file's own pages are)."""
    size, available = path.stat().st_size, available_memory()
    if available is not None and size > available:
        raise CheckpointMemoryError(
            f"checkpoint {path} ({size / 1e6:.0f} MB) does not fit in the available memory now "
            f"({available / 1e6:.0f} MB): a load reads every array into memory"
        )


def _read_safetensors(path: Path, with_arrays: bool = True) -> Checkpoint:
    """The checkpoint in the safetensors file ``path``; without ``with_arrays`` only its metadata (the header)."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="numpy") as file:  # checks that the header covers the whole file
            header = file.metadata() or {}
            params = {}
            if with_arrays:
                _fits_in_memory(path)
                params = {name: file.get_tensor(name) for name in file.keys()}
        metadata = json.loads(header.get(METADATA_KEY, "{}"))
    except CheckpointError:
        raise
    except MemoryError as error:
        raise CheckpointMemoryError(
            f"checkpoint {path} ({path.stat().st_size / 1e6:.0f} MB) does not fit in the available memory now: "
            "it ran out while reading the arrays"
        ) from error
    except Exception as error:  # safetensors' SafetensorError (truncated, bad header), or the metadata's JSON
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {error}") from error
    if with_arrays and not params:
        raise CheckpointError(f"checkpoint {path} holds no parameters")
    return Checkpoint(params, metadata)


def _read_mindspore_ckpt(path: Path) -> Checkpoint:
    """The checkpoint in the MindSpore ``.ckpt`` (protobuf) file ``path``, as written before 2026-11-26."""
    import mindspore as ms

    try:
        with _reclaimable_cache_counted():
            loaded = ms.load_checkpoint(str(path))
    except Exception as error:  # MindSpore raises ValueError/RuntimeError/DecodeError alike
        if _out_of_memory(error):
            raise CheckpointMemoryError(
                f"checkpoint {path} ({path.stat().st_size / 1e6:.0f} MB) does not fit in the available memory now: "
                f"MindSpore reads a .ckpt whole before parsing it ({error})"
            ) from error
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {error}") from error
    metadata = json.loads(loaded.pop(METADATA_KEY, "{}"))
    if not loaded:
        raise CheckpointError(f"checkpoint {path} holds no parameters")
    scalars = set(metadata.pop(SCALARS_KEY, []))
    params = {name: value.asnumpy() for name, value in loaded.items()}
    return Checkpoint({k: v.reshape(()) if k in scalars else v for k, v in params.items()}, metadata)


def _format_is_safetensors(path: Path) -> bool:
    """``is_safetensors``, a missing or unreadable file a ``CheckpointError`` naming it."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return is_safetensors(path)
    except OSError as error:
        raise CheckpointError(f"checkpoint {path} cannot be read: {error}") from error


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint file (safetensors, or an older MindSpore ``.ckpt``); a missing, truncated or corrupt file
    raises ``CheckpointError`` naming it, one whose arrays do not fit in the available memory
    ``CheckpointMemoryError``."""
    path = Path(path)
    return _read_safetensors(path) if _format_is_safetensors(path) else _read_mindspore_ckpt(path)


def load_metadata(path: str | Path) -> dict[str, int | float | bool | str]:
    """A checkpoint file's metadata, read from the safetensors header alone (an older ``.ckpt`` is read whole); the
    same errors as ``load_checkpoint`` for a missing, truncated or corrupt file."""
    path = Path(path)
    if _format_is_safetensors(path):
        return _read_safetensors(path, with_arrays=False).metadata
    return _read_mindspore_ckpt(path).metadata


def check_compatible(expected: dict[str, tuple[int, ...]], checkpoint: Checkpoint, source: str) -> None:
    """Raise ``CheckpointError`` naming ``source`` if the network parameters differ in names or shapes."""
    found = {name: tuple(v.shape) for name, v in checkpoint.network_params().items()}
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    reshaped = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
    problems = []
    if missing:
        problems.append(f"missing {missing[:5]}")
    if extra:
        problems.append(f"unexpected {extra[:5]}")
    if reshaped:
        problems.append(", ".join(f"{n} has shape {found[n]} instead of {expected[n]}" for n in reshaped[:5]))
    if problems:
        raise CheckpointError(f"checkpoint {source} does not match the network: {'; '.join(problems)}")
