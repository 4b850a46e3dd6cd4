"""A team's shared tuning on a real PostgreSQL server (``postgres``: Debian's package, password authentication),
its password where Kedro keeps credentials (conf/local/credentials.yml, ``study.tuning.credentials``) and nowhere
else: ``kedro run --pipelines=study`` tunes on it, and a wrong password stops the run before its first node with one
``Error:`` block that says so, leaving no MLflow run. A database lost mid-trial (its connections cut and refused, on
the session's server) is retried within its window: back in time, the trial goes on; past it, the main thread stops
with one error naming the database and Optuna's heartbeat thread prints no traceback."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import yaml

from tests.e2e.test_secrets import error_blocks, files_holding
from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.trees import write_image_tree
from trainlib import signals
from trainlib.params import TuningParams
from trainlib.study.tuning_storage import TuningStorageLost, open_storage, storage_url

SPACE = {"baseline": {"lr": {"peak": [0.01, 0.2], "warmup_epochs": None}, "weight_decay": None}}


def tuned_project(root: Path, storage: str, password: str) -> Path:
    tree = write_image_tree(root / "tree", classes=("cat", "dog"), per_class={"train": 4, "val": 2})
    study = {
        "recipes": ["baseline"],
        "seeds": [0],
        "epochs": 1,
        "eval_every_steps": 2,
        "tuning": {"trials": 2, "seeds": [100], "storage": storage, "credentials": "tuning_db", "spaces": SPACE},
    }
    project = make_project(
        root / "project", {**TINY_PARAMS, "study": study, "data": {**TINY_PARAMS["data"], "root": str(tree)}}
    )
    (project / "conf" / "local" / "credentials.yml").write_text(yaml.safe_dump({"tuning_db": {"PGPASSWORD": password}}))
    return project


def test_the_study_tunes_on_postgresql_with_the_password_from_credentials_only(tmp_path, postgres, monkeypatch):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    password = "Tun1ng-db-pw"
    postgres.add_user("tuner", password, "tuning")
    storage = postgres.url("tuner", "tuning")
    project = tuned_project(tmp_path, storage, password)

    result = kedro(project, "run", "--pipelines=study")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    trials = optuna.load_study(
        study_name="study/baseline", storage=postgres.url("tuner", "tuning", password, "postgresql+psycopg")
    ).trials
    assert [trial.state.name for trial in trials] == ["COMPLETE", "COMPLETE"]
    client, found = runs(project)
    by_trial = sorted(run.data.tags["trial"] for run in found if "trial" in run.data.tags)
    assert by_trial == ["0", "1"]  # one MLflow child run per trial
    (study_run,) = [run for run in found if run.data.tags.get("pipeline") == "study"]
    assert study_run.data.params["study.tuning.storage"] == storage
    # the secret stays in credentials.yml, where the user put it
    (project / "conf" / "local" / "credentials.yml").unlink()
    assert password not in result.stdout + result.stderr
    assert files_holding(project, password) == []


def test_a_rotated_password_is_one_error_line_naming_the_storage(tmp_path, postgres, monkeypatch):
    """The role's password rotated as docs/team.md says (ALTER ROLE): a project still holding the old one stops
    with one line; the new one opens the storage."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    postgres.add_user("late", "Wr0ng-password", "late_tuning")
    postgres.sql("ALTER ROLE late PASSWORD 'the-right-one';")
    project = tuned_project(tmp_path, postgres.url("late", "late_tuning"), "Wr0ng-password")

    result = kedro(project, "run", "--pipelines=study")
    assert result.returncode != 0
    assert error_blocks(result.stderr) == 1
    error = result.stderr[result.stderr.index("Error:") :]
    assert "study.tuning.storage" in error and 'password authentication failed for user "late"' in error
    assert f"database 'late_tuning' on 127.0.0.1, port {postgres.port}" in error
    assert "Wr0ng-password" not in result.stdout + result.stderr
    # found before the first node (no data step ran) and before kedro-mlflow started a run
    assert "Running node" not in result.stdout + result.stderr
    client, found = runs(project)
    assert found == []
    optuna.storages.RDBStorage(postgres.url("late", "late_tuning", "the-right-one", "postgresql+psycopg"))


def test_a_machine_that_loses_the_race_to_create_the_schema_opens_the_winners(postgres):
    """Machines started together on a new database all create Optuna's schema; one whose ``CREATE TABLE`` comes
    after another's commit gets PostgreSQL's "relation already exists" (optuna/optuna#1092, as a CI run of
    ``test_team_machines`` did). Here the other machine creates the storage at exactly that moment, every time."""
    postgres.add_user("racer", "Rac3-pw", "raced_tuning")
    url = postgres.url("racer", "raced_tuning", "Rac3-pw")
    other_machine_ran = []

    def the_other_machine_commits_first(connection, cursor, statement, *args):
        if statement.lstrip().startswith("CREATE TABLE alembic_version") and not other_machine_ran:
            other_machine_ran.append(True)
            optuna.storages.RDBStorage(storage_url(url))

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", the_other_machine_commits_first)
    try:
        storage = open_storage(url)
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", the_other_machine_commits_first)

    assert other_machine_ran
    assert postgres.sql("SELECT count(*) FROM alembic_version;", "raced_tuning").split()[2] == "1"
    study = optuna.create_study(storage=storage, study_name="raced")
    study.tell(study.ask(), 1.0)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"]


