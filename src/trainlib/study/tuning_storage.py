"""The tuning's Optuna storage: an RDB URL (SQLite, or PostgreSQL through psycopg 3) opened by every process and
machine that shares a tuning, with its heartbeats, the schema race of processes started together on a new database,
and its outages, each named in one error line with the database's host, port and name, password masked:

- a storage that cannot be opened (unreachable, refused, wrong password) is ``TuningStorageError``; a run checks it
  before its first node (``check_storage``), so that is seconds after the command, before any work;
- a storage that stops answering mid-run (a restart, a network lost) is retried for ``study.tuning.retry_window_s``,
  one log line per retry; back within it, the run goes on; past it, ``TuningStorageLost``. Optuna's heartbeat
  thread, where the loss usually shows first (the main thread trains for minutes without a query), stops the main
  thread with it (``trainlib.signals.stop_main_thread``) instead of dying with a traceback of its own.

``tuning`` runs the trials."""

from __future__ import annotations

import functools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial
from sqlalchemy.engine import make_url

from trainlib import signals
from trainlib.params import TuningParams
from trainlib.redaction import redact

logger = logging.getLogger(__name__)

SCHEMA_ATTEMPTS = 5  # opening a new storage that other processes create at the same moment
DEFAULT_RETRY_WINDOW_S = 60.0  # TuningParams.retry_window_s's default, for a storage opened without the parameters
RETRY_MAX_WAIT_S = 10.0  # retries 1, 2, 4, 8, 10, 10, ... s apart: a restart is noticed within seconds
# libpq's limits on one attempt, so that no query or connection outlasts the window by much: a connection to a host
# that drops packets (connect_timeout, s), an answer that never comes on an open connection (TCP keepalives: idle,
# interval, count; and tcp_user_timeout, ms, for data never acknowledged). A URL's own query values win.
PG_CONNECT_ARGS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 25_000,
}
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


class TuningStorageError(RuntimeError):
    """``study.tuning.storage`` names a database that cannot be opened (unreachable, refused, wrong password)."""


class TuningStorageLost(TuningStorageError):
    """The storage stopped answering mid-run and did not answer again within ``study.tuning.retry_window_s``."""


def storage_url(url: str) -> str:
    """``url`` as SQLAlchemy opens it: a bare ``postgresql://`` through psycopg (3), the driver the project locks
    (SQLAlchemy's default for it is psycopg2). With no password in the URL, libpq reads ``PGPASSWORD`` or
    ``~/.pgpass`` (docs/team.md)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def storage_named(url: str) -> str:
    """``url`` as an error names it, password masked, with its parts spelled out: ``postgresql://tuner@db-host/tuning
    (database 'tuning' on db-host, port 5432)``; a SQLite file's path."""
    shown = redact(url)
    try:
        parts = make_url(storage_url(url))
    except sqlalchemy.exc.ArgumentError:
        return shown
    if parts.get_backend_name() == "sqlite":
        return f"{shown} (file {parts.database})" if parts.database else shown
    host = parts.host or "the local socket"
    port = parts.port or DEFAULT_PORTS.get(parts.get_backend_name())
    return f"{shown} (database {parts.database!r} on {host}{f', port {port}' if port else ''})"


def open_storage(
    url: str,
    heartbeats: tuple[TuningParams, Callable[[optuna.Study, FrozenTrial], None]] | None = None,
    *,
    retry_window_s: float | None = None,
) -> RDBStorage:
    """An Optuna RDB storage; a SQLite file's folder is made, and its writers wait for each other's locks. With
    ``heartbeats``, its trials record them and a dead one's goes to the callback (``tuning.RetryDeadTrial``).

    Every call to it that finds the database gone is retried for ``retry_window_s`` (default: the heartbeats'
    ``TuningParams.retry_window_s``, else ``DEFAULT_RETRY_WINDOW_S``), then raises ``TuningStorageLost``; opening
    it too, but a refused login (a wrong password) is told at once. Pooled connections are checked before use
    (SQLAlchemy's ``pool_pre_ping``), so one left from before a restart is replaced, not failed.

    Processes started together on a new storage all create its schema: the ones that lose that race get a
    duplicate key or "relation already exists" (``_schema_race``), and open the storage the winner made.
    A storage that cannot be opened stops the study with ``TuningStorageError``, the URL's password masked."""
    if retry_window_s is None:
        retry_window_s = heartbeats[0].retry_window_s if heartbeats is not None else DEFAULT_RETRY_WINDOW_S
    engine_kwargs: dict = {"pool_pre_ping": True}
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": 60}
    elif storage_url(url).startswith("postgresql+psycopg"):
        given = make_url(storage_url(url)).query
        engine_kwargs["connect_args"] = {key: value for key, value in PG_CONNECT_ARGS.items() if key not in given}
    options: dict = {"engine_kwargs": engine_kwargs}
    if heartbeats is not None:
        tuning, on_dead_trial = heartbeats
        options |= {
            "heartbeat_interval": tuning.heartbeat_interval,
            "grace_period": tuning.grace_period,
            "heartbeat_stale_trial_callback": on_dead_trial,
        }
    outage = Outage(storage_named(url), retry_window_s)
    attempt = 1
    while True:
        try:
            storage = _rdb_storage(url, options)
        except (sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError) as raised:
            error = _database_error(raised) or raised
            if attempt < SCHEMA_ATTEMPTS and _schema_race(url, error):
                attempt += 1
                continue
            gone = isinstance(error, sqlalchemy.exc.DBAPIError) and _connection_lost(error)
            if gone and not _refused_login(error) and outage.wait_again(error):
                continue
            raise TuningStorageError(
                f"study.tuning.storage {outage.named} cannot be opened: {_reason(error)}. Check the server, the "
                "user and the password (PGPASSWORD or conf/local/credentials.yml, docs/team.md)"
            ) from None
        outage.answered()
        storage.outage = outage
        return storage


