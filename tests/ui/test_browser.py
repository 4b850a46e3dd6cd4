"""Real-browser checks of the MLflow UI (and the report's links into it), opened in headless Chromium; the
``kedro viz build`` site's are in ``test_viz_browser.py``.

A real tiny ``kedro run`` fills the MLflow store, served on localhost and read back from the rendered pages.
Chromium and its WebDriver are Debian's ``chromium`` and ``chromium-driver`` (installed by ``scripts/setup.sh``);
selenium is pointed at them, so nothing is downloaded. Screenshots go to ``test-artifacts/browser/`` at the
repository root, also when a page fails to render (``tests/support/browser.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from pipelines.tracking.naming import RUN_COLOUR_TAG
from tests.support.browser import before_each_page, screenshot, settled_screenshot, wait_for
from tests.support.projects import TINY_PARAMS, kedro, make_project, run_on_tiny_tree
from tests.support.servers import mlflow_server
from tests.support.stores import REPORT_OUTPUT, store_report, tracking_uri
from tests.support.trees import write_image_tree
from tests.support.views import charted, linked_view

RUN_OUTPUT = "kedro_run_output.txt"  # what the project's kedro run printed (its closing links among it)


@pytest.fixture(scope="module")
def filled_project(tmp_path_factory) -> Path:
    """A project whose ``mlflow.db`` holds one real baseline run of one epoch: one value per per-epoch key."""
    params = {"baseline": {**TINY_PARAMS["baseline"], "epochs": 1}}
    project, result = run_on_tiny_tree(tmp_path_factory.mktemp("browser"), "baseline", {"train": 4, "val": 2}, params)
    (project / RUN_OUTPUT).write_text(result.stdout + result.stderr)
    return project


@pytest.fixture(scope="module")
def study_project(tmp_path_factory) -> Path:
    """A project whose ``mlflow.db`` holds a real study: baseline and thor, 2 seeds, 1 epoch, step evaluations."""
    root = tmp_path_factory.mktemp("browser_study")
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    params = {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree), "step_eval_images": 6},
        "thor": {"batch_size": 4, "frequency": 4},
        "study": {"recipes": ["baseline", "thor"], "seeds": [0, 1], "epochs": 1, "eval_every_steps": 2},
    }
    project = make_project(root / "project", params)
    result = kedro(project, "run", "--pipelines=study")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    (project / RUN_OUTPUT).write_text(result.stdout + result.stderr)
    return project


@pytest.fixture
def mlflow_ui(filled_project, tmp_path) -> Iterator[str]:
    """The MLflow UI over the tiny baseline run's store."""
    with mlflow_server(filled_project / "mlflow.db", tmp_path / "mlflow_server.log") as url:
        yield url


def test_mlflow_ui_shows_the_run_and_its_metrics(filled_project, mlflow_ui, browser):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{filled_project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet-recipes")
    (run,) = client.search_runs([experiment.experiment_id])
    metrics = run.data.metrics
    assert {"train/loss", "val/top1", "val/top5", "final/top1"} <= set(metrics)  # the metric schema
    classic_mlflow_views(browser)

    browser.get(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs")
    run_link = f"a[href*='/runs/{run.info.run_id}']"
    links = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, run_link), "mlflow_experiment", "the run")
    # the header's experiment name arrives with a request of its own, after the runs on a loaded machine
    wait_for(
        browser,
        lambda d: "resnet-recipes" in d.find_element(By.TAG_NAME, "body").text,
        "mlflow_experiment",
        "the experiment's name",
    )
    screenshot(browser, "mlflow_experiment")
    assert run.info.run_name == "baseline"
    assert run.info.run_name in {link.text for link in links}

    browser.get(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}")

    def metric_rows(driver) -> dict[str, str]:
        table = driver.find_elements(By.XPATH, "//div[@role='table'][.//*[@role='columnheader'][.='Metric']]")
        rows = table[0].find_elements(By.XPATH, ".//div[@role='row'][.//a]") if table else []
        cells = [row.find_elements(By.XPATH, "./div") for row in rows]
        found = {c[0].text: c[1].text for c in cells if len(c) >= 2}
        return found if set(found) >= set(metrics) else {}

    shown = wait_for(browser, metric_rows, "mlflow_run", f"the metrics table with {sorted(metrics)}")
    browser.execute_script(
        "arguments[0].scrollIntoView({block: 'center'})", browser.find_element(By.XPATH, "//a[.='train/loss']")
    )
    screenshot(browser, "mlflow_run")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert run.info.run_id in body and "Finished" in body
    assert set(shown) == set(metrics)
    for name, value in metrics.items():
        assert float(shown[name]) == pytest.approx(value, rel=1e-9, abs=1e-12), name


