"""Where to see a run in the MLflow UI: the runs table, and the chart comparing the runs it trained or read.

A run's closing links (``pipelines.hooks``) open the tracking server itself when the store is one, else ``mlflow
ui`` over the local store. The report pipeline tags its run with the runs it compared (``record_compared_runs``),
so its chart draws them.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from collections.abc import Mapping, Sequence

import mlflow
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR, MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT

from pipelines.tracking.runs import child_runs
from pipelines.tracking.writer import set_tags
from trainlib.metrics import (
    FINAL_PREFIX,
    TARGET_EPOCHS,
    TARGET_TIME_S,
    VAL_MLM_ACCURACY,
    VAL_STEP_MLM_ACCURACY,
    VAL_STEP_TOP1,
    VAL_TOP1,
)

# A run's tag listing, comma-separated, the runs it compared (the report's), for the closing comparison link
COMPARED_RUNS_TAG = "compared_runs"
WORKFLOW = "workflowType=machine_learning"  # MLflow 3's UI otherwise shows its GenAI pages
# The experiment tag of a runs page's shared view (MLflow's Share button writes one; ``viewStateShareKey`` opens it)
SHARED_VIEW_TAG = "mlflow.sharedViewState."
# What the closing links show, the first family the runs logged: the charts (a step evaluation's, then the epochs')
# and the runs table's headline columns (the image recipes' top-1, else a language model's masked-LM accuracy, then
# when each run first reached its target)
TARGET_COLUMNS = (TARGET_EPOCHS, TARGET_TIME_S)
CHARTED = (
    ((VAL_STEP_TOP1, VAL_TOP1), (FINAL_PREFIX + "top1", FINAL_PREFIX + "top5", *TARGET_COLUMNS)),
    ((VAL_STEP_MLM_ACCURACY, VAL_MLM_ACCURACY), (FINAL_PREFIX + "mlm_accuracy", *TARGET_COLUMNS)),
)


def current_tracking_uri() -> str:
    return mlflow.get_tracking_uri()


def base_is_server(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is a tracking server (whose own address serves the UI)."""
    return tracking_uri.startswith(("http://", "https://"))


def ui_base_url(tracking_uri: str, host: str, port: str | int) -> str:
    """Where the MLflow UI of ``tracking_uri`` is: the tracking server itself when it is one (``http(s)://``),
    else ``mlflow ui`` over the local store at ``host``:``port`` (``mlflow.yml``'s ``ui``)."""
    if base_is_server(tracking_uri):
        return without_credentials(tracking_uri).rstrip("/")
    return f"http://{host}:{port}"


def no_mlflow_run_links() -> None:
    """MLflow prints "View run … at: <tracking URI>" as each run ends, with the URI's password when it holds one, and
    after the run's own closing lines: off in this process (``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``, unless the
    user set it), since the run prints its links itself (``closing_links``), without credentials. So are its
    progress bars of artifact downloads (``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``), which followed the closing links
    too."""
    os.environ.setdefault(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name, "true")
    os.environ.setdefault(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, "false")


def without_credentials(url: str) -> str:
    """``url`` without its user and password (``http://alice:<password>@host:5000`` -> ``http://host:5000``): a
    link to print or share, where the browser asks its own user to log in."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def experiment_of(run_id: str) -> str:
    return mlflow.MlflowClient().get_run(run_id).info.experiment_id


def runs_page_url(base: str, experiment_id: str, view: str | None = None) -> str:
    """The MLflow UI's runs table of experiment ``experiment_id``, in model-training mode; with ``view`` (a key of
    ``share_view``), as that shared view sets it: its columns, order and filter."""
    shared = f"viewStateShareKey={view}&" if view else ""
    return f"{base}/#/experiments/{experiment_id}/runs?{shared}{WORKFLOW}"


def comparison_url(base: str, experiment_id: str, view: str) -> str:
    """The runs page of ``experiment_id`` in its chart view, as the shared view ``view`` (``comparison_view``)
    sets it, in model-training mode."""
    return f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={view}&compareRunsMode=CHART&{WORKFLOW}"


def _column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # the runs table's name of a column (metrics.`final/top1`)


def only_runs(run_ids: Sequence[str]) -> str:
    """The runs page's filter that shows the runs ``run_ids`` and no other."""
    return "attributes.run_id IN ({})".format(", ".join(f"'{run_id}'" for run_id in run_ids))


