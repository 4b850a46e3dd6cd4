"""Which operator that only THOR runs gives CPU-dependent results (issue 29, item 7): each candidate MindSpore op on
the same fixed float32 inputs of THOR's shapes in the default study (every statistic of resnet_narrow at 32 px,
batch 64; Cholesky, cholesky_solve, unfold, the preconditioning products), natively and under emulated CPUs without
AVX-512, compared bitwise with the native run. Each statistic is also computed in float64 (a candidate pin).

The emulation is QEMU's user mode (``qemu-x86_64 -cpu Haswell`` and ``-cpu EPYC-Rome``: AVX2 and FMA3, no AVX-512;
QEMU 7.2's TCG). It is only for this investigation, so it is not in scripts/setup.sh: install it with
``apt-get install -y qemu-user`` (Debian 12). MindSpore runs 10-50 times slower under it: the emulated
configurations take 15-30 minutes each on 2 cores and run GRAPH mode only (THOR's); the native ones run GRAPH and
PyNative.

    .venv/bin/python benchmarks/cpu_dependent_ops.py             # native (AVX2 limit, no limit), then emulated
    .venv/bin/python benchmarks/cpu_dependent_ops.py --keep DIR  # keep the .npy files; a rerun reuses them

Each configuration is one process (``--worker OUT_DIR``) that writes one .npy per (op, mode); the tables compare
every configuration with the native one under the project's ``ONEDNN_MAX_CPU_ISA=AVX2``. The finding:
docs/troubleshooting.md#thor-cpu.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import pipelines  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA=AVX2 unless set; a worker may drop it before MindSpore loads)

BATCH = 64
DAMPING = 0.03  # thor.damping's order at the start of the default recipe; only makes the factors well conditioned
# QEMU's CPU models without AVX-512 (its TCG has none), an Intel and an AMD one whose L2 caches differ: CPUID leaf 4
# (what oneDNN reads) gives Haswell 4 MiB per core (leaf 2 and getconf: 2 MiB), 0x8000001D gives EPYC-Rome 512 KiB;
# this machine: 1 MiB per core (getconf)
EMULATED_CPUS = ("Haswell", "EPYC-Rome")
UNSET = "unset"


# THOR's statistics on resnet_narrow (3x3 stem, one basic block per stage, widths 16-128) at 32 px, batch 64:
# (layer, rows = batch x output positions, columns). A: im2col rows of the layer's input; G: rows of its output
# gradient (capture.CapturedLayer).
A_STATISTICS = (
    ("stem", BATCH * 32 * 32, 3 * 9),
    ("layer1 convs", BATCH * 32 * 32, 16 * 9),
    ("layer2.conv1", BATCH * 16 * 16, 16 * 9),
    ("layer2.conv2", BATCH * 16 * 16, 32 * 9),
    ("layer2.down", BATCH * 16 * 16, 16),
    ("layer3.conv1", BATCH * 8 * 8, 32 * 9),
    ("layer3.conv2", BATCH * 8 * 8, 64 * 9),
    ("layer3.down", BATCH * 8 * 8, 32),
    ("layer4.conv1", BATCH * 4 * 4, 64 * 9),
    ("layer4.conv2", BATCH * 4 * 4, 128 * 9),
    ("layer4.down", BATCH * 4 * 4, 64),
    ("fc", BATCH, 128),
)
G_STATISTICS = (
    ("stem, layer1", BATCH * 32 * 32, 16),
    ("layer2", BATCH * 16 * 16, 32),
    ("layer3", BATCH * 8 * 8, 64),
    ("layer4", BATCH * 4 * 4, 128),
    ("fc", BATCH, 10),
)


def thor_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Fixed float32 inputs of those shapes: non-negative (post-ReLU) rows for A, small gradient rows for G, a
    64-channel 8x8 feature map (layer3's im2col), damped SPD factors (layer3.conv2's A, layer3's G) made in float64,
    their inverses, a gradient, and the 576 factor's inverse as 5 blocks of 128 (block_size 128)."""
    rng = np.random.default_rng(seed)
    relu = lambda *shape: np.maximum(rng.standard_normal(shape), 0.0).astype(np.float32)  # noqa: E731
    inputs = {f"a_rows_{rows}x{cols}": relu(rows, cols) for _, rows, cols in A_STATISTICS}
    for _, rows, cols in G_STATISTICS:
        inputs[f"g_rows_{rows}x{cols}"] = (rng.standard_normal((rows, cols)) * 1e-3).astype(np.float32)
    inputs["feature_map"] = relu(BATCH, 64, 8, 8)
    inputs["grad_64x576"] = (rng.standard_normal((64, 576)) * 1e-2).astype(np.float32)
    for name, rows, positions in (("a_576", inputs["a_rows_4096x576"], 64.0), ("g_64", inputs["g_rows_4096x64"], 1.0)):
        wide = rows.astype(np.float64) * (BATCH if name == "g_64" else 1.0)
        stat = wide.T @ wide / wide.shape[0]
        inputs[name] = (stat + np.sqrt(DAMPING / positions) * np.eye(stat.shape[0])).astype(np.float32)
    inputs["a_576_inverse"] = np.linalg.inv(inputs["a_576"].astype(np.float64)).astype(np.float32)
    inputs["g_64_inverse"] = np.linalg.inv(inputs["g_64"].astype(np.float64)).astype(np.float32)
    padded = np.eye(5 * 128)
    padded[:576, :576] = inputs["a_576"]
    inputs["a_576_blocks"] = np.stack(
        [np.linalg.inv(padded[i * 128 : (i + 1) * 128, i * 128 : (i + 1) * 128]) for i in range(5)]
    ).astype(np.float32)
    return inputs


