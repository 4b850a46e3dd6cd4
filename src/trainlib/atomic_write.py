"""Files written whole or not at all: a temporary sibling, then ``os.replace`` onto the name, so that a reader (and
a rerun after a kill) sees the whole file or none; the temporaries a killed process left are removed by the next
writer of the folder. Checkpoints (``engine.checkpoint``), the launcher's job files (``distributed.launch``), the
study's records and the catalog's arrays are written this way; it sits below all of them."""

from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path

from trainlib.processes import process_alive


class NoSpaceError(OSError):
    """The disk holding a file's folder is full; the message names the folder and the space needed."""


# Temporaries are ``.<name>.<host>-<pid>.tmp<suffix>``, which a kill or a full disk can leave; so can MindSpore's
# ``save_checkpoint``'s own ``.<name>.<host>-<pid>.tmp.tmp``, which wrote .ckpt files before 2026-11-26.
TEMPORARY_MARK = ".tmp"


def atomic_path(path: Path) -> Path:
    """Temporary sibling of ``path``; write there, then ``os.replace`` onto ``path``."""
    return path.with_name(f".{path.stem}.{socket.gethostname()}-{os.getpid()}{TEMPORARY_MARK}{path.suffix}")


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
        if owner.startswith(prefix) and pid.isdigit() and not process_alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def no_space_error(
    path: Path, needed_bytes: int, what: str, advice: str, error_class: type[NoSpaceError] = NoSpaceError
) -> NoSpaceError:
    """``error_class`` for ``path``, which ``what`` needs ``needed_bytes`` for; ``advice`` follows "Free space
    there"."""
    free = shutil.disk_usage(path.parent).free
    return error_class(
        errno.ENOSPC,
        f"no space left on the device of {path.parent} to write {path.name}: {what} needs about "
        f"{needed_bytes / 1e6:.1f} MB and {free / 1e6:.1f} MB are free. Free space there{advice}",
    )


def write_atomically(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` so that readers (and a rerun after a kill) see the whole file or none."""
    tmp = atomic_path(path)
    try:
        tmp.write_bytes(payload)
        os.replace(tmp, path)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise no_space_error(path, len(payload), "the file", ", then rerun the same command") from error
        raise
    finally:
        tmp.unlink(missing_ok=True)
