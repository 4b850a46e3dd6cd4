"""The three evaluations of dim_reduce side by side: stage 1, stage 2 and the Momentum control."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pandas as pd

logger = logging.getLogger(__name__)


def compare_runs(reports: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per model of ``reports`` (``stage1``, ``stage2``, ``control``: their evaluation reports): epoch,
    top-1/top-5 and the gain over the control (``top1_minus_control``, a fraction); logs the three top-1s."""
    table = pd.DataFrame(
        [{"model": name, **{key: report[key] for key in ("epoch", "top1", "top5")}} for name, report in reports.items()]
    )
    control = reports["control"]["top1"]
    table["top1_minus_control"] = table["top1"] - control
    logger.info(
        "dim_reduce: stage 1 top-1 %.2f%%, stage 2 %.2f%%, control %.2f%% (stage 2 - control: %+.2f points)",
        100 * reports["stage1"]["top1"],
        100 * reports["stage2"]["top1"],
        100 * control,
        100 * (reports["stage2"]["top1"] - control),
    )
    return table
