"""An encoded image to a network's input as the evaluation reads it, and, for a file that cannot be read, what is
wrong with it in words a user acts on ("empty file", "truncated JPEG", "not an image") rather than MindSpore's
generic "Exception thrown from dataset pipeline"."""

from __future__ import annotations

import io
import warnings

# ImageNet channel statistics, in 0-255 pixel units (recipe values).
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
# The formats MindSpore's Decode reads (libjpeg-turbo, OpenCV), by their files' first bytes.
DECODED_SIGNATURES = {b"\xff\xd8\xff": "JPEG", b"\x89PNG\r\n\x1a\n": "PNG", b"BM": "BMP"}
DECODED = "JPEG, PNG or BMP"
# Formats MindSpore's Decode refuses, and then writes the refused file into the working directory (measured with
# MindSpore 2.10): refused here before it sees them.
REFUSED_SIGNATURES = {b"GIF87a": "GIF", b"GIF89a": "GIF", b"RIFF": "WebP"}
JPEG_END = b"\xff\xd9"  # a JPEG's end-of-image marker: libjpeg reads up to it, and fails on a file without one
PNG_END = b"IEND"  # a PNG's last chunk


class UnreadableImageError(ValueError):
    """An encoded image the network cannot be given; its message says why."""


def normalise_ops() -> list:
    """The last operations of every image path: normalise by the ImageNet statistics, HWC -> CHW."""
    from mindspore.dataset import vision

    return [vision.Normalize(mean=MEAN, std=STD), vision.HWC2CHW()]


def eval_image_ops(image_size: int, eval_resize_ratio: float) -> list:
    """An encoded image to the network's input, as evaluation reads it: Decode, Resize(image_size /
    eval_resize_ratio), CenterCrop(image_size), normalise, HWC->CHW. The evaluation's dataset maps them; a trained
    model's predictions (``classifier``) call them one image at a time, so both see the same pixels."""
    from mindspore.dataset import vision

    return [
        vision.Decode(),
        vision.Resize(int(round(image_size / eval_resize_ratio))),
        vision.CenterCrop(image_size),
        *normalise_ops(),
    ]


def image_format(image: bytes) -> str | None:
    """The format of an encoded image by its first bytes (JPEG, PNG, BMP, GIF, WebP), or None."""
    for signatures in (DECODED_SIGNATURES, REFUSED_SIGNATURES):
        for signature, name in signatures.items():
            if image.startswith(signature):
                return None if name == "WebP" and image[8:12] != b"WEBP" else name
    return None


def refused_before_decoding(image: bytes) -> str | None:
    """Why ``image`` is not worth decoding, by its bytes alone: empty, no JPEG, PNG or BMP signature, a GIF or WebP
    (MindSpore refuses them), a JPEG or PNG cut before its end; None for every other file."""
    if not image:
        return "empty file"
    found = image_format(image)
    if found in REFUSED_SIGNATURES.values():
        return f"{found} image: the model reads {DECODED}"
    if found is None:
        return f"not an image: the file starts with no {DECODED} signature"
    if found == "JPEG" and JPEG_END not in image:
        return "truncated JPEG: the file ends before its end-of-image marker"
    if found == "PNG" and PNG_END not in image:
        return "truncated PNG: the file ends before its IEND chunk"
    return None


def decode_failure(image: bytes, error: Exception) -> str:
    """Why the decoder failed on ``image`` (``error``: MindSpore's exception), named by what the bytes are."""
    found = image_format(image)
    # MindSpore's own line, without its advice to open the copy it writes or to delete the file from a dataset
    lines = [line.strip().removeprefix("[ERROR]").strip() for line in str(error).splitlines() if "[ERROR]" in line]
    cause = (lines[0] if lines else str(error).strip().splitlines()[0]).split(" Dump the ")[0].rstrip(". ")
    return f"corrupt {found}: {cause}"


def pillow_problem(image: bytes, max_pixels: int) -> str | None:
    """Why Pillow cannot read ``image`` (a JPEG, PNG or BMP by its signature), or None: its header is parsed in Python
    and a declared size over ``max_pixels`` refused before a pixel is decoded; then every pixel is decoded, and what
    the decoder refuses is named (``decoding`` says why this runs before MindSpore's decoder)."""
    from PIL import Image, UnidentifiedImageError

    found = image_format(image)
    try:
        # over Pillow's warning size, above this limit anyway: an exception here, not a warning in the caller's log
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(image), formats=list(DECODED_SIGNATURES.values()))
        with opened:
            width, height = opened.size
            if width * height > max_pixels:
                return f"{found} of {width} x {height} pixels: over the {max_pixels:,} pixels a model decodes"
            opened.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # Pillow's limits, met before this one
        return f"{found} of over {Image.MAX_IMAGE_PIXELS:,} pixels: over the {max_pixels:,} pixels a model decodes"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as error:
        return f"corrupt {found}: {error}"
    return None
