"""Untrusted encoded images to a network's input, without any byte able to end the process that asks.

MindSpore 2.10's ``vision.Decode`` (its own libjpeg-turbo) dies with SIGFPE or SIGSEGV on a JPEG whose Huffman tables
or header bytes were changed (a one-byte change in a 4 kB JPEG's first 620 bytes: 6 of 40 killed the process,
measured); no Python code can catch that. So an image passes three gates, each cheaper than the next:

1. its bytes (``images.refused_before_decoding``): empty, GIF or WebP, a JPEG cut before its end marker, a file
   with no JPEG, PNG or BMP signature;
2. Pillow (``images.pillow_problem``): its header parsed in Python (a declared size over ``max_pixels`` is refused
   before any pixel is decoded), then every pixel decoded by Pillow's libjpeg-turbo, libpng and BMP reader, which
   are fuzzed continuously in OSS-Fuzz and raise an exception on what they cannot read;
3. MindSpore's evaluation operations (``images.eval_image_ops``), so the pixels are the evaluation's own, run in one
   child process whose standard error is a file: what libjpeg says while it decodes an image ("Corrupt JPEG data:
   261 extraneous bytes before marker 0x67") becomes that image's ``warning``, and a decoder that still dies takes
   the child only: the image gets its reason and the next image a new child.

The child is ``python -m mindir_serving.decoding`` started by ``subprocess``, not by ``multiprocessing``: spawn
re-runs the caller's main script in the child (a user's ``predict.py`` without a ``__main__`` guard would run twice),
and a fork of a process holding MindSpore's threads can deadlock. Images and pixels pass as pickles over two pipes
(``multiprocessing.connection.Connection``); a child that answers nothing within ``timeout_s`` is killed. It works in
a temporary folder, so the copies MindSpore writes of images it refuses land nowhere else.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from functools import cache
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from mindir_serving.images import decode_failure, eval_image_ops, image_format, pillow_problem, refused_before_decoding

# The largest image decoded (width x height): ImageNet's largest is about 12 M pixels; a 64 M one takes 192 MB as
# RGB. Pillow's own bomb warning starts at 89 M.
MAX_PIXELS = 64_000_000
# How long one image may take in the child: a 64 M pixel JPEG decodes and resizes in about a second here.
TIMEOUT_S = 30.0
_GLOG = re.compile(r"^\[(WARNING|ERROR|INFO|CRITICAL)\] ")  # MindSpore's own log lines, not libjpeg's


@dataclass(frozen=True)
class Decoded:
    """One image's network input, or why there is none; ``warning``: what the decoder said of an image it read."""

    pixels: np.ndarray | None
    error: str = ""
    warning: str = ""


@cache
def _operations(image_size: int, eval_resize_ratio: float) -> list:
    return eval_image_ops(image_size, eval_resize_ratio)


def _decode(image: bytes, image_size: int, eval_resize_ratio: float) -> tuple[np.ndarray | None, str]:
    """In the child: ``image`` through the evaluation's operations; (pixels, "") or (None, why not)."""
    array = np.frombuffer(image, dtype=np.uint8)
    try:
        for operation in _operations(image_size, eval_resize_ratio):
            array = operation(array)
    except RuntimeError as error:
        return None, decode_failure(image, error)
    return array, ""


def _serve(requests: Connection, replies: Connection) -> None:
    """The child's loop: (image, image_size, eval_resize_ratio) in, (pixels, reason) out, until the parent closes
    its end (or dies)."""
    import mindspore.dataset.vision  # noqa: F401  (its import time goes to the start, not the first image)

    replies.send(None)  # ready
    while True:
        try:
            request = requests.recv()
        except EOFError:
            return
        replies.send(_decode(*request))


