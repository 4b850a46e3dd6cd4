"""The project's ``kedro run``: Kedro's own command (every option kept) plus ``--verbose``, a quiet
console and one ``Error:`` block for a run that fails.

- A failure prints one block on stderr: the message (naming the file or key), what to do, and
  where the traceback went (the logging configuration's log files; the terminal too with
  ``--verbose``). Errors already written for the user (``click.ClickException``: parameter
  errors, a missing device, an interruption) keep their own text and exit status.
- ``quiet_start`` (the ``kedro.init`` entry point of ``pyproject.toml``, so it runs before Kedro
  imports its plugins) and ``settings.py`` silence third-party warnings that only concern those
  packages' own code, move third-party INFO records that repeat what the user already knows
  to DEBUG, and keep each log record on one line when the output is not a terminal.
- ``--pipeline`` (one name, as older Kedro documentation writes it) runs as ``--pipelines`` does,
  without Kedro 1.7's deprecation warning.

Kedro-facing and light, since Kedro imports it for every ``kedro`` command: click and Kedro, never
MindSpore; MLflow only as kedro-mlflow's plugin loads it anyway. Error classes are known by name,
so that telling an error imports nothing.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import click
from kedro.framework.cli.project import run as kedro_run
from kedro.framework.cli.utils import CONTEXT_SETTINGS

from pipelines.failures import Failure
from trainlib.signals import Interrupted

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------- quiet start-up


# (category, message regex, module regex) of warnings that third-party code raises about itself
# on every start: nothing a user of this project can act on. OmegaConf 2.4 deprecates the call
# Kedro and kedro-mlflow make to register their resolvers.
THIRD_PARTY_WARNINGS = (
    (UserWarning, r"register_new_resolver\(\) is deprecated", r"kedro(_mlflow)?\."),
    # FastAPI 0.165 deprecates the response class kedro-viz 12.5 builds its API on: one warning per module
    (UserWarning, r"ORJSONResponse is deprecated", r"kedro_viz\."),
)
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
    # a site built before any `kedro run` of the project has no run events: nothing is wrong
    ("kedro_viz.api.rest.responses.run_events", r"Run events file .* not found"),
    # MLflow checks the logged model's input example as it logs it; a mismatch is an error the run reports
    ("mlflow.pyfunc", r"Validating input example against model signature"),
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


class StdoutHandler(logging.StreamHandler):
    """A ``StreamHandler`` writing to whatever ``sys.stdout`` is when it writes (pytest and click replace it), as
    the standard library's last-resort handler does for stderr."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def plain_logs_when_piped() -> None:
    """Kedro's rich console handler (conf/logging.yml ``rich``) lays each record out in columns as wide as the
    terminal, and as wide as 80 columns when the output is not a terminal (a CI log, a pipe, a file), where a long
    record is then cut over several lines. There, and not in a terminal or a notebook, it is replaced by the
    logging configuration's ``console`` handler: one line per record, in its formatter's format.

    The choice is made here, as Kedro accepts only its own and the standard library's classes in a logging
    configuration (no handler of the project's, no factory). Idempotent.
    """
    from kedro.framework.project import LOGGING
    from rich.logging import RichHandler

    config = LOGGING.data
    console = config.get("handlers", {}).get("console", {})
    style = config.get("formatters", {}).get(console.get("formatter"), {})
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, RichHandler) and not (handler.console.is_terminal or handler.console.is_jupyter):
            plain = StdoutHandler()
            plain.setLevel(console.get("level", logging.NOTSET))
            plain.setFormatter(logging.Formatter(style.get("format"), style.get("datefmt")))
            root.removeHandler(handler)
            root.addHandler(plain)


def quiet_start() -> None:
    """Silence ``THIRD_PARTY_WARNINGS`` and MLflow's ``PREDICT_TYPE_HINTS``, demote ``QUIET_RECORDS``, and keep
    each log record on one line when the output is not a terminal (``plain_logs_when_piped``).

    Kedro calls it (``kedro.init`` entry point) before it imports its plugins, which is when
    MLflow's warning is raised; ``settings.py`` calls it too, for sessions started from Python.
    Idempotent.
    """
    for category, message, module in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    _define_kedro_pipeline_model_quietly()
    demote_records(QUIET_RECORDS)
    plain_logs_when_piped()
    if sys.argv[1:2] == ["viz"]:
        _kedro_viz_without_a_false_update_banner()
        _kedro_viz_page_script()
        _kedro_viz_server_quietly()


