"""``trainlib.redaction``: a URL's password and a credential's value are masked in any text, parameter tree and
log record (the slow tier's tests/e2e/test_secrets.py checks a whole run's files and output)."""

from __future__ import annotations

import io
import logging

import pytest

from trainlib.redaction import MASK, redact, redact_value, register_secret


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://alice:S3cret@db-host/tuning", "postgresql://alice:***@db-host/tuning"),
        ("mysql+pymysql://u:p%40ss@h:3306/db?x=1", "mysql+pymysql://u:***@h:3306/db?x=1"),
        ("storage=postgresql://alice:a:b@c@db/tuning, next", "storage=postgresql://alice:***@db/tuning, next"),
        (
            "http://bob:tok@127.0.0.1:5000 and https://carol:pw@server",
            "http://bob:***@127.0.0.1:5000 and https://carol:***@server",
        ),
    ],
)
def test_a_url_password_is_masked(text, masked):
    assert redact(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "sqlite:///data/07_model_output/study/tuning.db",
        "postgresql://alice@db-host/tuning",
        "http://127.0.0.1:5000/#/x",
        "a:b@c",
    ],
)
def test_a_text_without_a_password_is_unchanged(text):
    assert redact(text) == text


def test_credential_values_from_the_environment_and_registered_ones_are_masked(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "env-secret-1")
    register_secret("file-secret-2")
    register_secret("ab")  # too short to mask by value
    assert redact("env-secret-1 / file-secret-2 / ab") == f"{MASK} / {MASK} / ab"


def test_parameter_trees_are_masked_and_other_values_kept():
    tree = {"tuning": {"storage": "postgresql://a:pw@h/db", "trials": 4, "seeds": [1, "x://u:p@h"]}}
    assert redact_value(tree) == {
        "tuning": {"storage": "postgresql://a:***@h/db", "trials": 4, "seeds": [1, "x://u:***@h"]}
    }


def test_log_records_are_masked_as_they_are_created_whatever_the_handler(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "tracking-pw-3")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    try:
        logger.warning("opening %s as %s", "postgresql://alice:S3cret@h/db", "tracking-pw-3")
        try:
            raise ConnectionError("refused: postgresql://alice:S3cret@h/db")
        except ConnectionError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "S3cret" not in written and "tracking-pw-3" not in written
    assert "opening postgresql://alice:***@h/db as ***" in written
    assert "ConnectionError: refused: postgresql://alice:***@h/db" in written
