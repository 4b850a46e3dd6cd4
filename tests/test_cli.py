"""The project's ``kedro run``: Kedro's ``--params`` key=value items plus lists in brackets, ``--pipeline`` as
``--pipelines``, log records on one line when the output is not a terminal; kedro-viz offline."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import warnings
from pathlib import Path

import click
import pytest

from pipelines.cli import split_params
from pipelines.viz_page import PAGE_SCRIPT

PROJECT = Path(__file__).resolve().parents[1]


def parse(value: str):
    context = click.Context(click.Command("run"))
    return split_params(context, click.Option(["--params"]), value)


def test_a_comma_inside_brackets_stays_with_its_list():
    assert parse("study.seeds=[0,1,2],study.epochs=3,thor.trace_rule=[0.01,0.001]") == {
        "study": {"seeds": [0, 1, 2], "epochs": 3},
        "thor": {"trace_rule": [0.01, 0.001]},
    }


def test_plain_items_parse_as_kedro_parses_them():
    assert parse("baseline.lr.peak=0.1, network.name=resnet18") == {
        "baseline": {"lr": {"peak": 0.1}},
        "network": {"name": "resnet18"},
    }
    assert parse("") == {}


def test_an_item_without_equals_names_the_item():
    with pytest.raises(click.UsageError, match="study.epochs"):
        parse("study.epochs")


def test_kedro_viz_offline_shows_no_update_banner(monkeypatch):
    """Offline (PyPI unreachable), kedro-viz 12.5 would report version "None" as newer than the installed one."""
    from kedro_viz import __version__
    from kedro_viz.api.rest.responses import version

    from pipelines.cli import _kedro_viz_without_a_false_update_banner

    monkeypatch.setattr(version, "get_latest_version", lambda: None)  # PyPI's answer when it cannot be reached
    assert version.get_version_response().is_outdated  # the bug: "Kedro-Viz None is here!"
    _kedro_viz_without_a_false_update_banner()
    response = version.get_version_response()
    assert not response.is_outdated and response.latest == __version__


def test_kedro_viz_pages_carry_the_page_script_and_its_server_runs_without_fastapis_warning(monkeypatch):
    """The page ``kedro viz run`` serves and the one ``kedro viz build`` writes carry ``viz_page.PAGE_SCRIPT`` once,
    before kedro-viz's own scripts (its first view: no feature tour, layout, minimap, zoom; tests/ui/test_browser.py
    checks what it draws); the server's spawned process gets the warnings filter through the environment."""
    from kedro_viz.api import apps
    from kedro_viz.integrations.deployment.base_deployer import BaseDeployer

    from pipelines import cli

    monkeypatch.setattr(apps, "HTMLResponse", apps.HTMLResponse)
    monkeypatch.setattr(BaseDeployer, "_write_heap_injected_index", BaseDeployer._write_heap_injected_index)
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    page = (Path(apps.__file__).parent.parent / "html" / "index.html").read_text()
    cli._kedro_viz_page_script()
    cli._kedro_viz_page_script()  # idempotent: quiet_start runs in each process
    served = apps.HTMLResponse(page).body.decode()
    assert served.count(PAGE_SCRIPT) == 1
    assert served.index(PAGE_SCRIPT) < served.index('<script type="module"')  # before the app reads its storage
    written = []

    class Files:  # stands for the build's fsspec file system
        def put(self, path, *_, **__):
            written.append(Path(path).read_text())

    deployer = BaseDeployer.__new__(BaseDeployer)
    deployer._fs, deployer._path = Files(), "build"
    BaseDeployer._write_heap_injected_index(deployer, page)
    assert written[0].count(PAGE_SCRIPT) == 1
    cli._kedro_viz_server_quietly()
    cli._kedro_viz_server_quietly()
    assert os.environ["PYTHONWARNINGS"] == f"default,{cli.VIZ_SERVER_WARNINGS}"
    code = "import warnings; warnings.warn('ORJSONResponse is deprecated, FastAPI now ...', UserWarning)"
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert quiet.stderr == ""


