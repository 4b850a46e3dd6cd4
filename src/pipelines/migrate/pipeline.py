"""``migrate`` pipeline: convert -> parity checks (report saved and logged) -> fail unless at parity."""

from kedro.pipeline import Pipeline, node, pipeline

from .nodes import check_migration_parity, convert_torch_weights, require_migration_parity


def create_pipeline(**kwargs) -> Pipeline:
    return pipeline(
        [
            node(
                convert_torch_weights,
                ["params:migrate", "params:runtime"],
                "migrated_checkpoint",
                name="convert_torch_weights",
            ),
            node(
                check_migration_parity,
                ["migrated_checkpoint", "params:migrate", "params:runtime"],
                ["migrate_parity_report", "migrate_parity_tensors"],
                name="check_migration_parity",
            ),
            node(require_migration_parity, "migrate_parity_report", None, name="require_migration_parity"),
        ]
    )
