"""The project's ``kedro run``: Kedro's own command (every option kept) plus ``--verbose``, a quiet
console and one ``Error:`` block for a run that fails.

- A failure prints one block on stderr: the message (naming the file or key), what to do, and
  where the traceback went (the logging configuration's log files; the terminal too with
  ``--verbose``). Errors already written for the user (``click.ClickException``: parameter
  errors, a missing device, an interruption) keep their own text and exit status.
- ``quiet_start`` (the ``kedro.init`` entry point of ``pyproject.toml``, so it runs before Kedro
  imports its plugins) and ``settings.py`` silence third-party warnings that only concern those
  packages' own code, and move third-party INFO records that repeat what the user already knows
  to DEBUG.

Kedro-facing and light, since Kedro imports it for every ``kedro`` command: click and Kedro, never
MindSpore; MLflow only as kedro-mlflow's plugin loads it anyway. Error classes are known by name,
so that telling an error imports nothing.
"""

from __future__ import annotations

import copy
import logging
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import click
from kedro.framework.cli.project import run as kedro_run
from kedro.framework.cli.utils import CONTEXT_SETTINGS

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------- quiet start-up


# (category, message regex, module regex) of warnings that third-party code raises about itself
# on every start: nothing a user of this project can act on. OmegaConf 2.4 deprecates the call
# Kedro and kedro-mlflow make to register their resolvers.
THIRD_PARTY_WARNINGS = ((UserWarning, r"register_new_resolver\(\) is deprecated", r"kedro(_mlflow)?\."),)
# kedro-mlflow's KedroPipelineModel has no type hints on predict, and MLflow warns (in colour) when
# the class is defined, i.e. when Kedro imports the plugin.
PREDICT_TYPE_HINTS = re.compile(r"(\x1b\[\d+m)?Add type hints to the `predict` method")

# (logger, message regex) of records moved to DEBUG: they repeat what the user asked for, or are
# about a plugin's internals (kedro-viz's run-status file is written only for whole runs).
QUIET_RECORDS = (
    ("kedro.io.data_catalog", r"Loading data from (params:|parameters )"),
    ("kedro.validation.parameter_validator", r"No typed parameter requirements found"),
    ("kedro.runner.sequential_runner", r"Using synchronous mode"),
    ("kedro_mlflow.framework.hooks.mlflow_hook", r"Registering new custom resolver"),
    ("kedro_viz.integrations.kedro.run_hooks", r"Workflow tracking is disabled"),
)

# Moved to DEBUG during a ``kedro run`` of this command, which reports the failure itself: Kedro's
# own account of a failed node and its advice to rerun with --from-nodes (a training resumes from
# its checkpoints, so the advice is to rerun the same command).
RUNNERS = ("kedro.runner.sequential_runner", "kedro.runner.thread_runner", "kedro.runner.parallel_runner")
FAILURE_RECORDS = (
    ("kedro.pipeline.node", r"Node .* failed with error"),
    *((runner, r"There are \d+ nodes that have not run|No nodes ran\.") for runner in RUNNERS),
)


