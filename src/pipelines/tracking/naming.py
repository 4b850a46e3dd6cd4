"""A run's name and description: what the MLflow runs table and the run's page show of a ``kedro run``."""

from __future__ import annotations

import colorsys
import json
from collections.abc import Mapping, Sequence

import mlflow

from trainlib.params.recipe_spec import colour_families
from trainlib.redaction import redact

RUN_NAME_LIMIT = 40  # characters: the runs table shows about this much of a name
DESCRIPTION_TAG = "mlflow.note.content"  # the run page's description


def short_key(key: str, keys: Sequence[str]) -> str:
    """The shortest dotted suffix of ``key`` that no other key of ``keys`` ends with (``thor.lr.peak``:
    ``peak``; ``network.name``, as other keys end with ``name``): one abbreviation per key, in every run."""
    parts = key.split(".")
    for length in range(1, len(parts)):
        suffix = ".".join(parts[-length:])
        if sum(k == suffix or k.endswith("." + suffix) for k in keys) == 1:
            return suffix
    return key


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def run_name(
    pipelines: list[str],
    env: str | None,
    overrides: Mapping,
    keys: Sequence[str],
    partial: bool,
    *,
    fast_dev_run: bool = False,
) -> str:
    """The MLflow run's name, at most ``RUN_NAME_LIMIT`` characters: ``fast_dev_run`` first for a rehearsal, the
    pipelines, the configuration environment when one was chosen (``--env``), each ``--params`` override that
    changes the configuration by its short key (``thor peak=0.05``), and ``(partial)`` when node filters
    (``--nodes``, ``--from-nodes``, …) cut the run. A longer name ends in an ellipsis; ``run_description`` holds
    everything."""
    words = [*(["fast_dev_run"] if fast_dev_run else []), "+".join(pipelines), *([env] if env else [])]
    shown = {k: v for k, v in overrides.items() if not (fast_dev_run and k == "runtime.fast_dev_run")}
    words += [f"{short_key(key, keys)}={_value(value)}" for key, value in shown.items()]
    name = " ".join(words)
    suffix = " (partial)" if partial else ""
    if len(name) + len(suffix) > RUN_NAME_LIMIT:
        name = name[: RUN_NAME_LIMIT - len(suffix) - 1] + "…"
    return name + suffix


def run_description(command: str | None, env: str, overrides: Mapping) -> str:
    """The run's description (its page shows it): the command, the environment, every override in full."""
    lines = [f"`{command}`" if command else "kedro run", "", f"configuration environment: {env}"]
    if overrides:
        lines += ["", "overrides (`--params`) that change the configuration:"]
        lines += [f"- `{key}` = `{_value(value)}`" for key, value in overrides.items()]
    return "\n".join(lines)


def set_run_name(name: str) -> None:
    """Rename the active MLflow run, if there is one (the runs table's first column)."""
    active = mlflow.active_run()
    if active is not None:
        mlflow.MlflowClient().update_run(active.info.run_id, name=redact(name))


# The tag MLflow's UI reads a run's colour from (charts, runs table), as its own colour picker writes it
RUN_COLOUR_TAG = "mlflow.runColor"
# Runs of no recipe (report, study, migrate, predict) brown; a recipe's runs take their colour family from its
# specification (trainlib.params.recipe_spec.colour_families). Tableau 10's hues.
OTHER_RUNS = "#9c755f"
# Seeds 0, 1, 2, …: the family's colour, darker, lighter, … (lightness factors), so the seeds of one recipe stay apart
SEED_SHADES = (1.0, 0.7, 1.3, 0.5, 1.5, 0.85, 1.15)


def run_colour(kind: str, seed: int | None = None) -> str:
    """The ``#rrggbb`` colour of a run of ``kind`` (a training, result row or pipeline: ``thor``,
    ``thor_bert_control``, ``stage2``) and ``seed``: its family's colour (``recipe_spec.colour_families``), shaded by
    seed."""
    family = colour_families().get(kind, OTHER_RUNS)
    red, green, blue = (int(family[i : i + 2], 16) / 255 for i in (1, 3, 5))
    hue, lightness, saturation = colorsys.rgb_to_hls(red, green, blue)
    shade = SEED_SHADES[(seed or 0) % len(SEED_SHADES)]
    red, green, blue = colorsys.hls_to_rgb(hue, min(0.9, lightness * shade), saturation)
    return "#" + "".join(f"{round(255 * channel):02x}" for channel in (red, green, blue))
