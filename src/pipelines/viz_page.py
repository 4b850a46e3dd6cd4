"""The script this project puts first in kedro-viz's page (the page ``kedro viz run`` serves and the one ``kedro viz
build`` writes; ``cli.quiet_start`` installs it): a first visit opens every pipeline readable.

kedro-viz 12.5 keeps its view preferences in the browser's localStorage key ``KedroViz`` (``orientation``,
``visible.miniMap``, ``visible.sidebar``, ``showFeatureHints``, ``expandAllPipelines``, …: its store writes them on
every change and merges them over its defaults when the page loads) and no zoom: it fits the whole graph into the
window, so dim_reduce opened at 38 % (labels of 14 px drawn 5 px high), the minimap covered its lower-left nodes and
its rightmost label was cut off. The script

- sets the preferences the user has not set yet: no first-visit feature tour, the graph laid out left to right
  (``orientation: horizontal``: dim_reduce's nine reporting datasets then stack in one column instead of a row 2,600
  px wide), the catalog's layer bands off (``layer.visible``: drawn, they put each layer in columns of its own, and
  dim_reduce at labels of 10 px was 58 px wider than a 1440 px window, 218 px at 1280; without them it fits at 11
  px; the toolbar's layers button draws them), the minimap and the sidebar closed (the graph gets the window's
  width; the toolbar's first button opens the sidebar); a choice the user made, kept by kedro-viz in the same key,
  stays;
- zooms each pipeline as it opens (on load, or another pipeline chosen) to the whole graph fitted to the width left
  by the sidebar, measured on the drawn labels, but never below ``LABEL_PX`` for the labels: a graph wider than
  that would start at its left edge (its first nodes), the rest a drag away (none is at 1280 and 1440 px with the
  layer bands off);
- zooms again when a box of the open pipeline is expanded: kedro-viz's own fit drew dim_reduce's stages at 34 %
  (labels of 5 px) and stage 2's nodes at 29 %; the script fits the whole graph if it fits with labels of
  ``LABEL_PX``, else what the click opened (the nodes new to the graph, their box in kedro-viz's layout), never below
  ``LABEL_PX``, from its left edge when wider than the window (dim_reduce's 11 opened nodes are 2,067 px wide at 10
  px). A box collapsed is zoomed as a pipeline opened; the reset button keeps kedro-viz's own fit (the whole graph).
  It marks the graph with the nodes it zoomed to (``data-page-script-focus``) and a count of its zooms. kedro-viz has
  no zoom setting; the script reaches its Redux store through
  ``window.__REDUX_DEVTOOLS_EXTENSION_COMPOSE__``, the hook kedro-viz reads when it creates the store (the Redux
  DevTools extension's, which it keeps working when installed), and sends the zoom as kedro-viz's own minimap does
  (``UPDATE_ZOOM``).

tests/ui/test_viz_browser.py measures the drawn label height and the graph's width on dim_reduce and every pipeline,
the hidden minimap, and dim_reduce and its stage 2 opened at 1280 and 1440 px, so a kedro-viz upgrade that renames a
key or the store hook fails there.
"""

from __future__ import annotations

LABEL_PX = 10  # the smallest label height a pipeline opens with, in CSS pixels

