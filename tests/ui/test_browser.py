"""Real-browser checks: the ``kedro viz build`` site and the MLflow UI, opened in headless Chromium.

A real tiny ``kedro run`` fills the MLflow store, ``kedro viz build`` writes the static site, both are served on
localhost and read back from the rendered pages. Chromium and its WebDriver are Debian's ``chromium`` and
``chromium-driver`` (installed by ``scripts/setup.sh``); selenium is pointed at them, so nothing is downloaded.
Screenshots go to ``test-artifacts/browser/`` at the repository root, also when a page fails to render.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import mlflow
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from pipelines.tracking.naming import RUN_COLOUR_TAG
from pipelines.viz_page import LABEL_PX
from tests.support.projects import PROJECT, TINY_PARAMS, kedro, make_project, run_on_tiny_tree
from tests.support.servers import mlflow_server
from tests.support.stores import REPORT_OUTPUT, store_report, tracking_uri
from tests.support.trees import write_image_tree
from tests.support.views import charted, linked_view

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = PROJECT / "test-artifacts" / "browser"
PAGE_TIMEOUT_S = 90  # a page's scripts, on 2 shared cores
# The baseline pipeline's task nodes, named here so that the check cannot pass on an empty graph.
FLOWCHART_NODES = "svg g.pipeline-node[data-node-fullname]"
LABELS = "svg g.pipeline-node text"
LAYER_NAMES = ".pipeline-flowchart__layer-names--visible .pipeline-layer-name"
DIM_REDUCE_STAGES = ("stage1", "trajectory_pca", "stage2", "control", "comparison")
LAYERS = ("raw", "intermediate", "primary", "model_input", "models", "model_output", "reporting")
BASELINE_TASKS = {
    "data.build_manifest",
    "baseline.build_network",
    "baseline.train",
    "baseline.evaluate",
    "baseline.export_model",
}


@pytest.fixture(scope="module", autouse=True)
def chromium_installed() -> None:
    """Fails in CI (``CI`` set) and skips elsewhere, before any work, when Chromium or its WebDriver is missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        reason = f"{', '.join(missing)} not installed: run scripts/setup.sh (Debian chromium, chromium-driver)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)


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
def browser() -> Iterator[webdriver.Chrome]:
    """Headless Debian Chromium driven by Debian's chromedriver, quit after the test."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    driver.set_script_timeout(PAGE_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def before_each_page(driver: webdriver.Chrome, script: str) -> None:
    """Run ``script`` in every page before the page's own scripts (to preset its localStorage)."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": script})


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}_failed.png").unlink(missing_ok=True)  # from an earlier run, no longer true
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")
    return path


def wait_for(driver: webdriver.Chrome, condition: Callable, name: str, what: str):
    """``condition``'s first truthy value within PAGE_TIMEOUT_S; on timeout a ``<name>_failed`` screenshot, a fail."""
    try:
        # an element read while the page re-renders goes stale: the condition is asked again
        wait = WebDriverWait(
            driver, PAGE_TIMEOUT_S, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,)
        )
        return wait.until(condition)
    except TimeoutException:
        path = screenshot(driver, f"{name}_failed")
        body = driver.find_element(By.TAG_NAME, "body").text
        pytest.fail(f"{what} not shown within {PAGE_TIMEOUT_S} s at {driver.current_url} ({path}); page text:\n{body}")


def settled_screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """A screenshot once the page's animations (fade-ins, drawn lines) have finished; looping ones (kedro-viz's
    pulsing markers) never do and are not waited for."""
    still = "a => a.playState !== 'running' || a.effect.getComputedTiming().iterations === Infinity"
    wait_for(
        driver,
        lambda d: d.execute_script(f"return document.getAnimations().every({still})"),
        name,
        "a still page",
    )
    return screenshot(driver, name)


