"""What ``thor.statistics_dtype: float64`` costs (issue 44): seconds per THOR step on the default study's network
(resnet_narrow, batch 64, 32 px) with A and G's products in float32 (oneDNN's GEMM, on MindSpore's kernel threads)
and in float64 (a single-threaded Eigen kernel): the second-order step, which takes the statistics, and the step
reusing the inverses, which takes none (the same graph either way: the mean of both medians stands for both);
medians of interleaved repeats in one process, so a shared machine's load falls on both alike
(``thor_options_cost.interleaved_medians``). Amortised over the recipe's ``thor.frequency`` (statistics every N
steps: 1 second-order step and N - 1 reuse steps).

    .venv/bin/python benchmarks/thor_statistics_dtype.py [--repeats 6] [--frequency 50]

docs/results.md (THOR's statistics in float64) and docs/recipes.md#thor-options."""

import argparse
import statistics

import mindspore as ms
import numpy as np
from mindspore import nn
from thor_options_cost import interleaved_medians

import pipelines  # noqa: F401  (sets the CPU speed environment, ONEDNN_MAX_CPU_ISA=AVX2, before MindSpore loads)
from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import create_resnet
from trainlib.optim.thor.step import create_thor_step
from trainlib.params import ThorSettings

DTYPES = ("float32", "float64")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--frequency", type=int, default=50, help="thor.frequency of the recipe (default: 50)")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((64, 3, 32, 32)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, 64).astype(np.int32))
    steps = {}
    for dtype in DTYPES:
        ms.set_seed(0)
        net = create_resnet("resnet_narrow", 10, zero_init_last_bn_gamma=True)
        steps[dtype] = create_thor_step(
            net,
            nn.WithLossCell(net, CrossEntropySmooth(10, 0.1)),
            np.full(4 * args.repeats + 4, 0.05, np.float32),
            np.full(4 * args.repeats + 4, 0.03, np.float32),
            ThorSettings(
                momentum=0.9, weight_decay=5e-4, loss_scale=128.0, frequency=2, block_size=None, statistics_dtype=dtype
            ),
            rank_size=1,
        )
    medians = interleaved_medians(steps, (x, y), args.repeats)
    for dtype, m in medians.items():
        print(f"{dtype}: second-order step {m['second_order']:.3f} s, reuse step {m['reuse']:.3f} s")
    # the reuse step takes no statistics: the same graph for both dtypes, so one figure (their mean) for both; the
    # dtype adds its cost to the second-order step alone
    reuse = statistics.mean(m["reuse"] for m in medians.values())
    second_order = {dtype: m["second_order"] for dtype, m in medians.items()}
    extra = second_order["float64"] - second_order["float32"]
    n = args.frequency
    per_step = {dtype: (m["second_order"] + (n - 1) * reuse) / n for dtype, m in medians.items()}
    print(
        f"float64 / float32: second-order step {second_order['float64'] / second_order['float32']:.2f}x "
        f"(+{extra:.2f} s); per step over frequency {n} (1 second-order + {n - 1} reuse steps of {reuse:.3f} s): "
        f"{per_step['float32']:.3f} s and {per_step['float64']:.3f} s, {per_step['float64'] / per_step['float32']:.3f}x"
    )


if __name__ == "__main__":
    main()
