"""Image files to fuzz decoders with (Hypothesis): valid seeds of every format a user may send and one mutation each
(``tests/predict/test_decoding.py``, and the served model's REST test)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def encoded(array: np.ndarray, file_format: str, **options) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, file_format, **options)
    return buffer.getvalue()


def seeds() -> dict[str, bytes]:
    """Valid files of every format a user may send: random pixels with stripes (so every codec has structure)."""
    pixels = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    pixels[::4] = 0
    return {
        "jpeg": encoded(pixels, "JPEG", quality=90),
        "progressive_jpeg": encoded(pixels, "JPEG", progressive=True),
        "grey_jpeg": encoded(pixels[:, :, 0], "JPEG"),
        "png": encoded(pixels, "PNG"),
        "bmp": encoded(pixels, "BMP"),
        "gif": encoded(pixels, "GIF"),
        "webp": encoded(pixels, "WEBP"),
    }


SEEDS = seeds()


def declared_huge(image: bytes, size: int) -> bytes:
    """``image`` with its header declaring ``size`` x ``size`` pixels (PNG's chunk checksum made right, so that the
    declared size, not the checksum, is what a reader meets)."""
    data = bytearray(image)
    if data.startswith(b"\x89PNG"):
        data[16:24] = struct.pack(">II", size, size)
        data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    elif data.startswith(b"BM"):
        data[18:26] = struct.pack("<ii", size, size)
    elif data.startswith(b"GIF"):
        data[6:10] = struct.pack("<HH", size & 0xFFFF, size & 0xFFFF)
    elif data.startswith(b"\xff\xd8"):
        start = max(data.find(b"\xff\xc0"), data.find(b"\xff\xc2"))
        data[start + 5 : start + 9] = struct.pack(">HH", size & 0xFFFF, size & 0xFFFF)
    return bytes(data)


@st.composite
def mutated_images(draw) -> bytes:
    """A valid file of any format with one mutation: bit flips, a byte changed, a run of one byte, a cut, a header
    byte changed, or a huge declared size."""
    data = bytearray(SEEDS[draw(st.sampled_from(sorted(SEEDS)))])
    mutation = draw(st.sampled_from(["flips", "byte", "run", "cut", "header", "huge"]))
    if mutation == "flips":
        for position in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=8)):
            data[position] ^= 1 << draw(st.integers(0, 7))
    elif mutation == "byte":
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif mutation == "run":
        start = draw(st.integers(0, len(data) - 1))
        length = draw(st.integers(1, 256))
        data[start : start + length] = bytes([draw(st.integers(0, 255))]) * length
    elif mutation == "cut":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif mutation == "header":
        data[draw(st.integers(0, min(len(data), 640) - 1))] = draw(st.integers(0, 255))
    else:
        data = bytearray(declared_huge(bytes(data), draw(st.sampled_from([0, 1, 65535, 100_000, 2**31 - 1]))))
    return bytes(data)


def fuzzing(examples: int) -> settings:
    """Hypothesis's settings for ``examples`` cases: the same cases every run (a failure reproduces in CI and here),
    no example database in the working tree, no deadline (a decoder child's start takes seconds), a module's decoder
    shared by the cases."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