@contextlib.contextmanager
def static_site(folder: Path) -> Iterator[str]:
    """``folder`` served over HTTP on a free localhost port; yields the base URL."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def mlflow_ui(filled_project, tmp_path) -> Iterator[str]:
    """The MLflow UI over the tiny baseline run's store."""
    with mlflow_server(filled_project / "mlflow.db", tmp_path / "mlflow_server.log") as url:
        yield url


def test_kedro_viz_site_shows_the_pipeline(viz_site, browser):
    graph = json.loads((viz_site / "build" / "api" / "main").read_text())
    # the site opens on __default__ with parameters hidden; with every modular pipeline expanded, every other
    # node of that pipeline is drawn (a task node by the last part of its name, ``train``)
    pipeline_nodes = [n for n in graph["nodes"] if "__default__" in n.get("pipelines", [])]
    expected = {(n["name"], n["type"]) for n in pipeline_nodes if n["type"] in ("task", "data")}
    assert BASELINE_TASKS <= {n["full_name"] for n in pipeline_nodes if n["type"] == "task"}
    # a first visit, nothing in the browser's storage: the site itself keeps kedro-viz's feature tour off the graph
    with static_site(viz_site / "build") as url:
        browser.get(f"{url}/?expandAllPipelines=true")
        wait_for(
            browser,
            lambda d: len(d.find_elements(By.CSS_SELECTOR, FLOWCHART_NODES)) >= len(expected),
            "kedro_viz",
            f"{len(expected)} flowchart nodes",
        )
        settled_screenshot(browser, "kedro_viz")
        nodes = browser.find_elements(By.CSS_SELECTOR, FLOWCHART_NODES)
        shown = {(n.get_attribute("data-node-fullname"), n.get_attribute("data-node-type")) for n in nodes}
        # every pipeline expanded is wider than the window at readable labels: the right part is a drag away, out of
        # view, where selenium's .text reads nothing; the drawn text elements carry the names all the same
        labels = {t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, LABELS)}
        tour = browser.find_elements(By.CSS_SELECTOR, ".feature-hints")
    assert shown == expected
    assert {name for name, _ in expected} <= labels  # the names are drawn, not only carried as attributes
    assert tour == []  # no "Workflow run status, 1 of 6" over the graph


def drawn(driver: webdriver.Chrome, kind: str) -> set[str]:
    """The ``data-node-fullname`` of every flowchart node of type ``kind`` (task, data, modularPipeline)."""
    nodes = driver.find_elements(By.CSS_SELECTOR, f"{FLOWCHART_NODES}[data-node-type='{kind}']")
    return {node.get_attribute("data-node-fullname") for node in nodes}


def click_node(driver: webdriver.Chrome, full_name: str) -> None:
    """Click the flowchart node ``full_name`` (a collapsed modular pipeline expands)."""
    driver.find_element(By.CSS_SELECTOR, f"{FLOWCHART_NODES}[data-node-fullname='{full_name}']").click()


