"""The tuning's Optuna storage: an RDB URL (SQLite, or PostgreSQL through psycopg 3) opened by every process and
machine that shares a tuning, with its heartbeats, the schema race of processes started together on a new database,
and one error line, password masked, for a database that cannot be opened (``tuning`` runs the trials)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial

from trainlib.params import TuningParams
from trainlib.redaction import redact

SCHEMA_ATTEMPTS = 5  # opening a new storage that other processes create at the same moment


class TuningStorageError(RuntimeError):
    """``study.tuning.storage`` names a database that cannot be opened (unreachable, refused, wrong password)."""


def storage_url(url: str) -> str:
    """``url`` as SQLAlchemy opens it: a bare ``postgresql://`` through psycopg (3), the driver the project locks
    (SQLAlchemy's default for it is psycopg2). With no password in the URL, libpq reads ``PGPASSWORD`` or
    ``~/.pgpass`` (docs/team.md)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def open_storage(
    url: str, heartbeats: tuple[TuningParams, Callable[[optuna.Study, FrozenTrial], None]] | None = None
) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage; a SQLite file's folder is made, and its writers wait for each other's locks. With
    ``heartbeats``, its trials record them and a dead one's goes to the callback (``tuning.RetryDeadTrial``).

    Processes started together on a new storage all create its schema: the ones that lose that race get a
    duplicate key or "relation already exists" (``_schema_race``), and open the storage the winner made.
    A storage that cannot be opened at all stops the study with ``TuningStorageError``, the URL's password
    masked."""
    options: dict = {}
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        options["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    if heartbeats is not None:
        tuning, on_dead_trial = heartbeats
        options |= {
            "heartbeat_interval": tuning.heartbeat_interval,
            "grace_period": tuning.grace_period,
            "heartbeat_stale_trial_callback": on_dead_trial,
        }
    attempt = 1
    while True:
        try:
            return _rdb_storage(url, options)
        except sqlalchemy.exc.DBAPIError as error:
            if attempt < SCHEMA_ATTEMPTS and _schema_race(url, error):
                attempt += 1
                continue
            reason = str(error.orig or error).strip().splitlines()[0]
            raise TuningStorageError(
                f"study.tuning.storage {redact(url)} cannot be opened: {redact(reason)}. Check the server, the "
                "user and the password (PGPASSWORD or conf/local/credentials.yml, docs/team.md)"
            ) from None


def _rdb_storage(url: str, options: Mapping) -> optuna.storages.RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeat_interval
        return optuna.storages.RDBStorage(storage_url(url), **options)


def _schema_race(url: str, error: sqlalchemy.exc.DBAPIError) -> bool:
    """Whether ``error`` may be another process creating the same schema, not a database that cannot be
    reached: a duplicate row or type (``IntegrityError``), a table "already exists" (PostgreSQL's
    ``DuplicateTable`` is a ``ProgrammingError``, SQLite's an ``OperationalError``), or any error of a SQLite file,
    whose writers lock each other out. Optuna's answer, creating the storage before starting the machines
    (optuna/optuna#1092), is one more step for every team; a retry needs none."""
    return (
        isinstance(error, sqlalchemy.exc.IntegrityError)
        or url.startswith("sqlite")
        or "already exists" in str(error.orig or error)
    )