def check_storage(url: str) -> None:
    """Open ``url``'s storage once, with no retry, and close it: a run checks its tuning storage before its first node,
    so an unreachable database or a refused login is one ``TuningStorageError`` within seconds (libpq's connect
    timeout at most), before any work and before any MLflow run."""
    storage = open_storage(url, retry_window_s=0)
    storage.engine.dispose()


class Outage:
    """One storage's answers over time: when it stopped answering (shared by the threads that call it, Optuna's
    heartbeat and the main one), each retry logged, and ``lost`` once it has not answered for ``window_s``."""

    def __init__(self, named: str, window_s: float):
        self.named, self.window_s = named, window_s
        self.lost: TuningStorageLost | None = None
        self.last_read: dict[int, FrozenTrial] = {}  # each trial as get_trial last read it (_WindowedStorage)
        self.told: dict[int, FrozenTrial] = {}  # and as a tell that found the storage lost asked it to be
        self._since: float | None = None  # time.monotonic() of the first failure of the current outage
        self._retries = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # a storage pickles (RDBStorage.__getstate__); its lock cannot
        return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def wait_again(self, error: BaseException) -> bool:
        """After a call that found the database gone: wait for the next retry and True, or False once it has not
        answered for the window (``lost`` is then set)."""
        with self._lock:
            now = time.monotonic()
            self._since = now if self._since is None else self._since
            waited = now - self._since
            if waited >= self.window_s:
                if self.lost is None:
                    self.lost = TuningStorageLost(
                        f"study.tuning.storage {self.named} stopped answering and was retried for {waited:.0f} s "
                        f"(study.tuning.retry_window_s is {self.window_s:g}): {_reason(error)}. Rerun the same "
                        "command once it answers: the trials it left RUNNING run again "
                        "(docs/troubleshooting.md#outages)"
                    )
                return False
            self._retries += 1
            retry = self._retries
            wait = min(RETRY_MAX_WAIT_S, 2.0 ** min(retry - 1, 10), self.window_s - waited)
        logger.warning(
            "study.tuning.storage %s does not answer (%s): retry %d in %.0f s, for up to %g s in all "
            "(study.tuning.retry_window_s)",
            self.named,
            _reason(error),
            retry,
            wait,
            self.window_s,
        )
        time.sleep(wait)
        return True

    def answered(self) -> None:
        with self._lock:
            since, self._since, self._retries = self._since, None, 0
        if since is not None:
            logger.info("study.tuning.storage %s answers again, after %.0f s", self.named, time.monotonic() - since)

    def call(self, method: Callable, *args, heartbeat: bool = False, **kwargs):
        """``method(*args, **kwargs)``, retried while the database is gone, within the window. Past it, raises
        ``TuningStorageLost`` (every later call at once); from the heartbeat thread, stops the main thread with it
        and returns (``heartbeat``)."""
        while self.lost is None:
            try:
                result = method(*args, **kwargs)
            except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as raised:
                error = _database_error(raised)
                if error is None or not _connection_lost(error):
                    raise
                if self.wait_again(error):
                    continue
                if heartbeat:
                    # Optuna's heartbeat thread would die with an 80-line traceback and leave the main thread
                    # training until its next query, minutes away: the main thread stops with the error instead
                    if not signals.stop_main_thread(self.lost):
                        logger.error("%s", self.lost)  # outside a kedro run: the next query in the main thread raises
                    return None
                raise TuningStorageLost(str(self.lost)) from None
            self.answered()
            return result
        if heartbeat:
            return None
        raise TuningStorageLost(str(self.lost)) from None


