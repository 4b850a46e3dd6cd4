"""No bytes end the process that decodes them (``mindir_serving.decoding``): the files that killed MindSpore's
decoder are refused with their reason, a decoder that still dies or hangs costs its child only, libjpeg's warnings
reach the image they concern, and Hypothesis fuzzes mutated JPEG, PNG, GIF, WebP and BMP files through the decoder
(a few hundred cases here, thousands in the slow tier)."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

import pipelines  # noqa: F401  (the CPU defaults before MindSpore loads)
from mindir_serving.decoding import ImageDecoder
from tests.support.fuzz_images import SEEDS, declared_huge, fuzzing, mutated_images

IMAGE_SIZE = 16
RATIO = 0.875
# Files that ended MindSpore's decoder (SIGFPE, SIGSEGV) or hung it, found by fuzzing it (issue 52), and one it reads
# with a libjpeg warning: kept as regression files
BAD_IMAGES = Path(__file__).with_name("bad_images")
FATAL = {"sigfpe_huffman_table.jpg", "sigsegv_huffman_table.jpg", "sigsegv_header_byte.jpg", "sigfpe_cut_inside.jpg"}


@pytest.fixture(scope="module")
def decoder():
    with ImageDecoder(IMAGE_SIZE, RATIO, timeout_s=5) as decoder:
        yield decoder


def assert_answered(decoded) -> None:
    """A decoded image, or a refusal with its reason: nothing else."""
    if decoded.pixels is None:
        assert decoded.error, "a refusal without a reason"
    else:
        assert decoded.error == ""
        assert decoded.pixels.shape == (3, IMAGE_SIZE, IMAGE_SIZE) and decoded.pixels.dtype == np.float32


def test_the_files_that_killed_the_decoder_are_refused_with_their_reason(decoder):
    for name in sorted(FATAL):
        decoded = decoder.decode((BAD_IMAGES / name).read_bytes())
        assert decoded.pixels is None, name
        assert decoded.error.startswith(("corrupt JPEG: ", "truncated JPEG: ")), (name, decoded.error)


def test_a_decoder_that_dies_or_hangs_costs_its_child_only(decoder):
    """Straight to MindSpore's decoder, without the checks before it: each file ends the child (SIGFPE, SIGSEGV) or
    outlasts the time limit, is named with the signal, and the next image gets a new child."""
    good = SEEDS["jpeg"]
    for name, how in [
        ("sigfpe_huffman_table.jpg", "SIGFPE"),
        ("sigsegv_huffman_table.jpg", "SIGSEGV"),
        ("sigfpe_cut_inside.jpg", "SIGFPE"),
    ]:
        decoded = decoder.decode_in_child((BAD_IMAGES / name).read_bytes())
        assert decoded.pixels is None and f"MindSpore's decoder crashed on it ({how})" in decoded.error, name
        assert_answered(decoder.decode(good))
        assert decoder.decode(good).error == ""
    with ImageDecoder(IMAGE_SIZE, RATIO, timeout_s=1) as impatient:
        decoded = impatient.decode_in_child((BAD_IMAGES / "hangs_cut_inside.jpg").read_bytes())
        assert decoded.error == "corrupt JPEG: not decoded within 1 s"
        assert impatient.decode(good).error == ""


def test_a_decoder_left_unclosed_takes_its_folder_with_it():
    """A served model's decoder is never closed: when it goes, its folder (the child's standard error) goes too."""
    unclosed = ImageDecoder(IMAGE_SIZE, RATIO, timeout_s=5)
    assert unclosed.decode(SEEDS["jpeg"]).error == ""
    folder = Path(unclosed._folder)
    assert (folder / "stderr.txt").is_file()
    del unclosed
    gc.collect()
    assert not folder.exists()


def test_a_libjpeg_warning_is_attributed_to_its_image(decoder):
    """A progressive JPEG with one byte changed decodes with libjpeg's "Corrupt JPEG data" line: that line is the
    image's warning, and the next image, read cleanly, has none."""
    decoded = decoder.decode((BAD_IMAGES / "warns_extraneous_bytes.jpg").read_bytes())
    assert decoded.error == "" and decoded.pixels is not None
    assert decoded.warning == "Corrupt JPEG data: 1 extraneous bytes before marker 0xd9"
    assert decoder.decode(SEEDS["jpeg"]).warning == ""


def test_a_huge_declared_size_is_refused_before_any_pixel_is_decoded(decoder):
    for name in ("jpeg", "png", "bmp"):
        decoded = decoder.decode(declared_huge(SEEDS[name], 65535))
        assert decoded.error.endswith(" pixels: over the 64,000,000 pixels a model decodes"), (name, decoded.error)
    assert decoder.decode(declared_huge(SEEDS["png"], 9_000)).error == (
        "PNG of 9000 x 9000 pixels: over the 64,000,000 pixels a model decodes"
    )


def test_the_valid_seeds_decode_and_gif_and_webp_are_refused(decoder):
    for name, image in SEEDS.items():
        decoded = decoder.decode(image)
        if name in ("gif", "webp"):
            assert decoded.error.endswith("image: the model reads JPEG, PNG or BMP"), name
        else:
            assert decoded.error == "" and decoded.warning == "", (name, decoded.error, decoded.warning)


@fuzzing(300)
@given(image=mutated_images())
def test_fuzzed_images_are_decoded_or_refused_with_a_reason(decoder, image):
    assert_answered(decoder.decode(image))


@pytest.mark.slow
@fuzzing(3000)
@given(image=mutated_images())
def test_thousands_of_fuzzed_images_are_decoded_or_refused_with_a_reason(decoder, image):
    """The slow tier's share: the same mutations, three thousand of them."""
    assert_answered(decoder.decode(image))
