"""The backend audit: which backends MindSpore declares for each primitive a compiled graph uses, and the
tests' checks that every recipe's graphs run on Ascend, GPU and CPU.

MindSpore states an operator's backends in its docstring ("Supported Platforms: ``Ascend`` ``GPU`` ``CPU``"); it is
the record of what runs on Ascend or GPU that a CPU machine holds. Primitives MindSpore generates itself (``x * 2.0``
is Muls) have docstrings that defer to undocumented functions; for those, the kernel headers MindSpore ships, one
folder per backend (``include/mindspore/ops/kernel/{ascend,gpu,cpu}``), are the evidence. The graphs are MindSpore's
own IR dumps (``MS_DEV_SAVE_GRAPHS=1``, ``MS_DEV_SAVE_GRAPHS_PATH=<folder>``, and ``MS_DEV_DUMP_IR_PASSES=validate``
to write only the pass read here, at half the compile time of every pass): the ``*validate*.ir`` files hold
each graph after the frontend's passes and before any backend's, so the primitives listed are the ones every backend
is handed.

The tests dump the graphs a pipeline compiles in this process (``dumped_graphs``) and check every primitive against
each device target's path (``assert_declared_on_every_target``); each exception carries its evidence, which
tests/test_backends.py checks. To audit a run of your own: ``graph_primitives(folder)`` and ``undeclared(...)`` over
its dump (docs/backends.md).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mindspore as ms

PLATFORMS = ("Ascend", "GPU", "CPU")

BACKEND_FOLDERS = {"Ascend": "ascend", "GPU": "gpu", "CPU": "cpu"}

# Graph plumbing, not kernels: ordering, side-effect and tuple nodes the backends consume while building the
# kernel graph, so no docstring declares a platform for them; and TensorMove, the copy MindSpore's compiler inserts
# itself on every backend (a framework op, include/mindspore/ops/include/primitive/framework_ops.h).
PLUMBING = frozenset(
    {"Depend", "UpdateState", "Load", "MakeTuple", "TupleGetItem", "Return", "Partial", "Switch", "TensorMove"}
)
_KERNEL_SUFFIX = re.compile(r"(_(cpu|gpu|aclnn|aicpu))?(_kernel)?$")

_CALL = re.compile(r"= (?:PrimFunc_)?([A-Z][A-Za-z0-9_]*)\(")
_FORWARD = re.compile(r'forward_node_name: "([A-Za-z0-9_]+?)_\d+"')
_DECLARATION = re.compile(r"Supported Platforms:\s*\n((?:[ \t]*``\w+``[^\n]*\n?)+)")
_REFERENCE = re.compile(r"Refer to :func:`(mindspore\.ops\.[\w.]+)`")


def graph_lines(dump: str) -> Iterator[str]:
    """The lines of an IR dump that hold its graphs' nodes: not its "symbol engine details", the relations between
    symbolic shapes a graph with a dynamic dimension carries (``s5<[1,inf]> = ScalarMax(s4, s2)`` when a network is
    exported for any batch size), which the compiler evaluates and no backend runs as a kernel."""
    in_symbols = False
    for line in dump.splitlines():
        if line.startswith("symbol engine details:"):
            in_symbols = True
        elif in_symbols and line.startswith("}"):
            in_symbols = False
        elif not in_symbols:
            yield line


def graph_primitives(ir_folder: Path) -> set[str]:
    """The primitives of every graph dumped under ``ir_folder`` (recursively: msrun's ranks dump into their own
    folders), plumbing left out. A gradient kernel with no declaration of its own (``Conv2DBackpropFilter``) is given
    as the forward primitive it differentiates, whose docstring declares the pair."""
    files = sorted(Path(ir_folder).rglob("*validate*.ir"))
    if not files:
        raise FileNotFoundError(
            f"no *validate*.ir graph dump under {ir_folder}: run the training with MS_DEV_SAVE_GRAPHS=1, "
            f"MS_DEV_SAVE_GRAPHS_PATH={ir_folder} and MS_DEV_DUMP_IR_PASSES=validate (GRAPH mode)"
        )
    primitives: set[str] = set()
    for file in files:
        for line in graph_lines(file.read_text(errors="replace")):
            call = _CALL.search(line)
            if call is None:
                continue
            forward = _FORWARD.search(line)
            own = call.group(1)
            primitives.add(forward.group(1) if forward and declared_platforms(own) is None else own)
    return primitives - PLUMBING


def _declaration(doc: str | None) -> frozenset[str] | None:
    found = _DECLARATION.search(doc or "")
    if found is None:
        return None
    return frozenset(re.findall(r"``(\w+)``", found.group(1))) & frozenset(PLATFORMS)


def _resolve(dotted: str) -> object | None:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


@cache
def declared_platforms(primitive: str) -> frozenset[str] | None:
    """The backends MindSpore's docstring of ``primitive`` declares, following its "Refer to" link to the functional
    form where the primitive's own docstring defers; None when no declaration is found."""
    from mindspore import ops
    from mindspore.ops import operations

    for owner in (operations, ops):
        target = getattr(owner, primitive, None)
        if target is None:
            continue
        doc = inspect.getdoc(target)
        declared = _declaration(doc)
        if declared is None and (reference := _REFERENCE.search(doc or "")):
            declared = _declaration(inspect.getdoc(_resolve(reference.group(1))))
        if declared is not None:
            return declared
    return None


