"""Nodes of the ``migrate`` pipeline: convert a PyTorch state_dict, check parity, refuse a failed migration."""

from __future__ import annotations

import logging

import pandas as pd

from pipelines.tracking import log_metrics
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.runtime import configure_mindspore
from trainlib.migrate.convert import check_parity, convert, load_state_dict, require_parity
from trainlib.params import MigrateParams, RuntimeParams

logger = logging.getLogger(__name__)


def convert_torch_weights(migrate: MigrateParams, runtime: RuntimeParams) -> Checkpoint:
    """Our ResNet's checkpoint from the ``.pth`` state_dict at ``migrate.state_dict``."""
    state_dict = load_state_dict(migrate.state_dict)
    configure_mindspore(runtime.device_target, runtime.mode, runtime.seed)
    checkpoint = convert(state_dict, migrate.architecture, migrate.num_classes, source=migrate.state_dict)
    logger.info(
        "Converted %d PyTorch tensors of %s into %d MindSpore parameters",
        len(state_dict),
        migrate.state_dict,
        len(checkpoint.params),
    )
    return checkpoint


def check_migration_parity(
    checkpoint: Checkpoint, migrate: MigrateParams, runtime: RuntimeParams
) -> tuple[dict, pd.DataFrame]:
    """Forward and single-step parity of the converted checkpoint against the PyTorch original.

    Logs the figures to MLflow (``migrate_forward_max_abs_diff``, ``migrate_step_*``,
    ``migrate_passed``); returns the report and the per-tensor table of the step.
    """
    state_dict = load_state_dict(migrate.state_dict)
    configure_mindspore(runtime.device_target, runtime.mode, runtime.seed)
    report, table = check_parity(state_dict, checkpoint, migrate.architecture, migrate.num_classes, migrate.parity)
    report["state_dict"] = migrate.state_dict
    forward, step = report["forward"], report["single_step"]
    log_metrics(
        {
            "migrate_forward_max_abs_diff": forward["max_abs_diff"],
            "migrate_step_loss_abs_diff": abs(step["loss_mindspore"] - step["loss_torch"]),
            **{f"migrate_step_{key}": step[key] for key in ("weight_max_abs_diff", "weight_max_rel_diff")},
            **{f"migrate_step_{key}": step[key] for key in ("update_max_rel_diff", "mindspore_update_error")},
            "migrate_step_torch_float32_update_error": step["torch_float32_update_error"],
            "migrate_step_near_kink_activations": step["near_kink_activations"],
            "migrate_passed": float(report["passed"]),
        }
    )
    logger.info(
        "migrate: forward max |logit diff| %.3g (bound %.3g); one SGD step: max |weight diff| %.3g, max relative "
        "update diff %.3g (criterion %s); %s",
        forward["max_abs_diff"],
        forward["tolerance"],
        step["weight_max_abs_diff"],
        step["update_max_rel_diff"],
        step["criterion"],
        "PASSED" if report["passed"] else "FAILED",
    )
    return report, table


def require_migration_parity(report: dict) -> None:
    """Fail the run, after the report is saved, when a parity check failed."""
    require_parity(report)
