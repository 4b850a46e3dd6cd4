"""Image files checked at ingest: which ones training could not use, and why.

Levels, each including the one before:

- ``none``: name, file type and size only (hidden, system, non-image, empty files and broken
  links are caught; the content is never read);
- ``header``: the header is parsed (format and size) and ``Image.verify`` run. Fast, but a file cut
  short after its header passes, and training later stops mid-epoch when it reaches it;
- ``decode``: every pixel is decoded, as training does. Truncated and corrupt files are caught.

Content checks (``header``, ``decode``) run in parallel worker processes and their verdicts are
kept in a SQLite cache keyed by (path, size, mtime), so a rerun re-reads only new or changed
files, and an interrupted verification resumes where it stopped.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from pipelines.processes import die_with_parent

logger = logging.getLogger(__name__)

VERIFY_MODES = ("none", "header", "decode")
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".webp")
# What MindSpore's Decode (libjpeg-turbo, OpenCV) reads; it rejects GIF and WebP content.
DECODABLE_FORMATS = ("JPEG", "PNG", "BMP")
# Files that operating systems and file browsers drop into folders.
SYSTEM_FILE_NAMES = ("thumbs.db", "ehthumbs.db", "desktop.ini", "icon\r", "__macosx")
_LEVEL_RANK = {"header": 1, "decode": 2}
# Files per task sent to a worker process: large enough to amortise the round trip.
_TASK_FILES = 64
# Below this many files to read, starting worker processes costs more than it saves.
_INLINE_MAX_FILES = 64


def is_hidden_or_system(name: str) -> bool:
    """Hidden (``.DS_Store``, ``._x.JPEG``) or operating-system file and folder names."""
    return name.startswith(".") or name.lower() in SYSTEM_FILE_NAMES


def entry_problem(entry: os.DirEntry) -> tuple[str | None, os.stat_result | None]:
    """Why a scanned directory entry is not a usable image by name, type and size (level ``none``), and its status.

    Links are followed: a link to an image is used like the image.
    """
    if is_hidden_or_system(entry.name):
        return "hidden or system file", None
    try:
        status = entry.stat()
    except FileNotFoundError:
        if entry.is_symlink():
            return f"broken symbolic link to {os.readlink(entry.path)}", None
        return "disappeared during the scan", None
    except OSError as error:  # e.g. a symbolic link loop, a permission denied on stat
        return f"cannot be opened: {error.strerror or error}", None
    if not stat.S_ISREG(status.st_mode):
        return "not a regular file", None
    suffix = os.path.splitext(entry.name)[1]
    if suffix.lower() not in IMAGE_EXTENSIONS:
        return f"not an image file (extension {suffix or 'none'!r})", None
    if status.st_size == 0:
        return "empty file", None
    return None, status


def content_problem(path: str | Path, level: str) -> str | None:
    """Why the content of ``path`` cannot be used at ``level`` (``header`` or ``decode``), or None."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed by the with block below)
    except OSError as error:
        return f"cannot be opened: {error.strerror or error}"
    try:
        with handle, Image.open(handle) as image:
            if image.format not in DECODABLE_FORMATS:
                return f"{image.format} content: training decodes {', '.join(DECODABLE_FORMATS)} only"
            if level == "decode":
                image.load()
            else:
                image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return f"cannot be decoded: {error}"
    return None


def _check_task(paths: Sequence[str], level: str) -> list[str | None]:
    """Worker-process task: the content problem of each path (None where usable)."""
    return [content_problem(path, level) for path in paths]


@dataclass(frozen=True, slots=True)  # one per file of the tree: slots keep it small
class FileState:
    """A file as found by the scan: the cache key of its verdict."""

    path: str
    size: int  # bytes
    mtime_ns: int


