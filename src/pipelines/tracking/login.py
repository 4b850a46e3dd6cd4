"""A tracking server that refuses the login: one error that names the server and what to set, instead of MLflow's
"API request to endpoint ... failed with error code 401" (``pipelines.cli`` tells it as the run's ``Error:`` line).
kedro-mlflow opens the experiment before any run starts, so a refused login leaves no run behind."""

from __future__ import annotations

import os
import re
import urllib.parse

import mlflow
from mlflow.exceptions import MlflowException

from pipelines.tracking.links import without_credentials
from trainlib.redaction import redact

_REFUSED = re.compile(r"error code (401|403)\b")


class TrackingLoginError(RuntimeError):
    """The MLflow server refused this process's credentials (HTTP 401) or their rights (403)."""


def refused_login(error: BaseException) -> TrackingLoginError | None:
    """A ``TrackingLoginError`` when ``error`` (or one it was raised from) is the server's 401 or 403, else None."""
    seen = error
    while seen is not None:
        found = _REFUSED.search(str(seen)) if isinstance(seen, MlflowException) else None
        if found:
            return _told(found[1], str(seen))
        seen = seen.__cause__ or seen.__context__
    return None


def _told(status: str, message: str) -> TrackingLoginError:
    """What a 401 or 403 of the server means and what to do: wrong credentials (401), a host name the server was not
    started for (403 "Invalid Host header", MLflow's DNS-rebinding check), or a permission the user lacks (403)."""
    server = redact(without_credentials(mlflow.get_tracking_uri()))
    user = os.environ.get("MLFLOW_TRACKING_USERNAME") or urllib.parse.urlsplit(mlflow.get_tracking_uri()).username
    who = f"user {user!r}" if user else "a request without a user name"
    if status == "401":
        return TrackingLoginError(
            f"The MLflow server {server} refused the login of {who} (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), in the environment or in a conf/local/"
            "credentials.yml entry that conf/local/mlflow.yml's server.credentials names (docs/team.md)"
        )
    if "Invalid Host header" in message:
        host = urllib.parse.urlsplit(without_credentials(mlflow.get_tracking_uri())).netloc
        return TrackingLoginError(
            f"The MLflow server {server} refused the host name {host!r} (HTTP 403, its DNS-rebinding check): the "
            f"server must be started with --allowed-hosts naming it, e.g. --allowed-hosts {host} (docs/team.md)"
        )
    return TrackingLoginError(
        f"The MLflow server {server} denied a permission to {who} (HTTP 403): the login is right, the user lacks "
        "EDIT on the experiment or on the registered model this run writes; the server's admin grants it (MLflow's "
        "basic-auth permissions, docs/team.md)"
    )