def table_view(headline: Sequence[str], epochs_params: Sequence[str], run_ids: Sequence[str] | None = None) -> dict:
    """A shared view of the runs table: the ``headline`` metrics (``final/top1``, …) and the ``epochs_params`` as
    columns beside each run's name, the runs ordered by the first headline metric, best first, every run drawn;
    with ``run_ids``, only those runs (the report's: what it compared, not every run of the experiment)."""
    columns = [_column("metrics", key) for key in headline]
    columns += [_column("params", key) for key in epochs_params] + [_column("tags", "seed")]
    return {
        "selectedColumns": columns,
        "orderByKey": columns[0],
        "orderByAsc": False,
        "runsHiddenMode": "SHOW_ALL",
        **({"searchFilter": only_runs(run_ids)} if run_ids else {}),
    }


# Chart tiles per row in each section of the chart view: MLflow's default, 3, drew them 276 px wide in a 1440 px
# window beside the runs list and the side bar (tests/ui/test_browser.py measures them)
CHART_COLUMNS = 2
MODEL_METRICS, SYSTEM_METRICS = "Model metrics", "System metrics"  # MLflow's sections of keys without a prefix


def chart_sections(run_ids: Sequence[str]) -> list[str]:
    """The sections MLflow's chart view puts a chart of each metric of ``run_ids`` in, by name: a key's part before
    its last ``/`` (``val`` for ``val/top5``; ``Model metrics`` for a key without one, ``System metrics`` for
    ``system/…``), sorted."""
    client = mlflow.MlflowClient()
    keys = {key for run_id in run_ids for key in client.get_run(run_id).data.metrics}
    prefixes = {key.rpartition("/")[0] for key in keys}
    return sorted({MODEL_METRICS if not p else SYSTEM_METRICS if p == "system" else p for p in prefixes})


def _section(uuid: str, name: str, reordered: bool) -> dict:
    return {
        "uuid": uuid,
        "name": name,
        "display": True,
        "isReordered": reordered,
        "deleted": False,
        "columns": CHART_COLUMNS,
    }


def comparison_view(
    run_ids: Sequence[str], metrics: Sequence[str], table: Mapping, sections: Sequence[str] = ()
) -> dict:
    """A shared view of the runs page's chart view: only the runs ``run_ids``, every one drawn, and one line chart
    per key of ``metrics`` (a step evaluation's, then the epochs'), whose points are drawn as markers, so a run
    with a single value is a point and not an invisible line. Below that section MLflow draws a chart of each other
    metric in a section of its prefix; the ``sections`` named (``chart_sections``) are laid out, as the first, with
    ``CHART_COLUMNS`` tiles a row, those of ``metrics``' prefixes first (``val``: its other keys, ``val/top5``)."""
    section = "compared"
    charted_prefixes = {metric.rpartition("/")[0] for metric in metrics}
    sections = sorted(sections, key=lambda name: (name not in charted_prefixes, name))
    charts = [
        {
            "uuid": f"chart-{index}",
            "type": "LINE",
            "metricSectionId": section,
            "deleted": False,
            "isGenerated": False,
            "displayName": metric,
            "metricKey": metric,
            "selectedMetricKeys": [metric],
            "xAxisKey": "step",
            "xAxisScaleType": "linear",
            "scaleType": "linear",
            "yAxisKey": "metric",
            "yAxisExpressions": [],
            "selectedXAxisMetricKey": "",
            "lineSmoothness": 0,
            "displayPoints": True,
            "range": {},
            "ignoreOutliers": False,
            "useGlobalXaxisKey": False,
            "useGlobalLineSmoothing": False,
            "runsCountToCompare": len(run_ids),
        }
        for index, metric in enumerate(metrics)
    ]
    return {
        **table,
        "searchFilter": only_runs(run_ids),
        "compareRunCharts": charts,
        "compareRunSections": [
            _section(section, "compared runs", True),
            *(_section(f"section-{name}", name, False) for name in sections),
        ],
        "hideEmptyCharts": True,
        "isAccordionReordered": True,
    }


