"""SIGINT and SIGTERM during a ``kedro run``: an orderly stop (``Interrupted``) whose MLflow run ends KILLED.

The stop is raised where the run can end cleanly; inside code that would swallow it or log it at length
(logging, MindSpore's compiler, MLflow's store) it waits until that code returns. A second signal stops the
process at once.
"""

from __future__ import annotations

import _thread
import functools
import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The run received SIGINT or SIGTERM; it stops like a failing node, and exits 128 + the signal number
    (``exit_code``; the command line, ``pipelines.cli``, shows it as one ``Error:`` line).

    MindSpore's graph runtime installs a SIGINT handler of its own each time it compiles a graph,
    which raises SIGTERM instead, so Ctrl-C during training arrives here as SIGTERM.
    """

    def __init__(self, signum: int):
        name = signal.Signals(signum).name
        self.message = f"interrupted ({name}); rerun the same command to resume from the last full checkpoint"
        super().__init__(self.message)
        self.exit_code = 128 + signum


# Where an exception raised by the stop signal would be swallowed, or logged at length, instead of
# stopping the run cleanly: (module, function; None: any). There the stop waits, looking again every
# DEFERRED_STOP_POLL_S, until the code has returned.
UNSAFE_TO_RAISE = (
    ("logging", None),  # Handler.emit prints "--- Logging error ---" and a traceback, and goes on
    ("rich", None),  # Kedro's console handler
    ("mindspore", "compile"),  # the graph compiler logs it with an IR dump (stderr, rank_0/om/analyze_fail.ir)
    ("mindspore.train.serialization", None),  # save_checkpoint logs it at CRITICAL before passing it on
    ("mlflow", None),  # the tracking store passes it on as an MlflowException, mid-transaction
    ("sqlalchemy", None),
)
DEFERRED_STOP_POLL_S = 0.2


def _is_unsafe(module: str, function: str) -> bool:
    return any(
        (module == unsafe or module.startswith(unsafe + ".")) and only in (None, function)
        for unsafe, only in UNSAFE_TO_RAISE
    )


def _unsafe_to_raise(frame) -> bool:
    """Whether ``frame`` or a caller of it is one of ``UNSAFE_TO_RAISE``."""
    while frame is not None:
        if _is_unsafe(frame.f_globals.get("__name__", ""), frame.f_code.co_name):
            return True
        frame = frame.f_back
    return False


# an error another thread asked the main thread to stop with (``stop_main_thread``), raised in place of Interrupted
_pending: list[BaseException] = []


def stop_main_thread(error: BaseException) -> bool:
    """From another thread: the main thread stops with ``error``, raised where a stop signal's ``Interrupted`` would
    be (never inside logging, MLflow or SQLAlchemy), so the run ends FAILED with that error. For a background thread
    that finds the run cannot go on (Optuna's heartbeat: the tuning storage lost) while the main thread trains and
    would not notice for minutes. Only while ``install``'s handler has SIGTERM (a ``kedro run``); False otherwise."""
    if signal.getsignal(signal.SIGTERM) is not _raise_interrupted:
        return False
    _pending.append(error)
    # Python runs the SIGTERM handler in the main thread, as for a real signal, without any process getting one
    _thread.interrupt_main(signal.SIGTERM)
    return True


def _stop(signum: int) -> BaseException:
    return _pending.pop() if _pending else Interrupted(signum)


def _raise_interrupted(signum: int, frame) -> None:
    # a second signal while the run winds down stops the process at once
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_DFL)
    if _unsafe_to_raise(frame):
        signal.signal(signal.SIGALRM, functools.partial(_raise_deferred, signum))
        signal.setitimer(signal.ITIMER_REAL, DEFERRED_STOP_POLL_S)
        return
    raise _stop(signum)


def _raise_deferred(signum: int, _alarm: int, frame) -> None:
    if _unsafe_to_raise(frame):
        signal.setitimer(signal.ITIMER_REAL, DEFERRED_STOP_POLL_S)
        return
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    raise _stop(signum)


def install() -> dict:
    """Handle SIGINT and SIGTERM with an orderly stop; returns the handlers they had, for ``restore``."""
    return {stop_signal: signal.signal(stop_signal, _raise_interrupted) for stop_signal in STOP_SIGNALS}


def restore(previous: dict) -> None:
    """Cancel a deferred stop and give the signals their ``previous`` handlers back."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    _pending.clear()
    for stop_signal, handler in previous.items():
        signal.signal(stop_signal, handler)