class RecordedSession:
    """Stands for ``KedroSession``: records what ``kedro run`` asks it to run."""

    runs: list[dict] = []

    @classmethod
    def create(cls, **_) -> RecordedSession:
        return cls()

    def __enter__(self) -> RecordedSession:
        return self

    def __exit__(self, *_) -> None:
        pass

    def run(self, **options) -> dict:
        self.runs.append(options)
        return {}


def test_the_singular_pipeline_option_runs_that_pipeline_without_a_deprecation_warning(monkeypatch):
    """``kedro run --pipeline=dim_reduce``, as older Kedro documentation writes it: Kedro 1.7 warns on every run."""
    from click.testing import CliRunner
    from kedro import KedroDeprecationWarning
    from kedro.framework.session import KedroSession

    from pipelines.cli import cli

    monkeypatch.setattr(KedroSession, "create", RecordedSession.create)
    monkeypatch.setattr(RecordedSession, "runs", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(cli, ["run", "--pipeline=dim_reduce", "--env=ascend"])
    assert result.exit_code == 0, result.output
    assert [w.message for w in caught if issubclass(w.category, KedroDeprecationWarning)] == []
    assert [run["pipeline_names"] for run in RecordedSession.runs] == [["dim_reduce"]]
    both = CliRunner().invoke(cli, ["run", "--pipeline=thor", "--pipelines=dim_reduce"])
    assert both.exit_code != 0 and len(RecordedSession.runs) == 1  # both options together stay Kedro's error


LONG_RECORD = "a log record longer than any terminal " + "x" * 150


def logged_through_the_project_configuration(tmp_path: Path, stdout, record: str = LONG_RECORD) -> None:
    """A ``pipelines`` INFO record, in a new process that configures logging as ``kedro`` does (conf/logging.yml),
    its stdout ``stdout``. (``quiet_start`` makes the same call: tests/e2e/test_quiet.py reads a real run's.)"""
    script = (
        "import logging, kedro.framework.project\n"
        "from pipelines.cli import plain_logs_when_piped\n"
        "plain_logs_when_piped()\n"
        f"logging.getLogger('pipelines').info({record!r})\n"
    )
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    environment["KEDRO_LOGGING_CONFIG"] = str(PROJECT / "conf" / "logging.yml")
    subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=environment, stdout=stdout, check=True, timeout=120
    )


def test_log_records_keep_one_line_when_piped_and_richs_layout_in_a_terminal(tmp_path):
    """Piped (a CI log), a record is one line however long; a terminal keeps rich's columns (80 wide here)."""
    piped = tmp_path / "piped.txt"
    with piped.open("w") as stdout:
        logged_through_the_project_configuration(tmp_path, stdout)
    record = [line for line in piped.read_text().splitlines() if "x" * 10 in line]
    assert len(record) == 1 and record[0].endswith(f" - pipelines - INFO - {LONG_RECORD}"), record

    controller, terminal = pty.openpty()
    try:
        logged_through_the_project_configuration(tmp_path, terminal)
    finally:
        os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal's other end is closed: everything was read
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    wrapped = [line for line in shown.decode(errors="replace").splitlines() if "x" * 10 in line]
    assert len(wrapped) > 1 and "INFO" in shown.decode(errors="replace")


def test_the_reports_markdown_table_is_not_wrapped_when_piped(tmp_path):
    """The report logs its summary as one multi-line record (pipelines.report.nodes): piped, every table row
    stays one line, however wide (Rich's handler cut it at 80 columns)."""
    row = (
        "| thor vs baseline | final_top1_difference | +18.50 pt [+12.15, +24.85] | 2 | 2 epochs each |" + " " * 10 + "|"
    )
    summary = f"By how much:\nthor beat baseline by +18.50 pt final top-1.\n\n| comparison | measure |\n{row}"
    piped = tmp_path / "piped.txt"
    with piped.open("w") as stdout:
        logged_through_the_project_configuration(tmp_path, stdout, summary)
    assert row in piped.read_text().splitlines()