LOST_PASSWORD = "L0st-db-pw"


def cut(postgres, database: str, *, allow: bool) -> None:
    """The database gone for its clients as when its server stops (``allow=False``: every connection ended, every
    new one refused) or back (``allow=True``), while the session's server goes on for the other tests."""
    postgres.sql(f"ALTER DATABASE {database} ALLOW_CONNECTIONS {str(allow).lower()};")
    if not allow:
        postgres.sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}';")


def until(condition, timeout_s: float = 60) -> None:
    """Return once ``condition()`` holds, looking every 50 ms (a training's steps), or fail after ``timeout_s``."""
    stop = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < stop, "timed out"
        threading.Event().wait(0.05)


def heartbeat_storage(postgres, database: str, window_s: float, dead: list, *, new: bool = True):
    """``database``'s storage (a new role and database with ``new``) with heartbeats every second, a trial stale after
    2 s (its number then goes to ``dead``), retried for ``window_s``."""
    if new:
        postgres.add_user(database, LOST_PASSWORD, database)
    url = postgres.url(database, database, LOST_PASSWORD)
    tuning = TuningParams(
        trials=1, seeds=[100], sampler="tpe", sampler_seed=0, pruner="none", storage=url, name="lost", spaces={},
        heartbeat_interval=1, grace_period=2, retry_window_s=window_s,
    )  # fmt: skip
    return open_storage(url, heartbeats=(tuning, lambda study, trial: dead.append(trial.number)))


@pytest.fixture
def thread_tracebacks(monkeypatch):
    """The errors any thread died of (what ``threading.excepthook`` would print as a traceback)."""
    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    return died


def test_a_database_back_within_its_window_is_retried_and_the_trial_goes_on(postgres, caplog, thread_tracebacks):
    storage = heartbeat_storage(postgres, "blip", 60, [])
    study = optuna.create_study(storage=storage, study_name="blip")

    def training(trial):
        cut(postgres, "blip", allow=False)
        until(lambda: "retry 1 " in caplog.text)  # the heartbeat found it gone
        cut(postgres, "blip", allow=True)  # a restart: back before the window's end
        until(lambda: "answers again" in caplog.text)
        return 1.0

    with caplog.at_level(logging.INFO, logger="trainlib.study.tuning_storage"):
        study.optimize(training, n_trials=1)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"]
    assert "database 'blip' on 127.0.0.1" in caplog.text and LOST_PASSWORD not in caplog.text
    assert thread_tracebacks == []


def test_a_database_lost_mid_trial_stops_the_main_thread_with_one_error_after_its_window(
    postgres, caplog, thread_tracebacks
):
    window = 3
    dead = []
    storage = heartbeat_storage(postgres, "lost", window, dead)
    study = optuna.create_study(storage=storage, study_name="lost")
    started = []

    def training(trial):  # steps that never touch the storage, as a training's do
        cut(postgres, "lost", allow=False)
        started.append(time.monotonic())
        until(lambda: False, timeout_s=120)

    previous = signals.install()  # as a kedro run has them: the heartbeat thread stops the main thread through them
    try:
        with caplog.at_level(logging.INFO, logger="trainlib.study.tuning_storage"):
            with pytest.raises(TuningStorageLost) as lost:
                study.optimize(training, n_trials=1)
    finally:
        signals.restore(previous)
    took = time.monotonic() - started[0]

    message = str(lost.value)
    assert f"database 'lost' on 127.0.0.1, port {postgres.port}" in message and "retry_window_s" in message
    assert LOST_PASSWORD not in message + caplog.text
    # the heartbeat (every second) finds it gone, then retries for the window, one line each
    assert window <= took < 1 + window + 15
    retries = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(retries) >= 2 and all("database 'lost'" in line for line in retries)
    assert thread_tracebacks == []  # the heartbeat thread died of nothing

    # back, a rerun finds the trial left RUNNING stale (no heartbeat since the cut) and fails it: its values run again
    cut(postgres, "lost", allow=True)
    rerun = optuna.load_study(study_name="lost", storage=heartbeat_storage(postgres, "lost", window, dead, new=False))
    assert [trial.state.name for trial in rerun.trials] == ["RUNNING"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(rerun)
    assert [trial.state.name for trial in rerun.trials] == ["FAIL"] and dead == [0]
