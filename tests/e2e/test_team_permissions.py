"""docs/team.md's permission plan on the team's server behind its login, on PostgreSQL (the session's ``team_server``,
shared with test_team_login.py, so this module starts no server): the admin applies it with ``kedro team
permissions``, then each user works through MLflow's client in this process as that user.

alice's run creates the experiment, and bob, refused before the plan with a 403 naming EDIT on it, logs runs into it
after; bob (a member) can neither create a version of a reserved registered model nor move ``champion`` (403 naming
EDIT on that model); erin, the release role (the issue's carol: test_team_login.py creates a carol of its own on the
same server), can; dave, in no role, cannot take a reserved name. Names of its own (experiment, models, users), so
that test_team_login.py's experiment and model on the same server keep their permissions."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from unittest import mock

import mlflow
import pytest
import yaml
from kedro.io import DataCatalog
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.server import get_app_client

from pipelines.cli import registered_model_names
from pipelines.pipeline_registry import register_pipelines
from pipelines.tracking.login import refused_login
from pipelines.tracking.permissions import PermissionPlan, PlanError, apply_plan
from tests.support.config import load_config
from tests.support.projects import kedro, make_project
from tests.support.servers import TeamServer

EXPERIMENT = "team-plan"
MODELS = ("plan.baseline", "plan.thor")  # reserved by the plan, as the pipelines' baseline and thor names would be
MEMBERS, RELEASE, OUTSIDER = ("alice", "bob"), "erin", "dave"


@contextlib.contextmanager
def logged_in(user: tuple[str, str]):
    """This process's MLflow clients logged in as ``user`` meanwhile (the variables a run reads)."""
    with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_USERNAME": user[0], "MLFLOW_TRACKING_PASSWORD": user[1]}):
        yield


def refusal(call, *args, **kwargs) -> tuple[str, str]:
    """The server's refusal of ``call(*args, **kwargs)``: MLflow's error code and the project's words for it (told
    while still logged in, as the project tells it: the experiment's name is looked up as the same user)."""
    with pytest.raises(MlflowException) as caught:
        call(*args, **kwargs)
    told = refused_login(caught.value)
    return caught.value.error_code, str(told) if told else str(caught.value)


def admin_project(root: Path, server: TeamServer) -> Path:
    """A project logged in as the admin (conf/local/credentials.yml, as docs/team.md's teammates), its experiment
    this module's."""
    project = make_project(root, {})
    local = project / "conf" / "local"
    mlflow_yml = {
        "server": {"mlflow_tracking_uri": server.url, "credentials": "mlflow_login"},
        "tracking": {"experiment": {"name": EXPERIMENT}},
    }
    (local / "mlflow.yml").write_text(yaml.safe_dump(mlflow_yml))
    login = {"MLFLOW_TRACKING_USERNAME": server.admin[0], "MLFLOW_TRACKING_PASSWORD": server.admin[1]}
    (local / "credentials.yml").write_text(yaml.safe_dump({"mlflow_login": login}))
    (local / "credentials.yml").chmod(0o600)
    return project


@pytest.fixture(scope="module")
def plan(team_server, tmp_path_factory):
    """The users, alice's experiment and run, bob's refusal before the plan, and the plan applied by the command."""
    users = {"alice": team_server.user}
    for name in ("bob", RELEASE, OUTSIDER):
        users[name] = TeamServer.with_user(team_server.url, team_server.admin, name, secrets.token_urlsafe(12)).user
    with logged_in(users["alice"]):
        client = mlflow.MlflowClient(team_server.url)
        experiment_id = client.create_experiment(EXPERIMENT)
        client.set_terminated(client.create_run(experiment_id).info.run_id)
    with logged_in(users["bob"]):
        before = refusal(mlflow.MlflowClient(team_server.url).create_run, experiment_id)
    command = ["team", "permissions", f"--members={','.join(MEMBERS)}", f"--release={RELEASE}"]
    command.append(f"--models={','.join(MODELS)}")
    # one kedro process (the slow tier's budget): the command's refusals are told by refused_login, checked in-process
    applied = kedro(admin_project(tmp_path_factory.mktemp("team_permissions"), team_server), *command, timeout=300)
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    return {"users": users, "experiment_id": experiment_id, "before": before, "applied": applied}


def test_bob_logs_runs_into_the_experiment_alices_run_created(team_server, plan):
    experiment_id = plan["experiment_id"]
    code, told = plan["before"]
    assert code == "PERMISSION_DENIED"
    assert f"denied user 'bob' EDIT on experiment '{EXPERIMENT}' (id {experiment_id})" in told, told
    assert "kedro team permissions" in told and "MLFLOW_TRACKING_PASSWORD" not in told  # not the login's advice
    with logged_in(plan["users"]["bob"]):
        client = mlflow.MlflowClient(team_server.url)
        run = client.create_run(experiment_id, run_name="bob's")
        client.log_batch(run.info.run_id, metrics=[Metric("top1", 0.5, 0, 1)])
        client.log_text(run.info.run_id, "a model folder's file", "model/MLmodel")  # proxied to the artifact store
        client.set_terminated(run.info.run_id)
        assert client.get_run(run.info.run_id).data.metrics == {"top1": 0.5}
    # a wrong password is the login's 401, told as such
    with logged_in(("bob", "not-his-password")):
        code, told = refusal(mlflow.MlflowClient(team_server.url).search_experiments)
    assert code == "UNAUTHENTICATED" and "refused the login of user 'bob' (HTTP 401)" in told, told


