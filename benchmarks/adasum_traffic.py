"""Bytes communicated per step, plain gradient AllReduce vs Adasum, and 2-rank vs 1-rank images/s.

1. Computed (``communication_bytes_per_step`` below, ring-algorithm costs, bytes sent per
   rank per step) for the trainable parameters of resnet_narrow (10 classes) and resnet50 (1001
   classes) at 2-16 ranks, with the swap MindSpore CPU allows (AllReduce over pairs beyond 2
   ranks) and the one GPU/Ascend allow (AllGather over pairs).
2. Measured under ``msrun`` on CPU: each rank's bytes written (``wchar`` of /proc/self/io, which
   counts socket writes) per step of a plain data-parallel step (``TrainOneStepCell`` with a
   ``DistributedGradReducer``) and of ``AdasumTrainStep`` on resnet_narrow, against the model.
3. Images/s of a tiny loop (resnet_narrow, 32 px random batches of ``--batch-size`` per rank):
   median over ``--epochs`` timed epochs of ``--steps`` steps after one warm-up epoch, 1 rank
   (no communication) vs 2 ranks (plain and Adasum, alternating epochs).

    .venv/bin/python benchmarks/adasum_traffic.py                 # all three
    .venv/bin/python benchmarks/adasum_traffic.py --skip-measured # the computed table only

Internally the script also is the msrun worker (``--run-worker OUT_DIR``; msrun would take
``--worker`` for an abbreviation of its own ``--worker_num``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)
from trainlib.readable import counted

NUM_CLASSES = {"resnet_narrow": 10, "resnet50": 1001}
LOSS_SCALE = 1024.0


# A dot product and two squared norms per tensor, summed across ranks at every level.
STATS_PER_TENSOR = 3


def communication_bytes_per_step(
    param_sizes: Sequence[int],
    rank_size: int,
    exchange: str = "allgather",
    stat_count: int = 0,
    bytes_per_element: int = 4,
) -> dict[str, float]:
    """Bytes each rank sends per step: plain gradient AllReduce vs ``optim.adasum``'s Adasum.

    Collectives are costed with the ring algorithm: an AllReduce of ``m`` elements over ``g`` ranks
    sends ``2 m (g-1)/g`` elements per rank, an AllGather of ``m`` elements per rank sends
    ``m (g-1)``. ``param_sizes`` are the element counts of the trainable tensors; ``stat_count``
    is the number of BatchNorm moving-statistic elements, averaged once per step by
    ``AdasumTrainStep`` (plain data parallel leaves them local). Keys: ``allreduce`` (plain data
    parallel), ``adasum_exchange`` (half swaps), ``adasum_scalars`` (per-tensor dot products and
    norms), ``adasum_allgather`` (final assembly), ``batchnorm``, ``adasum`` (sum of the four).
    """
    from trainlib.optim.adasum.combine import EXCHANGES, check_rank_size

    check_rank_size(rank_size)
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    p = rank_size
    total = int(sum(param_sizes))
    padded = -(-total // p) * p  # the fused buffer, padded to a multiple of the ranks as Adasum pads it
    stats_len = STATS_PER_TENSOR * (len(param_sizes) + 1)
    levels = p.bit_length() - 1
    swap = scalars = 0.0
    for level in range(levels):
        current = padded / 2**level
        # An AllGather over 2 ranks sends the half; an AllReduce over 2 ranks sends 2 * current * 1/2.
        swap += current / 2 if exchange == "allgather" else current
        group = 2 ** (level + 1)
        scalars += 2 * stats_len * (group - 1) / group
    assemble = (padded / p) * (p - 1)
    batchnorm = 2 * stat_count * (p - 1) / p
    parts = {
        "allreduce": 2 * total * (p - 1) / p,
        "adasum_exchange": swap,
        "adasum_scalars": scalars,
        "adasum_allgather": assemble,
        "batchnorm": batchnorm,
    }
    result = {key: value * bytes_per_element for key, value in parts.items()}
    result["adasum"] = sum(
        result[key] for key in ("adasum_exchange", "adasum_scalars", "adasum_allgather", "batchnorm")
    )
    return result


def parameter_layout(name: str) -> tuple[list[int], int]:
    """Element counts of the trainable tensors and the number of BatchNorm statistic elements."""
    import numpy as np

    from trainlib.models.resnet import create_resnet
    from trainlib.optim.adasum.step import batchnorm_statistics

    net = create_resnet(name, NUM_CLASSES[name])
    sizes = [int(np.prod(p.shape)) for p in net.trainable_params()]
    stats = sum(int(np.prod(p.shape)) for p in batchnorm_statistics(net))
    return sizes, stats


def print_computed() -> None:
    print("Computed bytes sent per rank per step (ring costs, float32)")
    print(
        f"{'network':<14}{'params':>11}{'ranks':>6}{'AllReduce':>12}{'Adasum CPU':>12}{'ratio':>7}"
        f"{'Adasum GPU':>12}{'ratio':>7}{'of which BN':>12}"
    )
    for name in NUM_CLASSES:
        sizes, stats = parameter_layout(name)
        for ranks in (2, 4, 8, 16):
            cpu = communication_bytes_per_step(sizes, ranks, "allreduce" if ranks > 2 else "allgather", stats)
            gpu = communication_bytes_per_step(sizes, ranks, "allgather", stats)
            print(
                f"{name:<14}{sum(sizes):>11,}{ranks:>6}{mb(cpu['allreduce']):>12}{mb(cpu['adasum']):>12}"
                f"{cpu['adasum'] / cpu['allreduce']:>7.2f}{mb(gpu['adasum']):>12}"
                f"{gpu['adasum'] / gpu['allreduce']:>7.2f}{mb(cpu['batchnorm']):>12}"
            )


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3f} MB"


def bytes_written() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar"))


def build_steps(rank_size: int, batch: int, image_size: int):
    """Fresh resnet_narrow training steps from one initialisation: {"plain": ..., "adasum": ...}."""
    import mindspore as ms
    from mindspore import nn

    from trainlib.models.resnet import create_resnet
    from trainlib.optim.adasum.step import AdasumTrainStep

    steps = {}
    for mode in ("plain", "adasum"):
        ms.set_seed(0)
        net = create_resnet("resnet_narrow", NUM_CLASSES["resnet_narrow"])
        with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9, loss_scale=LOSS_SCALE)
        if mode == "adasum":
            step = AdasumTrainStep(with_loss, optimizer, sens=LOSS_SCALE, rank_size=rank_size)
        else:
            step = nn.TrainOneStepCell(with_loss, optimizer, sens=LOSS_SCALE)
            if rank_size > 1:
                step.grad_reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True, degree=rank_size)
        step.set_train(True)
        steps[mode] = step
    return steps


def run_worker(out: Path, batch: int, image_size: int, epochs: int, steps_per_epoch: int, distributed: bool) -> None:
    """Time and count bytes of plain and Adasum steps on this rank; write rank<r>.json under ``out``."""
    import numpy as np
    from mindspore import Tensor

    from trainlib.engine.runtime import configure_mindspore

    configure_mindspore("CPU", "graph", 0)
    rank, rank_size = 0, 1
    if distributed:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank, rank_size = get_rank(), get_group_size()
    data = np.random.default_rng(rank)
    images = Tensor(data.normal(size=(batch, 3, image_size, image_size)).astype(np.float32))
    labels = Tensor(data.integers(0, NUM_CLASSES["resnet_narrow"], size=batch).astype(np.int32))
    steps = build_steps(rank_size, batch, image_size)
    result = {mode: {"seconds": [], "bytes_per_step": []} for mode in steps}
    for epoch in range(epochs + 1):
        for mode, step in steps.items():
            written, start = bytes_written(), time.perf_counter()
            for _ in range(steps_per_epoch):
                loss = step(images, labels)
            loss.asnumpy()
            if epoch:  # epoch 0 compiles the graphs
                result[mode]["seconds"].append(time.perf_counter() - start)
                result[mode]["bytes_per_step"].append((bytes_written() - written) / steps_per_epoch)
    result["rank_size"] = rank_size
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(ranks: int, out: Path, worker_args: list[str]) -> list[dict]:
    command = [sys.executable, __file__, "--run-worker", str(out), *worker_args]
    if ranks > 1:
        env_path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        command = [
            "msrun", f"--worker_num={ranks}", f"--local_worker_num={ranks}", f"--master_port={free_port()}",
            "--join=True", f"--log_dir={out / 'logs'}", "python", *command[1:], "--distributed",
        ]  # fmt: skip
        done = subprocess.run(
            command, env=dict(os.environ, PATH=env_path), capture_output=True, timeout=1800, check=False
        )
        if done.returncode:
            for log in sorted((out / "logs").glob("*.log")):
                print(f"--- {log.name} ---", *log.read_text(errors="replace").splitlines()[-30:], sep="\n")
            raise SystemExit(f"msrun with {ranks} ranks failed ({done.returncode})")
    else:
        subprocess.run(command, check=True, timeout=1800)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs (after one warm-up)")
    parser.add_argument("--steps", type=int, default=10, help="steps per epoch")
    parser.add_argument("--traffic-ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--skip-measured", action="store_true")
    parser.add_argument("--run-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--distributed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_worker:
        run_worker(args.run_worker, args.batch_size, args.image_size, args.epochs, args.steps, args.distributed)
        return

    print_computed()
    if args.skip_measured:
        return
    from trainlib.optim.adasum.combine import default_exchange

    sizes, stats = parameter_layout("resnet_narrow")
    worker_args = ["--batch-size", str(args.batch_size), "--image-size", str(args.image_size)]
    with tempfile.TemporaryDirectory() as tmp:
        print("\nMeasured bytes written per rank per step (wchar), resnet_narrow on CPU, vs the model")
        print(f"{'ranks':>5}{'mode':>8}{'measured':>14}{'model':>14}{'measured/model':>16}")
        timing = {}
        for ranks in sorted(set(args.traffic_ranks) | {1, 2}):
            out = Path(tmp) / f"ranks{ranks}"
            out.mkdir()
            # Throughput needs the full run only at 1 and 2 ranks; traffic settles after 2 epochs.
            epochs = args.epochs if ranks <= 2 else 2
            results = launch(ranks, out, [*worker_args, "--epochs", str(epochs), "--steps", str(args.steps)])
            timing[ranks] = results
            if ranks == 1:
                continue
            model = communication_bytes_per_step(sizes, ranks, default_exchange("CPU", ranks), stats)
            for mode, key in (("plain", "allreduce"), ("adasum", "adasum")):
                measured = statistics.median(b for r in results for b in r[mode]["bytes_per_step"])
                print(f"{ranks:>5}{mode:>8}{mb(measured):>14}{mb(model[key]):>14}{measured / model[key]:>16.2f}")

        print(
            f"\nImages/s, resnet_narrow {args.image_size} px, batch {args.batch_size} per rank, "
            f"median of {counted(args.epochs, 'epoch')} of {args.steps} steps"
        )
        single = args.batch_size * args.steps / statistics.median(timing[1][0]["plain"]["seconds"])
        print(f"{'1 rank (no communication)':<34}{single:>10.1f}")
        for mode in ("plain", "adasum"):
            # An epoch ends when its slowest rank does.
            per_epoch = [max(r[mode]["seconds"][e] for r in timing[2]) for e in range(args.epochs)]
            rate = 2 * args.batch_size * args.steps / statistics.median(per_epoch)
            print(f"{'2 ranks, ' + mode:<34}{rate:>10.1f}   speed-up {rate / single:.2f}x")


if __name__ == "__main__":
    main()
