"""Checkpoints on disk: MindSpore ``.ckpt`` files written atomically, loaded with clear errors.

A ``Checkpoint`` is plain data (name -> numpy array, plus metadata), so it can travel between
Kedro nodes as a catalog dataset and be inspected without building a network.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

METADATA_TYPES = (int, float, bool, str)
# Metadata travels as one JSON string: MindSpore would turn numeric extras into parameters.
METADATA_KEY = "__metadata__"
# MindSpore stores 0-d arrays as shape (1,); their names are kept to restore the shape on load.
SCALARS_KEY = "__scalars__"
OPTIMIZER_PREFIX = "optimizer."


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt or does not fit the network."""


class CheckpointMemoryError(CheckpointError):
    """An intact checkpoint file larger than the available memory: MindSpore reads a ``.ckpt`` whole before parsing."""


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


class CheckpointSpaceError(OSError):
    """The disk holding a checkpoint's folder is full; the message names the folder and the space needed."""


# Temporaries are ``.<name>.<host>-<pid>.tmp<suffix>``; MindSpore's ``save_checkpoint`` writes its own
# ``.<name>.<host>-<pid>.tmp.tmp`` before renaming it onto ours, and a kill or a full disk can leave either.
TEMPORARY_MARK = ".tmp"


def atomic_path(path: Path) -> Path:
    """Temporary sibling of ``path``; write there, then ``os.replace`` onto ``path``."""
    return path.with_name(f".{path.stem}.{socket.gethostname()}-{os.getpid()}{TEMPORARY_MARK}{path.suffix}")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_abandoned_temporaries(directory: str | Path) -> list[Path]:
    """Remove the temporaries in ``directory`` left by a process of this host that no longer runs (a kill, or
    a full disk during a save); returns those removed. Another host's (a shared folder) and a live process's
    are left alone."""
    directory = Path(directory)
    prefix = f"{socket.gethostname()}-"
    removed = []
    for path in directory.glob(f".*{TEMPORARY_MARK}*") if directory.is_dir() else ():
        owner = path.name.split(TEMPORARY_MARK, 1)[0].rsplit(".", 1)[-1]
        pid = owner.removeprefix(prefix)
        if owner.startswith(prefix) and pid.isdigit() and not _process_alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _space_error(path: Path, needed_bytes: int) -> CheckpointSpaceError:
    free = shutil.disk_usage(path.parent).free
    return CheckpointSpaceError(
        errno.ENOSPC,
        f"no space left on the device of {path.parent} to write {path.name}: a checkpoint of this training needs "
        f"about {needed_bytes / 1e6:.1f} MB and {free / 1e6:.1f} MB are free. Free space there (or point the "
        "training's checkpoint.dir at a larger disk), then rerun the same command: it resumes from the last "
        "checkpoint written",
    )


def write_atomically(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` so that readers (and a rerun after a kill) see the whole file or none."""
    tmp = atomic_path(path)
    try:
        tmp.write_bytes(payload)
        os.replace(tmp, path)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise _space_error(path, len(payload)) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(checkpoint: Checkpoint, path: str | Path) -> None:
    """Write ``checkpoint`` to ``path`` so that readers see either the old file or the whole new one."""
    import mindspore as ms

    path = Path(path)
    if path.suffix != ".ckpt":
        raise CheckpointError(f"checkpoint path {path} must end in .ckpt")
    bad_meta = {k: type(v).__name__ for k, v in checkpoint.metadata.items() if not isinstance(v, METADATA_TYPES)}
    if bad_meta:
        raise CheckpointError(f"checkpoint metadata must be int/float/bool/str, got {bad_meta}")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_temporaries(path.parent)
    tmp = atomic_path(path)
    metadata = {**checkpoint.metadata, SCALARS_KEY: sorted(k for k, v in checkpoint.params.items() if np.ndim(v) == 0)}
    entries = [
        {"name": name, "data": ms.Tensor(np.ascontiguousarray(value))} for name, value in checkpoint.params.items()
    ]
    try:
        ms.save_checkpoint(entries, str(tmp), append_dict={METADATA_KEY: json.dumps(metadata)})
        os.replace(tmp, path)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise _space_error(path, sum(np.asarray(value).nbytes for value in checkpoint.params.values())) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(TEMPORARY_MARK).unlink(missing_ok=True)  # MindSpore's own temporary


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


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a ``.ckpt`` file; a missing, truncated or corrupt file raises ``CheckpointError`` naming it."""
    import mindspore as ms

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
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
