"""MLflow's servers on a free localhost port, always stopped afterwards: ``mlflow server`` as a team runs one (a
SQLite backend store and proxied artifacts: the clients upload and download artifacts through the server,
``mlflow-artifacts:``), and ``mlflow models serve`` of a registered model."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TEAM_HOST_NAME = "mlflow-host"  # the name a team's clients reach its server by (docs/team.md)
START_TIMEOUT_S = 180  # mlflow server imports for ~30 s on a busy machine
ENV_BUILD_TIMEOUT_S = 1800  # a model's environment built from nothing: MindSpore, MLflow and their dependencies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(
    backend: Path,
    log: Path,
    artifacts: Path | None = None,
    app_name: str = "model-training",
    port: int | None = None,
) -> Iterator[str]:
    """``mlflow server --app-name <app_name>`` over the SQLite store ``backend`` (with ``artifacts`` as the proxied
    artifact store, when given), as the docs start a team's: the project's app plugin opens the UI in its
    model-training view (``pipelines.tracking.ui_app``); yields its URL once its ``/health`` answers. ``port``: a
    given one (a server restarted where its clients look for it), else a free one."""
    port = port or free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--app-name", app_name]
    command += ["--backend-store-uri", f"sqlite:///{backend}"]
    if artifacts is not None:
        command += ["--artifacts-destination", str(artifacts)]
    with served(command, backend.parent, log, f"http://127.0.0.1:{port}", "/health") as url:
        yield url


@dataclass(frozen=True)
class TeamServer:
    """A running team server: its URL, its admin's and a user's name and password."""

    url: str
    admin: tuple[str, str]
    user: tuple[str, str]

    @classmethod
    def with_user(cls, url: str, admin: tuple[str, str], name: str, password: str) -> TeamServer:
        """The server at ``url`` with the user ``name`` created by its admin (MLflow's users REST API)."""
        request = urllib.request.Request(
            f"{url}/api/2.0/mlflow/users/create",
            data=json.dumps({"username": name, "password": password}).encode(),
            headers={"Content-Type": "application/json", "Authorization": basic_auth(*admin)},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
        return cls(url, admin, (name, password))


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@contextlib.contextmanager
def team_mlflow_server(backend_uri: str, folder: Path, admin_password: str) -> Iterator[str]:
    """``mlflow server`` as docs/team.md starts a team's: the backend store ``backend_uri`` (PostgreSQL), proxied
    artifacts in ``folder``, and MLflow's login with the model-training view (``--app-name model-training-auth``),
    its users in ``folder``'s own database; yields its URL once ``/health`` answers (the one page without login)."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--app-name", "model-training-auth", "--backend-store-uri", backend_uri]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    # as docs/team.md: the host names clients use besides the loopback MLflow allows by default
    command += ["--allowed-hosts", f"{TEAM_HOST_NAME},{TEAM_HOST_NAME}:{port},localhost:{port},127.0.0.1:{port}"]
    command += ["--cors-allowed-origins", f"http://{TEAM_HOST_NAME}:{port}"]
    config = folder / "auth.ini"
    config.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{folder / 'users.db'}\nadmin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "auth_cache_ttl_seconds = 60\n"  # docs/team.md's: the password hash checked once a minute, not per request
    )
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,  # read on first start only: the admin user's password
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
    }
    with served(command, folder, folder / "server.log", f"http://127.0.0.1:{port}", "/health", **env) as url:
        yield url


@contextlib.contextmanager
def model_server(
    model_uri: str, tracking_uri: str, cwd: Path, log: Path, env_manager: str = "local", **env: str
) -> Iterator[str]:
    """``mlflow models serve -m <model_uri> --env-manager <env_manager>`` with its models from ``tracking_uri``
    (``local``: this environment, the project's package and MindSpore; ``virtualenv``: one MLflow builds from the
    model's requirements, ready beforehand, see ``prepare_model_env``), with ``env`` added to its environment; yields
    its URL once its ``/ping`` answers."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", env_manager]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    # it starts uvicorn by name, from PATH: this environment's, as an activated venv gives it
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with served(
        command, cwd, log, f"http://127.0.0.1:{port}", "/ping", MLFLOW_TRACKING_URI=tracking_uri, PATH=path, **env
    ) as url:
        yield url


def prepare_model_env(model_uri: str, tracking_uri: str, cwd: Path, env_manager: str, **env: str) -> None:
    """``mlflow models prepare-env -m <model_uri> --env-manager <env_manager>``: the environment MLflow builds from
    the model's requirements, made before its server starts (a first build outlasts ``START_TIMEOUT_S``) and kept
    where ``env``'s ``MLFLOW_ENV_ROOT`` says."""
    command = [sys.executable, "-m", "mlflow", "models", "prepare-env", "-m", model_uri, "--env-manager", env_manager]
    result = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_DISABLE_TELEMETRY": "true", **env},
        capture_output=True,
        text=True,
        timeout=ENV_BUILD_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@contextlib.contextmanager
def served(command: list[str], cwd: Path, log: Path, url: str, health: str, **env: str) -> Iterator[str]:
    """``command``, a server at ``url``, started in ``cwd`` with its output in ``log``; yields ``url`` once
    ``url + health`` answers 200, and stops the server (and the uvicorn process it starts) afterwards."""
    with log.open("w") as out:
        # its own process group: the server runs uvicorn in a child process, and both must go at the end
        server = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", **env},
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url + health):  # each try waits up to a second for the server's answer
            assert server.poll() is None, (
                f"{' '.join(command[2:4])} exited with {server.returncode}:\n{log.read_text()[-3000:]}"
            )
            assert time.monotonic() < deadline, (
                f"{' '.join(command[2:4])} not up in {START_TIMEOUT_S} s:\n{log.read_text()}"
            )
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


def _healthy(address: str) -> bool:
    try:
        with urllib.request.urlopen(address, timeout=1) as response:
            return response.status == 200
    except OSError:
        time.sleep(0.2)  # refused at once while the port is not open yet: not a busy loop
        return False
