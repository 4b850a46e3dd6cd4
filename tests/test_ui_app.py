"""The MLflow app plugin's page edit (``pipelines.tracking.ui_app``): the UI's ``index.html``, served from a file as
MLflow serves it, gets the model-training view's script first in its head, once; other answers are untouched. The
browser test (tests/ui/test_browser.py) checks what the script does in MLflow's real UI."""

from __future__ import annotations

from flask import Flask, jsonify, send_from_directory

from pipelines.tracking.ui_app import (
    ASSISTANT_AUTO_OPENED_KEY,
    ASSISTANT_PANEL_KEY,
    VIEW_SCRIPT,
    WORKFLOW_KEY,
    with_view_script,
)

PAGE = "<!doctype html><html><head><meta charset='utf-8'/></head><body><div id='root'></div></body></html>"


def served(tmp_path) -> Flask:
    (tmp_path / "index.html").write_text(PAGE)
    app = Flask(__name__)
    app.add_url_rule("/", "page", lambda: send_from_directory(tmp_path, "index.html"))
    app.add_url_rule("/api", "api", lambda: jsonify({"head": "<head>"}))
    app.after_request(with_view_script)
    return app


def test_the_page_gets_the_view_script_first_in_its_head_once(tmp_path):
    client = served(tmp_path).test_client()
    page = client.get("/").get_data(as_text=True)
    assert page.startswith("<!doctype html><html><head>" + VIEW_SCRIPT + "<meta")
    assert page.count(WORKFLOW_KEY) == 2 and page.count("<script>") == 1
    # it sets the key only where unset, to the JSON string the UI parses
    assert f"getItem('{WORKFLOW_KEY}')===null" in VIEW_SCRIPT and "JSON.stringify('machine_learning')" in VIEW_SCRIPT
    # and closes the Assistant panel where the browser has no choice stored, so that MLflow does not open it
    assert f"getItem('{ASSISTANT_PANEL_KEY}')===null){{s.setItem('{ASSISTANT_PANEL_KEY}','false');" in VIEW_SCRIPT
    assert f"s.setItem('{ASSISTANT_AUTO_OPENED_KEY}','true')" in VIEW_SCRIPT


def test_other_answers_are_left_as_they_are(tmp_path):
    client = served(tmp_path).test_client()
    assert client.get("/api").get_json() == {"head": "<head>"}
    assert client.head("/").get_data() == b""