def run_ops(out_dir: Path, mode: str) -> None:
    """Each candidate op on ``thor_inputs``, in ``mode``, one .npy per op in ``out_dir``."""
    import mindspore as ms
    from mindspore import nn, ops

    from trainlib.optim.thor.linalg import apply_left, apply_right, block_inverse

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)

    class Op(nn.Cell):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def construct(self, *args):
            return self.fn(*args)

    def statistic(rows):  # capture.CapturedLayer's A and G
        return ops.matmul(ops.transpose(rows, (1, 0)), rows) / rows.shape[0]

    def statistic_float64(rows):  # the same in float64 (not oneDNN's kernel), cast back
        rows = ops.cast(rows, ms.float64)
        return ops.cast(ops.matmul(ops.transpose(rows, (1, 0)), rows) / rows.shape[0], ms.float32)

    def im2col(x):  # capture.CapturedLayer._patches of a 3x3 conv, padding 1
        cols = ops.unfold(ops.pad(x, (1, 1, 1, 1)), (3, 3), (1, 1), 0, (1, 1))
        return ops.reshape(ops.transpose(cols, (0, 2, 1)), (-1, 576))

    def full_inverse(matrix):  # linalg.block_inverse, block_size null: cholesky, then cholesky_solve
        return block_inverse(matrix, None, "cholesky")

    def inverse_blocks(matrix):  # block_size 128: five blocks, batched
        return block_inverse(matrix, 128, "cholesky")

    def precondition(g_inverse, grad, a_inverse):  # preconditioner: G^-1 grad A^-1, full inverses (block_size null)
        return apply_right(apply_left(ops.expand_dims(g_inverse, 0), grad), ops.expand_dims(a_inverse, 0))

    def precondition_blocks(a_blocks, grad):  # block_size 128: bmm over the blocks
        return apply_right(grad, a_blocks)

    cases = {}
    for kind, shapes in (("A", A_STATISTICS), ("G", G_STATISTICS)):
        for layer, rows, cols in shapes:
            name = f"{kind.lower()}_rows_{rows}x{cols}"
            cases[f"{kind} {layer}: matmul(rows.T, rows) {rows}x{cols}"] = (statistic, (name,))
            cases[f"{kind} {layer}: the same in float64 {rows}x{cols}"] = (statistic_float64, (name,))
    cases |= {
        "im2col: unfold 64x64x8x8": (im2col, ("feature_map",)),
        "cholesky 576": (ops.cholesky, ("a_576",)),
        "cholesky 64": (ops.cholesky, ("g_64",)),
        "cholesky + cholesky_solve 576": (full_inverse, ("a_576",)),
        "cholesky + cholesky_solve 64": (full_inverse, ("g_64",)),
        "cholesky + cholesky_solve, 5 blocks of 128": (inverse_blocks, ("a_576",)),
        "precondition: matmul G^-1 grad A^-1 64x576": (precondition, ("g_64_inverse", "grad_64x576", "a_576_inverse")),
        "precondition: bmm grad x 5 blocks of 128": (precondition_blocks, ("a_576_blocks", "grad_64x576")),
    }
    inputs = thor_inputs()
    out_dir.mkdir(parents=True, exist_ok=True)
    for index, (fn, args) in enumerate(cases.values()):
        result = Op(fn)(*(ms.Tensor(inputs[arg]) for arg in args))
        np.save(out_dir / f"{index:02d}.npy", result.asnumpy())
    (out_dir / "names.txt").write_text("\n".join(cases))


