"""A team's MLflow server as docs/team.md sets it up: ``mlflow server --app-name model-training-auth`` (MLflow's
login, the model-training view) on a real PostgreSQL backend store with proxied artifacts (``team_server``).
A project logs to it as the user ``alice``, whose password lives only in conf/local/credentials.yml, exported by
kedro-mlflow (``server.credentials``): the baseline and thor runs arrive, the report reads them back, the baseline's
model is registered, given the alias ``champion`` and used by ``predict`` through the login; an adasum run on two msrun
workers, whose rank 0 logs into the run with the credentials it inherits from the ``kedro run`` (no file holds them).
A wrong password is one ``Error:`` line naming the server and the variables to set, and leaves no run behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import mlflow
import pandas as pd
import pytest
import yaml

from tests.e2e.test_secrets import error_blocks, files_holding
from tests.support.projects import TINY_PARAMS, kedro, make_project
from tests.support.runner import process_state_kept
from tests.support.servers import TEAM_HOST_NAME, TeamServer, basic_auth, free_port
from tests.support.stores import ADASUM_PARAMS, THOR_PARAMS
from tests.support.trees import write_image_tree

EXPERIMENT = "resnet-recipes"


def logged_in_project(root: Path, server: str, user: tuple[str, str]) -> Path:
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    data = {**TINY_PARAMS["data"], "root": str(tree)}
    params = {**TINY_PARAMS, "data": data, "thor": THOR_PARAMS, "adasum": ADASUM_PARAMS}
    project = make_project(root / "project", {**params, "model": {"register": True}})
    local = project / "conf" / "local"
    (local / "mlflow.yml").write_text(
        yaml.safe_dump({"server": {"mlflow_tracking_uri": server, "credentials": "mlflow_login"}})
    )
    login = {"MLFLOW_TRACKING_USERNAME": user[0], "MLFLOW_TRACKING_PASSWORD": user[1]}
    (local / "credentials.yml").write_text(yaml.safe_dump({"mlflow_login": login}))
    return project


@contextmanager
def logged_in(user: tuple[str, str]):
    """This process's MLflow client logged in as ``user`` meanwhile."""
    with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_USERNAME": user[0], "MLFLOW_TRACKING_PASSWORD": user[1]}):
        yield


def run(project: Path, *args: str):
    result = kedro(project, "run", *args)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def team_project(team_server, tmp_path_factory):
    """The baseline, thor, adasum (two msrun workers), report and predict runs of one project, logged through the
    login."""
    project = logged_in_project(tmp_path_factory.mktemp("team_login"), team_server.url, team_server.user)
    two_workers = f"distributed.worker_num=2,distributed.local_worker_num=2,distributed.master_port={free_port()}"
    outputs = [
        run(project),
        run(project, "--pipelines=thor"),
        run(project, "--pipelines=adasum", f"--params={two_workers}"),
        run(project, "--pipelines=report"),
    ]
    with logged_in(team_server.user):
        client = mlflow.MlflowClient(team_server.url)
        (version,) = client.search_model_versions("name = 'baseline'")
        client.set_registered_model_alias("baseline", "champion", version.version)
    outputs.append(run(project, "--pipelines=predict", "--params=predict.model=models:/baseline@champion"))
    (project / "conf" / "local" / "credentials.yml").unlink()  # where the user put the password: the only place
    return project, outputs


def test_runs_report_and_registered_model_go_through_the_login(team_server, team_project):
    project, _ = team_project
    with logged_in(team_server.user):
        client = mlflow.MlflowClient(team_server.url)
        experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
        found = client.search_runs([experiment])
        by_pipeline = {run.data.tags.get("pipeline"): run for run in found if "mlflow.parentRunId" not in run.data.tags}
        assert set(by_pipeline) == {"baseline", "thor", "adasum", "report", "predict"}
        assert {run.info.status for run in found} == {"FINISHED"}
        # msrun's rank 0 logged through the login, with the credentials the workers inherited
        adasum = by_pipeline["adasum"].info.run_id
        assert [m.step for m in client.get_metric_history(adasum, "train/loss")] == [1, 2]
        assert "distributed/replica_max_abs_diff" in by_pipeline["adasum"].data.metrics  # two ranks compared
        compared = set(by_pipeline["report"].data.tags["compared_runs"].split(","))
        assert {by_pipeline["baseline"].info.run_id, by_pipeline["thor"].info.run_id} <= compared
    # nothing stayed local: the store is the server's PostgreSQL database
    assert not (project / "mlflow.db").exists() and not (project / "mlruns").exists()
    predictions = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    report = json.loads((project / "data/08_reporting/baseline_eval.json").read_text())
    assert (predictions["class_1"] == predictions["class_name"]).mean() == pytest.approx(report["top1"])


