"""A real PostgreSQL server for the slow tier, as a team runs one for its shared tuning and MLflow store: Debian's
``postgresql`` package (scripts/setup.sh installs it), a new cluster in a temporary folder made by ``initdb`` as an
unprivileged user (PostgreSQL refuses to run as root), password authentication (scram-sha-256) on a free loopback
port, and a stop afterwards. ``pg_ctl -w`` returns once the server accepts connections: no waiting on a clock."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import free_port

SERVER_USER = "postgres"  # the Debian package's system user, when the tests run as root
SUPERUSER = "postgres"


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's programs (``/usr/lib/postgresql/<major>/bin``), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


@dataclass(frozen=True)
class PostgresServer:
    port: int
    superuser_password: str
    bin: Path

    def url(self, user: str, database: str, password: str | None = None, driver: str = "postgresql") -> str:
        secret = f":{password}" if password is not None else ""
        return f"{driver}://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run ``statement`` as the superuser with ``psql``; its output."""
        result = subprocess.run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-d", database],
            input=statement,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={**os.environ, "PGPASSWORD": self.superuser_password},
        )
        return result.stdout

    def add_user(self, user: str, password: str, *databases: str) -> None:
        """A login role ``user`` owning each of ``databases`` (created)."""
        self.sql(f"CREATE ROLE {user} LOGIN PASSWORD '{password}';")
        for database in databases:
            self.sql(f"CREATE DATABASE {database} OWNER {user};")


def _as_server_user() -> dict:
    """``subprocess`` arguments that run a command as the unprivileged server user when this process is root."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam(SERVER_USER)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


@contextlib.contextmanager
def postgres_server(log: Path) -> Iterator[PostgresServer]:
    """A new PostgreSQL cluster on a free loopback port, its log in ``log``; stopped and removed afterwards."""
    bin_dir = postgres_bin()
    assert bin_dir is not None, "PostgreSQL is not installed: bash scripts/setup.sh installs Debian's postgresql"
    folder = Path(tempfile.mkdtemp(prefix="postgres-"))
    password = secrets.token_urlsafe(16)
    run_as = _as_server_user()
    if run_as:
        shutil.chown(folder, run_as["user"], run_as["group"])
    (folder / "pwfile").write_text(password + "\n")
    if run_as:
        shutil.chown(folder / "pwfile", run_as["user"], run_as["group"])
    data, port = folder / "data", free_port()
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    quiet = {"capture_output": True, "text": True, "timeout": 120, **run_as}
    subprocess.run(
        [
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            SUPERUSER,
            "--auth=scram-sha-256",
            f"--pwfile={folder / 'pwfile'}",
        ],
        check=True,
        **quiet,
    )
    server_log = folder / "server.log"
    subprocess.run(
        [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(server_log), "-w", "start"],
        check=True,
        **quiet,
    )
    try:
        yield PostgresServer(port, password, bin_dir)
    finally:
        subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], check=False, **quiet)
        with contextlib.suppress(OSError):
            log.write_text(server_log.read_text())
        shutil.rmtree(folder, ignore_errors=True)