def classic_mlflow_views(driver: webdriver.Chrome) -> None:
    """The classic run views (not the GenAI ones a new experiment opens on)."""
    before_each_page(driver, "localStorage.setItem('mlflow.workflowType_v1', JSON.stringify('machine_learning'));")


# MLflow's Assistant (Beta): its panel (a box beside the page, position: relative) and its round button at the
# bottom right (position: fixed), shown whenever the panel is closed; MLflow opens the panel by itself, once, when
# that button first mounts on a server at localhost, unless the served page's script (``ui_app``) closed it.
ASSISTANT = """
const parts = Array.from(document.querySelectorAll('[data-assistant-ui="true"]')).filter(e => e.offsetWidth > 0);
const of = position => parts.filter(e => getComputedStyle(e).position === position);
return {panel: of('relative').map(e => Math.round(e.getBoundingClientRect().width)),
        button: of('fixed').length > 0, stored: localStorage.getItem('mlflow.assistant.panelOpen_v1')};
"""


def assistant(driver: webdriver.Chrome, name: str, shown: str = "button") -> dict:
    """The Assistant's state once its button (the panel closed) or its panel (``shown="panel"``) is on the page:
    the panel's width in px (empty when closed), whether the button shows and the stored choice."""

    def state(d) -> dict | None:
        found = d.execute_script(ASSISTANT)
        return found if found[shown] else None

    return wait_for(driver, state, name, f"the Assistant's {shown}")


# Each chart tile of the chart view: its width, its title as shown and the title's parts cut short by an ellipsis.
CHART_TILES = """
return Array.from(document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]'))
  .filter(card => card.offsetWidth > 0).map(card => {
    const header = card.firstElementChild;
    const cut = Array.from(header.querySelectorAll('*')).filter(e =>
      getComputedStyle(e).textOverflow === 'ellipsis' && e.scrollWidth > e.clientWidth);
    return {width: card.getBoundingClientRect().width, title: header.innerText, cut: cut.map(e => e.innerText)};
  });
"""


# Each line chart's drawn traces: per trace (one per run and chart, and the unsmoothed copy MLflow draws beneath), the
# run's id (MLflow's ``uuid`` on the plotly trace), the chart's metric, the markers drawn and whether a line is drawn
# (an SVG path through two points or more).
DRAWN_TRACES = """
return Array.from(document.querySelectorAll('div.js-plotly-plot')).flatMap(plot =>
  Array.from(plot.querySelectorAll('g.trace.scatter')).map(group => {
    const input = plot.data[group.__data__[0].trace.index];
    const markers = Array.from(group.querySelectorAll('path.point')).filter(p => p.getAttribute('d'));
    const lines = Array.from(group.querySelectorAll('path.js-line')).filter(p => /L/.test(p.getAttribute('d') || ''));
    const colour = (input.line && input.line.color) || (input.marker && input.marker.color);
    return {run: input.uuid, metric: input.metricKey, markers: markers.length, line: lines.length > 0, colour: colour};
  }));
"""


