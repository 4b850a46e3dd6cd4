"""Real-browser checks of the ``kedro viz build`` site, opened in headless Chromium (``tests/ui/conftest.py``): the
pipeline drawn, dim_reduce's stages collapsed with layers, every pipeline readable."""

from __future__ import annotations

import json

from selenium import webdriver
from selenium.webdriver.common.by import By

from pipelines.viz_page import LABEL_PX
from tests.support.browser import (
    before_each_page,
    settled_screenshot,
    static_site,
    wait_for,
)

# The baseline pipeline's task nodes, named here so that the check cannot pass on an empty graph.
FLOWCHART_NODES = "svg g.pipeline-node[data-node-fullname]"
LABELS = "svg g.pipeline-node text"
LAYER_NAMES = ".pipeline-flowchart__layer-names--visible .pipeline-layer-name"
DIM_REDUCE_STAGES = ("stage1", "trajectory_pca", "stage2", "control", "comparison")
OPENED = {"data", *(f"dim_reduce.{stage}" for stage in DIM_REDUCE_STAGES)}  # the boxes once dim_reduce is opened
STAGE2_TASKS = {"train_stage2", "evaluate", "export_model"}  # labelled by the last part of their names
LAYERS = ("raw", "intermediate", "primary", "model_input", "models", "model_output", "reporting")
BASELINE_TASKS = {
    "data.build_manifest",
    "baseline.build_network",
    "baseline.train",
    "baseline.evaluate",
    "baseline.export_model",
}


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
    """Click the flowchart node ``full_name`` (a collapsed modular pipeline expands), where it is drawn: in view, or
    a drag away (``dim_reduce.stage2`` once dim_reduce is opened at readable labels), where selenium cannot click."""
    node = driver.find_element(By.CSS_SELECTOR, f"{FLOWCHART_NODES}[data-node-fullname='{full_name}']")
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", node)


def test_kedro_viz_shows_dim_reduce_stages_collapsed_with_layers(viz_site, browser):
    graph = json.loads((viz_site / "build" / "api" / "pipelines" / "dim_reduce").read_text())
    (stage2_train,) = [n["id"] for n in graph["nodes"] if n.get("full_name") == "dim_reduce.stage2.train_stage2"]
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
            lambda d: drawn(d, "modularPipeline") == OPENED,
            "kedro_viz_dim_reduce_stages",
            "the stages",
        )
        settled_screenshot(browser, "kedro_viz_dim_reduce_stages")
        assert drawn(browser, "task") == set()  # the stages are collapsed too
        # the catalog's layers: the layers button is on and the bands are drawn, named in the layers' order (each
        # name read whether in view or a drag away: the stages opened at readable labels are wider than the window)
        layers_button = browser.find_element(By.CSS_SELECTOR, "button.pipeline-menu-button--layers")
        assert layers_button.is_enabled() and "pipeline-icon-toolbar__button--active" in layers_button.get_attribute(
            "class"
        )
        names = [li.get_attribute("textContent").strip() for li in browser.find_elements(By.CSS_SELECTOR, LAYER_NAMES)]
        assert {"intermediate", "models", "reporting"} <= set(names)
        assert names == sorted(names, key=LAYERS.index)
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.pipeline-flowchart__layers rect.pipeline-layer")) == len(
            names
        )

        click_node(browser, "dim_reduce.stage2")
        stage2 = f"{FLOWCHART_NODES}[data-id='{stage2_train}']"
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, stage2), "kedro_viz_stage2_expanded", "stage 2")
        # the stage 2 box fades out (a d3 transition) as its nodes come in
        boxes = OPENED - {"dim_reduce.stage2"}
        wait_for(browser, lambda d: drawn(d, "modularPipeline") == boxes, "kedro_viz_stage2_box", "no stage 2 box")
        settled_screenshot(browser, "kedro_viz_stage2_expanded")
        # labelled by the last part of their names: stage 2's training tells itself from the control's
        assert drawn(browser, "task") == STAGE2_TASKS


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
const focus = zoomed ? (zoomed.getAttribute('data-page-script-focus') || '').split(',').filter(Boolean) : [];
const opened = [...document.querySelectorAll('svg g.pipeline-node[data-id]')]
  .filter(n => !focus.length || focus.includes(n.getAttribute('data-id'))).map(n => n.getBoundingClientRect());