def _kedro_viz_without_a_false_update_banner() -> None:
    """kedro-viz 12.5's ``/api/version`` turns a failed PyPI lookup (no network to pypi.python.org, as on a
    cluster's nodes) into the string ``"None"`` and compares version strings, so ``"12.5.0" < "None"`` reads as
    outdated and the page shows "Kedro-Viz None is here!". Without an answer from PyPI, the latest version known is
    the installed one."""
    from kedro_viz import __version__
    from kedro_viz.api.rest.responses import version
    from packaging.version import parse

    lookup = version.get_latest_version

    def latest_known():
        return lookup() or parse(__version__)

    version.get_latest_version = latest_known


def _kedro_viz_page_script() -> None:
    """kedro-viz 12.5 has no option or query parameter for its first view (its feature tour, layout, minimap,
    zoom), only the browser's local storage and its own page: the page it serves (``kedro viz run``,
    ``apps.HTMLResponse``) and the one it writes (``kedro viz build``, ``BaseDeployer._write_heap_injected_index``)
    get ``viz_page.PAGE_SCRIPT``."""
    from kedro_viz.api import apps
    from kedro_viz.integrations.deployment.base_deployer import BaseDeployer

    from pipelines.viz_page import with_page_script

    class PageWithScript(apps.HTMLResponse):
        def __init__(self, content=None, *args, **kwargs):
            super().__init__(with_page_script(content) if isinstance(content, str) else content, *args, **kwargs)

    apps.HTMLResponse = PageWithScript
    write = BaseDeployer._write_heap_injected_index
    if getattr(write, "with_page_script", False):
        return

    def write_with_page_script(self, html_content):
        write(self, with_page_script(html_content))

    write_with_page_script.with_page_script = True
    BaseDeployer._write_heap_injected_index = write_with_page_script


# -W syntax: kedro-viz's server runs in a spawned process, which takes no filter of this one, only the environment
VIZ_SERVER_WARNINGS = "ignore:ORJSONResponse is deprecated:UserWarning"


def _kedro_viz_server_quietly() -> None:
    """FastAPI 0.165's ``FastAPIDeprecationWarning`` about ``ORJSONResponse``, which kedro-viz 12.5 imports, is
    raised in ``kedro viz run``'s server process (multiprocessing's spawn) before the project is loaded there: the
    filter goes to that process through ``PYTHONWARNINGS``."""
    current = os.environ.get("PYTHONWARNINGS", "")
    if VIZ_SERVER_WARNINGS not in current.split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (current, VIZ_SERVER_WARNINGS)))


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


class StoppedBySignal(click.ClickException):
    """A run stopped by SIGINT or SIGTERM (``trainlib.signals.Interrupted``): one ``Error:`` line, exit status 128 +
    the signal number."""

    def __init__(self, interrupted: Interrupted):
        super().__init__(interrupted.message)
        self.exit_code = interrupted.exit_code


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
    if options["pipeline"] and not options["pipelines"]:
        # Kedro 1.7 deprecates --pipeline, with a warning on every run; one name is a list of one for --pipelines
        # (both together stay Kedro's error)
        options["pipelines"], options["pipeline"] = [options["pipeline"]], None
    if not (options["pipeline"] or options["pipelines"]):
        # kedro-viz's run commands name a node or dataset, no pipeline: `--to-nodes='dim_reduce.stage2.train_stage2'`
        from pipelines.pipeline_registry import pipelines_named_by

        filters = ("node_names", "from_nodes", "to_nodes", "from_inputs", "to_outputs", "namespaces")
        options["pipelines"] = pipelines_named_by(name for key in filters for name in options[key])
    try:
        kedro_run.callback(**options)
    except click.ClickException:
        raise  # already written for the user: parameter errors, a missing device
    except Interrupted as error:
        raise StoppedBySignal(error) from error
    except KeyboardInterrupt as error:  # Ctrl-C before the hooks handle signals (start-up)
        raise StoppedBySignal(Interrupted(signal.SIGINT)) from error
    except Exception as error:
        from pipelines.tracking.login import refused_login  # MLflow: loaded only once a run failed
        from pipelines.tracking.outage import outage

        failure = Failure.of(refused_login(error) or outage(error) or error)
        files = log_traceback(error, failure)
        if verbose:
            traceback.print_exception(error, file=sys.stderr)
        raise RunFailed(failure, files, verbose) from error


# ----------------------------------------------------------------- a team's server

