"""Secrets stay where they were given: the one place that masks a password or token before anything records it.

Every writer that keeps text passes it through ``redact``: MLflow params, tags and run names
(``pipelines.tracking``, ``pipelines.hooks``), log records (``redact_log_records``, as each is created), the
``Error:`` block (``pipelines.failures``) and the tuning storage's errors (``trainlib.study.tuning``). The study's
files hold no storage URL (tests/e2e/test_secrets.py searches every file of a run). Two kinds of secret are masked:

- the password of a URL, ``postgresql://alice:<password>@db-host/tuning`` -> ``postgresql://alice:***@db-host/tuning``,
  wherever such a URL appears in a text;
- the value of every environment variable that holds a credential (``SECRET_VARIABLES``: libpq's ``PGPASSWORD``,
  MLflow's ``MLFLOW_TRACKING_PASSWORD`` and ``MLFLOW_TRACKING_TOKEN``, ...) and of every credential the project
  exported from conf/local/credentials.yml (``register_secret``), wherever it appears.

The secrets themselves are never copied anywhere: they are read from the environment when a text is redacted.
"""

from __future__ import annotations

import logging
import os
import re
import traceback
from collections.abc import Mapping

MASK = "***"
# Environment variables whose value is a credential, as their owners define them: libpq (PostgreSQL), MySQL's client,
# MLflow's REST client (basic auth and bearer token), and the S3 client of an MLflow artifact store
SECRET_VARIABLES = (
    "PGPASSWORD",
    "MYSQL_PWD",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)
# Shorter values are not masked by value (a one- or two-letter value would mask every word holding it); a URL's
# password is masked whatever its length
MIN_SECRET_LENGTH = 4
# scheme://user:password@host...: the password runs to the last "@" before the host (an "@" inside it is
# percent-encoded in a valid URL, but a hand-typed one may not be)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<password>[^\s/]*)@")
_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Mask ``value`` from now on in this process (a credential read from conf/local/credentials.yml)."""
    if value and len(str(value)) >= MIN_SECRET_LENGTH:
        _registered.add(str(value))


def secret_values() -> list[str]:
    """The values masked by value, longest first (a secret holding another is masked whole)."""
    values = {os.environ.get(name) for name in SECRET_VARIABLES} | _registered
    return sorted((v for v in values if v and len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def redact(text: str) -> str:
    """``text`` with every URL password and every known secret value replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda found: f"{found['head']}{MASK}@", text)
    for secret in secret_values():
        text = text.replace(secret, MASK)
    return text


def redact_value(value):
    """A parameter, tag or row with its strings redacted, nested mappings and lists included; other values as
    they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: redact_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item) for item in value)
    return value


def redact_log_records() -> None:
    """Make every log record of this process redacted as it is created, whatever handler writes it (rich's
    console, the log file, a notebook's, an msrun worker's): its message with its arguments merged in, and its
    traceback. Kedro accepts no filter class of a project's in conf/logging.yml, so the record factory is where
    one place can see every record. Idempotent."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "redacts", False):
        return

    def redacted_record(*args, **kwargs) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        message = record.getMessage()
        if (clean := redact(message)) != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            # a handler that renders the exception itself (rich's) would print its message as raised
            text = "".join(traceback.format_exception(*record.exc_info))
            if (clean := redact(text)) != text:
                record.exc_info, record.exc_text = None, clean.rstrip("\n")
        return record

    redacted_record.redacts = True
    logging.setLogRecordFactory(redacted_record)