def test_the_password_stays_in_credentials_yml(team_server, team_project):
    project, outputs = team_project
    password = team_server.user[1]
    assert not [result.args for result in outputs if password in result.stdout + result.stderr]
    # written 0644 by the test as by most editors: each run named the file and the fix
    printed = " ".join((outputs[0].stdout + outputs[0].stderr).split())
    assert "conf/local/credentials.yml is readable by other users of this machine (mode 644): chmod 600" in printed
    assert list((project / "logs" / "msrun").glob("*/worker_*.log"))  # the adasum job's folder, checked too
    assert files_holding(project, password) == []


def rotate_password(server: str, user: str, old: str, new: str) -> None:
    """The user's own password change, as docs/team.md gives it (MLflow's users REST API, logged in with the old)."""
    request = urllib.request.Request(
        f"{server}/api/2.0/mlflow/users/update-password",
        data=json.dumps({"username": user, "password": new, "current_password": old}).encode(),
        headers={"Content-Type": "application/json", "Authorization": basic_auth(user, old)},
        method="PATCH",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def test_a_rotated_password_is_one_error_naming_the_server_and_leaves_no_run(team_server, tmp_path):
    """A teammate's password rotated as docs/team.md says: a project still holding the old one stops with one line
    and no run; the new one logs in."""
    old, new = "the-password-before", "the-password-after"
    TeamServer.with_user(team_server.url, team_server.admin, "carol", old)
    rotate_password(team_server.url, "carol", old, new)
    with logged_in(team_server.admin):
        client = mlflow.MlflowClient(team_server.url)
        before = {e.experiment_id: len(client.search_runs([e.experiment_id])) for e in client.search_experiments()}
    project = logged_in_project(tmp_path, team_server.url, ("carol", old))
    result = kedro(project, "run")
    assert result.returncode != 0
    error = result.stderr[result.stderr.index("Error:") :]
    assert error_blocks(result.stderr) == 1
    assert f"The MLflow server {team_server.url} refused the login of user 'carol' (HTTP 401)" in error
    assert "MLFLOW_TRACKING_PASSWORD" in error
    assert old not in result.stdout + result.stderr
    with logged_in(team_server.admin):
        after = {e.experiment_id: len(client.search_runs([e.experiment_id])) for e in client.search_experiments()}
    assert after == before
    with logged_in(("carol", new)):
        assert mlflow.MlflowClient(team_server.url).search_experiments()


def test_a_password_in_the_tracking_uri_is_printed_and_kept_nowhere(team_server, tmp_path):
    """``MLFLOW_TRACKING_URI=http://alice:<password>@host:port`` (issue 52): the data pipeline's run arrives through
    the login, and the password is in no line printed (MLflow's "View run" line included: off, the run prints its own
    links without credentials), no file of the project, no param, tag or run name."""
    name, password = team_server.user
    host = team_server.url.removeprefix("http://")
    project = logged_in_project(tmp_path, team_server.url, team_server.user)
    (project / "conf" / "local" / "mlflow.yml").unlink()  # the URI from the environment, as conf/base reads it
    (project / "conf" / "local" / "credentials.yml").unlink()
    environment = {**os.environ, "MLFLOW_TRACKING_URI": f"http://{name}:{password}@{host}", "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "kedro", "run", "--pipelines=data"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    printed = result.stdout + result.stderr
    assert password not in printed, printed[-3000:]
    assert f"MLflow: the runs table is {team_server.url}/#/experiments/" in printed  # the link, without credentials
    assert "View run" not in printed
    assert files_holding(project, password) == []
    with logged_in(team_server.user):
        client = mlflow.MlflowClient(team_server.url)
        experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
        (run,) = client.search_runs([experiment], "tags.pipeline = 'data'", order_by=["start_time DESC"], max_results=1)
    texts = [run.info.run_name, *run.data.tags.values(), *run.data.params.values()]
    assert not [text for text in texts if password in text]


def host_named(url: str, host: str, user: tuple[str, str]) -> tuple[int, str]:
    """The server's answer to ``url`` asked for by ``user`` under the host name ``host`` (the Host header a client that
    resolves that name sends)."""
    request = urllib.request.Request(url, headers={"Host": host, "Authorization": basic_auth(*user)})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_server_answers_the_host_name_docs_team_starts_it_for(team_server):
    """docs/team.md's ``--allowed-hosts``: a client that reaches the server by its host name is answered, where MLflow
    3.17's DNS-rebinding check refused every name but loopback's with 403 (issue 52); a name not listed still gets
    403 (``/health`` is exempt from the check: an API call is asked), and the project names the option rather than
    the credentials."""
    from pipelines.tracking.login import _told

    port = urllib.parse.urlsplit(team_server.url).port
    search = f"{team_server.url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert host_named(search, f"{TEAM_HOST_NAME}:{port}", team_server.user)[0] == 200
    status, body = host_named(search, f"elsewhere:{port}", team_server.user)
    assert status == 403 and "Invalid Host header" in body
    with process_state_kept(Path(".")):
        mlflow.set_tracking_uri(f"http://elsewhere:{port}")
        told = str(_told("403", body))
    assert f"refused the host name 'elsewhere:{port}'" in told and "--allowed-hosts elsewhere:" in told
    assert "MLFLOW_TRACKING_PASSWORD" not in told
