"""Data-parallel training over MindSpore's own launcher, ``msrun``.

A training function runs unchanged in every worker: :func:`launch` pickles its arguments into a
job folder and starts ``msrun ... python -m trainlib.distributed.worker <job folder>``; each worker
initialises MindSpore's collectives (HCCL, NCCL, or the CPU ones), switches on data-parallel
gradient averaging, calls the function, and the first worker of each node pickles the result back.
Global rank 0 alone logs to the caller's experiment-tracking run, handed over by a :class:`RunHandoff`
(``pipelines.tracking.handoff.MlflowRunHandoff``; this module knows no tracking library), and the first worker
of each node writes checkpoints. When any worker fails, the others are stopped and :func:`launch` raises
:class:`DistributedTrainingError` carrying the failing rank's own error text; when the caller is
interrupted, every worker is stopped before the interruption propagates.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trainlib.atomic_write import write_atomically
from trainlib.processes import die_with_parent

if TYPE_CHECKING:
    from trainlib.params import DistributedParams

logger = logging.getLogger(__name__)

JOB_FILE = "job.pkl"
RESULT_FILE = "result.pkl"
POLL_S = 0.5
STOP_GRACE_S = 10.0


class DistributedTrainingError(RuntimeError):
    """A worker of an msrun job failed; the message carries its rank and error text."""


class RunHandoff(Protocol):
    """The caller's tracking run, pickled into the job: rank 0 logs into it while ``attached()``;
    ``reclaim()`` gives it back to the caller after the job."""

    def attached(self) -> AbstractContextManager[None]: ...
    def reclaim(self) -> None: ...


# Returns the hand-off of the caller's active run (None without one); set by the project's hooks.
_capture_run: Callable[[], RunHandoff | None] = lambda: None  # noqa: E731


def hand_off_runs_with(capture: Callable[[], RunHandoff | None]) -> None:
    """Let every later :func:`launch` of this process hand the run ``capture()`` returns to rank 0."""
    global _capture_run  # noqa: PLW0603 - one tracking set-up per process
    _capture_run = capture


@dataclass(frozen=True)
class RankContext:
    """Where this process sits in the job: global rank, ranks in all, and ranks on this node."""

    rank: int = 0
    size: int = 1
    local_size: int = 1

    @property
    def is_node_leader(self) -> bool:
        return self.rank % self.local_size == 0


_context = RankContext()


def rank_context() -> RankContext:
    """This process's place in the job; rank 0 of 1 outside a worker."""
    return _context


def is_main_rank() -> bool:
    """Whether this process writes checkpoints and logs to MLflow (global rank 0)."""
    return _context.rank == 0


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def msrun_command(distributed: DistributedParams, job_dir: Path) -> list[str]:
    """The ``msrun`` command line that starts this node's workers over ``job_dir``."""
    return [
        "msrun",
        f"--worker_num={distributed.worker_num}",
        f"--local_worker_num={distributed.local_worker_num}",
        f"--master_addr={distributed.master_addr}",
        f"--master_port={distributed.master_port}",
        f"--node_rank={distributed.node_rank}",
        f"--log_dir={job_dir}",
        "--join=True",
        f"--cluster_time_out={distributed.cluster_timeout_s}",
        "--tail_worker_log=0" if distributed.node_rank == 0 else "--tail_worker_log=-1",
        "python",
        "-m",
        "trainlib.distributed.worker",
        str(job_dir),
    ]


def msrun_environment(distributed: DistributedParams) -> dict[str, str]:
    """The environment ``msrun`` and its workers start with: this one, the interpreter's folder first on ``PATH``
    (msrun starts the bare ``python``), and the scheduler's retry interval if configured, which sets how long
    joining and leaving the cluster take."""
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if distributed.scheduler_retry_interval_s is not None:
        lower, upper = distributed.scheduler_retry_interval_s
        environment |= {"MS_RETRY_INTERVAL_LOWER": str(lower), "MS_RETRY_INTERVAL_UPPER": str(upper)}
    return environment


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


class _Job:
    """The files of one launch: arguments, per-rank pids and errors, the result."""

    def __init__(self, job_dir: Path):
        self.dir = job_dir

    def rank_files(self, suffix: str) -> dict[int, Path]:
        """``rank_<rank>.<suffix>`` files by rank."""
        return {int(p.stem.split("_")[1]): p for p in self.dir.glob(f"rank_*.{suffix}")}

    def pids(self) -> dict[int, int]:
        return {rank: int(path.read_text()) for rank, path in self.rank_files("pid").items()}

    def msrun_log(self) -> str:
        path = self.dir / "msrun.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def dead_ranks(self) -> list[int]:
        """Ranks whose process is gone before writing a result or an error (killed)."""
        finished = self.rank_files("done")
        return sorted(r for r, pid in self.pids().items() if r not in finished and not _alive(pid))

    def stop_workers(self) -> None:
        for pid in self.pids().values():
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _stop(msrun: subprocess.Popen, job: _Job) -> None:
    """msrun's own SIGINT handler kills its workers; anything left after the grace period is killed."""
    if msrun.poll() is None:
        msrun.send_signal(signal.SIGINT)
        try:
            msrun.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            msrun.kill()
            msrun.wait()
    job.stop_workers()


