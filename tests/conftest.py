"""Shared fixtures and the two tiers of the suite.

The fast tier (``bash scripts/test.sh``, plain ``pytest``) runs everything in-process: every library module and
every pipeline's nodes, each registered pipeline once through Kedro's ``SequentialRunner``. The slow tier
(``bash scripts/test.sh --all``, ``pytest --all``, and CI) adds the tests that start processes: real ``kedro run``
commands (``tests/e2e/``), msrun workers (``tests/distributed/``), Chromium and JupyterLab (``tests/ui/``).
Those folders, and any test marked ``slow``, are the slow tier; a module of theirs marked ``fast`` runs in-process
(the launcher's pure parts) and joins the fast tier.

``pipelines`` is imported first on purpose: its ``__init__`` sets ``ONEDNN_MAX_CPU_ISA`` (and
``GLOG_v``), which only take effect if they are in the environment before MindSpore loads.
"""

from __future__ import annotations

# isort: off
import pipelines  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA: must come before any mindspore import)

# isort: on
import gc
import os
import secrets
from pathlib import Path

import pytest

from tests.support.trees import write_image_tree

SLOW_FOLDERS = ("e2e", "distributed", "ui")
# The slow tier runs three tests at a time, grouped by ``xdist_group`` (``--dist loadgroup``): the tests of an
# expensive session set-up share the worker that builds it once, and so do the tests of a module-scoped set-up; the
# large_memory tests (11-13 GB each) share one group, so no two of them run together
SHARED_SETUPS = ("recipe_store", "viz_site", "postgres")
# The fast tier's modules of the longest tests (each 10-30 s: whole pipelines, a tuned study, P-BFGS's compiled steps,
# THOR's options), started first so that the two workers end together on short ones
LONGEST_FIRST = (
    "tests/pipelines/test_runs.py",
    "tests/study/test_tuning.py",
    "tests/optim/dim_reduce/test_pbfgs.py",
    "tests/optim/thor/test_options.py",
)


def setup_group(item: pytest.Item) -> str | None:
    """The one ``xdist_group`` of ``item`` (xdist joins several into a name of their own): ``large_memory`` for
    the tests taking 11 GB or more (one at a time), else the session set-up it reads, else its module when it reads
    a module-scoped fixture, else none."""
    if item.get_closest_marker("large_memory"):
        return "large_memory"
    names = getattr(item, "fixturenames", ())
    shared = [setup for setup in SHARED_SETUPS if setup in names]
    if shared:
        return shared[0]
    definitions = getattr(item, "_fixtureinfo", None)
    scopes = {defs[-1].scope for defs in definitions.name2fixturedefs.values() if defs} if definitions else set()
    return item.nodeid.split("::")[0] if "module" in scopes else None


def slow_order(group: str | None) -> int:
    """Where a test of ``group`` (``setup_group``) goes in the slow tier's order: large_memory, shared set-ups,
    module set-ups, the rest."""
    if group == "large_memory":
        return 0
    if group in SHARED_SETUPS:
        return 1
    return 2 if group is not None else 3


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", help="also run the slow tier (kedro run processes, msrun, browsers)")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks this adds
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    groups = {}
    for item in items:
        in_slow_folder = Path(item.fspath).relative_to(tests).parts[0] in SLOW_FOLDERS
        if in_slow_folder and not item.get_closest_marker("fast"):
            item.add_marker(pytest.mark.slow)
        groups[item.nodeid] = group = setup_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if config.getoption("--all") or config.getoption("-m"):
        # in this order to the two workers (scripts/test.sh: --no-loadscope-reorder): the large_memory group (about
        # 15 minutes on one worker), the long shared set-ups, the modules of one set-up (a minute or more each), then
        # the tests that stand alone, so that the session ends on short units (a module last, the browser's 2.5
        # minutes, left one worker idle that long at a79bc46)
        items.sort(key=lambda item: slow_order(groups[item.nodeid]))
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
    # the longest in-process tests first, so the workers end together on short ones instead of one of them
    # finishing a half-minute pipeline run alone
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in LONGEST_FIRST)


