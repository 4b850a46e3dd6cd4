"""Shared fixtures.

``pipelines`` is imported first on purpose: its ``__init__`` sets ``ONEDNN_MAX_CPU_ISA`` (and
``GLOG_v``), which only take effect if they are in the environment before MindSpore loads.
"""

from __future__ import annotations

# isort: off
import pipelines  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA: must come before any mindspore import)

# isort: on
import pytest
from helpers import write_image_tree


@pytest.fixture(scope="session", autouse=True)
def mindspore_cpu():
    """CPU device, GRAPH mode, seed 0 for the whole session (what the pipelines use by default).

    ``configure_mindspore`` may be called again later in the same process (``ms.set_device``
    accepts a repeated call, also after networks have run), so tests or nodes that configure
    MindSpore themselves do not clash with this fixture.
    """
    from pipelines.engine.runtime import configure_mindspore

    configure_mindspore("CPU", "graph", 0)
    import mindspore as ms

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
    """A project whose MLflow store holds real baseline and thor runs (tests/report_store.py); filled once."""
    from report_store import fill_store

    return fill_store(tmp_path_factory.mktemp("recipe_store"))
