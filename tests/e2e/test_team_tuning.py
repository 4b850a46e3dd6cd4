"""A team's shared tuning on a real PostgreSQL server (``postgres``: Debian's package, password authentication),
its password where Kedro keeps credentials (conf/local/credentials.yml, ``study.tuning.credentials``) and nowhere
else: ``kedro run --pipelines=study`` tunes on it, and a wrong password stops the run with one ``Error:`` block
that says so, leaving no run RUNNING."""

from __future__ import annotations

from pathlib import Path

import optuna
import sqlalchemy
import yaml

from tests.e2e.test_secrets import error_blocks, files_holding
from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.trees import write_image_tree
from trainlib.study.tuning_storage import open_storage, storage_url

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
    assert "Wr0ng-password" not in result.stdout + result.stderr
    client, found = runs(project)
    assert {run.info.status for run in found} == {"FAILED"}
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
