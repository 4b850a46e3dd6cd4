"""A tracking server that refuses the login: one error that names the server and what to set, instead of MLflow's
"API request to endpoint ... failed with error code 401" (``pipelines.cli`` tells it as the run's ``Error:`` line).
kedro-mlflow opens the experiment before any run starts, so a refused login leaves no run behind."""

from __future__ import annotations

import os
import re

import mlflow
from mlflow.exceptions import MlflowException

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
            server = redact(mlflow.get_tracking_uri())
            user = os.environ.get("MLFLOW_TRACKING_USERNAME")
            who = f"user {user!r}" if user else "a request without a user name"
            what = "refused the login of" if found[1] == "401" else "denied the permission to"
            return TrackingLoginError(
                f"The MLflow server {server} {what} {who} (HTTP {found[1]}): set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), in the environment or in a conf/local/"
                "credentials.yml entry that conf/local/mlflow.yml's server.credentials names (docs/team.md)"
            )
        seen = seen.__cause__ or seen.__context__
    return None
