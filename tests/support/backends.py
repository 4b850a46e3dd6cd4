"""The backend audit as the tests apply it: graphs dumped while a pipeline runs in this process, then every primitive
checked against the backends MindSpore names for it (docstring, else kernel headers), on each device target's path.

Each exception carries its evidence, and tests/engine/test_backends.py checks that evidence."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mindspore as ms

from pipelines.engine.backends import PLATFORMS, graph_primitives, undeclared

# Gaps MindSpore's own code leaves, primitive -> the devices without evidence for it, stated in docs/backends.md
# (Findings): boost's GradientAccumulation counts its steps with ``+= 1`` on a Parameter, InplaceAddsExt, whose
# kernel headers MindSpore 2.10 ships for Ascend and CPU only.
KNOWN_GAPS = {"InplaceAddsExt": ("GPU",)}
# What a recipe's own code uses instead where a device lacks the CPU path's primitive: (device, primitive) ->
# its replacement there. THOR's preconditioner inverts with MatrixInverse on Ascend (Cholesky is declared for GPU
# and CPU only).
DEVICE_PATHS = {("Ascend", "Cholesky"): "MatrixInverse", ("Ascend", "CholeskySolve"): "MatrixInverse"}


@contextmanager
def dumped_graphs(folder: Path) -> Iterator[Path]:
    """MindSpore's IR of every graph compiled meanwhile, under ``folder``: only the ``validate`` pass the audit reads
    (MindSpore reads ``MS_DEV_DUMP_IR_PASSES`` at its first dump; every pass's IR doubled a tiny run's time)."""
    os.environ.setdefault("MS_DEV_DUMP_IR_PASSES", "validate")
    ms.set_context(save_graphs=1, save_graphs_path=str(folder))
    try:
        yield folder
    finally:
        ms.set_context(save_graphs=0)


def primitives_on(device: str, primitives: set[str]) -> set[str]:
    """The primitives a device runs: the CPU path's, with the device's replacements of ``DEVICE_PATHS``."""
    replaced = {primitive for (target, primitive) in DEVICE_PATHS if target == device}
    return (primitives - replaced) | {DEVICE_PATHS[device, p] for p in primitives & replaced}


def assert_declared_on_every_target(folder: Path) -> set[str]:
    """Every primitive of the graphs under ``folder`` is one MindSpore declares for each device target on that
    target's path; returns the primitives (the CPU path's)."""
    primitives = graph_primitives(folder)
    for device in PLATFORMS:
        gaps = [primitive for primitive, devices in KNOWN_GAPS.items() if device in devices]
        findings = undeclared(primitives_on(device, primitives), device, exceptions=gaps)
        assert not findings, f"on {device}: " + "; ".join(finding.describe(device) for finding in findings)
    return primitives
