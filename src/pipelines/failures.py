"""The errors a ``kedro run`` can end with, each told in a few lines with its own advice (``Failure``). Used by the
command (``pipelines.cli``, whose ``Error:`` block prints it) and by the hooks, which tag the MLflow run with the same
text. Error classes are known by name, so telling an error imports nothing. It lives with the pipelines, not in the
library: it knows the library's errors and Kedro's, and the library knows nothing above it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from trainlib.redaction import redact

# What to do, by the name of an error class of this project or Kedro (found through the error's
# MRO, so subclasses share their parent's entry; by name, so that the module need not be imported
# and may move): a text, a function of the message, or None when the message says it already.
Advice = str | Callable[[str], str | None] | None
ADVICE: dict[str, Advice] = {
    "DataLayoutError": (
        "Check data.root and data.split_dirs (conf/local/parameters.yml or --params): the tree must be "
        "<root>/<split folder>/<class>/<image>."
    ),
    "BadImageError": None,
    "InputPipelineError": None,
    "ChangedImageError": None,
    "CheckpointMemoryError": (
        "The file is kept as it is: free memory (stop other jobs on this machine) and rerun the same command."
    ),
    "CheckpointError": (
        "Rerun the nodes that write it (the whole pipeline, without --nodes or --from-nodes); "
        "delete a truncated or corrupt file first."
    ),
    "MigrationError": lambda message: (
        None
        if "not at parity" in message  # the parity report says what differs
        else "migrate.state_dict names the file, migrate.architecture its torchvision layout "
        "(conf/local/parameters.yml or --params)."
    ),
    "DeviceUnavailableError": None,
    "DistributedTrainingError": (
        "Fix what failed on that rank (its log is named above), then rerun the same command: "
        "trainings resume from their last checkpoint."
    ),
    "NonFiniteLossError": None,
    "ThorInverseError": None,
    "ThorDivergenceError": None,
    "ChildProcessFailure": None,
    "NoRunsError": None,
    "DatasetError": lambda message: (
        "Run the nodes that write it first (the whole pipeline, without --nodes or --from-nodes)."
        if message.startswith("Failed while loading data")
        else None
    ),
}
# Messages of these classes keep their first two lines (a count, then the first file named).
TWO_LINE_HEAD = {"BadImageError"}
# ProjectHooks.on_node_error adds this note (plus the node's name) to the error of a failed node.
NODE_NOTE = "while running Kedro node "
# MindSpore appends its C++ call stack after a rule of dashes
_NATIVE_STACK = re.compile(r"^-{10,}")
ADVISED_PACKAGES = ("trainlib", "pipelines", "kedro")


def _known_class(error: BaseException) -> str | None:
    """The name of the first class in ``error``'s MRO that has an ``ADVICE`` entry."""
    found = (c for c in type(error).__mro__ if c.__module__.split(".")[0] in ADVISED_PACKAGES and c.__name__ in ADVICE)
    return next((c.__name__ for c in found), None)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from (``raise … from``), outermost first."""
    chain = [error]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain:
        chain.append(chain[-1].__cause__)
    return chain


def _condensed(text: str, head: int) -> list[str]:
    """The first ``head`` lines and the last line of ``text`` (blank lines and MindSpore's C++ stack dropped)."""
    lines = []
    for line in text.strip().splitlines():
        if _NATIVE_STACK.match(line.strip()):
            break
        if line.strip():
            lines.append(line.strip())
    if len(lines) <= head + 1:
        return lines
    return [*lines[:head], lines[-1]]


@dataclass(frozen=True)
class Failure:
    """A failed run, told in a few lines: ``lines`` (the message), ``advice``, the error's class and node."""

    lines: list[str]
    advice: str | None
    error_class: str
    node: str | None

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        """The failure that ``error`` reports: the project's own error in its ``raise … from`` chain when
        there is one (a catalog error raised from a checkpoint error is told as the latter), else the
        first one with an ``ADVICE`` entry, else ``error`` itself."""
        chain = _chain(error)
        known = [e for e in chain if _known_class(e) is not None]
        ours = [e for e in known if type(e).__module__.startswith(tuple(f"{p}." for p in ADVISED_PACKAGES[:2]))]
        told = (ours or known or [error])[0]
        key = _known_class(told)
        text = redact(str(told)) if str(told).strip() else type(told).__name__
        lines = _condensed(text, head=2 if key in TWO_LINE_HEAD else 1)
        if key is None:  # an error without an entry: its class says what it is
            lines[0] = f"{type(told).__name__}: {lines[0]}"
        advice = ADVICE.get(key) if key else None
        if callable(advice):
            advice = advice(text)
        notes = [n for e in chain for n in getattr(e, "__notes__", ()) if n.startswith(NODE_NOTE)]
        node = notes[0].removeprefix(NODE_NOTE) if notes else None
        return cls(lines, advice, type(told).__name__, node)

    def summary(self) -> str:
        """One line: the message and the advice (the MLflow run's ``error`` tag)."""
        return " ".join([*self.lines, *([self.advice] if self.advice else [])])
