"""A password given to ``kedro run`` stays where it was given: in a storage URL of ``--params``, in the environment
(libpq's ``PGPASSWORD``) or in conf/local/credentials.yml, it reaches no MLflow param, tag or run name, no log
line, no file of the project and no message on screen (``trainlib.redaction``).

Each case is a real ``kedro run --pipelines=study`` whose tuning storage is a PostgreSQL server that cannot be
reached (port 1 of loopback): the run stops on opening it, with one ``Error:`` block naming the key, after the data
pipeline and the MLflow run have started. Then every byte the run left in the project folder (``mlflow.db``,
``info.log``, ``data/``, artifacts) and everything it printed is searched for the secret.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.trees import write_image_tree

pytestmark = pytest.mark.slow

UNREACHABLE = "127.0.0.1:1/tuning"
STUDY = {"recipes": ["baseline"], "seeds": [0], "epochs": 1, "eval_every_steps": 2, "tuning": {"trials": 1}}


def project_on(root: Path) -> Path:
    tree = write_image_tree(root / "tree", classes=("cat", "dog"), per_class={"train": 4, "val": 2})
    return make_project(
        root / "project", {**TINY_PARAMS, "study": STUDY, "data": {**TINY_PARAMS["data"], "root": str(tree)}}
    )


def error_blocks(stderr: str) -> int:
    """How many ``Error:`` blocks ``stderr`` holds (click starts each on a line of its own)."""
    return len(re.findall(r"^Error: ", stderr, flags=re.MULTILINE))


def files_holding(folder: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [
        str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() and needle in path.read_bytes()
    ]


def assert_kept_secret(project: Path, result, secret: str, storage_param: str) -> None:
    assert result.returncode != 0
    printed = result.stdout + result.stderr
    assert secret not in printed, printed[-3000:]
    assert error_blocks(result.stderr) == 1, result.stderr[-3000:]
    assert "study.tuning.storage" in result.stderr and "cannot be opened" in result.stderr
    assert files_holding(project, secret) == []
    assert storage_param in result.stderr  # the storage named, its password masked
    # the storage is opened before kedro-mlflow's run starts (issue 52 item 4): no run, so no param, tag or name
    # holds the secret either
    _, found = runs(project)
    assert found == []


def test_a_password_in_the_storage_url_of_params_is_masked_everywhere(tmp_path):
    secret = "Secr3t-in-url"
    project = project_on(tmp_path)
    result = kedro(
        project, "run", "--pipelines=study", f"--params=study.tuning.storage=postgresql://alice:{secret}@{UNREACHABLE}"
    )
    assert_kept_secret(project, result, secret, f"postgresql://alice:***@{UNREACHABLE}")
    printed = " ".join((result.stdout + result.stderr).split())
    assert "--params holds a password: every user of this machine can read a command line (ps)" in printed
    assert f"postgresql://alice:***@{UNREACHABLE}" in result.stderr


def test_a_password_from_the_environment_is_masked_everywhere(tmp_path, monkeypatch):
    secret = "Secr3t-in-env"
    monkeypatch.setenv("PGPASSWORD", secret)
    project = project_on(tmp_path)
    result = kedro(
        project, "run", "--pipelines=study", f"--params=study.tuning.storage=postgresql://alice@{UNREACHABLE}"
    )
    assert_kept_secret(project, result, secret, f"postgresql://alice@{UNREACHABLE}")


def test_a_password_from_credentials_yml_is_exported_and_masked_everywhere(tmp_path, monkeypatch):
    """conf/local/credentials.yml's entry named by study.tuning.credentials is exported for libpq, and nothing the
    run records holds it."""
    secret = "Secr3t-in-credentials"
    monkeypatch.delenv("PGPASSWORD", raising=False)
    project = project_on(tmp_path)
    (project / "conf" / "local" / "credentials.yml").write_text(yaml.safe_dump({"tuning_db": {"PGPASSWORD": secret}}))
    storage = f"postgresql://alice@{UNREACHABLE}"
    result = kedro(
        project,
        "run",
        "--pipelines=study",
        f"--params=study.tuning.storage={storage},study.tuning.credentials=tuning_db",
    )
    # the credentials file itself holds the secret, as the user wrote it: every other file must not
    (project / "conf" / "local" / "credentials.yml").unlink()
    assert_kept_secret(project, result, secret, storage)
    assert "PGPASSWORD" not in os.environ
