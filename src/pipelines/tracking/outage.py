"""Outages of the parts a run reaches over the network, each told in one line naming the part, never a password:
the MLflow tracking server (``TrackingServerError``, its URL without credentials) and the tuning storage
(``trainlib.study.tuning_storage``'s ``TuningStorageError``, its host, port and database). ``pipelines.cli`` tells
the one ``outage`` finds as the run's ``Error:`` line.

The tracking server's restart window: ``tracking.server_retry_window_s`` sets MLflow's own retries
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``, which urllib3 applies to refused
connections and to 429/5xx answers) so that their waits cover at least that many seconds; null leaves MLflow's own
(7 retries, factor 2: 244 s of waits). urllib3 waits ``factor * 2**(n - 1)`` s before the retry after the n-th
failure (none after the first), at most 120 s each; MLflow allows at most 10 retries and a factor of 120."""

from __future__ import annotations

import os
import re
import urllib.parse

from mlflow.exceptions import MlflowException

from pipelines.tracking.links import without_credentials
from trainlib.redaction import redact
from trainlib.study.tuning_storage import TuningStorageError

MAX_RETRIES = 10  # MLflow 3.17's limit (_MLFLOW_HTTP_REQUEST_MAX_RETRIES_LIMIT)
MAX_FACTOR = 120  # and its backoff factor's (_MLFLOW_HTTP_REQUEST_MAX_BACKOFF_FACTOR_LIMIT)
MAX_WAIT_S = 120  # urllib3 2's Retry.DEFAULT_BACKOFF_MAX: no wait between two retries is longer
MLFLOW_DEFAULT = (7, 2)  # MLflow 3.17's MLFLOW_HTTP_REQUEST_MAX_RETRIES and _BACKOFF_FACTOR defaults
RETRIES_VARIABLE, FACTOR_VARIABLE = "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"

# MLflow's words for a request that found no server, or only failing answers (urllib3's), after all its retries
_UNREACHABLE = re.compile(r"API request to (\S+) failed with (?:timeout )?exception")
_FAILING_ANSWERS = re.compile(r"too many (\d{3}) error responses")


class TrackingServerError(RuntimeError):
    """The MLflow tracking server did not answer within its retry window (a restart, a network lost)."""


def waits(retries: int, factor: int) -> float:
    """Seconds urllib3 waits in all before giving up after ``retries`` retries at backoff ``factor`` (no jitter)."""
    return float(sum(min(MAX_WAIT_S, factor * 2 ** (n - 1)) for n in range(2, retries + 1)))


def retry_schedule(window_s: float) -> tuple[int, int]:
    """MLflow's (retries, backoff factor) whose waits are the shortest covering ``window_s``; among equal ones, the
    most retries (a server back between two is found sooner). ``window_s`` beyond the longest: the longest."""
    schedules = [(r, f) for r in range(MAX_RETRIES + 1) for f in range(1, MAX_FACTOR + 1)]
    covering = [schedule for schedule in schedules if waits(*schedule) >= window_s]
    if not covering:
        return MAX_RETRIES, MAX_FACTOR
    return min(covering, key=lambda schedule: (waits(*schedule), -schedule[0]))


def set_server_retry_window(window_s: float | None) -> None:
    """MLflow's retries for ``tracking.server_retry_window_s`` in this process's environment (msrun's workers inherit
    it); ``None`` leaves MLflow's own, as the environment may set them. Before kedro-mlflow's first request."""
    if window_s is None:
        return
    retries, factor = retry_schedule(window_s)
    os.environ[RETRIES_VARIABLE], os.environ[FACTOR_VARIABLE] = str(retries), str(factor)


def current_schedule() -> tuple[int, int]:
    """MLflow's (retries, backoff factor) as this process's requests use them."""
    try:
        return int(os.environ[RETRIES_VARIABLE]), int(os.environ[FACTOR_VARIABLE])
    except (KeyError, ValueError):
        return (
            int(os.environ.get(RETRIES_VARIABLE) or MLFLOW_DEFAULT[0]),
            int(os.environ.get(FACTOR_VARIABLE) or MLFLOW_DEFAULT[1]),
        )


def give_up_at_once() -> None:
    """No more retries in this process: the server had its window, and a run that stops on its outage should not
    wait it again to record the failure (kedro-mlflow ends the run FAILED, the project tags it)."""
    os.environ[RETRIES_VARIABLE] = "0"


def server_unreachable(error: BaseException) -> TrackingServerError | None:
    """A ``TrackingServerError`` when ``error`` is MLflow's request that found no server, or only 429/5xx answers,
    after all its retries; else None."""
    if not isinstance(error, MlflowException):
        return None
    text = str(error)
    found = _UNREACHABLE.search(text)
    if not found:
        return None
    answers = _FAILING_ANSWERS.search(text)
    if answers:
        reason = f"HTTP {answers[1]} to every retry"
    elif "timeout" in text.lower() or "timed out" in text.lower():
        reason = "no answer within MLFLOW_HTTP_REQUEST_TIMEOUT"
    elif "Connection refused" in text:
        reason = "connection refused"
    elif "resolve" in text or "Name or service not known" in text:
        reason = "host name not found"
    else:
        reason = "no connection"
    # the request's own URL (the server it went to, whatever the process's tracking URI is by now), its host part
    requested = urllib.parse.urlsplit(found[1])
    server = redact(without_credentials(f"{requested.scheme}://{requested.netloc}"))
    retries, factor = current_schedule()
    waited = waits(retries, factor)
    return TrackingServerError(
        f"The MLflow server {server} did not answer: {reason}, after {retries} retries over {waited:.0f} s "
        "(tracking.server_retry_window_s). Rerun the same command once it answers; a run it left RUNNING is marked"
        " KILLED then (docs/troubleshooting.md#outages)"
    )


def outage(error: BaseException) -> Exception | None:
    """What the run lost, told: the first outage in ``error``'s chain (raised from, or while handling), innermost
    first (what failed first: the tuning storage lost, then the tracking server while the run recorded its
    failure), as ``TrackingServerError`` or the storage's own ``TuningStorageError``; else None."""
    chain, seen = [], error
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for raised in reversed(chain):
        if isinstance(raised, TuningStorageError):
            return raised
        told = server_unreachable(raised)
        if told is not None:
            return told
    return None