class ImageDecoder:
    """Encoded images to the evaluation's network input (``(3, image_size, image_size)`` float32) through the three
    gates of this module. Safe to share between threads (one image decodes at a time); ``close`` ends the child."""

    def __init__(
        self, image_size: int, eval_resize_ratio: float, *, max_pixels: int = MAX_PIXELS, timeout_s: float = TIMEOUT_S
    ):
        self.image_size, self.eval_resize_ratio = image_size, eval_resize_ratio
        self.max_pixels, self.timeout_s = max_pixels, timeout_s
        self._lock = threading.Lock()
        self._child: tuple[subprocess.Popen, Connection, Connection] | None = None
        self._folder = tempfile.mkdtemp(prefix="mindir-decode-")
        self._stderr_path = os.path.join(self._folder, "stderr.txt")
        # a served model's decoder is never closed: its folder goes when the decoder does, or at the latest on exit
        self._remove_folder = weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)

    def decode(self, image: bytes) -> Decoded:
        reason = refused_before_decoding(image) or pillow_problem(image, self.max_pixels)
        if reason is not None:
            return Decoded(None, error=reason)
        return self.decode_in_child(image)

    def decode_in_child(self, image: bytes) -> Decoded:
        """``image`` through MindSpore's operations in the child, with no check before: what the first two gates
        passed, or (a test's) bytes that end the child."""
        with self._lock:
            process, requests, replies = self._started()
            start = os.path.getsize(self._stderr_path)
            requests.send((image, self.image_size, self.eval_resize_ratio))
            if not replies.poll(self.timeout_s):
                self._stop(kill=True)
                return Decoded(None, error=f"corrupt {image_format(image)}: not decoded within {self.timeout_s:g} s")
            try:
                pixels, reason = replies.recv()
            except EOFError:
                said = self._said_since(start)
                self._stop(kill=False)
                return Decoded(None, error=_crash_reason(image, process.returncode, said))
            said = self._said_since(start)
        return Decoded(pixels, error=reason, warning="" if reason else "; ".join(_libjpeg_lines(said)))

    def close(self) -> None:
        with self._lock:
            self._stop(kill=False)
        self._remove_folder()

    def __enter__(self) -> ImageDecoder:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _started(self) -> tuple[subprocess.Popen, Connection, Connection]:
        """The running child, started if there is none: its standard error appends to the file read after each
        image; the package is found where this one was loaded from (a logged model's code folder)."""
        if self._child is not None:
            return self._child
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        package_root = str(Path(__file__).resolve().parent.parent)
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
        }
        with open(self._stderr_path, "ab") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "mindir_serving.decoding", str(request_read), str(reply_write)],
                pass_fds=(request_read, reply_write),
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                cwd=self._folder,
                env=environment,
            )
        os.close(request_read)
        os.close(reply_write)
        requests, replies = Connection(request_write, readable=False), Connection(reply_read, writable=False)
        self._child = (process, requests, replies)
        try:
            replies.recv()  # ready
        except EOFError:
            self._stop(kill=False)
            raise RuntimeError(f"the image decoder did not start: {' '.join(self._said_since(0))[-500:]}") from None
        return self._child

    def _stop(self, *, kill: bool) -> None:
        if self._child is None:
            return
        process, requests, replies = self._child
        self._child = None
        if kill:
            process.kill()
        requests.close()
        replies.close()
        process.wait()

    def _said_since(self, start: int) -> list[str]:
        """The lines the child wrote to its standard error after byte ``start``."""
        with open(self._stderr_path, "rb") as file:
            file.seek(start)
            text = file.read().decode("utf-8", "replace")
        return [line.strip() for line in text.splitlines() if line.strip()]


def _libjpeg_lines(said: list[str]) -> list[str]:
    """What the decoder said of an image, without MindSpore's own log lines."""
    return [line for line in said if not _GLOG.match(line)]


def _crash_reason(image: bytes, returncode: int | None, said: list[str]) -> str:
    """Why the child died on ``image``: the signal that ended it and what libjpeg said before."""
    how = signal.Signals(-returncode).name if returncode is not None and returncode < 0 else f"exit {returncode}"
    before = _libjpeg_lines(said)
    detail = f" after '{'; '.join(before)}'" if before else ""
    return f"corrupt {image_format(image)}: MindSpore's decoder crashed on it ({how}){detail}"


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
