"""Processes a test stops at a chosen moment, found by what they print (never by waiting a while).

``Watched`` starts a command in a session of its own (so a signal reaches its whole process group, as Ctrl-C in a
terminal does), reads its output line by line as it comes, and stops at the first line holding a given text.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path


class Watched:
    """``command`` running in ``cwd``; its stdout (and stderr, unless ``stderr`` names a file) read as it comes."""

    def __init__(self, command: list[str], cwd: Path | None = None, stderr: Path | None = None):
        self.stderr_file = stderr.open("w") if stderr is not None else None
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file or subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        self.lines: list[str] = []

    @classmethod
    def kedro_run(cls, project: Path, *args: str, stderr: Path | None = None) -> Watched:
        """``kedro run`` with ``args`` in ``project``."""
        return cls([sys.executable, "-m", "kedro", "run", *args], cwd=project, stderr=stderr)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str) -> str:
        """Read until a line holding ``text`` and return it; fail, with the output's end, if the process ends
        first."""
        for line in self.process.stdout:
            self.lines.append(line)
            if text in line:
                return line
        self.process.wait()
        raise AssertionError(
            f"the process ended (status {self.process.returncode}) before printing {text!r}:\n" + self.output[-3000:]
        )

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the whole process group (the command and every process it started)."""
        os.killpg(self.process.pid, signum)

    def finish(self, timeout: float = 300) -> int:
        """Read the rest of the output and wait for the process; returns its status."""
        self.lines.extend(self.process.stdout)
        returncode = self.process.wait(timeout=timeout)
        if self.stderr_file is not None:
            self.stderr_file.close()
        return returncode

    def kill_group(self) -> None:
        """SIGKILL the whole process group and reap the command."""
        self.signal_group(signal.SIGKILL)
        self.finish()


def kill_kedro_in_epoch(project: Path, pipeline: str, epoch: int, epochs: int) -> Watched:
    """Run ``kedro run --pipelines=<pipeline>`` in ``project`` and SIGKILL it (its whole process group) as soon as it
    reports a step of epoch ``epoch`` of ``epochs``: mid-epoch, after the checkpoint of the epoch before."""
    run = Watched.kedro_run(project, f"--pipelines={pipeline}")
    run.wait_for(f"epoch {epoch}/{epochs} step")
    run.kill_group()
    return run


def wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait, up to ``timeout`` seconds in all, until every process of ``pids`` has ended (a pidfd becomes readable
    when its process ends); returns those still running then."""
    handles = {}
    for pid in pids:
        try:
            handles[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone already
    deadline = time.monotonic() + timeout
    try:
        while handles:
            ready, _, _ = select.select(list(handles.values()), [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                break
            for pid in [pid for pid, fd in handles.items() if fd in ready]:
                os.close(handles.pop(pid))
        return sorted(pid for pid in handles if running(pid))
    finally:
        for fd in handles.values():
            os.close(fd)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its parent's wait is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def msrun_worker_pids(project: Path) -> list[int]:
    """The pids of every msrun worker the project's runs started (each rank writes its own file)."""
    return [int(p.read_text()) for p in (project / "logs/msrun").glob("*/rank_*.pid")]


def assert_no_worker_left(project: Path) -> None:
    pids = msrun_worker_pids(project)
    assert pids, "no worker ever started"
    assert wait_until_gone(pids, timeout=15) == [], "msrun workers outlived the run"
