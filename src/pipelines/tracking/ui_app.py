"""MLflow app plugins (``mlflow ui --app-name …``, ``mlflow server --app-name …``) that open MLflow 3's UI in its
model-training view on every page, alone (``model-training``) or behind MLflow's own login (``model-training-auth``,
MLflow's ``basic-auth`` plus the same view: only one ``--app-name`` can be given).

Why a plugin: MLflow 3.17-3.18's UI reads its view (GenAI or model training) only from the URL's ``workflowType``
and from the browser's localStorage key ``mlflow.workflowType_v1``, whose built-in default is GenAI; its Compare
button, run links and breadcrumbs drop the URL parameter. The plugin serves the UI's ``index.html`` with a short
script at the top of ``<head>`` that, when the key is unset, sets it to the JSON string ``"machine_learning"`` (the
UI parses the value as JSON: a bare string falls back to GenAI). A user who picks GenAI keeps that choice. The same
script closes MLflow's Assistant (Beta) panel on a first visit: MLflow opens it by itself on a browser's first visit to
a server on localhost, where it took 360 of 1,440 px and narrowed the compare link's chart tiles to 150 px with their
titles cut; the script sets ``mlflow.assistant.panelOpen_v1`` to ``false`` (and MLflow's record that it auto-opened
the panel) only when that key is unset, so a user who opens the panel keeps it open.
tests/ui/test_browser.py clicks through Compare, a run page and the breadcrumb from a fresh browser profile, with no
Assistant panel on any page, then opens the panel and finds it open on the next page, so an MLflow upgrade that
changes a key or its parsing fails there.
"""

from __future__ import annotations

from flask import Flask, Response, request

WORKFLOW_KEY = "mlflow.workflowType_v1"
MODEL_TRAINING = "machine_learning"
# MLflow's Assistant (Beta): its panel, a quarter of the window, opens by itself on a browser's first visit to a
# server on localhost (MLflow then records that it did, the second key) and stays as the user leaves it (the first).
ASSISTANT_PANEL_KEY = "mlflow.assistant.panelOpen_v1"
ASSISTANT_AUTO_OPENED_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
VIEW_SCRIPT = (
    "<script>try{var s=window.localStorage;"
    f"if(s.getItem('{WORKFLOW_KEY}')===null){{s.setItem('{WORKFLOW_KEY}',JSON.stringify('{MODEL_TRAINING}'))}}"
    f"if(s.getItem('{ASSISTANT_PANEL_KEY}')===null)"
    f"{{s.setItem('{ASSISTANT_PANEL_KEY}','false');s.setItem('{ASSISTANT_AUTO_OPENED_KEY}','true')}}"
    "}catch(e){}</script>"
)


def with_view_script(response: Response) -> Response:
    """The UI's page (any HTML answer of the server: ``/``, ``/static-files/``, a ``--static-prefix`` path) with
    ``VIEW_SCRIPT`` first in its ``<head>``; every other answer as it is."""
    if request.method != "GET" or response.status_code != 200 or response.mimetype != "text/html":
        return response
    response.direct_passthrough = False  # send_from_directory streams the file: read it to edit it
    page = response.get_data(as_text=True)
    if "<head>" in page and VIEW_SCRIPT not in page:
        response.set_data(page.replace("<head>", "<head>" + VIEW_SCRIPT, 1))
        response.headers.pop("ETag", None)  # the file's tag no longer names this body
    return response


def _served(app: Flask):
    """``app`` as ``mlflow server`` runs it: inside MLflow's FastAPI app under uvicorn (its default), else as is."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME

    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app


def model_training_view():
    """``--app-name model-training``: MLflow's tracking server, its UI opening in the model-training view."""
    from mlflow.server import app

    app.after_request(with_view_script)
    return _served(app)


def model_training_view_with_login():
    """``--app-name model-training-auth``: MLflow's ``basic-auth`` app (users, passwords, permissions; the same
    configuration, ``MLFLOW_AUTH_CONFIG_PATH`` and ``MLFLOW_FLASK_SERVER_SECRET_KEY``) with the model-training view.

    ``mlflow server`` bootstraps the admin user before its workers only for the app named ``basic-auth``; here
    MLflow's ``create_app`` does it in each worker (the admin user is created only where missing)."""
    from mlflow.server import app
    from mlflow.server.auth import create_app

    app.after_request(with_view_script)
    return create_app(app)