def share_view(experiment_id: str, view: Mapping) -> str:
    """Store ``view`` (a runs page's state: columns, order, filter, charts) as a shared view of the experiment, as
    the UI's Share button does (the experiment tag ``mlflow.sharedViewState.<key>``); the key, the view's hash,
    opens it (``viewStateShareKey=<key>``). The same view is stored once."""
    value = json.dumps(view, sort_keys=True, separators=(",", ":"))
    key = hashlib.sha256(value.encode()).hexdigest()
    client = mlflow.MlflowClient()
    if client.get_experiment(experiment_id).tags.get(SHARED_VIEW_TAG + key) != value:
        client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + key, value)
    return key


def epochs_params(run_ids: Sequence[str]) -> list[str]:
    """The parameters of ``run_ids`` that set a training's epochs (``baseline.epochs``, ``dim_reduce.stage1.epochs``;
    not ``warmup_epochs``), in order."""
    client = mlflow.MlflowClient()
    keys = {key for run_id in run_ids for key in client.get_run(run_id).data.params if key.endswith(".epochs")}
    return sorted(keys)


def record_compared_runs(run_ids: Sequence[str]) -> None:
    """Tag the active run with ``run_ids`` and their child runs (dim_reduce's trainings): what it compared."""
    compared = [
        child.info.run_id
        for run_id in run_ids
        for child in (mlflow.MlflowClient().get_run(run_id), *child_runs(run_id))
    ]
    set_tags({COMPARED_RUNS_TAG: ",".join(dict.fromkeys(compared))})  # once each: a child may be named too


def runs_to_compare(run_id: str, metric: str = VAL_TOP1) -> list[str]:
    """The runs a ``kedro run``'s comparison link draws: its own run and its child runs that logged ``metric`` (a
    training pipeline's, the study's trainings; not a tuned study's trials, tagged ``trial``: its fresh-seed
    trainings are the comparison), and the runs its ``compared_runs`` tag names (the report's)."""
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    candidates = [run, *child_runs(run_id)]
    named = run.data.tags.get(COMPARED_RUNS_TAG, "")
    candidates += [client.get_run(other) for other in named.split(",") if other]
    return list(
        dict.fromkeys(
            candidate.info.run_id
            for candidate in candidates
            if metric in candidate.data.metrics and "trial" not in candidate.data.tags
        )
    )


def closing_links(base: str, run_id: str) -> tuple[str | None, str]:
    """A ``kedro run``'s two links: the chart view of the runs it trained or compared (``runs_to_compare``; None
    when none logged a charted metric) and its experiment's runs table, each a shared view (``share_view``) with
    the headline columns of the first family of ``CHARTED`` its runs logged. A report's table lists the runs it
    compared alone: the whole experiment put FAILED runs and runs of unequal budget it left out above them."""
    experiment_id = experiment_of(run_id)
    reported = COMPARED_RUNS_TAG in mlflow.MlflowClient().get_run(run_id).data.tags
    for metrics, headline in CHARTED:
        compared = {metric: runs_to_compare(run_id, metric) for metric in metrics}
        charted = [metric for metric in metrics if compared[metric]]
        if charted:
            runs = list(dict.fromkeys(run for metric in charted for run in compared[metric]))
            table = table_view(headline, epochs_params(runs))
            charts = share_view(experiment_id, comparison_view(runs, charted, table, chart_sections(runs)))
            listed = table_view(headline, epochs_params(runs), runs) if reported else table
            return comparison_url(base, experiment_id, charts), runs_page_url(
                base, experiment_id, share_view(experiment_id, listed)
            )
    return None, runs_page_url(base, experiment_id, share_view(experiment_id, table_view(CHARTED[0][1], [])))
