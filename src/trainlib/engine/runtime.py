"""Process-level set-up for MindSpore: CPU speed settings, device checks, context, and the machine a run ran on.

``apply_cpu_defaults`` must run before MindSpore is imported; the package ``__init__`` calls
it, so ``kedro run`` and the tests get it without any shell set-up.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path
from typing import get_args

# oneDNN picks a reference 3x3 convolution on AVX-512 machines here (30x slower); AVX2 kernels
# are the fast path. GLOG_v=3 keeps MindSpore's C++ warnings out of Kedro's log.
CPU_DEFAULTS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "GLOG_v": "3"}


def apply_cpu_defaults() -> None:
    """Set MindSpore's CPU speed settings unless the user already set them."""
    for key, value in CPU_DEFAULTS.items():
        os.environ.setdefault(key, value)


# the vector extensions that change which CPU kernels MindSpore and oneDNN pick, widest first
ISA_FLAGS = ("avx512f", "avx2", "avx")


def _cpuinfo_field(text: str, field: str) -> str | None:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    return None


def _l2_cache_per_core(caches: Path) -> str:
    """The L2 cache of one core as Linux reports it (``1024K``), or ``unknown``."""
    for index in sorted(caches.glob("index*")):
        if (index / "level").is_file() and (index / "level").read_text().strip() == "2":
            return (index / "size").read_text().strip()
    return "unknown"


def describe_machine(
    cpuinfo: Path = Path("/proc/cpuinfo"), caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")
) -> dict[str, str]:
    """What a run's figures may depend on, without loading MindSpore: the CPU model, its widest vector extension
    (``isa``: avx512f, avx2, avx or none), the ``ONEDNN_MAX_CPU_ISA`` in force (``onednn_isa``, ``unset``),
    the cores, the L2 cache per core, and the MindSpore, Python and OS versions. THOR's statistics depend on the
    cores and the L2 cache, through oneDNN's thread count (docs/troubleshooting.md#thor-cpu), so a THOR figure is
    only comparable with one from the same kind of machine."""
    text = cpuinfo.read_text() if cpuinfo.is_file() else ""
    flags = set((_cpuinfo_field(text, "flags") or "").split())
    try:
        mindspore = metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        mindspore = "not installed"
    return {
        "cpu": _cpuinfo_field(text, "model name") or platform.processor() or platform.machine(),
        "isa": next((flag for flag in ISA_FLAGS if flag in flags), "none"),
        "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "unset"),
        "cores": str(os.cpu_count()),
        "l2_cache": _l2_cache_per_core(caches),
        "mindspore": mindspore,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }


class DeviceUnavailableError(RuntimeError):
    """The configured device target is not present on this machine."""


def device_available(device_target: str) -> bool:
    """Cheap presence check, without loading MindSpore (driver device nodes or tools)."""
    if device_target == "CPU":
        return True
    if device_target == "GPU":
        return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None
    if device_target == "Ascend":
        return bool(glob.glob("/dev/davinci[0-9]*")) or shutil.which("npu-smi") is not None
    # imported here: ``import trainlib`` runs this module, and building the parameter models costs a third of a second
    from trainlib.params import DeviceTarget

    raise ValueError(f"unknown device_target {device_target!r}; choose one of {get_args(DeviceTarget)}")


def require_device(device_target: str, env: str | None = None, *, rehearsal: str | None = None) -> None:
    """Fail at once, naming the device, when ``device_target`` is absent; ``rehearsal``, the command that rehearses
    the environment's recipe on this CPU instead (``runtime.fast_dev_run``), is named in the error."""
    if not device_available(device_target):
        where = f" (configuration environment '{env}')" if env else ""
        hint = {"GPU": "no NVIDIA GPU (/dev/nvidia*, nvidia-smi)", "Ascend": "no Ascend NPU (/dev/davinci*, npu-smi)"}
        instead = (
            f" To rehearse this recipe on this CPU instead (every node, a few batches): {rehearsal}"
            if rehearsal
            else ""
        )
        raise DeviceUnavailableError(
            f"runtime.device_target is {device_target}{where}, but this machine has "
            f"{hint[device_target]}. Run on a machine with that device, or use the CPU default "
            f"(drop --env).{instead}"
        )


MAX_CALL_DEPTH = 10000


def configure_mindspore(device_target: str = "CPU", mode: str = "graph", seed: int = 0) -> None:
    """Select the device, execution mode and global seed for this process."""
    import mindspore as ms

    from trainlib.distributed.launch import rank_context

    require_device(device_target)
    if rank_context().size == 1:  # an msrun worker chose its device before init(); it cannot change
        ms.set_device(device_target)
    # THOR's graphs loop over every preconditioned layer: BERT-large's 147 Dense layers pass MindSpore's default
    # limit of 1,000 nested calls when the graph is compiled ("Exceed function call depth limit 1000")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, max_call_depth=MAX_CALL_DEPTH)
    ms.set_seed(seed)