MODES = ("graph", "pynative")


def configurations(python: str, qemu: str | None) -> dict[str, tuple[list[str], str, tuple[str, ...]]]:
    """Label: (command prefix, ONEDNN_MAX_CPU_ISA, modes) of each configuration; the first is the reference. The
    emulated ones run GRAPH mode only (THOR's; PyNative gave the same bits as GRAPH in every native and emulated run,
    and QEMU takes 10-50 times as long)."""
    found = {
        "native, ONEDNN_MAX_CPU_ISA=AVX2": ([python], "AVX2", MODES),
        "native, ONEDNN_MAX_CPU_ISA unset": ([python], UNSET, MODES),
    }
    for cpu in EMULATED_CPUS if qemu else ():
        found[f"qemu -cpu {cpu}, ONEDNN_MAX_CPU_ISA=AVX2"] = ([qemu, "-cpu", cpu, python], "AVX2", ("graph",))
    return found


def table(reference: Path, other: Path) -> list[tuple[str, str, float, float, bool]]:
    """(op, mode, max abs diff, max abs value, bitwise equal) of each op in each mode ``other`` ran, against
    ``reference``."""
    rows = []
    for mode in MODES:
        if not (other / mode / "names.txt").is_file():
            continue
        names = (reference / mode / "names.txt").read_text().splitlines()
        for index, name in enumerate(names):
            ours, theirs = (np.load(root / mode / f"{index:02d}.npy") for root in (reference, other))
            diff = float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))
            rows.append((name, mode, diff, float(np.max(np.abs(ours))), bool(np.array_equal(ours, theirs))))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--onednn-isa", default="AVX2", help=argparse.SUPPRESS)
    parser.add_argument("--modes", default=",".join(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, help="keep the .npy files here; a configuration already there is reused")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per configuration")
    args = parser.parse_args(argv)
    if args.worker:
        if args.onednn_isa == UNSET:  # before MindSpore loads: oneDNN reads it once
            os.environ.pop("ONEDNN_MAX_CPU_ISA", None)
        else:
            os.environ["ONEDNN_MAX_CPU_ISA"] = args.onednn_isa
        for mode in args.modes.split(","):
            run_ops(args.worker / mode, mode)
        return
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        print("qemu-x86_64 not found (apt-get install -y qemu-user): native configurations only")
    root = args.keep or Path(tempfile.mkdtemp(prefix="cpu_dependent_ops-"))
    outs = {}
    for index, (label, (prefix, isa, modes)) in enumerate(configurations(sys.executable, qemu).items()):
        out = root / f"config{index}"
        command = [*prefix, str(Path(__file__).resolve()), "--worker", str(out), "--onednn-isa", isa]
        command += ["--modes", ",".join(modes)]
        if all((out / mode / "names.txt").is_file() for mode in modes):
            print(f"reusing {label}: {out}", flush=True)
        else:
            print(f"running {label}: {' '.join(command)}", flush=True)
            subprocess.run(command, check=True, timeout=args.timeout, stderr=subprocess.DEVNULL)
        outs[label] = out
    (reference_label, reference), *others = outs.items()
    for label, out in others:
        print(f"\n{label} against {reference_label}")
        print(f"| {'op (shapes)':<52} | {'mode':<8} | {'max abs diff':>12} | {'max abs value':>13} | bitwise equal |")
        print(f"|{'-' * 54}|{'-' * 10}|{'-' * 14}|{'-' * 15}|---------------|")
        for name, mode, diff, scale, equal in table(reference, out):
            print(f"| {name:<52} | {mode:<8} | {diff:>12.3g} | {scale:>13.3g} | {'yes' if equal else 'no':<13} |")
    if args.keep is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
