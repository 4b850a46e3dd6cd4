"""The comparison notebook executed against the shared recipe store."""

from __future__ import annotations

from pathlib import Path

import mlflow
import nbformat
from nbclient import NotebookClient

from tests.support.stores import recipe_runs, tracking_uri, trainings

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "compare_recipes.ipynb"


def test_notebook_compares_the_recipes_of_the_store(recipe_store):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # run where a user would start Jupyter: inside the project, whose root kedro.ipython finds
    NotebookClient(
        notebook, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(recipe_store)}}
    ).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) == 4  # top-1 vs epoch, top-1 vs time, loss, explained variance
    html = "\n".join(output["data"].get("text/html", "") for output in outputs if "data" in output)
    client = mlflow.MlflowClient(tracking_uri(recipe_store))
    for pipeline in ("baseline", "thor", "adasum"):
        trained = next(run for run in recipe_runs(recipe_store, pipeline) if "train/loss" in run.data.metrics)
        assert trained.info.run_id in html, pipeline
    # dim_reduce's metrics are in its child runs: the run shown is the newest whose stage 1 trained
    stage1s = ((run, trainings(client, run).get("stage1")) for run in recipe_runs(recipe_store, "dim_reduce"))
    trained = next(run for run, stage1 in stage1s if stage1 is not None and "train/loss" in stage1.data.metrics)
    assert trained.info.run_id in html
    assert "val/top1" in html and "train/epoch_time_s" in html  # the per-epoch history, in the schema's keys
    markdown = "\n".join(output["data"].get("text/markdown", "") for output in outputs if "data" in output)
    assert "| thor vs baseline | final_top1_difference |" in markdown  # by how much, as the report says it
    assert "| stage2 vs control | final_top1_difference |" in markdown
    assert tracking_uri(recipe_store) in "\n".join(output.get("text", "") for output in outputs)