# Where MindSpore records a rank that stopped answering (a killed node, a cut network): the scheduler's log on the
# master node, and the cluster error raised on the ranks left. Either may come first, or alone: a rank left may
# also exit without a Python error, or fail in a collective with another message.
_SCHEDULER_TIMED_OUT = re.compile(r"The node: (\d+) is timed out")
_RANK_TIMED_OUT = re.compile(r"Timed out node list is: [^{]*\{([\d, ]+)\}")


def _timed_out_ranks(job: _Job) -> set[int]:
    """Ranks the scheduler log or any rank's error names as timed out."""
    scheduler_log = job.dir / "scheduler.log"
    text = scheduler_log.read_text(errors="replace") if scheduler_log.exists() else ""
    ranks = {int(rank) for rank in _SCHEDULER_TIMED_OUT.findall(text)}
    for error in job.rank_files("error").values():
        for listed in _RANK_TIMED_OUT.findall(error.read_text(errors="replace")):
            ranks.update(int(rank) for rank in listed.split(","))
    return ranks


def _failure_message(job: _Job, rc: int | None, first_dead: list[int], distributed: DistributedParams) -> str:
    errors = job.rank_files("error")
    first_error = min(errors.items(), key=lambda item: item[1].stat().st_mtime) if errors else None  # first to fail
    local_worker_num = distributed.local_worker_num
    lost = sorted(r for r in _timed_out_ranks(job) if r // local_worker_num != distributed.node_rank)
    if lost:
        nodes = sorted({r // local_worker_num for r in lost})
        here = first_error[0] if first_error else (first_dead or [distributed.node_rank * local_worker_num])[0]
        return (
            f"node {', '.join(map(str, nodes))} of the msrun job stopped answering (rank "
            f"{', '.join(map(str, lost))} timed out): its kedro run was stopped or killed, or the network between "
            f"the nodes failed; see that node's own output and msrun logs. Rank {here} here stopped with it "
            f"(logs: {job.dir}/worker_{here}.log)"
        )
    if first_error:
        rank, error = first_error
        return f"rank {rank} of the msrun job failed (logs: {job.dir}/worker_{rank}.log):\n{error.read_text().rstrip()}"
    # msrun reports the first worker it saw exit; it kills the others itself
    reported = re.search(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)", job.msrun_log())
    ranks_by_pid = {pid: rank for rank, pid in job.pids().items()}
    if reported and int(reported[1]) in ranks_by_pid:
        rank, code = ranks_by_pid[int(reported[1])], int(reported[2])
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"rank {rank} of the msrun job {how} without a Python error; see {job.dir}/worker_{rank}.log"
    if first_dead:
        return (
            f"rank {first_dead[0]} of the msrun job was killed without a Python error (e.g. by a signal or the "
            f"out-of-memory killer); see {job.dir}/worker_{first_dead[0]}.log"
        )
    return f"msrun exited with status {rc} before its workers reported; see {job.dir}/scheduler.log and msrun.log"


def launch(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    distributed: DistributedParams,
    device_target: str,
    run_handoff: RunHandoff | None = None,
) -> Any:
    """Run ``fn(**kwargs)`` on every worker of this node under ``msrun`` and return its result.

    The job folder (arguments, msrun's per-rank logs, errors) is kept under ``distributed.log_dir``.
    ``run_handoff``, if any, is the caller's tracking run, which global rank 0 logs into.
    """
    job_dir = Path(distributed.log_dir) / f"{fn.__name__}-{datetime.now():%Y%m%d-%H%M%S-%f}"
    job_dir.mkdir(parents=True)
    job = {
        "module": fn.__module__,
        "qualname": fn.__qualname__,
        "kwargs": kwargs,
        "device_target": device_target,
        "local_worker_num": distributed.local_worker_num,
        "run_handoff": run_handoff,
    }
    write_atomically(job_dir / JOB_FILE, pickle.dumps(job))
    # setpriv: msrun gets SIGINT, on which it stops its workers, if this process dies (even by SIGKILL)
    command = ["setpriv", "--pdeathsig", "INT", *msrun_command(distributed, job_dir)]
    logger.info(
        "Launching %d of %d workers on node %d: %s",
        distributed.local_worker_num,
        distributed.worker_num,
        distributed.node_rank,
        " ".join(command),
    )
    files = _Job(job_dir)
    with open(job_dir / "msrun.log", "wb") as msrun_log:
        msrun = subprocess.Popen(
            command,
            env=msrun_environment(distributed),
            stdout=None if distributed.node_rank == 0 else msrun_log,
            stderr=msrun_log,
        )
        first_dead: list[int] = []
        try:
            while msrun.poll() is None:
                first_dead = first_dead or files.dead_ranks()
                if files.rank_files("error") or first_dead:
                    time.sleep(POLL_S)  # let the failing rank finish writing before everyone is stopped
                    _stop(msrun, files)
                    break
                time.sleep(POLL_S)
        except BaseException:
            logger.warning("Interrupted: stopping the msrun job in %s", job_dir)
            _stop(msrun, files)
            raise
        rc = msrun.wait()
    files.stop_workers()
    result = job_dir / RESULT_FILE
    if rc != 0 or files.rank_files("error") or not result.exists():
        raise DistributedTrainingError(_failure_message(files, rc, first_dead, distributed))
    if run_handoff is not None:
        run_handoff.reclaim()  # rank 0 handed the run back; the caller's run goes on
    with open(result, "rb") as f:
        return pickle.load(f)


def _init_worker(device_target: str, local_worker_num: int) -> RankContext:
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_device(device_target)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return RankContext(get_rank(), get_group_size(), local_worker_num)


def run_worker(job_dir: Path) -> None:
    """Entry point of one msrun worker: init collectives, run the job's function, report back."""
    global _context  # noqa: PLW0603 - the rank is a fact about the whole process
    die_with_parent(signal.SIGKILL)
    job = pickle.loads((job_dir / JOB_FILE).read_bytes())
    rank_id = int(os.environ.get("RANK_ID", "0"))
    # atomically: the launcher polls these files while the workers start
    write_atomically(job_dir / f"rank_{rank_id}.pid", str(os.getpid()).encode())
    logging.basicConfig(
        level=logging.INFO, format=f"[rank {rank_id}] %(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    try:
        _context = _init_worker(job["device_target"], job["local_worker_num"])
        handoff = job["run_handoff"] if is_main_rank() else None
        fn = importlib.import_module(job["module"])
        for part in job["qualname"].split("."):
            fn = getattr(fn, part)
        with handoff.attached() if handoff is not None else contextlib.nullcontext():
            result = fn(**job["kwargs"])
        if _context.is_node_leader:
            write_atomically(job_dir / RESULT_FILE, pickle.dumps(result))
    except BaseException:
        write_atomically(job_dir / f"rank_{rank_id}.error", traceback.format_exc().encode())
        raise
    (job_dir / f"rank_{rank_id}.done").touch()


def on_every_rank(train: Callable[..., Any], context, *args, **kwargs) -> Any:
    """``train(context, *args, **kwargs)`` on ``context.distributed.worker_num`` msrun workers of this node when
    that is more than one, else (and inside a worker) right here; returns rank 0's (each node's first worker's)
    result.

    ``context`` is a training's context (``recipes.context.TrainingContext``: its ``distributed`` and ``runtime``
    sections are read). ``train`` must be importable by name, its arguments and result picklable. Rank 0 logs into
    the run ``hand_off_runs_with`` captures: the caller's active run.
    """
    distributed = context.distributed
    if distributed.worker_num == 1 or _context.size > 1:
        return train(context, *args, **kwargs)
    arguments = inspect.signature(train).bind(context, *args, **kwargs).arguments
    return launch(train, dict(arguments), distributed, context.runtime.device_target, _capture_run())


def sum_over_ranks(values) -> np.ndarray:
    """The element-wise sum of ``values`` (a float vector) over every rank; ``values`` itself with one rank.

    Host-side agreement between ranks (which checkpoint to resume from); AllReduce's sum runs on every backend.
    """
    values = np.asarray(values, np.float32)
    if _context.size == 1:
        return values
    import mindspore as ms
    from mindspore import Tensor, ops

    return ops.AllReduce()(Tensor(values, ms.float32)).asnumpy()


def barrier() -> None:
    """Wait until every rank gets here (a no-op with one rank)."""
    sum_over_ranks([1.0])


def verify_replicas(net) -> float:
    """Largest absolute difference between this rank's trainable weights and rank 0's (0.0 alone).

    Data parallel keeps every replica identical; a difference means the ranks diverged.
    """
    if _context.size == 1:
        return 0.0
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, ops

    broadcast = ops.Broadcast(0)
    largest = 0.0
    for param in net.trainable_params():
        (reference,) = broadcast((param.value(),))
        largest = max(largest, float(np.abs(reference.asnumpy() - param.asnumpy()).max()))
    # CPU's AllReduce sums only: gather every rank's figure instead
    return float(ops.AllGather()(Tensor([largest], ms.float32)).asnumpy().max())
