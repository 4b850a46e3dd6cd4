"""``CredentialHooks``: the tuning storage's secrets from conf/local/credentials.yml, Kedro's place for them, and
no secret in the run's record of its command line.

``study.tuning.credentials`` names an entry of the credentials whose keys are environment variables, as
kedro-mlflow's ``server.credentials`` does for the MLflow server::

    # conf/local/credentials.yml (git-ignored)
    tuning_db:
      PGPASSWORD: "..."

Before the run they are exported into this process's environment, where the database driver reads them (libpq's
``PGPASSWORD``) and msrun's workers inherit them; nothing is written to disk, and each value is masked wherever
the run records text (``trainlib.redaction``).

kedro-mlflow tags the run with the run's parameters as given (``runtime_params``: ``--params`` whole), before any
hook of the project could mask them afterwards; so they are masked in place first.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from kedro.framework.hooks import hook_impl

from trainlib.redaction import redact_value, register_secret

logger = logging.getLogger(__name__)


class CredentialsError(KeyError):
    """``study.tuning.credentials`` names no entry of the credentials."""

    def __str__(self) -> str:
        return str(self.args[0])


def readable_by_others(path: Path) -> bool:
    """Whether the file at ``path`` exists and its group or other users may read it."""
    try:
        return bool(path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH))
    except FileNotFoundError:
        return False


class CredentialHooks:
    @hook_impl(trylast=True)  # after ConfigurationHooks checked the environment and the parameters; before any node
    def after_context_created(self, context) -> None:
        # a credentials file every local user can read (git's checkout and most editors write 0644) holds the team's
        # passwords for them all
        local = Path(context.project_path) / "conf" / "local" / "credentials.yml"
        if readable_by_others(local):
            logger.warning(
                "%s is readable by other users of this machine (mode %o): chmod 600 %s",
                local,
                stat.S_IMODE(local.stat().st_mode),
                local,
            )
        # the raw parameters, not context.params: that property runs Kedro's typed validation, which imports every
        # pipeline's nodes (MindSpore) before ConfigurationHooks names a bad or renamed parameter
        study = context.config_loader["parameters"].get("study") or {}
        name = (study.get("tuning") or {}).get("credentials")
        if not name:
            return
        credentials = context.config_loader["credentials"]
        entry = credentials.get(name)
        if not isinstance(entry, dict):
            raise CredentialsError(
                f"study.tuning.credentials names {name!r}, which conf/local/credentials.yml does not define: add "
                f"{name}: {{PGPASSWORD: ...}} there, or set PGPASSWORD in the environment and credentials: null"
            )
        for variable, value in entry.items():
            register_secret(str(value))
            os.environ[str(variable)] = str(value)

    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook writes them as tags
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        given = dict(run_params.get("runtime_params") or {})
        if redact_value(given) != given:
            logger.warning(
                "--params holds a password: every user of this machine can read a command line (ps); give it in "
                "conf/local/credentials.yml or an environment variable instead (docs/team.md)"
            )
        run_params.update(redact_value(dict(run_params)))
