"""THOR's options (issue 29), what each costs: seconds per THOR step on resnet_narrow (the study's network, batch 64,
32 px), by option: the second-order step (statistics, inverses or eigendecompositions, update) and the step reusing
them; medians of interleaved repeats in one process (the options' graphs compiled first), so a shared machine's load
falls on all alike. ``.venv/bin/python benchmarks/thor_options_cost.py`` (docs/results.md, THOR's options)."""

import statistics
import time

import mindspore as ms
import numpy as np
from mindspore import nn

from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import create_resnet
from trainlib.optim.thor.step import create_thor_step
from trainlib.params import ThorSettings

CONFIGS = {
    "thor": {},
    "factored": {"damping_method": "factored"},
    "eigen": {"compute_method": "eigen"},
    "kl_clip": {"kl_clip": 0.001},
    "adam_graft": {"adam_graft": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}},
}
REPEATS = 6


def interleaved_medians(steps: dict, batch: tuple, repeats: int) -> dict[str, dict[str, float]]:
    """Seconds of each THOR step of ``steps`` (built with frequency 2: second-order and reuse steps alternate) on
    ``batch``, by kind: every step is called twice first (both graphs compiled), then ``repeats`` rounds call each
    step once per kind in turn, so the machine's load falls on all alike; the medians."""
    for step in steps.values():
        for _ in range(2):
            step(*batch).asnumpy()
    times = {name: {"second_order": [], "reuse": []} for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            for kind in ("second_order", "reuse"):
                started = time.perf_counter()
                step(*batch).asnumpy()
                times[name][kind].append(time.perf_counter() - started)
    return {name: {kind: statistics.median(values) for kind, values in kinds.items()} for name, kinds in times.items()}


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    steps = {}
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((64, 3, 32, 32)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, 64).astype(np.int32))
    for name, options in CONFIGS.items():
        ms.set_seed(0)
        net = create_resnet("resnet_narrow", 10, zero_init_last_bn_gamma=True)
        steps[name] = create_thor_step(
            net,
            nn.WithLossCell(net, CrossEntropySmooth(10, 0.1)),
            np.full(4 * REPEATS + 4, 0.05, np.float32),
            np.full(4 * REPEATS + 4, 0.03, np.float32),
            ThorSettings.model_validate(
                dict(momentum=0.9, weight_decay=5e-4, loss_scale=128.0, frequency=2, block_size=None, **options)
            ),
            rank_size=1,
        )
    for name, medians in interleaved_medians(steps, (x, y), REPEATS).items():
        so, re_ = medians["second_order"], medians["reuse"]
        print(f"{name}: second-order {so:.3f} s, reuse {re_:.3f} s, per 50 steps (1 + 49) {so + 49 * re_:.1f} s")


if __name__ == "__main__":
    main()
