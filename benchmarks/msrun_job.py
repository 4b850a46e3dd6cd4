"""Seconds from ``launch`` to its return for an msrun job of 2 CPU workers that does no work (``os.getpid``): what
every data-parallel training pays on top of its own, with ``distributed.scheduler_retry_interval_s`` at conf/base's
value against MindSpore's default (null: no ``MS_RETRY_INTERVAL_*`` set).

Alternates the two settings, each job on a new port; prints each setting's median, and where the time goes in its
last job: workers started (``rank_*.pid``), the function returned on every rank (``rank_*.done``), msrun exited.

    .venv/bin/python benchmarks/msrun_job.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
from tests.support.config import distributed_params  # noqa: E402
from tests.support.servers import free_port  # noqa: E402
from trainlib.distributed.launch import launch  # noqa: E402


def job(interval: list[int] | None) -> tuple[float, dict[str, float]]:
    """Seconds of one empty 2-worker job, and the seconds at which its workers started and returned (the
    modification times of their files)."""
    with tempfile.TemporaryDirectory() as log_dir:
        distributed = distributed_params(
            worker_num=2,
            local_worker_num=2,
            master_port=free_port(),
            scheduler_retry_interval_s=interval,
            log_dir=log_dir,
        )
        started_wall, started = time.time(), time.perf_counter()
        launch(os.getpid, {}, distributed, "CPU")
        seconds = time.perf_counter() - started
        (folder,) = Path(log_dir).iterdir()
        marks = {
            kind: max(p.stat().st_mtime for p in folder.glob(f"rank_*.{kind}")) - started_wall
            for kind in ("pid", "done")
        }
    return seconds, marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="jobs per setting, alternated")
    args = parser.parse_args()
    # null means MindSpore's own default here, not a leftover variable (launch sets a configured one in msrun's
    # environment only)
    for name in ("MS_RETRY_INTERVAL_LOWER", "MS_RETRY_INTERVAL_UPPER"):
        os.environ.pop(name, None)

    configured = distributed_params().scheduler_retry_interval_s
    settings = {f"conf/base {configured}": configured, "MindSpore's default": None}
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    last: dict[str, dict[str, float]] = {}
    for _ in range(args.repeats):
        for name, interval in settings.items():
            took, last[name] = job(interval)
            seconds[name].append(took)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, values in seconds.items():
        marks = last[name]
        print(
            f"{name:>24}: median {medians[name]:.2f} s over {len(values)} jobs "
            f"(min {min(values):.2f}, max {max(values):.2f}); last job: workers started at {marks['pid']:.1f} s, "
            f"returned on every rank at {marks['done']:.1f} s, msrun exited at {values[-1]:.1f} s"
        )
    base, default = medians.values()
    print(f"ratio conf/base / MindSpore's default: {base / default:.2f} ({default - base:.1f} s less a job)")


if __name__ == "__main__":
    main()