def drawn_runs(driver: webdriver.Chrome, metric: str) -> dict[str, tuple[int, bool]]:
    """Per run drawn in ``metric``'s chart: its markers and whether a line is drawn (traces without either are not)."""
    found: dict[str, tuple[int, bool]] = {}
    for trace in driver.execute_script(DRAWN_TRACES):
        if trace["metric"] == metric and (trace["markers"] or trace["line"]):
            markers, line = found.get(trace["run"], (0, False))
            found[trace["run"]] = (max(markers, trace["markers"]), line or trace["line"])
    return found


def drawn_colours(driver: webdriver.Chrome, metric: str) -> dict[str, str]:
    """The colour each run is drawn in on ``metric``'s chart (lower case ``#rrggbb``; a faded trace of the run,
    ``#rrggbbaa``, is the same colour)."""
    return {
        t["run"]: str(t["colour"]).lower()[:7] for t in driver.execute_script(DRAWN_TRACES) if t["metric"] == metric
    }


def printed_links(output: str) -> tuple[str, str]:
    (chart,) = re.findall(r"MLflow: compare the runs at (\S+)", output)
    (table,) = re.findall(r"MLflow: the runs table is (\S+)", output)
    return chart, table


def open_chart_link(driver: webdriver.Chrome, link: str, metric: str, expected: set[str], name: str):
    """Open ``link`` as printed, with no click, until ``metric``'s chart draws every run of ``expected``."""
    driver.get(link)

    def every_run_drawn(d) -> bool:
        return set(drawn_runs(d, metric)) >= expected

    wait_for(driver, every_run_drawn, name, f"a {metric} chart drawing a line or marker for each of {sorted(expected)}")
    settled_screenshot(driver, name)
    return drawn_runs(driver, metric)


def test_the_link_after_a_one_epoch_run_draws_its_single_value_as_a_marker(filled_project, mlflow_ui, browser):
    """One epoch: one val/top1 value, which MLflow's metric page drew as an empty chart with a legend alone."""
    chart, _ = printed_links((filled_project / RUN_OUTPUT).read_text())
    link = chart.replace("http://127.0.0.1:5000", mlflow_ui)  # mlflow ui's address in mlflow.yml; served here
    uri = f"sqlite:///{filled_project / 'mlflow.db'}"
    (run,) = mlflow.MlflowClient(uri).search_runs(
        [mlflow.MlflowClient(uri).get_experiment_by_name("resnet-recipes").experiment_id]
    )
    assert charted(linked_view(uri, chart)) == ["val/top1"]
    drawn = open_chart_link(browser, link, "val/top1", {run.info.run_id}, "mlflow_link_one_epoch")
    assert drawn[run.info.run_id][0] == 1  # its one value, a marker
    assert "Model training" in browser.find_element(By.TAG_NAME, "body").text  # not the GenAI pages


@pytest.fixture
def study_ui(study_project, tmp_path) -> Iterator[str]:
    with mlflow_server(study_project / "mlflow.db", tmp_path / "mlflow_server.log") as url:
        yield url


def test_the_link_after_a_study_charts_its_step_evaluations_a_line_per_run(study_project, study_ui, browser):
    """At a 1440 px window from a fresh profile: no Assistant panel, each chart tile wide with its whole title."""
    browser.set_window_size(1440, 1000)
    chart, _ = printed_links((study_project / RUN_OUTPUT).read_text())
    link = chart.replace("http://127.0.0.1:5000", study_ui)
    uri = f"sqlite:///{study_project / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("resnet-recipes")
    trainings = {
        run.info.run_id: run for run in client.search_runs([experiment.experiment_id]) if "recipe" in run.data.tags
    }
    assert len(trainings) == 4  # baseline and thor, seeds 0 and 1
    assert all(len(client.get_metric_history(r, "val/step_top1")) >= 2 for r in trainings)
    assert charted(linked_view(uri, chart)) == ["val/step_top1", "val/top1"]  # the step evaluations first
    drawn = open_chart_link(browser, link, "val/step_top1", set(trainings), "mlflow_link_study")
    assert set(drawn) == set(trainings)
    assert all(line and markers >= 2 for markers, line in drawn.values())  # a line through each run's evaluations
    assert set(drawn_runs(browser, "val/top1")) == set(trainings)  # and each run's one epoch, a marker
    # each run in its own colour, the one its tag sets: blues for the baseline's seeds, oranges for THOR's
    colours = drawn_colours(browser, "val/step_top1")
    assert colours == {r: run.data.tags[RUN_COLOUR_TAG] for r, run in trainings.items()}
    assert len(set(colours.values())) == len(trainings)
    assert browser.execute_script("return window.innerWidth") == 1440
    assert assistant(browser, "mlflow_link_study")["panel"] == []
    tiles = browser.execute_script(CHART_TILES)
    print("chart tiles:", tiles)
    # the compared runs' two charts first, then MLflow's of the runs' other metrics (val/step_top5, …), 2 a row
    titles = [tile["title"].split("\n")[0] for tile in tiles]
    assert titles[:3] == ["val/step_top1", "val/top1", "val/step_top5"]
    assert all(tile["width"] >= 300 and tile["cut"] == [] for tile in tiles), tiles