PAGE_SCRIPT = (
    """<script>
(function () {
  var key = "KedroViz", state = {};
  try { state = JSON.parse(window.localStorage.getItem(key)) || {}; } catch (error) {}
  var visible = state.visible || {}, layer = state.layer || {};
  if (!("showFeatureHints" in state)) state.showFeatureHints = false;
  if (!("orientation" in state)) state.orientation = "horizontal";
  if (!("miniMap" in visible)) visible.miniMap = false;
  if (!("sidebar" in visible)) visible.sidebar = false;
  if (!("visible" in layer)) layer.visible = false;
  state.visible = visible;
  state.layer = layer;
  window.localStorage.setItem(key, JSON.stringify(state));

  var LABEL_PX = """
    + str(LABEL_PX)
    + """, MARGIN_PX = 16, FRAMES_TO_FIT = 120;
  var devtools = window.__REDUX_DEVTOOLS_EXTENSION_COMPOSE__;
  window.__REDUX_DEVTOOLS_EXTENSION_COMPOSE__ = function () {
    var enhancers = Array.prototype.slice.call(arguments);
    var enhance = devtools ? devtools.apply(null, enhancers) : function (create) {
      return enhancers.reduceRight(function (made, enhancer) { return enhancer(made); }, create);
    };
    return function (create) {
      return function () {
        var store = enhance(create).apply(null, arguments);
        zoomEachOpenedPipeline(store);
        return store;
      };
    };
  };

  // After kedro-viz has fitted a new layout (its zoom changed and no transition runs), once per pipeline opened and
  // again when the same nodes are laid out anew (labels measured, orientation, sidebar, window size).
  function zoomEachOpenedPipeline(store) {
    var seen = {}, zoomed = {}, pending = null;
    store.subscribe(function () {
      var now = store.getState(), nodes = now.graph.nodes || [];
      // by value: kedro-viz replaces the graph object when a node is clicked, with the same layout
      var view = {
        layout: nodes.map(function (node) { return [node.id, node.x, node.y].join(":"); }).join(),
        sidebar: now.visible.sidebar,
        size: [now.chartSize.width, now.chartSize.height].join(),
        pipeline: now.pipeline.active,
        nodes: nodes.map(function (node) { return node.id; }).sort().join(),
      };
      if (view.layout === seen.layout && view.sidebar === seen.sidebar && view.size === seen.size) return;
      seen = view;
      if (!nodes.length) {
        pending = null;
        return;
      }
      // a box of the same pipeline expanded: the nodes it opened into (none when one collapsed)
      var before = {}, opened = [];
      if (view.pipeline === zoomed.pipeline && view.nodes !== zoomed.nodes) {
        zoomed.nodes.split(",").forEach(function (id) { before[id] = true; });
        opened = nodes.filter(function (node) { return !before[node.id]; }).map(function (node) { return node.id; });
      }
      if (pending === null) window.requestAnimationFrame(settle);
      pending = {view: view, zoom: now.zoom, frames: 0, opened: opened};
    });
    function settle() {
      if (pending === null) return;
      var svg = document.querySelector("svg.pipeline-flowchart__graph"), wrapper = svg && svg.querySelector("g");
      var fitted = store.getState().zoom !== pending.zoom || ++pending.frames > FRAMES_TO_FIT;
      if (!wrapper || !fitted || wrapper.classList.contains("pipeline-flowchart__zoom-wrapper--animating")) {
        window.requestAnimationFrame(settle);
        return;
      }
      var opened = pending.opened;
      zoomed = pending.view;
      pending = null;
      zoomToRead(store, svg, opened);
    }
  }

  // The box of the graph's nodes ``ids`` in its own coordinates (kedro-viz's layout: a node's x and y are its centre)
  function boxOf(store, ids) {
    var wanted = {}, left = Infinity, top = Infinity, right = -Infinity, bottom = -Infinity;
    ids.forEach(function (id) { wanted[id] = true; });
    store.getState().graph.nodes.forEach(function (node) {
      if (!wanted[node.id]) return;
      left = Math.min(left, node.x - node.width / 2);
      right = Math.max(right, node.x + node.width / 2);
      top = Math.min(top, node.y - node.height / 2);
      bottom = Math.max(bottom, node.y + node.height / 2);
    });
    return right > left ? {x: left, y: top, width: right - left, height: bottom - top} : null;
  }

  function zoomToRead(store, svg, opened) {
    var nodes = svg.querySelector("g.pipeline-flowchart__nodes"), label = svg.querySelector("g.pipeline-node text");
    if (!nodes || !label) return;
    var box = nodes.getBBox(), font = parseFloat(window.getComputedStyle(label).fontSize);
    var sidebar = document.querySelector(".pipeline-sidebar");
    var left = sidebar ? sidebar.getBoundingClientRect().right - svg.getBoundingClientRect().left : 0;
    var width = svg.clientWidth - left - 2 * MARGIN_PX, height = svg.clientHeight - 2 * MARGIN_PX;
    // a thousandth above the floor: the label's drawn height is then LABEL_PX or more after rounding
    var floor = (1.001 * LABEL_PX) / font, part = opened.length ? boxOf(store, opened) : null;
    var focus = "";
    if (part && Math.min(width / box.width, height / box.height) < floor) {
      box = part;  // the whole graph unreadable in the window: what was opened, in view
      focus = opened.join(",");
    }
    var fit = Math.min(width / box.width, height / box.height);
    var scale = Math.min(Math.max(fit, floor), store.getState().zoom.maxScale || 2);
    svg.setAttribute("data-page-script-focus", focus);  // the nodes zoomed to (none: the whole graph)
    svg.setAttribute("data-page-script-zooms", 1 + (parseInt(svg.getAttribute("data-page-script-zooms"), 10) || 0));
    var x = left + MARGIN_PX + Math.max(0, (width - box.width * scale) / 2);
    var y = MARGIN_PX + Math.max(0, (height - box.height * scale) / 2);
    svg.setAttribute("data-page-script-zoom", scale);  // the zoom it asked for: tests/ui/test_browser.py waits on it
    // kedro-viz's zoom action centres the point (x / scale, y / scale) of the graph: the one that puts the box there
    store.dispatch({
      type: "UPDATE_ZOOM",
      zoom: {
        scale: scale,
        x: svg.clientWidth / 2 - (x - box.x * scale),
        y: svg.clientHeight / 2 - (y - box.y * scale),
        applied: false,
        transition: false,
        relative: false,
      },
    });
  }
})();
</script>
"""
)


def with_page_script(html: str) -> str:
    """kedro-viz's page ``html`` with ``PAGE_SCRIPT`` first in its head, before its own scripts."""
    return html.replace("<head>", "<head>\n" + PAGE_SCRIPT, 1) if PAGE_SCRIPT not in html else html
