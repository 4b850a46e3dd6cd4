"""What the report writes, checked as its reader sees it: figures on an honest scale that tick whole epochs, and no
CSV file that is a header alone."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def visible_ticks(axes: Axes) -> list[float]:
    """The x ticks within the axis as drawn (matplotlib places them on drawing, some beyond the limits)."""
    FigureCanvasAgg(axes.figure).draw()
    low, high = axes.get_xlim()
    return [float(tick) for tick in axes.get_xticks() if low <= tick <= high]


def assert_honest_figures(drawn: Mapping[str, Figure]) -> None:
    """The loss figure's y axis starts at zero (fitted to the lines, a 0.004 gap filled it); the figures against
    epoch tick whole epochs only (one epoch read 0.945 ... 1.050), at least one."""
    assert drawn["loss"].axes[0].get_ylim()[0] == 0
    for name in ("loss", "top1_vs_epoch"):
        ticks = visible_ticks(drawn[name].axes[0])
        assert ticks and all(tick == round(tick) for tick in ticks), (name, ticks)


def assert_no_header_only_csv(folder: Path) -> None:
    """Every CSV file under ``folder`` has a row below its header: an empty table writes no file."""
    header_only = [path.name for path in sorted(folder.rglob("*.csv")) if len(path.read_text().splitlines()) < 2]
    assert not header_only, f"CSV files with a header alone: {header_only}"
