"""What the command line asked for, read from click's context: the command as typed, and the pipelines named.

Both are ``None`` outside a command line (a ``KedroSession`` started from Python, a notebook, the tests).
"""

from __future__ import annotations

import shlex
import sys

import click


def invoked_command() -> str | None:
    """The command line of this run when it was started from one (``kedro run …`` with every option)."""
    context = click.get_current_context(silent=True)
    if context is None:
        return None
    program = "kedro" if context.parent is not None else "python -m pipelines"
    return shlex.join([program, *sys.argv[1:]])


def requested_pipelines() -> list[str] | None:
    """The pipelines ``kedro run`` was asked for (``--pipelines``, ``--pipeline``), or ``None`` when it names none
    (its node filters may pick any pipeline) or runs outside a command line."""
    context = click.get_current_context(silent=True)
    names = context and (context.params.get("pipelines") or context.params.get("pipeline"))
    if not names:
        return None
    names = names if isinstance(names, list | tuple) else str(names).split(",")
    return [name.strip() for name in names]
