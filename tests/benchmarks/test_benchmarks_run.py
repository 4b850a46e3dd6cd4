"""The cheap parts of the benchmarks that broke when the library changed under them, run as the benchmarks run them."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from benchmarks.study_runner import StudyOutcome, print_outcome
from trainlib.report.differences import in_points

RUNS = pd.DataFrame(
    {"result": ["baseline", "thor"], "seed": [0, 0], "final_top1": [0.1, 0.275], "mlflow_run_id": "x", "key": "k"}
)
# the study's paired differences as fractions, before paired.csv is written
PAIRED = pd.DataFrame(
    {
        "comparison": ["thor vs baseline"] * 2,
        "measure": ["final_top1_difference", "time_to_target_ratio"],
        "mean": [0.175, 0.8],
        "ci_low": [0.1115, 0.6],
        "ci_high": [0.2385, 1.0],
        "n": [2, 2],
    }
)


def test_the_study_outcome_prints_paired_csv_in_its_points(capsys):
    """paired.csv holds accuracy differences in points (unit pt): printed as they are, not multiplied again."""
    print_outcome(StudyOutcome(RUNS, pd.DataFrame(), in_points(PAIRED), 60.0))
    out = capsys.readouterr().out
    assert "thor vs baseline, final_top1_difference: +17.50 pt [+11.15, +23.85], n = 2 seeds" in out
    assert "thor vs baseline, time_to_target_ratio: 0.80 [0.60, 1.00], n = 2 seeds" in out
    # one written before the unit column (fractions) prints the same figures
    print_outcome(StudyOutcome(RUNS, pd.DataFrame(), PAIRED, 60.0))
    assert "final_top1_difference: +17.50 pt [+11.15, +23.85]" in capsys.readouterr().out


def test_the_loader_benchmark_decodes_an_image_with_the_librarys_normalisation():
    """The plain ImageFolderDataset side of loader_throughput.py: crop-decode-resize, flip, the library's
    normalisation (``mindir_serving.images.normalise_ops``), CHW."""
    from mindspore.dataset import transforms
    from PIL import Image

    from benchmarks.loader_throughput import _image_ops

    encoded = io.BytesIO()
    Image.fromarray(np.full((60, 80, 3), 128, np.uint8)).save(encoded, format="JPEG")
    image = transforms.Compose(_image_ops())(np.frombuffer(encoded.getvalue(), np.uint8))
    image = image[0] if isinstance(image, tuple) else image
    assert image.shape == (3, 224, 224)
    # grey 128 normalised by the ImageNet statistics: (128 - 0.485 * 255) / (0.229 * 255) on the red channel
    assert abs(float(image[0].mean()) - (128 - 0.485 * 255) / (0.229 * 255)) < 0.05
