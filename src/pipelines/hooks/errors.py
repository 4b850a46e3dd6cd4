"""``NodeErrorHooks``: a failing node's name goes with its error, for the ``Error:`` block of ``pipelines.cli``."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl

from pipelines.failures import NODE_NOTE


class NodeErrorHooks:
    """Adds the failing node's name to its error as a note (``pipelines.failures.NODE_NOTE``)."""

    @hook_impl
    def on_node_error(self, error: Exception, node) -> None:
        error.add_note(NODE_NOTE + node.name)