class DemoteToDebug(logging.Filter):
    """Logger filter: records whose message matches ``pattern`` become DEBUG records.

    A logger filter runs before the handlers' level check, so the demoted record reaches only
    handlers (and loggers) set to DEBUG.
    """

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and self.pattern.match(record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def demote_records(records: Iterable[tuple[str, str]]) -> None:
    """Install a ``DemoteToDebug`` filter for each (logger, pattern), once."""
    for name, pattern in records:
        target = logging.getLogger(name)
        if not any(isinstance(f, DemoteToDebug) and f.pattern.pattern == pattern for f in target.filters):
            target.addFilter(DemoteToDebug(pattern))


def _define_kedro_pipeline_model_quietly() -> None:
    """Import kedro-mlflow's ``KedroPipelineModel`` without MLflow's ``PREDICT_TYPE_HINTS`` warning.

    MLflow raises that warning under a ``warnings.simplefilter("once")`` of its own, which takes
    precedence over any filter; so the warnings of this one import are recorded, that one is
    dropped, and any other is shown as usual.
    """
    if "kedro_mlflow.mlflow.kedro_pipeline_model" in sys.modules:
        return
    with warnings.catch_warnings(record=True) as caught:
        try:
            import kedro_mlflow.mlflow.kedro_pipeline_model  # noqa: F401
        except ImportError:  # without kedro-mlflow there is nothing to quieten
            return
    for warning in caught:
        if not PREDICT_TYPE_HINTS.match(str(warning.message)):
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


def quiet_start() -> None:
    """Silence ``THIRD_PARTY_WARNINGS`` and MLflow's ``PREDICT_TYPE_HINTS``, and demote ``QUIET_RECORDS``.

    Kedro calls it (``kedro.init`` entry point) before it imports its plugins, which is when
    MLflow's warning is raised; ``settings.py`` calls it too, for sessions started from Python.
    Idempotent.
    """
    for category, message, module in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    _define_kedro_pipeline_model_quietly()
    demote_records(QUIET_RECORDS)


# ----------------------------------------------------------------- one Error: block


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
    "OwnProcessError": None,
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
ADVISED_PACKAGES = ("pipelines", "kedro")


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
        ours = [e for e in known if type(e).__module__.startswith("pipelines.")]
        told = (ours or known or [error])[0]
        key = _known_class(told)
        text = str(told) if str(told).strip() else type(told).__name__
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


def _log_files() -> list[logging.FileHandler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


def _shown(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def log_traceback(error: BaseException, failure: Failure) -> list[str]:
    """Write ``error``'s traceback to the log files of the logging configuration (not the console);
    returns their paths."""
    files = _log_files()
    record = logger.makeRecord(
        logger.name,
        logging.ERROR,
        __file__,
        0,
        "kedro run failed: %s",
        (failure.summary(),),
        (type(error), error, error.__traceback__),
    )
    for handler in files:
        if record.levelno >= handler.level:
            handler.handle(record)
    return [_shown(h.baseFilename) for h in files]


class RunFailed(click.ClickException):
    """A failed ``kedro run``, shown by click as one ``Error:`` block on stderr (exit status 1)."""

    def __init__(self, failure: Failure, log_files: list[str], verbose: bool):
        named = failure.lines[0].startswith(f"{failure.error_class}: ")  # an error without advice names its class
        where = f"in node {failure.node}" if failure.node else None
        what = " ".join(w for w in (None if named else failure.error_class, where) if w)
        details = [what] if what else []
        if not verbose and log_files:
            details.append(f"traceback in {', '.join(log_files)}, or rerun with --verbose")
        elif not verbose:
            details.append("--verbose shows the traceback")
        lines = [*failure.lines, *([failure.advice] if failure.advice else [])]
        super().__init__("\n".join([*lines, f"({'; '.join(details)})"] if details else lines))


def interrupted(signum: int) -> click.ClickException:
    """The error of a run stopped by ``signum`` (the hooks' own, which ends the MLflow run KILLED)."""
    from pipelines.hooks import Interrupted

    return Interrupted(signum)


# ----------------------------------------------------------------- the command


def split_params(ctx: click.Context, param: click.Parameter, value: str | dict) -> dict:
    """``--params`` as Kedro reads it (``key=value`` items, dotted keys nest), except that a comma inside
    brackets belongs to its value: ``--params="study.seeds=[0,1,2],study.epochs=3"`` gives a list of three
    seeds (Kedro's own splitter cuts every comma, so a list could not be passed)."""
    from omegaconf import OmegaConf

    if isinstance(value, dict):
        return value
    items, depth, current = [], 0, ""
    for char in value or "":
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    dot_list = []
    for item in filter(None, (item.strip() for item in items)):
        key, equals, val = item.partition("=")
        if not equals or not key.strip():
            ctx.fail(f"Invalid format of `{param.name}` option: item `{item}` must be key=value, e.g. study.epochs=3.")
        dot_list.append(f"{key.strip()}={val}")
    return OmegaConf.to_container(OmegaConf.from_dotlist(dot_list))


def _with_list_params(option: click.Parameter) -> click.Parameter:
    if option.name != "params":
        return option
    keeping_lists = copy.copy(option)
    keeping_lists.callback = split_params
    keeping_lists.help = (
        "Override parameters: key=value items separated by commas, nested keys with dots, lists in brackets: "
        '--params="study.seeds=[0,1,2],thor.frequency=20".'
    )
    return keeping_lists


VERBOSE = click.Option(
    ["--verbose", "-v"],
    is_flag=True,
    default=False,
    help="On failure, print the traceback here too (it always goes to the log file).",
)


@click.group(context_settings=CONTEXT_SETTINGS, name="resnet-recipes")
def cli() -> None:
    """Commands of this project (they replace Kedro's commands of the same name)."""


@cli.command(
    name="run",
    params=[*map(_with_list_params, kedro_run.params), VERBOSE],
    help=kedro_run.help,
    context_settings=CONTEXT_SETTINGS,
)
def run(verbose: bool, **options) -> None:
    """Kedro's ``run`` with one ``Error:`` block for a failure (see the module docstring)."""
    demote_records(FAILURE_RECORDS)
    if not (options["pipeline"] or options["pipelines"]):
        # kedro-viz's run commands name a node or dataset, no pipeline: `--to-nodes='dim_reduce.stage2.train'`
        from pipelines.pipeline_registry import pipelines_named_by

        filters = ("node_names", "from_nodes", "to_nodes", "from_inputs", "to_outputs", "namespaces")
        options["pipelines"] = pipelines_named_by(name for key in filters for name in options[key])
    try:
        kedro_run.callback(**options)
    except click.ClickException:
        raise  # already written for the user: parameter errors, a missing device, an interruption
    except KeyboardInterrupt as error:  # Ctrl-C before the hooks handle signals (start-up)
        raise interrupted(signal.SIGINT) from error
    except Exception as error:
        failure = Failure.of(error)
        files = log_traceback(error, failure)
        if verbose:
            traceback.print_exception(error, file=sys.stderr)
        raise RunFailed(failure, files, verbose) from error
