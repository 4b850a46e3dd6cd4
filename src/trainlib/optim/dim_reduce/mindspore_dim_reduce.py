"""Stage 2 with ``mindspore.boost``'s own DimReduce, for comparison with this project's P-BFGS.

``builtin_dim_reduce_config`` enables only dim_reduce with a precomputed projection (``pca_mat_path``), under
MindSpore's real key names (``n_components``, ``device_number``; the tutorial's
``n_component``/``device_num`` are silently ignored by MindSpore); ``builtin_dim_reduce_model`` builds
the ``Model`` whose training step is boost's DimReduce.

``mindspore.boost.AutoBoost`` is a process-wide singleton configured by the first ``Model`` of a
process, so the built-in stage 2 always trains in a child process: ``run_in_child_process(fn, kwargs)``
pickles the call into a job folder, runs ``python -m trainlib.optim.dim_reduce.mindspore_dim_reduce <folder>``
(which dies with its parent) and returns ``fn``'s result; the child's log goes to this process's console.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOB_FILE = "job.pkl"
RESULT_FILE = "result.pkl"
ERROR_FILE = "error.txt"


class ChildProcessFailure(RuntimeError):
    """The child process failed; the message carries its error text."""


def builtin_dim_reduce_config(
    pca_path: str | Path,
    *,
    n_components: int,
    rho: float,
    gamma: float,
    alpha: float,
    sigma: float,
    device_number: int,
) -> dict:
    """``boost_config_dict`` enabling only dim_reduce with a precomputed projection.

    Boost writes its per-rank slices of the projection beside ``pca_path`` (``weight_load_dir``).
    """
    pca_path = Path(pca_path)
    return {
        "boost": {"mode": "manual", "dim_reduce": True},
        "common": {"device_number": device_number},
        "dim_reduce": {
            "rho": rho,
            "gamma": gamma,
            "alpha": alpha,
            "sigma": sigma,
            "n_components": n_components,
            "pca_mat_path": str(pca_path),
            "weight_load_dir": str(pca_path.parent),
            "timeout": 60,
        },
    }


def builtin_dim_reduce_model(net, loss_fn, config: dict, *, loss_scale: float | None):
    """A ``Model`` whose training step is ``mindspore.boost``'s DimReduce (SGD with lr 1 underneath).

    Without a loss-scale manager MindSpore's boost step reports a None loss; with one, its
    residual momentum uses the still-scaled gradient (one of the faults our P-BFGS fixes).
    """
    from mindspore import nn
    from mindspore.train import FixedLossScaleManager, Model

    optimizer = nn.SGD(net.trainable_params(), learning_rate=1.0, loss_scale=loss_scale or 1.0)
    manager = FixedLossScaleManager(loss_scale, drop_overflow_update=False) if loss_scale else None
    kwargs = {"loss_scale_manager": manager} if manager else {}
    # Model silently skips boost unless it has metrics or an eval network
    return Model(net, loss_fn, optimizer, metrics={"accuracy"}, boost_level="O1", boost_config_dict=config, **kwargs)


def run_in_child_process(fn: Callable[..., Any], kwargs: dict[str, Any], job_dir: Path) -> Any:
    """``fn(**kwargs)`` in a new Python process (``fn`` a module-level function, ``kwargs`` picklable).

    ``job_dir`` (existing, empty) holds the job and the result. The child inherits stdout and stderr,
    is killed when this process dies, and is stopped when this process is interrupted. A failure raises
    ``ChildProcessFailure`` with the child's traceback.
    """
    job = {"module": fn.__module__, "qualname": fn.__qualname__, "kwargs": kwargs}
    (job_dir / JOB_FILE).write_bytes(pickle.dumps(job))
    # setpriv: the child gets SIGKILL if this process dies, even by SIGKILL
    command = ["setpriv", "--pdeathsig", "KILL", sys.executable, "-m", __name__, str(job_dir)]
    child = subprocess.Popen(command)
    try:
        returncode = child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise
    error = job_dir / ERROR_FILE
    if returncode != 0 or not (job_dir / RESULT_FILE).exists():
        text = error.read_text() if error.exists() else f"it exited with status {returncode} without a Python error"
        raise ChildProcessFailure(f"{fn.__qualname__} failed in its child process: {text.rstrip()}")
    return pickle.loads((job_dir / RESULT_FILE).read_bytes())


def _run_job(job_dir: Path) -> None:
    """The child's side of ``run_in_child_process``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    job = pickle.loads((job_dir / JOB_FILE).read_bytes())
    try:
        fn = importlib.import_module(job["module"])
        for name in job["qualname"].split("."):
            fn = getattr(fn, name)
        result = fn(**job["kwargs"])
    except BaseException:
        (job_dir / ERROR_FILE).write_text(traceback.format_exc())
        raise
    (job_dir / RESULT_FILE).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    _run_job(Path(sys.argv[1]))