MODEL_METADATA_KEY = "mlflow_model"  # hooks.models.METADATA_KEY: the catalog's model folders, each one registered name


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(name.strip() for name in (value or "").split(",") if name.strip())


def registered_model_names(catalog, dataset_names: Iterable[str]) -> tuple[str, ...]:
    """The registered model names the catalog gives the models of ``dataset_names`` (``baseline``,
    ``dim_reduce.stage2``, ...): what ``model.register`` creates versions of."""
    names = set()
    for dataset_name in dataset_names:
        if dataset_name in catalog:
            declared = (getattr(catalog.get(dataset_name), "metadata", None) or {}).get(MODEL_METADATA_KEY)
            names.update([declared["name"]] if declared else [])
    return tuple(sorted(names))


ENV = click.option("--env", "-e", default=None, help="Kedro configuration environment.")


@contextmanager
def _tracking_context(env: str | None):
    """The project's context with MLflow set as for a run: kedro-mlflow reads mlflow.yml, exports the
    credentials.yml entry it names, and opens the experiment. A server refusing the login is one Error line."""
    from kedro.framework.session import KedroSession

    from pipelines.tracking.login import refused_login

    try:
        with KedroSession.create(env=env) as session:
            yield session.load_context()
    except click.ClickException:
        raise
    except Exception as error:
        told = refused_login(error)
        if told is None:
            raise
        raise click.ClickException(f"TrackingLoginError: {told}") from error


@cli.group(name="team", context_settings=CONTEXT_SETTINGS)
def team() -> None:
    """A team's shared MLflow server (docs/team.md)."""


@team.command(name="permissions", context_settings=CONTEXT_SETTINGS)
@click.option("--members", default="", help="Users who log runs: EDIT on the experiments, READ on the models.")
@click.option("--release", default="", help="Users who register versions and move champion: MANAGE on the models.")
@click.option(
    "--experiments",
    default=None,
    help="Comma-separated; default: the experiment of mlflow.yml (opened in any case, as by a run).",
)
@click.option(
    "--models", default=None, help="Registered model names, comma-separated; default: every one the pipelines register."
)
@ENV
def permissions(members: str, release: str, experiments: str | None, models: str | None, env: str | None) -> None:
    """As the server's admin, create the experiments, reserve the registered model names and give members and the
    release role their permissions (docs/team.md#permissions). Idempotent. The admin's login comes from
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or conf/local/credentials.yml, as for a run."""
    from pipelines.tracking.permissions import PermissionPlan, PlanError, apply_plan

    roles = _names(members), _names(release)
    try:
        PermissionPlan((), (), *roles)  # a user in both roles stops before the project loads
        with _tracking_context(env) as context:
            if models is None:
                from pipelines.pipeline_registry import register_pipelines  # MindSpore: only when names are not given

                datasets = {name for pipeline in register_pipelines().values() for name in pipeline.datasets()}
                models = ",".join(registered_model_names(context.catalog, sorted(datasets)))
            plan = PermissionPlan(
                _names(experiments) or (context.mlflow.tracking.experiment.name,), _names(models), *roles
            )
            for line in apply_plan(plan, context.mlflow.server.mlflow_tracking_uri):
                click.echo(line)
    except PlanError as error:
        raise click.ClickException(f"PlanError: {error}") from error


@cli.group(name="models", context_settings=CONTEXT_SETTINGS)
def model_registry() -> None:
    """MLflow's Model Registry: the models the runs logged (docs/use-a-model.md)."""  # not `registry`: Kedro's own
    # `kedro registry list` shows the pipelines


@model_registry.command(name="register", context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@click.option("--run-id", default=None, help="The run whose model to register; default: NAME's newest finished run.")
@click.option("--alias", default=None, help="Point this alias (e.g. champion) at the version.")
@ENV
def register(name: str, run_id: str | None, alias: str | None, env: str | None) -> None:
    """Register the model a run logged as a version of NAME (baseline, thor, dim_reduce.stage2, ...) without training
    again (docs/use-a-model.md#register-a-model-a-run-logged). Store and login as for a run; idempotent."""
    from pipelines.tracking.registry import RegistryError, register_run_model

    try:
        with _tracking_context(env) as context:
            experiment = context.mlflow.tracking.experiment.name
            registered = register_run_model(name, experiment=experiment, run_id=run_id, alias=alias)
    except RegistryError as error:
        raise click.ClickException(f"RegistryError: {error}") from error
    for line in registered.lines():
        click.echo(line)