def test_kedro_viz_shows_dim_reduce_stages_collapsed_with_layers(viz_site, browser):
    graph = json.loads((viz_site / "build" / "api" / "pipelines" / "dim_reduce").read_text())
    (stage2_train,) = [n["id"] for n in graph["nodes"] if n.get("full_name") == "dim_reduce.stage2.train_stage2"]
    stages = {f"dim_reduce.{stage}" for stage in DIM_REDUCE_STAGES}
    # the layer bands turned on, as the toolbar's layers button stores it (the page script leaves them off at first)
    before_each_page(
        browser, "localStorage.setItem('KedroViz', JSON.stringify({showFeatureHints: false, layer: {visible: true}}));"
    )
    with static_site(viz_site / "build") as url:
        browser.get(f"{url}/?pid=dim_reduce")
        # every namespace starts collapsed: the data pipeline and dim_reduce are one box each, no task is drawn
        wait_for(
            browser,
            lambda d: drawn(d, "modularPipeline") == {"data", "dim_reduce"},
            "kedro_viz_dim_reduce",
            "the data and dim_reduce boxes",
        )
        settled_screenshot(browser, "kedro_viz_dim_reduce")
        assert drawn(browser, "task") == set()

        click_node(browser, "dim_reduce")
        wait_for(
            browser,
            lambda d: drawn(d, "modularPipeline") == {"data", *stages},
            "kedro_viz_dim_reduce_stages",
            "the stages",
        )
        settled_screenshot(browser, "kedro_viz_dim_reduce_stages")
        assert drawn(browser, "task") == set()  # the stages are collapsed too
        # the catalog's layers: the layers button is on and the bands are drawn, named in the layers' order
        layers_button = browser.find_element(By.CSS_SELECTOR, "button.pipeline-menu-button--layers")
        assert layers_button.is_enabled() and "pipeline-icon-toolbar__button--active" in layers_button.get_attribute(
            "class"
        )
        names = [li.text for li in browser.find_elements(By.CSS_SELECTOR, LAYER_NAMES)]
        assert {"intermediate", "models", "reporting"} <= set(names)
        assert names == sorted(names, key=LAYERS.index)
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.pipeline-flowchart__layers rect.pipeline-layer")) == len(
            names
        )

        click_node(browser, "dim_reduce.stage2")
        stage2 = f"{FLOWCHART_NODES}[data-id='{stage2_train}']"
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, stage2), "kedro_viz_stage2_expanded", "stage 2")
        settled_screenshot(browser, "kedro_viz_stage2_expanded")
        assert drawn(browser, "modularPipeline") == {"data", *stages} - {"dim_reduce.stage2"}
        # labelled by the last part of their names: stage 2's training tells itself from the control's
        assert drawn(browser, "task") == {"train_stage2", "evaluate", "export_model"}


# Each node label's drawn size (its font size times the zoom), the zoom the page script asked for and the one drawn
# (kedro-viz keeps a small graph at its own larger fit), the left edge of the chart (right of the toolbar and sidebar),
# the labels' extent, the graph's extent (its nodes and edges, not the layer bands, which span the chart), the
# window's size, the minimap's right edge and its button's state.
VIZ_VIEW = """
const labels = [...document.querySelectorAll(arguments[0])];
const zoomed = document.querySelector('svg.pipeline-flowchart__graph[data-page-script-zoom]');
const drawn = labels.map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
const boxes = labels.map(t => t.getBoundingClientRect());
const graph = [...document.querySelectorAll('g.pipeline-flowchart__nodes, g.pipeline-flowchart__edges')]
  .map(g => g.getBoundingClientRect());
const minimap = document.querySelector('.pipeline-minimap-container').getBoundingClientRect();
return {
  labels: zoomed ? labels.length : 0,
  zoom_asked: zoomed ? parseFloat(zoomed.getAttribute('data-page-script-zoom')) : null,
  zoom_drawn: labels.length ? labels[0].getScreenCTM().a : null,
  smallest_px: Math.min(...drawn),
  smallest_box_px: Math.min(...boxes.map(b => b.height)),
  chart_left: document.querySelector('.pipeline-sidebar').getBoundingClientRect().right,
  left: Math.min(...boxes.map(b => b.left)), top: Math.min(...boxes.map(b => b.top)),
  bottom: Math.max(...boxes.map(b => b.bottom)), height: window.innerHeight,
  graph_left: Math.min(...graph.map(b => b.left)), graph_right: Math.max(...graph.map(b => b.right)),
  width: window.innerWidth,
  minimap_right: minimap.right,
  minimap_button: document.querySelector('.pipeline-minimap-button--map').getAttribute('aria-label'),
};
"""