def test_only_the_release_role_creates_versions_and_moves_champion(team_server, plan):
    model = MODELS[0]
    with logged_in(plan["users"]["bob"]):
        client = mlflow.MlflowClient(team_server.url)
        run = client.create_run(plan["experiment_id"])
        client.log_text(run.info.run_id, "a model folder's file", "model/MLmodel")
        client.set_terminated(run.info.run_id)
        source = f"runs:/{run.info.run_id}/model"
        code, told = refusal(client.create_model_version, model, source, run.info.run_id)
        assert code == "PERMISSION_DENIED" and f"denied user 'bob' EDIT on registered model '{model}'" in told, told
    with logged_in(plan["users"][RELEASE]):
        client = mlflow.MlflowClient(team_server.url)
        version = client.create_model_version(model, source, run.info.run_id)
        client.set_registered_model_alias(model, "champion", version.version)
        second = client.create_model_version(model, source, run.info.run_id)
    with logged_in(plan["users"]["bob"]):
        client = mlflow.MlflowClient(team_server.url)
        assert client.get_model_version_by_alias(model, "champion").version == version.version  # READ: he uses it
        code, told = refusal(client.set_registered_model_alias, model, "champion", second.version)
        assert code == "PERMISSION_DENIED" and f"denied user 'bob' EDIT on registered model '{model}'" in told, told
        assert "POST /api/2.0/mlflow/registered-models/alias" in told and "only the release role" in told
    with logged_in(plan["users"][RELEASE]):
        client = mlflow.MlflowClient(team_server.url)
        client.set_registered_model_alias(model, "champion", second.version)  # the release moves it
        assert client.get_model_version_by_alias(model, "champion").version == second.version


def test_a_user_outside_the_plan_cannot_take_a_reserved_name(team_server, plan):
    auth = get_app_client("basic-auth", tracking_uri=team_server.url)
    with logged_in(plan["users"][OUTSIDER]):
        client = mlflow.MlflowClient(team_server.url)
        code, _ = refusal(client.create_registered_model, MODELS[1])
        assert code == "RESOURCE_ALREADY_EXISTS"  # the admin's: dave's create made nothing of his
        code, told = refusal(client.update_registered_model, MODELS[1], "dave's description")
        assert code == "PERMISSION_DENIED" and f"denied user 'dave' EDIT on registered model '{MODELS[1]}'" in told
    with logged_in(team_server.admin):
        assert auth.get_user_permission(OUTSIDER, "registered_model", MODELS[1]).permission == "READ"  # the default
        assert auth.get_user_permission(RELEASE, "registered_model", MODELS[1]).permission == "MANAGE"


def test_the_plan_applied_twice_changes_nothing_and_prints_no_password(team_server, plan):
    applied = plan["applied"]
    printed = applied.stdout + applied.stderr
    assert team_server.admin[1] not in printed
    assert not [user for user, (_, password) in plan["users"].items() if password in printed]
    lines = applied.stdout.splitlines()
    experiment = f"experiment '{EXPERIMENT}' (id {plan['experiment_id']})"
    assert f"{experiment} exists" in lines and f"registered model '{MODELS[0]}' reserved" in lines, lines
    assert f"alice: EDIT on {experiment}: was MANAGE" in lines  # what her run's creation gave her, as planned now
    assert f"erin: MANAGE on registered model '{MODELS[0]}': granted (was READ)" in lines
    with logged_in(team_server.admin):
        again = apply_plan(PermissionPlan((EXPERIMENT,), MODELS, MEMBERS, (RELEASE,)), team_server.url)
    grants = [line for line in again if line.partition(":")[0] in (*MEMBERS, RELEASE)]
    assert len(grants) == 3 * (1 + len(MODELS)) and all(line.endswith(": unchanged") for line in grants), again
    # the plan is the admin's to apply: a member's attempt stops at its first grant, told as such
    with logged_in(plan["users"]["bob"]):
        code, told = refusal(apply_plan, PermissionPlan((EXPERIMENT,), MODELS, ("bob",), ()), team_server.url)
    assert code == "PERMISSION_DENIED" and f"denied user 'bob' MANAGE on {experiment}, needed to grant" in told, told
    # a user the server does not know stops the plan before any change
    with logged_in(team_server.admin), pytest.raises(PlanError, match="user 'zoe' does not exist on the MLflow server"):
        apply_plan(PermissionPlan(("team-plan-unmade",), MODELS, ("bob", "zoe"), ()), team_server.url)
    with logged_in(team_server.admin):
        assert mlflow.MlflowClient(team_server.url).get_experiment_by_name("team-plan-unmade") is None


def test_the_plan_reserves_every_name_the_pipelines_register_by_default():
    """The command's default ``--models``: each model folder of the catalog (``mlflow_model``) that a pipeline
    writes, under the name ``model.register`` creates versions of (in-process: no server)."""
    catalog = DataCatalog.from_config(load_config("base", "catalog"))
    datasets = sorted({name for pipeline in register_pipelines().values() for name in pipeline.datasets()})
    assert registered_model_names(catalog, datasets) == (
        *("adasum", "baseline", "dim_reduce.control", "dim_reduce.stage2"),
        *("lars", "thor", "thor_bert.control", "thor_bert.thor"),
    )
