"""``mlflow server`` on a free localhost port, as a team runs one: a SQLite backend store and proxied artifacts (the
clients upload and download artifacts through the server, ``mlflow-artifacts:``), always stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 180  # mlflow server imports for ~30 s on a busy machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(backend: Path, log: Path, artifacts: Path | None = None) -> Iterator[str]:
    """``mlflow server`` over the SQLite store ``backend`` (with ``artifacts`` as the proxied artifact store, when
    given); yields its URL once its ``/health`` answers."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{backend}"]
    if artifacts is not None:
        command += ["--artifacts-destination", str(artifacts)]
    with log.open("w") as out:
        # its own process group: the server runs uvicorn in a child process, and both must go at the end
        server = subprocess.Popen(
            command,
            cwd=backend.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):  # each try waits up to a second for the server's answer
            assert server.poll() is None, f"mlflow server exited with {server.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"mlflow server not up in {START_TIMEOUT_S} s:\n{log.read_text()}"
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        time.sleep(0.2)  # refused at once while the port is not open yet: not a busy loop
        return False
