"""MLflow runs logged by hand as the pipelines log them, for the report to read: a recipe's single run, and the issue's
walk, a 2-seed study of baseline and thor after a default run (tests/report/)."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import pandas as pd

from tests.support.stores import EXPERIMENT
from trainlib.readable import write_csv
from trainlib.report.differences import in_points
from trainlib.study.statistics import paired_differences, summarise

# The seeds' final top-1 on 3,000 images: each recipe's mean rounds to six digits one way (0.348667), the mean of the
# six-digit values in the study's runs.csv the other (0.348666)
STUDIED_FINALS = {
    ("baseline", 0): 895 / 3000, ("baseline", 1): 1197 / 3000, ("thor", 0): 1495 / 3000, ("thor", 1): 1857 / 3000
}  # fmt: skip


def log_recipe_run(
    client, experiment: str, pipeline: str, params: dict, top1: list[float], epoch_s: float = 10.0, **tags: str
) -> str:
    """A finished run of an image recipe as the pipelines log it: per-epoch metrics (step = epoch), final top-1;
    each epoch trains on 1,000 images in ``epoch_s`` seconds."""
    run_id = client.create_run(experiment, tags={"pipeline": pipeline, "env": "base", **tags}).info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    for epoch, value in enumerate(top1, start=1):
        for key, logged in (("train/loss", 2.0 / epoch), ("val/top1", value), ("val/top5", 0.99)):
            client.log_metric(run_id, key, logged, step=epoch)
        client.log_metric(run_id, "train/epoch_time_s", epoch_s, step=epoch)
        client.log_metric(run_id, "train/images_per_s", 1000.0 / epoch_s, step=epoch)
    client.log_metric(run_id, "final/top1", top1[-1])
    client.log_metric(run_id, "final/top5", 0.99)
    client.set_terminated(run_id)
    return run_id


def log_study_walk(
    uri: str, folder: Path, *, result_column: str = "result"
) -> tuple[str, str, dict[tuple[str, int], str]]:
    """The issue's walk, logged into the store at ``uri`` (its artifacts and CSV files under ``folder``): the default
    run (baseline, 5 epochs), then a study of baseline and thor over 2 seeds of 1 epoch each, whose trainings are
    child runs of the study's run as the study pipeline logs them; killed after its first training and rerun, so that
    training is a child of the killed run, and the rerun's runs.csv names it. Its split has 1,050 train images, of
    which an epoch trains on 1,000 (full batches), in 10 s on seed 0 and 20 s on seed 1. Its CSV files are written
    as the catalog writes them (six digits), its summary from runs.csv read back, as the study's next node reads it;
    ``result_column`` names the result row in runs.csv and summary.csv (``recipe``: a study of before the rename).
    Returns the default run, the study's run and its trainings by (recipe, seed)."""
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(folder / "mlruns").as_uri())
    data = {"data.image_size": "32", "network.name": "resnet_narrow"}
    default = log_recipe_run(client, experiment, "baseline", data, [0.5, 0.7, 0.8, 0.84, 0.85])
    tags = {"pipeline": "study", "env": "base", "train_images": "1050"}
    killed, study = (client.create_run(experiment, tags=tags).info.run_id for _ in range(2))
    for key, value in {**data, "study.epochs": "1"}.items():
        client.log_param(study, key, value)
    trainings = {}
    for (recipe, seed), top1 in STUDIED_FINALS.items():
        parent = killed if (recipe, seed) == ("baseline", 0) else study
        tags = {"mlflow.parentRunId": parent, "recipe": recipe, "result": recipe, "seed": str(seed)}
        trainings[recipe, seed] = log_recipe_run(client, experiment, "study", {}, [top1], 10.0 * (seed + 1), **tags)
    client.set_terminated(killed, "KILLED")
    results, seeds = zip(*STUDIED_FINALS, strict=True)
    runs = pd.DataFrame(
        {"result": list(results), "seed": list(seeds), "final_top1": list(STUDIED_FINALS.values())}
        | {"final_top5": [0.99] * 4, "time_to_target_s": [math.nan] * 4, "epochs_to_target": [math.nan] * 4}
        | {"mlflow_run_id": list(trainings.values())}
    )
    tables = folder / "study"
    tables.mkdir()
    write_csv(runs, tables / "runs.csv")
    runs = pd.read_csv(tables / "runs.csv")
    write_csv(in_points(paired_differences(runs)), tables / "paired.csv")
    write_csv(summarise(runs).rename(columns={"result": result_column}), tables / "summary.csv")
    if result_column != "result":
        write_csv(runs.rename(columns={"result": result_column}), tables / "runs.csv")
    for table in ("paired", "runs", "summary"):
        client.log_artifact(study, str(tables / f"{table}.csv"), "study")
    client.set_terminated(study)
    return default, study, trainings