def readable_view(driver: webdriver.Chrome, name: str) -> dict:
    """The opened pipeline's ``VIZ_VIEW`` once the page script has zoomed (after kedro-viz's own fit, which it
    marks on the graph) and the labels are drawn at ``viz_page.LABEL_PX`` or more, measured again when the page is
    still (the zoom drawn); fails with a screenshot if the labels never are that size."""

    def measured(d):
        view = d.execute_script(VIZ_VIEW, LABELS)
        return view if view["labels"] and view["smallest_px"] >= LABEL_PX else None

    wait_for(driver, measured, name, f"labels of {LABEL_PX} px or more")
    settled_screenshot(driver, name)
    view = driver.execute_script(VIZ_VIEW, LABELS)
    print(
        f"{name}: zoom {view['zoom_drawn']:.3f}, labels {view['smallest_px']:.2f} px, graph x {view['graph_left']:.0f}"
        f"-{view['graph_right']:.0f} in {view['chart_left']}-{view['width']} px"
    )
    return view


def fits_the_width(view: dict) -> bool:
    """The whole graph (nodes and edges) between the toolbar and the window's right edge: nothing cut off."""
    return view["chart_left"] <= view["graph_left"] and view["graph_right"] <= view["width"]


def test_kedro_viz_opens_every_pipeline_readable_without_the_minimap(viz_site, browser):
    pipelines = sorted(path.name for path in (viz_site / "build" / "api" / "pipelines").iterdir())
    assert "dim_reduce" in pipelines
    with static_site(viz_site / "build") as url:
        # a first visit (a fresh profile, nothing stored) in the window widths people use: before the page script,
        # dim_reduce opened at 38 % (labels 5 px), under the minimap, its rightmost label cut off; with the layer
        # bands drawn, at labels of 10 px its right edge was still 58 px past the window at 1440 px, 218 px at 1280
        for width in (1280, 1440):
            browser.set_window_size(width, 900)
            browser.get(f"{url}/?pid=dim_reduce")
            view = readable_view(browser, f"kedro_viz_readable_dim_reduce_{width}")
            assert view["smallest_box_px"] >= LABEL_PX, view
            assert view["minimap_button"] == "Turn minimap on", view  # kedro-viz's own state: off
            assert view["minimap_right"] <= view["chart_left"], view  # moved out, under the toolbar
            assert fits_the_width(view), view
            assert 0 <= view["top"] and view["bottom"] <= view["height"], view
        stored = json.loads(browser.execute_script("return localStorage.getItem('KedroViz')"))
        assert stored["orientation"] == "horizontal" and stored["visible"]["miniMap"] is False
        assert stored["layer"]["visible"] is False
        for pipeline in pipelines:  # every registered pipeline opens readable and whole in width at 1440 px
            browser.get(f"{url}/?pid={pipeline}")
            view = readable_view(browser, f"kedro_viz_readable_{pipeline}")
            assert fits_the_width(view), (pipeline, view)
        # a choice the user made stays: the minimap turned on is on at the next visit
        browser.execute_script(
            "const s = JSON.parse(localStorage.getItem('KedroViz')); s.visible.miniMap = true;"
            "localStorage.setItem('KedroViz', JSON.stringify(s));"
        )
        browser.get(f"{url}/?pid=dim_reduce")
        assert readable_view(browser, "kedro_viz_readable_minimap_kept")["minimap_button"] == "Turn minimap off"


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
    """The classic run views (not the GenAI ones a new experiment opens on), without the assistant panel."""
    before_each_page(driver, "localStorage.setItem('mlflow.workflowType_v1', JSON.stringify('machine_learning'));")
    no_assistant_panel(driver)


def no_assistant_panel(driver: webdriver.Chrome) -> None:
    """No MLflow Assistant panel over the page (it opens by itself on a browser's first visit)."""
    before_each_page(
        driver,
        "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
        "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');",
    )


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
    no_assistant_panel(driver)
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


def test_the_runs_table_link_shows_the_headline_columns_best_first(study_project, study_ui, browser):
    _, table = printed_links((study_project / RUN_OUTPUT).read_text())
    no_assistant_panel(browser)
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
    no_assistant_panel(browser)
    browser.get(f"{study_ui}/#/experiments/{experiment}")
    rows = ".ag-pinned-left-cols-container .ag-row"
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{rows} button"), "mlflow_bare", "rows")
    settled_screenshot(browser, "mlflow_bare_experiment")
    on_table = genai_elements(browser)

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