def test_the_runs_table_link_shows_the_headline_columns_best_first(study_project, study_ui, browser):
    _, table = printed_links((study_project / RUN_OUTPUT).read_text())
    browser.get(table.replace("http://127.0.0.1:5000", study_ui))
    headers = ("final/top1", "final/top5", "target/epochs", "target/time_s", "baseline.epochs", "thor.epochs", "seed")

    def columns(driver) -> list[str] | None:
        shown = [h.text.strip() for h in driver.find_elements(By.CSS_SELECTOR, "[role=columnheader]")]
        return shown if set(headers) <= set(shown) else None

    shown = wait_for(browser, columns, "mlflow_runs_table", f"the columns {headers}")
    screenshot(browser, "mlflow_runs_table")
    assert shown.index("final/top1") < shown.index("final/top5")
    names = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "a[href*='/runs/']") if a.text.startswith("seed")]
    assert {name.split()[0] for name in names} == {"seed0", "seed1"}  # the seed first, readable


GENAI_PAGES = ("Judges", "Evaluation runs", "Prompts", "Sessions", "Agent versions")  # GenAI mode's side bar


def genai_elements(driver: webdriver.Chrome) -> list[str]:
    found = driver.find_elements(
        By.XPATH, "//aside//*[" + " or ".join(f"normalize-space(text())='{t}'" for t in GENAI_PAGES) + "]"
    )
    return [element.text for element in found if element.is_displayed()]


