"""Process-level set-up for MindSpore: CPU speed settings, device checks, context.

``apply_cpu_defaults`` must run before MindSpore is imported; the package ``__init__`` calls
it, so ``kedro run`` and the tests get it without any shell set-up.
"""

from __future__ import annotations

import glob
import os
import shutil

DEVICE_TARGETS = ("CPU", "GPU", "Ascend")

# oneDNN picks a reference 3x3 convolution on AVX-512 machines here (30x slower); AVX2 kernels
# are the fast path. GLOG_v=3 keeps MindSpore's C++ warnings out of Kedro's log.
CPU_DEFAULTS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "GLOG_v": "3"}


def apply_cpu_defaults() -> None:
    """Set MindSpore's CPU speed settings unless the user already set them."""
    for key, value in CPU_DEFAULTS.items():
        os.environ.setdefault(key, value)


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
    raise ValueError(f"unknown device_target {device_target!r}; choose one of {DEVICE_TARGETS}")


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

    from pipelines.distributed.launch import rank_context

    require_device(device_target)
    if rank_context().size == 1:  # an msrun worker chose its device before init(); it cannot change
        ms.set_device(device_target)
    # THOR's graphs loop over every preconditioned layer: BERT-large's 147 Dense layers pass MindSpore's default
    # limit of 1,000 nested calls when the graph is compiled ("Exceed function call depth limit 1000")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, max_call_depth=MAX_CALL_DEPTH)
    ms.set_seed(seed)