@pytest.fixture(scope="session", autouse=True)
def mindspore_cpu():
    """CPU device, GRAPH mode, seed 0 for the whole session (what the pipelines use by default).

    ``configure_mindspore`` may be called again later in the same process (``ms.set_device``
    accepts a repeated call, also after networks have run), so tests or nodes that configure
    MindSpore themselves do not clash with this fixture.
    """
    from trainlib.engine.runtime import configure_mindspore

    configure_mindspore("CPU", "graph", 0)
    import mindspore as ms

    # xdist's workers share the cores: MindSpore's CPU kernels get their share each (one thread a worker on 2 cores)
    # instead of a pool the size of the machine in every worker
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        ms.device_context.cpu.op_tuning.threads_num(max(1, (os.cpu_count() or 1) // workers))
    return ms


@pytest.fixture
def make_image_tree(tmp_path):
    """Factory: ``make_image_tree(name="data", **kwargs)`` writes a tree under ``tmp_path / name``.

    Keyword arguments are those of ``helpers.write_image_tree`` (classes, per_class, split_dirs,
    size, fmt, seed, noise); returns the tree's root.
    """

    def make(name: str = "data", **kwargs):
        return write_image_tree(tmp_path / name, **kwargs)

    return make


@pytest.fixture(scope="session")
def recipe_store(tmp_path_factory):
    """A project whose runs of every recipe (and a report) are on a local ``mlflow server``, as on a team's
    (``tests.support.stores``); the server runs until the session ends."""
    from tests.support.servers import mlflow_server
    from tests.support.stores import fill_store

    root = tmp_path_factory.mktemp("recipe_store")
    with mlflow_server(root / "server.db", root / "server.log", artifacts=root / "artifacts") as url:
        yield fill_store(root, url)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL server (``tests.support.postgres``), started once for every test that uses it."""
    from tests.support.postgres import postgres_server

    with postgres_server(tmp_path_factory.mktemp("postgres") / "server.log") as server:
        yield server


@pytest.fixture(scope="session")
def team_server(postgres, tmp_path_factory):
    """A team's MLflow server behind its login (``tests.support.servers.team_mlflow_server``) on the ``postgres``
    server, with a user ``alice`` beside the admin; started once for every test that uses it."""
    from tests.support.servers import TeamServer, team_mlflow_server

    folder = tmp_path_factory.mktemp("team_server")
    store_password, admin_password = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    postgres.add_user("mlflow", store_password, "mlflow")
    backend = postgres.url("mlflow", "mlflow", store_password, driver="postgresql+psycopg")
    with team_mlflow_server(backend, folder, admin_password) as url:
        yield TeamServer.with_user(url, ("admin", admin_password), "alice", secrets.token_urlsafe(12))


@pytest.fixture(scope="session")
def viz_site(tmp_path_factory):
    """A tiny project with its ``kedro viz build`` site in ``build/``, built once for every test that reads it."""
    from tests.support.projects import DIM_REDUCE_PARAMS, TINY_PARAMS, kedro, make_project

    root = tmp_path_factory.mktemp("viz")
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 4, "val": 2})
    params = {**TINY_PARAMS, **DIM_REDUCE_PARAMS, "data": {**TINY_PARAMS["data"], "root": str(tree)}}
    project = make_project(root / "project", params)
    result = kedro(project, "viz", "build", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return project


def pytest_collection_finish(session):
    """Every module the tests import is loaded now: move its objects out of the garbage collector's reach.
    MindSpore runs a full collection before compiling each graph (``graph/api.py``), a quarter of a second each in
    a process holding MindSpore, Kedro and MLflow; frozen objects are not scanned again."""
    gc.collect()
    gc.freeze()