def _squashed(name: str) -> str:
    return name.replace("_", "").lower()


@cache
def _kernel_index() -> dict[str, frozenset[str]]:
    """Squashed kernel name (``matmulext``) -> the backends with a header of it."""
    import mindspore as ms

    root = Path(ms.__file__).parent / "include/mindspore/ops/kernel"
    index: dict[str, set[str]] = {}
    for platform, folder in BACKEND_FOLDERS.items():
        for header in (root / folder).rglob("*.h"):
            index.setdefault(_squashed(_KERNEL_SUFFIX.sub("", header.stem)), set()).add(platform)
    return {name: frozenset(platforms) for name, platforms in index.items()}


def kernel_platforms(primitive: str) -> frozenset[str]:
    """The backends MindSpore ships a kernel header of ``primitive`` for (``muls.h``, ``matmul_ext.h``)."""
    return _kernel_index().get(_squashed(primitive), frozenset())


@dataclass(frozen=True)
class Evidence:
    platforms: frozenset[str]
    source: str  # "docstring" | "kernel headers" | "none"


def evidence(primitive: str) -> Evidence:
    """The backends of ``primitive`` by MindSpore's docstring, else by the kernel headers it ships."""
    declared = declared_platforms(primitive)
    if declared is not None:
        return Evidence(declared, "docstring")
    shipped = kernel_platforms(primitive)
    return Evidence(shipped, "kernel headers" if shipped else "none")


@dataclass(frozen=True)
class Finding:
    primitive: str
    evidence: Evidence

    def describe(self, device: str) -> str:
        if self.evidence.source == "none":
            return f"{self.primitive}: no docstring declaration and no kernel header for any backend"
        platforms = ", ".join(sorted(self.evidence.platforms)) or "none"
        return f"{self.primitive}: {self.evidence.source} name {platforms}, not {device}"


def undeclared(primitives: Iterable[str], device: str, *, exceptions: Collection[str]) -> list[Finding]:
    """The primitives with no evidence for ``device``, by name, less ``exceptions`` (names the caller holds other
    evidence for)."""
    if device not in PLATFORMS:
        raise ValueError(f"device must be one of {PLATFORMS}, got {device!r}")
    findings = []
    for primitive in sorted(set(primitives) - set(exceptions)):
        found = evidence(primitive)
        if device not in found.platforms:
            findings.append(Finding(primitive, found))
    return findings


def platform_table(primitives_by_recipe: Mapping[str, set[str]]) -> list[dict[str, str]]:
    """One row per primitive: the recipes whose graphs use it, the evidence, and per platform whether it names it."""
    rows = []
    for primitive in sorted(set().union(*primitives_by_recipe.values())):
        found = evidence(primitive)
        row = {
            "primitive": primitive,
            "recipes": ", ".join(recipe for recipe, used in primitives_by_recipe.items() if primitive in used),
            "evidence": found.source,
        }
        for platform in PLATFORMS:
            row[platform] = "yes" if platform in found.platforms else "no"
        rows.append(row)
    return rows


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