return {
  labels: zoomed ? labels.length : 0,
  zooms: zoomed ? parseInt(zoomed.getAttribute('data-page-script-zooms'), 10) : 0,
  focus: focus.length,
  opened_left: Math.min(...opened.map(b => b.left)), opened_right: Math.max(...opened.map(b => b.right)),
  opened_top: Math.min(...opened.map(b => b.top)), opened_bottom: Math.max(...opened.map(b => b.bottom)),
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


def readable_view(driver: webdriver.Chrome, name: str, after: int = 0) -> dict:
    """The opened pipeline's ``VIZ_VIEW`` once the page script has zoomed (after kedro-viz's own fit, which it
    marks on the graph; more than ``after`` times) and the labels are drawn at ``viz_page.LABEL_PX`` or more,
    measured again when the page is still (the zoom drawn); fails with a screenshot if the labels never are that
    size."""

    def measured(d):
        view = d.execute_script(VIZ_VIEW, LABELS)
        return view if view["labels"] and view["zooms"] > after and view["smallest_px"] >= LABEL_PX else None

    wait_for(driver, measured, name, f"labels of {LABEL_PX} px or more")
    settled_screenshot(driver, name)
    view = driver.execute_script(VIZ_VIEW, LABELS)
    print(
        f"{name}: zoom {view['zoom_drawn']:.3f}, labels {view['smallest_px']:.2f} px, graph x {view['graph_left']:.0f}"
        f"-{view['graph_right']:.0f} in {view['chart_left']}-{view['width']} px; zoomed to {view['focus'] or 'all'}"
        f" nodes: x {view['opened_left']:.0f}-{view['opened_right']:.0f}, y {view['opened_top']:.0f}"
        f"-{view['opened_bottom']:.0f} in 0-{view['height']} px"
    )
    return view


def opened_in_view(view: dict) -> bool:
    """The nodes the page script zoomed to (those a click opened, else the whole graph) inside the chart."""
    inside_x = view["chart_left"] <= view["opened_left"] and view["opened_right"] <= view["width"]
    return inside_x and 0 <= view["opened_top"] and view["opened_bottom"] <= view["height"]


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
            # a box opened (dim_reduce, then its stage 2): kedro-viz's own fit drew dim_reduce's at 34 % (labels of
            # 5 px) and stage 2's at 29 %; the page script zooms to what the click opened, at labels of 10 px or more
            click_node(browser, "dim_reduce")
            wait_for(browser, lambda d: drawn(d, "modularPipeline") == OPENED, "kedro_viz_opened", "the stages")
            view = readable_view(browser, f"kedro_viz_opened_dim_reduce_{width}", after=view["zooms"])
            assert view["smallest_box_px"] >= LABEL_PX and view["focus"], view
            # its 11 opened nodes are 2,067 px wide at labels of 10 px: they start in view, the rest a drag away
            assert view["chart_left"] <= view["opened_left"] < view["width"], view
            assert 0 <= view["opened_top"] and view["opened_bottom"] <= view["height"], view
            click_node(browser, "dim_reduce.stage2")
            wait_for(browser, lambda d: drawn(d, "task") == STAGE2_TASKS, "kedro_viz_opened_stage2", "stage 2's tasks")
            view = readable_view(browser, f"kedro_viz_opened_stage2_{width}", after=view["zooms"])
            assert view["smallest_box_px"] >= LABEL_PX and view["focus"] and opened_in_view(view), view
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
