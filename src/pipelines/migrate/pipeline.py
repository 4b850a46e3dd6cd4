"""``migrate`` pipeline: convert -> parity checks (report saved and logged) -> fail unless at parity, the modular
pipeline ``migrate``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import check_migration_parity, convert_torch_weights, require_migration_parity


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``migrate.convert_torch_weights``, ``migrate.check_parity``, ``migrate.require_parity``."""
    return namespaced(
        pipeline(
            [
                node(
                    convert_torch_weights,
                    ["params:migrate", "params:runtime"],
                    "checkpoint",
                    name="convert_torch_weights",
                ),
                node(
                    check_migration_parity,
                    ["checkpoint", "params:migrate", "params:runtime"],
                    ["parity_report", "parity_tensors"],
                    name="check_parity",
                ),
                node(require_migration_parity, "parity_report", None, name="require_parity"),
            ]
        ),
        "migrate",
    )
