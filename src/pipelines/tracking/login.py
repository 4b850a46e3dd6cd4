"""A tracking server that refuses the login: one error that names the server and what to set, instead of MLflow's
"API request to endpoint ... failed with error code 401" (``pipelines.cli`` tells it as the run's ``Error:`` line).
kedro-mlflow opens the experiment before any run starts, so a refused login leaves no run behind."""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

import mlflow
from mlflow.exceptions import MlflowException

from pipelines.tracking.links import without_credentials
from trainlib.redaction import redact

_REFUSED = re.compile(r"error code (401|403)\b")
_ENDPOINT = re.compile(r"endpoint (\S+) failed with error code")


class TrackingLoginError(RuntimeError):
    """The MLflow server refused this process's credentials (HTTP 401) or their rights (403)."""


def refused_login(error: BaseException) -> TrackingLoginError | None:
    """A ``TrackingLoginError`` when ``error`` (or one it was raised from) is the server's 401 or 403, else None."""
    seen = error
    while seen is not None:
        found = _REFUSED.search(str(seen)) if isinstance(seen, MlflowException) else None
        if found:
            return _told(found[1], str(seen), _failed_request(seen))
        seen = seen.__cause__ or seen.__context__
    return None


@dataclass(frozen=True)
class FailedRequest:
    """What a refused request asked: MLflow's exception names only its endpoint, and the server's 403 says only
    "Permission denied"."""

    endpoint: str
    method: str
    body: dict
    server: str | None = None  # the URL it went to, and as whom
    user: str | None = None


def _failed_request(error: BaseException) -> FailedRequest | None:
    """The request behind MLflow's ``error``, read from the frames of MLflow's REST helpers in its traceback:
    ``call_endpoint`` (the tracking and registry clients) holds ``json_body``, the auth client's ``_request`` its
    ``kwargs``; both hold ``host_creds`` (the server's URL and the user name) and ``method``."""
    endpoint = _ENDPOINT.search(str(error))
    frames, step = [], error.__traceback__
    while step is not None:
        frames.append(step.tb_frame)
        step = step.tb_next
    for frame in reversed(frames if endpoint else []):  # innermost first: the helper that sent the request
        if not frame.f_globals.get("__name__", "").startswith("mlflow."):
            continue
        local = frame.f_locals
        sent = local.get("kwargs") if isinstance(local.get("kwargs"), dict) else {}
        body = local["json_body"] if "json_body" in local else sent.get("json", sent.get("params"))
        if isinstance(body, dict) and isinstance(local.get("method"), str):
            creds = local.get("host_creds")
            user, host = getattr(creds, "username", None), getattr(creds, "host", None)
            return FailedRequest(endpoint[1], local["method"], body, host, user)
    return None


def _told(status: str, message: str, request: FailedRequest | None = None) -> TrackingLoginError:
    """What a 401 or 403 of the server means and what to do: wrong credentials (401), a host name the server was not
    started for (403 "Invalid Host header", MLflow's DNS-rebinding check), or a permission the user lacks (403,
    naming the permission and the experiment or registered model when the request says which)."""
    uri = (request and request.server) or mlflow.get_tracking_uri()
    server = redact(without_credentials(uri))
    user = (
        (request and request.user) or os.environ.get("MLFLOW_TRACKING_USERNAME") or urllib.parse.urlsplit(uri).username
    )
    who = f"user {user!r}" if user else "a request without a user name"
    if status == "401":
        return TrackingLoginError(
            f"The MLflow server {server} refused the login of {who} (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), in the environment or in a conf/local/"
            "credentials.yml entry that conf/local/mlflow.yml's server.credentials names (docs/team.md)"
        )
    if "Invalid Host header" in message:
        host = urllib.parse.urlsplit(without_credentials(uri)).netloc
        return TrackingLoginError(
            f"The MLflow server {server} refused the host name {host!r} (HTTP 403, its DNS-rebinding check): the "
            f"server must be started with --allowed-hosts naming it, e.g. --allowed-hosts {host} (docs/team.md)"
        )
    lacking = _lacking(request, uri) if request else None
    if lacking is None:
        return TrackingLoginError(
            f"The MLflow server {server} denied a permission to {who} (HTTP 403): the login is right, the user lacks "
            "EDIT on the experiment or on the registered model this run writes; the server's admin grants it "
            "(kedro team permissions, docs/team.md#permissions)"
        )
    # the team's plan keeps a registered model's writes to the release role: a member refused there is the plan working
    endpoint = request.endpoint
    model_write = "/model-versions/" in endpoint or (
        "/registered-models/" in endpoint and not endpoint.endswith("/registered-models/create")
    )
    who_grants = (
        "in the team's plan only the release role creates versions and moves aliases: kedro team permissions --release"
        if model_write and request.method.upper() != "GET"
        else "the server's admin grants it: kedro team permissions"
    )
    return TrackingLoginError(
        f"The MLflow server {server} denied {who} {lacking} (HTTP 403 on {request.method} {request.endpoint}): the "
        f"login is right; {who_grants} (docs/team.md#permissions)"
    )


def _lacking(request: FailedRequest, uri: str) -> str | None:
    """The permission ``request`` needed and on what, in words, or None when its body names no resource."""
    body, endpoint = request.body, request.endpoint
    if "/users/" in endpoint:
        # users and permissions: MLflow's admin, or MANAGE on the resource a grant names
        target = _resource(body.get("resource_type"), body.get("resource_id"), uri)
        return f"MANAGE on {target}, needed to grant on it" if target else "the admin's rights, needed to read users"
    if endpoint.endswith(("/experiments/create", "/registered-models/create")) and body.get("name"):
        kind = "experiment" if "/experiments/" in endpoint else "registered model"
        return f"the right to create the {kind} {body['name']!r}"
    # MLflow's basic-auth: reads need READ, writes EDIT (creating a run, a version, moving an alias), deletions MANAGE
    permission = {"GET": "READ", "DELETE": "MANAGE"}.get(request.method.upper(), "EDIT")
    if "/registered-models/" in endpoint or "/model-versions/" in endpoint:
        target = _resource("registered_model", body.get("name"), uri)
    elif body.get("experiment_id"):
        target = _resource("experiment", body["experiment_id"], uri)
    elif body.get("run_id") or body.get("run_uuid"):
        target = _resource("run", body.get("run_id") or body.get("run_uuid"), uri)
    else:
        target = None
    return f"{permission} on {target}" if target else None


def _resource(kind: str | None, key: str | None, uri: str) -> str | None:
    """``experiment 'resnet-recipes' (id 1)``, ``registered model 'baseline'``; an experiment's name, and a run's
    experiment, looked up on the server (the user may read them: READ is MLflow's default), else the id alone."""
    if not key:
        return None
    if kind == "registered_model":
        return f"registered model {key!r}"
    if kind not in ("experiment", "run"):
        return f"{kind} {key!r}"
    client = mlflow.MlflowClient(uri)
    try:
        experiment_id = client.get_run(key).info.experiment_id if kind == "run" else key
    except MlflowException:
        return f"the experiment of run {key}"
    try:
        return f"experiment {client.get_experiment(experiment_id).name!r} (id {experiment_id})"
    except MlflowException:
        return f"experiment {experiment_id}"
