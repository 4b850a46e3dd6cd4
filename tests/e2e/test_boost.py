"""The baseline pipeline with a boost option, as a real kedro run."""

from __future__ import annotations

from tests.support.config import load_config
from tests.support.projects import TINY_PARAMS, run_on_tiny_tree
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, load_checkpoint

OFF = load_config()["boost"]


def test_baseline_pipeline_trains_with_gradient_accumulation(tmp_path):
    per_class = {"train": 8, "val": 2}  # 24 images, batch 4: 6 batches per epoch
    project, _ = run_on_tiny_tree(tmp_path, "baseline", per_class, {"boost": {**OFF, "grad_accumulation_steps": 3}})
    final = load_checkpoint(project / "data/06_models/baseline/final.ckpt")
    initial = load_checkpoint(project / "data/06_models/baseline/initial.ckpt")
    assert set(final.network_params()) == set(initial.params)  # loads into the plain network evaluated after
    epochs, batches_per_epoch = TINY_PARAMS["baseline"]["epochs"], 6
    assert int(final.params[OPTIMIZER_PREFIX + "global_step"].reshape(-1)[0]) == epochs * batches_per_epoch
    assert any(name.startswith(OPTIMIZER_PREFIX + "moments.") for name in final.params)