def test_compare_a_run_page_and_the_breadcrumb_from_a_bare_experiment_link_stay_in_model_training(
    study_project, study_ui, browser
):
    """A fresh browser profile (nothing in its storage) opens ``#/experiments/<id>`` with no ``workflowType``, as a
    teammate's bookmark does; MLflow's own Compare button, a run's name and the breadcrumb back each keep the
    model-training view: the server's app plugin (``pipelines.tracking.ui_app``) sets the view's default. An MLflow
    upgrade that renames the view's key or changes its parsing fails here."""
    client = mlflow.MlflowClient(f"sqlite:///{study_project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
    browser.get(f"{study_ui}/#/experiments/{experiment}")
    rows = ".ag-pinned-left-cols-container .ag-row"
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{rows} button"), "mlflow_bare", "rows")
    settled_screenshot(browser, "mlflow_bare_experiment")
    on_table = genai_elements(browser)
    panels = [assistant(browser, "mlflow_bare")["panel"]]

    def trainings(driver) -> list:
        """The study's training rows (its child runs), once the study run's row shows them."""
        found = [row for row in driver.find_elements(By.CSS_SELECTOR, rows) if "seed" in row.text]
        return found if len(found) >= 2 else []

    def open_trainings(name: str) -> list:
        """Open the study run's row (its one expander) unless its trainings show already, and wait for them."""
        if not trainings(browser):
            browser.find_element(By.CSS_SELECTOR, f"{rows} button").click()
        return wait_for(browser, trainings, name, "the study's trainings")

    for row in open_trainings("mlflow_open")[:2]:
        row.find_element(By.CSS_SELECTOR, "input.ag-checkbox-input").find_element(By.XPATH, "..").click()
    compare = wait_for(
        browser,
        lambda d: [b for b in d.find_elements(By.TAG_NAME, "button") if b.text == "Compare"],
        "mlflow_select",
        "Compare",
    )
    compare[0].click()
    wait_for(
        browser, lambda d: "Comparing" in d.find_element(By.TAG_NAME, "body").text, "mlflow_compare", "the comparison"
    )
    settled_screenshot(browser, "mlflow_compare")
    on_compare = genai_elements(browser)
    panels.append(assistant(browser, "mlflow_compare")["panel"])
    browser.back()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{rows} button"), "mlflow_runs_table_back", "rows")
    (training, *_) = open_trainings("mlflow_runs_table_open")
    training.find_element(By.CSS_SELECTOR, "a[href*='/runs/']").click()
    wait_for(
        browser,
        lambda d: "About this run" in d.find_element(By.TAG_NAME, "body").text,
        "mlflow_run_page",
        "the run page",
    )
    settled_screenshot(browser, "mlflow_run_page")
    on_run = genai_elements(browser)
    panels.append(assistant(browser, "mlflow_run_page")["panel"])
    crumb = wait_for(
        browser,
        lambda d: [
            a
            for a in d.find_elements(By.CSS_SELECTOR, f"a[href*='experiments/{experiment}']")
            if a.text == "resnet-recipes"
        ],
        "mlflow_breadcrumb",
        "the breadcrumb",
    )
    crumb[0].click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, rows), "mlflow_breadcrumb_back", "rows")
    settled_screenshot(browser, "mlflow_breadcrumb_back")
    assert (on_table, on_compare, on_run, genai_elements(browser)) == ([], [], [], [])
    assert "Model training" in browser.find_element(By.TAG_NAME, "body").text
    closed = assistant(browser, "mlflow_breadcrumb_back")
    assert panels + [closed["panel"]] == [[]] * 4 and closed["stored"] == "false"  # closed on every page
    # the user opens the panel with its button: the next page keeps it open
    browser.execute_script(
        "Array.from(document.querySelectorAll('[data-assistant-ui=\"true\"]'))"
        ".find(e => getComputedStyle(e).position === 'fixed').querySelector('button').click()"
    )
    assistant(browser, "mlflow_assistant_opened", "panel")
    browser.refresh()
    kept = assistant(browser, "mlflow_assistant_kept", "panel")
    settled_screenshot(browser, "mlflow_assistant_kept")
    print("assistant panel kept:", kept)
    assert kept["stored"] == "true" and not kept["button"]


def test_the_report_link_draws_every_compared_run(recipe_store, browser):
    """The report's ``kedro run`` ends with a link to the comparison; opened as it is, with no click, its top-1 chart
    draws a line or marker for each run the report compared, at the tracking server's address."""
    server = tracking_uri(recipe_store)
    chart, _ = printed_links((recipe_store / REPORT_OUTPUT).read_text())
    assert chart.startswith(f"{server}/#/experiments/") and chart.endswith("workflowType=machine_learning")
    client = mlflow.MlflowClient(server)
    report = store_report(recipe_store)
    compared = [client.get_run(run_id) for run_id in report.data.tags["compared_runs"].split(",")]
    expected = {run.info.run_id for run in compared if "val/top1" in run.data.metrics}
    assert len(expected) == 6  # baseline, thor, adasum, dim_reduce's stage 1, stage 2 and control
    assert "val/top1" in charted(linked_view(server, chart))
    drawn = open_chart_link(browser, chart, "val/top1", expected, "mlflow_compare_top1")
    assert set(drawn) == expected
    assert "Model training" in browser.find_element(By.TAG_NAME, "body").text  # not the GenAI pages
