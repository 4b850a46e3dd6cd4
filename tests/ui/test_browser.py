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
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.projects import PROJECT, run_on_tiny_tree
from tests.support.servers import mlflow_server
from tests.support.stores import REPORT_OUTPUT, store_report, tracking_uri

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = PROJECT / "test-artifacts" / "browser"
PAGE_TIMEOUT_S = 90  # a page's scripts, on 2 shared cores
# The baseline pipeline's task nodes, named here so that the check cannot pass on an empty graph.
FLOWCHART_NODES = "svg g.pipeline-node[data-node-fullname]"
LAYER_NAMES = ".pipeline-flowchart__layer-names--visible .pipeline-layer-name"
DIM_REDUCE_STAGES = ("stage1", "trajectory_pca", "stage2", "control", "comparison")
LAYERS = ("raw", "intermediate", "primary", "model_input", "models", "model_output", "reporting")
BASELINE_TASKS = {
    "data.locate_image_tree",
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


@pytest.fixture(scope="module")
def filled_project(tmp_path_factory) -> Path:
    """A project whose ``mlflow.db`` holds one real baseline run."""
    project, _ = run_on_tiny_tree(tmp_path_factory.mktemp("browser"), "baseline", {"train": 4, "val": 2})
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
        return WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.5).until(condition)
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
    no_feature_tour(browser)
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
        labels = {t.text for t in browser.find_elements(By.CSS_SELECTOR, "svg g.pipeline-node text")}
    assert shown == expected
    assert {name for name, _ in expected} <= labels  # the names are drawn, not only carried as attributes


def no_feature_tour(driver: webdriver.Chrome) -> None:
    """No first-visit feature tour over the flowchart."""
    before_each_page(driver, "localStorage.setItem('KedroViz', JSON.stringify({showFeatureHints: false}));")


def drawn(driver: webdriver.Chrome, kind: str) -> set[str]:
    """The ``data-node-fullname`` of every flowchart node of type ``kind`` (task, data, modularPipeline)."""
    nodes = driver.find_elements(By.CSS_SELECTOR, f"{FLOWCHART_NODES}[data-node-type='{kind}']")
    return {node.get_attribute("data-node-fullname") for node in nodes}


def click_node(driver: webdriver.Chrome, full_name: str) -> None:
    """Click the flowchart node ``full_name`` (a collapsed modular pipeline expands)."""
    driver.find_element(By.CSS_SELECTOR, f"{FLOWCHART_NODES}[data-node-fullname='{full_name}']").click()


def test_kedro_viz_shows_dim_reduce_stages_collapsed_with_layers(viz_site, browser):
    graph = json.loads((viz_site / "build" / "api" / "pipelines" / "dim_reduce").read_text())
    (stage2_train,) = [n["id"] for n in graph["nodes"] if n.get("full_name") == "dim_reduce.stage2.train"]
    stages = {f"dim_reduce.{stage}" for stage in DIM_REDUCE_STAGES}
    no_feature_tour(browser)
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
        assert drawn(browser, "task") == {"train", "evaluate", "export_model"}  # dim_reduce.stage2.train, …: last parts


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
    screenshot(browser, "mlflow_experiment")
    assert run.info.run_name == "baseline"
    assert run.info.run_name in {link.text for link in links}
    assert "resnet-recipes" in browser.find_element(By.TAG_NAME, "body").text

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


def test_the_printed_link_opens_one_val_top1_chart_with_every_compared_run(recipe_store, browser):
    """The report's ``kedro run`` ends with a link to the comparison; opened as it is, with no click, it shows one
    val/top1 chart with a line for each run the report compared, at the tracking server's address."""
    server = tracking_uri(recipe_store)
    output = (recipe_store / REPORT_OUTPUT).read_text()
    (link,) = re.findall(r"MLflow: compare the runs at (\S+)", output)
    assert link.startswith(f"{server}/#/metric?") and "workflowType=machine_learning" in link
    client = mlflow.MlflowClient(server)
    report = store_report(recipe_store)
    compared = [client.get_run(run_id) for run_id in report.data.tags["compared_runs"].split(",")]
    expected = {f"{run.info.run_name} (val/top1)" for run in compared if "val/top1" in run.data.metrics}
    assert len(expected) == 6  # baseline, thor, adasum, dim_reduce's stage 1, stage 2 and control
    no_assistant_panel(browser)
    browser.get(link)

    def legend(driver) -> set[str] | None:
        # MLflow 3 draws the chart's legend as HTML beside the plotly SVG: one "<run> (val/top1)" line per run
        lines = driver.execute_script("return document.body.innerText").splitlines()
        found = {line.strip() for line in lines if line.strip().endswith("(val/top1)")}
        return found if found >= expected else None

    shown = wait_for(browser, legend, "mlflow_compare_top1", f"a val/top1 chart with {sorted(expected)}")
    settled_screenshot(browser, "mlflow_compare_top1")
    assert shown == expected
    assert len(browser.find_elements(By.CSS_SELECTOR, "div.js-plotly-plot")) == 1  # one chart
    assert "Model training" in browser.find_element(By.TAG_NAME, "body").text  # not the GenAI pages
