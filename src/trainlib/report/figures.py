"""The report's figures: top-1 against epoch and training time, training loss, dim_reduce's explained variance."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from trainlib.metrics import TRAIN_LOSS, VAL_TOP1
from trainlib.report.histories import recipe_curve
from trainlib.report.runs import report_recipes


def stage_boundaries(histories: pd.DataFrame, x: str) -> dict[str, float]:
    """Per recipe with chained trainings, ``x`` (epoch or training time) where its first training ends."""
    boundaries = {}
    for name, recipe in report_recipes().items():
        if len(recipe.trainings) < 2:
            continue
        first = histories[(histories["recipe"] == name) & (histories["training"] == recipe.trainings[0])]
        later = histories[(histories["recipe"] == name) & histories["training"].isin(recipe.trainings[1:])]
        if len(first) and len(later):
            boundaries[name] = float(first[x].iloc[-1])
    return boundaries


def _label_the_end(axes, xs: pd.Series, ys: pd.Series, colour: str) -> None:
    """The line's last value written beside its last point, so the figure says how far each recipe got."""
    if len(xs):
        axes.annotate(
            f"{ys.iloc[-1]:.4g}", (xs.iloc[-1], ys.iloc[-1]), textcoords="offset points", xytext=(4, 4), fontsize=8,
            color=colour,
        )  # fmt: skip


def _curves(histories: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, title: str, scale: float = 1.0):
    """One line per recipe (``y`` against ``x``), side trainings dashed from their branch point, and
    a dotted line where a chained recipe switches training (dim_reduce: stage 1 -> stage 2)."""
    figure = Figure(figsize=(7, 4.5), tight_layout=True)
    axes = figure.add_subplot()
    colours = {}
    for recipe, rows in histories.groupby("recipe", sort=False):
        curve = recipe_curve(rows)
        logged = curve[curve[y].notna()]
        (line,) = axes.plot(logged[x], scale * logged[y], marker="o", markersize=4, label=recipe)
        colours[recipe] = line.get_color()
        _label_the_end(axes, logged[x], scale * logged[y], line.get_color())
        side = rows[~rows.index.isin(curve.index)]
        for training, side_rows in side.groupby("training", sort=False):
            first = report_recipes()[recipe].trainings[0]
            branch = curve[curve["training"] == first].tail(1)  # the side training starts where this ends
            drawn = pd.concat([branch, side_rows])
            drawn = drawn[drawn[y].notna()]
            axes.plot(
                drawn[x], scale * drawn[y], linestyle="--", marker="s", markersize=3, color=line.get_color(),
                label=f"{recipe} {training}",
            )  # fmt: skip
            _label_the_end(axes, drawn[x], scale * drawn[y], line.get_color())
    for recipe, boundary in stage_boundaries(histories, x).items():
        first, second = report_recipes()[recipe].trainings[:2]
        axes.axvline(boundary, color=colours[recipe], linestyle=":", linewidth=1.2, label=f"_{recipe} boundary")
        axes.annotate(
            f"{recipe}: {first} → {second}", (boundary, 0.02), xycoords=("data", "axes fraction"),
            rotation=90, fontsize=8, ha="right", va="bottom", color=colours[recipe],
        )  # fmt: skip
    if x == "epoch":
        whole_epochs(axes, histories["epoch"])
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    return figure, axes


def whole_epochs(axes, epochs: pd.Series) -> None:
    """Ticks at whole epochs only, the axis half an epoch wider than the epochs drawn: matplotlib's integer locator
    falls back to fractions (0.945 ... 1.050) when the axis holds fewer than two whole numbers, as one epoch does."""
    if len(epochs):
        axes.set_xlim(float(epochs.min()) - 0.5, float(epochs.max()) + 0.5)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def top1_figure(histories: pd.DataFrame, x: str = "epoch", target_top1: float | None = None) -> Figure:
    """Top-1 (%) on val against ``epoch`` or ``train_time_s``, one line per recipe, the target dashed."""
    xlabel = {"epoch": "epoch", "train_time_s": "training time (s, sum of epoch times)"}[x]
    figure, axes = _curves(
        histories, x, VAL_TOP1, xlabel, "top-1 accuracy on val (%)", f"Top-1 against {xlabel.split(' (')[0]}", 100.0
    )
    if target_top1 is not None:
        axes.axhline(100 * target_top1, color="grey", linestyle="--", linewidth=1, label="_target")
        axes.annotate(f"target {100 * target_top1:g} %", (0.01, 100 * target_top1), xycoords=("axes fraction", "data"))
    return figure


def loss_figure(histories: pd.DataFrame) -> Figure:
    """Training loss (mean over each epoch) against epoch, one line per recipe, the y axis from zero: fitted to the
    lines alone, it spanned 1.8045-1.8088 for two recipes 0.004 apart, a gap it drew as half the figure."""
    figure, axes = _curves(
        histories, "epoch", TRAIN_LOSS, "epoch", "training loss (mean over the epoch)", "Training loss"
    )
    axes.set_ylim(bottom=0)
    return figure


def explained_variance_figure(table: pd.DataFrame) -> Figure:
    """dim_reduce's PCA: each component's explained-variance ratio (bars) and the cumulative ratio."""
    figure = Figure(figsize=(7, 4.5), tight_layout=True)
    axes = figure.add_subplot()
    axes.set_xlabel("principal component")
    axes.set_ylabel("explained variance ratio")
    axes.set_title("dim_reduce: PCA of the stage-1 trajectory")
    axes.set_ylim(0, 1)
    axes.bar(table["component"], table["explained_variance_ratio"], label="component")
    axes.plot(table["component"], table["cumulative_ratio"], color="black", marker=".", label="cumulative")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.legend()
    return figure


def compared_histories(histories: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``histories`` of the recipes compared side by side: those whose ``left_out`` (``table``) is
    empty, at the reference run's budget."""
    left_out = set(table.loc[table["left_out"].fillna("") != "", "recipe"]) if "left_out" in table else set()
    return histories[~histories["recipe"].isin(left_out)]


def figures(histories: pd.DataFrame, explained_variance: pd.DataFrame, target_top1: float) -> dict[str, Figure]:
    """The report's figures by name: top-1 against epoch and time, loss, and dim_reduce's explained variance when
    there is a dim_reduce run (no empty figure)."""
    drawn = {
        "top1_vs_epoch": top1_figure(histories, "epoch", target_top1),
        "top1_vs_time": top1_figure(histories, "train_time_s", target_top1),
        "loss": loss_figure(histories),
    }
    if not explained_variance.empty:
        drawn["explained_variance"] = explained_variance_figure(explained_variance)
    return drawn