class VerdictCache:
    """Verdicts of earlier content checks, in SQLite: (path, size, mtime_ns) -> level, problem.

    A verdict is reused only for the same size and modification time, and only when it was
    reached at the level asked or a stricter one (a ``decode`` verdict answers ``header``).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Several processes (ranks, a second kedro run) may open it: wait for locks, not fail.
        self._db = sqlite3.connect(self.path, timeout=600)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS verdicts "
            "(path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, level INTEGER, problem TEXT)"
        )

    def close(self) -> None:
        self._db.close()

    def lookup(self, folder: str, files: Iterable[FileState], level: str) -> dict[str, str | None]:
        """Cached problems (None: usable) of those ``files``, all directly under ``folder``, that have one."""
        # One range query per folder: memory stays bounded by the largest class, not the tree.
        rows = self._db.execute(
            "SELECT path, size, mtime_ns, level, problem FROM verdicts WHERE path > ? AND path < ?",
            (folder + os.sep, folder + chr(ord(os.sep) + 1)),
        )
        known = {path: (size, mtime_ns, rank, problem) for path, size, mtime_ns, rank, problem in rows}
        wanted = _LEVEL_RANK[level]
        found = {}
        for file in files:
            hit = known.get(file.path)
            if hit is not None and hit[:2] == (file.size, file.mtime_ns) and hit[2] >= wanted:
                found[file.path] = hit[3]
        return found

    def store(self, verdicts: Iterable[tuple[FileState, str | None]], level: str) -> None:
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?)",
                [(f.path, f.size, f.mtime_ns, _LEVEL_RANK[level], problem) for f, problem in verdicts],
            )


class _Progress:
    """Files checked, files/s and ETA: a rich bar on a terminal, else a log line every 10 s."""

    LOG_EVERY_S = 10.0

    def __init__(self, total: int, description: str):
        from rich import get_console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.total, self.description, self.done = total, description, 0
        self.started = self.last_log = time.perf_counter()
        self.bar = None
        console = get_console()
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>8.0f} files/s  ETA"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(description, total=total, rate=0.0)

    def advance(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        rate = self.done / max(now - self.started, 1e-9)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, rate=rate)
        elif now - self.last_log >= self.LOG_EVERY_S:
            self.last_log = now
            eta = (self.total - self.done) / max(rate, 1e-9)
            logger.info(
                "%s: %d/%d files (%.1f%%), %.0f files/s, ETA %d:%02d",
                self.description,
                self.done,
                self.total,
                100 * self.done / self.total,
                rate,
                eta // 60,
                eta % 60,
            )

    def close(self) -> float:
        """Stop drawing; returns the seconds taken."""
        if self.bar is not None:
            self.bar.stop()
        return time.perf_counter() - self.started


def worker_count() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_contents(files: Sequence[FileState], level: str, workers: int | None = None) -> Iterator[list]:
    """Content problems of ``files`` at ``level``, yielded as lists of (file, problem) as they finish.

    Runs in ``workers`` processes (default: every core) unless there are only a few files.
    PIL releases the GIL while decoding, but opening and parsing headers hold it, so processes
    (spawned, not forked from a process that may hold MindSpore's threads) scale where threads would not.
    """
    workers = workers or worker_count()
    if workers == 1 or len(files) <= _INLINE_MAX_FILES:
        for start in range(0, len(files), _TASK_FILES):
            batch = files[start : start + _TASK_FILES]
            yield list(zip(batch, _check_task([f.path for f in batch], level), strict=True))
        return
    # spawned, so that each worker is this process's own child and ends with it (a kill -9 of kedro run leaves no
    # orphan decoding on); a forkserver would be the workers' parent and outlive this process
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=die_with_parent, initargs=(signal.SIGKILL, os.getpid())
    ) as pool:
        batches = {}
        for start in range(0, len(files), _TASK_FILES):
            batch = files[start : start + _TASK_FILES]
            batches[pool.submit(_check_task, [f.path for f in batch], level)] = batch
        for future in as_completed(batches):
            yield list(zip(batches.pop(future), future.result(), strict=True))


def verify_files(
    folders: Sequence[tuple[str, Sequence[FileState]]],
    level: str,
    cache_path: str | Path | None,
    workers: int | None = None,
) -> tuple[dict[str, str | None], int]:
    """Content problem of every file (None: usable) at ``level``, and how many files were read.

    ``folders``: (folder, files directly in it) pairs. Files with a cached verdict for the same
    size and mtime are not read again; the new verdicts are stored as they arrive. Without
    ``cache_path`` nothing is cached.
    """
    if level not in _LEVEL_RANK:
        raise ValueError(f"content checks run at level 'header' or 'decode', not {level!r}")
    problems: dict[str, str | None] = {}
    todo: list[FileState] = []
    cache = VerdictCache(cache_path) if cache_path is not None else None
    try:
        for folder, files in folders:
            cached = cache.lookup(folder, files, level) if cache is not None else {}
            problems.update(cached)
            todo.extend(f for f in files if f.path not in cached)
        if not todo:
            return problems, 0
        progress = _Progress(len(todo), f"Verifying images ({level})")
        try:
            for verdicts in check_contents(todo, level, workers):
                problems.update((f.path, problem) for f, problem in verdicts)
                if cache is not None:
                    cache.store(verdicts, level)
                progress.advance(len(verdicts))
        finally:
            elapsed = progress.close()
    finally:
        if cache is not None:
            cache.close()
    logger.info(
        "Verified %d file(s) at level %r in %.1f s (%.0f files/s); %d verdict(s) came from the cache",
        len(todo),
        level,
        elapsed,
        len(todo) / max(elapsed, 1e-9),
        len(problems) - len(todo),
    )
    return problems, len(todo)
