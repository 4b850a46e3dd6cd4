"""Child processes that end with their parent (msrun's workers, the image verification pool), and whether a process
still runs (a temporary checkpoint's, an MLflow run's or an Optuna trial's owner).

Linux sends a child the signal chosen with ``PR_SET_PDEATHSIG`` when the thread that started it ends, so a
``kill -9`` of ``kedro run`` leaves no orphan training or decoding on. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies. With ``parent_pid`` (the parent as the
    caller knows it), exit at once if the parent died before the request took effect (this process then already
    belongs to another)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
