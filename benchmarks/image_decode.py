"""Milliseconds per image of a model's decode (``mindir_serving.decoding.ImageDecoder``: Pillow's full decode, then
MindSpore's evaluation ops in a child process) against MindSpore's ops in the caller's process (the path before issue
52, which a corrupt JPEG could end), on the same JPEG files: the default network's 32 px input from 28 px files, and
ImageNet's 224 px from 500 x 375 photos-sized files. Alternates the two paths, each over every image, ``--repeats``
times; prints each one's median and the ratio. The child's start (about 3 s: MindSpore's import) is not counted.

    .venv/bin/python benchmarks/image_decode.py --repeats 5
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
from PIL import Image

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)
from mindir_serving.decoding import ImageDecoder
from mindir_serving.images import eval_image_ops


def jpegs(count: int, height: int, width: int) -> list[bytes]:
    """``count`` JPEG files of smooth random pictures (noise compresses unlike photos)."""
    rng = np.random.default_rng(0)
    files = []
    for _ in range(count):
        small = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
        picture = Image.fromarray(small).resize((width, height), Image.BILINEAR)
        buffer = io.BytesIO()
        picture.save(buffer, "JPEG", quality=90)
        files.append(buffer.getvalue())
    return files


def in_process(images: list[bytes], operations: list) -> None:
    for image in images:
        array = np.frombuffer(image, dtype=np.uint8)
        for operation in operations:
            array = operation(array)


def guarded(images: list[bytes], decoder: ImageDecoder) -> None:
    for image in images:
        assert decoder.decode(image).error == ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for label, size, (height, width), count in [
        ("default network, 28 px files -> 32 px", 32, (28, 28), 500),
        ("ImageNet, 500 x 375 files -> 224 px", 224, (375, 500), 100),
    ]:
        images = jpegs(count, height, width)
        operations = eval_image_ops(size, 0.875)
        with ImageDecoder(size, 0.875) as decoder:
            guarded(images[:1], decoder)  # the child started
            times: dict[str, list[float]] = {"in process": [], "guarded": []}
            for _ in range(args.repeats):
                for name, run, target in [("in process", in_process, operations), ("guarded", guarded, decoder)]:
                    start = time.perf_counter()
                    run(images, target)
                    times[name].append(1000 * (time.perf_counter() - start) / count)
        before, after = statistics.median(times["in process"]), statistics.median(times["guarded"])
        print(
            f"{label}: in process {before:.3f} ms/image, guarded {after:.3f} ms/image "
            f"(median of {args.repeats} x {count} images), ratio {after / before:.2f}"
        )


if __name__ == "__main__":
    main()