def _within_window(name: str) -> Callable:
    method = getattr(RDBStorage, name)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        outage = getattr(self, "outage", None)
        if outage is None:  # RDBStorage's own __init__, before open_storage sets it
            return method(self, *args, **kwargs)
        return outage.call(method, self, *args, heartbeat=name == "record_heartbeat", **kwargs)

    return call


class _WindowedStorage(RDBStorage):
    """Optuna's ``RDBStorage``, each of its calls through its ``outage`` (``Outage.call``)."""

    outage: Outage | None = None

    # Optuna 5's _run_trial reads the trial again when its tell fails, and its `finally` then raises UnboundLocalError
    # when that read fails too, or AssertionError for a trial still RUNNING, instead of the storage's error. Once the
    # storage is lost, that read gets the trial as last read in the state the tell asked for, so that the tell's
    # TuningStorageLost is what the run stops with.

    def get_trial(self, trial_id: int) -> FrozenTrial:
        try:
            trial = _get_trial_within_window(self, trial_id)
        except TuningStorageLost:
            known = self.outage.told.get(trial_id) or self.outage.last_read.get(trial_id) if self.outage else None
            if known is None:
                raise
            return known
        if self.outage is not None:
            self.outage.last_read[trial_id] = trial
        return trial

    def set_trial_state_values(self, trial_id: int, state, values=None) -> bool:
        try:
            return _set_trial_state_values_within_window(self, trial_id, state, values)
        except TuningStorageLost:
            read = self.outage.last_read.get(trial_id) if self.outage is not None else None
            if read is not None:
                self.outage.told[trial_id] = FrozenTrial(
                    number=read.number, state=state, value=None, values=values, datetime_start=read.datetime_start,
                    datetime_complete=None, params=read.params, distributions=read.distributions,
                    user_attrs=read.user_attrs, system_attrs=read.system_attrs,
                    intermediate_values=read.intermediate_values, trial_id=trial_id,
                )  # fmt: skip
            raise


# every query of the storage: BaseStorage's public methods and the heartbeat's (fail_stale_trials reads the stale ones)
for _name in [
    *(name for name, value in vars(BaseStorage).items() if callable(value) and not name.startswith("_")),
    "record_heartbeat",
    "_get_stale_trial_ids",
    "_create_new_trial",  # what Optuna's cache in front of the storage calls for create_new_trial
]:
    if _name not in ("remove_session", "check_trial_is_updatable", "get_trial", "set_trial_state_values"):
        setattr(_WindowedStorage, _name, _within_window(_name))  # (no query; the last two above)
_get_trial_within_window = _within_window("get_trial")
_set_trial_state_values_within_window = _within_window("set_trial_state_values")


def _rdb_storage(url: str, options: Mapping) -> RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeat_interval
        return _WindowedStorage(storage_url(url), **options)


def _database_error(error: BaseException) -> sqlalchemy.exc.DBAPIError | None:
    """The driver's error behind ``error`` (Optuna's ``StorageInternalError`` is raised from it), or None."""
    seen = error
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.DBAPIError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _connection_lost(error: sqlalchemy.exc.DBAPIError) -> bool:
    """Whether ``error`` says the database is gone (refused, reset, not accepting connections, timed out), not that
    a query is wrong: SQLAlchemy's ``OperationalError`` and ``InterfaceError``, or a connection it invalidated."""
    return isinstance(error, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError) or bool(
        error.connection_invalidated
    )


def _refused_login(error: BaseException) -> bool:
    """A wrong password or an unknown user (PostgreSQL's SQLSTATE class 28): no retry makes it right."""
    return str(getattr(getattr(error, "orig", None), "sqlstate", None) or "").startswith("28")


def _reason(error: BaseException) -> str:
    """The driver's first line, password masked."""
    text = str(getattr(error, "orig", None) or error).strip()
    return redact(text.splitlines()[0] if text else type(error).__name__)


def _schema_race(url: str, error: BaseException) -> bool:
    """Whether ``error`` may be another process creating the same schema, not a database that cannot be
    reached: a duplicate row or type (``IntegrityError``), a table "already exists" (PostgreSQL's
    ``DuplicateTable`` is a ``ProgrammingError``, SQLite's an ``OperationalError``), or any error of a SQLite file,
    whose writers lock each other out. Optuna's answer, creating the storage before starting the machines
    (optuna/optuna#1092), is one more step for every team; a retry needs none."""
    return (
        isinstance(error, sqlalchemy.exc.IntegrityError)
        or url.startswith("sqlite")
        or "already exists" in str(getattr(error, "orig", None) or error)
    )
