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
from array import array
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from trainlib.processes import die_with_parent

logger = logging.getLogger(__name__)

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
# Tasks queued per worker process beyond the one it runs: keeps every worker busy, bounds what waits in memory.
_TASKS_AHEAD = 4


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


@dataclass(frozen=True, slots=True)  # made only for the files being checked or stored at a time
class FileState:
    """A file as found by the scan: the cache key of its verdict."""

    path: str
    size: int  # bytes
    mtime_ns: int


@dataclass
class FolderFiles:
    """The candidate images of one class folder (sub-folders included), held compactly: names relative to
    ``folder`` and two integer arrays. A Python object and a full path per file would cost about 200 bytes
    each, 250 MB for ImageNet's 1.28 M files; this holds the name (about 80 bytes) and 16 bytes."""

    folder: str
    names: list[str] = field(default_factory=list)
    sizes: array = field(default_factory=lambda: array("q"))  # bytes
    mtimes_ns: array = field(default_factory=lambda: array("q"))

    def add(self, name: str, size: int, mtime_ns: int) -> None:
        self.names.append(name)
        self.sizes.append(size)
        self.mtimes_ns.append(mtime_ns)

    def sort(self) -> None:
        """Names in order (paths sort as their names do within one folder)."""
        order = sorted(range(len(self.names)), key=self.names.__getitem__)
        self.names = [self.names[i] for i in order]
        self.sizes = array("q", (self.sizes[i] for i in order))
        self.mtimes_ns = array("q", (self.mtimes_ns[i] for i in order))

    def __len__(self) -> int:
        return len(self.names)

    def path(self, index: int) -> str:
        return self.folder + os.sep + self.names[index]

    def state(self, index: int) -> FileState:
        return FileState(self.path(index), self.sizes[index], self.mtimes_ns[index])


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

    def lookup(self, files: FolderFiles, level: str) -> dict[int, str | None]:
        """Cached problems (None: usable) of those of ``files`` that have one, by index in ``files``."""
        # One range query per folder: memory stays bounded by the largest class, not the tree.
        rows = self._db.execute(
            "SELECT path, size, mtime_ns, level, problem FROM verdicts WHERE path > ? AND path < ?",
            (files.folder + os.sep, files.folder + chr(ord(os.sep) + 1)),
        )
        known = {path: (size, mtime_ns, rank, problem) for path, size, mtime_ns, rank, problem in rows}
        wanted = _LEVEL_RANK[level]
        found = {}
        for index in range(len(files)):
            hit = known.get(files.path(index))
            if hit is not None and hit[:2] == (files.sizes[index], files.mtimes_ns[index]) and hit[2] >= wanted:
                found[index] = hit[3]
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


def _batches(files: Iterable[FileState]) -> Iterator[list[FileState]]:
    iterator = iter(files)
    while batch := list(islice(iterator, _TASK_FILES)):
        yield batch


def check_contents(
    files: Iterable[FileState], count: int, level: str, workers: int | None = None
) -> Iterator[list[tuple[FileState, str | None]]]:
    """Content problems of the ``count`` ``files`` at ``level``, yielded as lists of (file, problem) as they finish.

    Runs in ``workers`` processes (default: every core) unless there are only a few files. ``files`` is taken
    as the workers need it, a few tasks ahead, so the files waiting are never all in memory.
    PIL releases the GIL while decoding, but opening and parsing headers hold it, so processes
    (spawned, not forked from a process that may hold MindSpore's threads) scale where threads would not.
    """
    workers = workers or worker_count()
    if workers == 1 or count <= _INLINE_MAX_FILES:
        for batch in _batches(files):
            yield list(zip(batch, _check_task([f.path for f in batch], level), strict=True))
        return
    # spawned, so that each worker is this process's own child and ends with it (a kill -9 of kedro run leaves no
    # orphan decoding on); a forkserver would be the workers' parent and outlive this process
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=die_with_parent, initargs=(signal.SIGKILL, os.getpid())
    ) as pool:
        waiting = _batches(files)
        running = {}
        for batch in islice(waiting, _TASKS_AHEAD * workers):
            running[pool.submit(_check_task, [f.path for f in batch], level)] = batch
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                yield list(zip(running.pop(future), future.result(), strict=True))
                for batch in islice(waiting, 1):
                    running[pool.submit(_check_task, [f.path for f in batch], level)] = batch


def verify_files(
    folders: Sequence[FolderFiles], level: str, cache_path: str | Path | None, workers: int | None = None
) -> tuple[dict[str, str], int]:
    """The content problem of every file that has one at ``level`` (a file not listed is usable), by path, and how
    many files were read.

    Files with a cached verdict for the same size and mtime are not read again; the new verdicts are stored as
    they arrive. Without ``cache_path`` nothing is cached. Usable files are not listed, so that a tree of a
    million files costs memory for its bad files only.
    """
    if level not in _LEVEL_RANK:
        raise ValueError(f"content checks run at level 'header' or 'decode', not {level!r}")
    problems: dict[str, str] = {}
    unread: list[tuple[FolderFiles, array]] = []  # each folder's files without a cached verdict, by index
    from_cache = to_read = 0
    cache = VerdictCache(cache_path) if cache_path is not None else None
    try:
        for files in folders:
            cached = cache.lookup(files, level) if cache is not None else {}
            from_cache += len(cached)
            problems.update((files.path(i), problem) for i, problem in cached.items() if problem is not None)
            indices = array("l", (i for i in range(len(files)) if i not in cached))
            if indices:
                unread.append((files, indices))
                to_read += len(indices)
        if not to_read:
            return problems, 0
        states = (files.state(i) for files, indices in unread for i in indices)
        progress = _Progress(to_read, f"Verifying images ({level})")
        try:
            for verdicts in check_contents(states, to_read, level, workers):
                problems.update((f.path, problem) for f, problem in verdicts if problem is not None)
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
        to_read,
        level,
        elapsed,
        to_read / max(elapsed, 1e-9),
        from_cache,
    )
    return problems, to_read
