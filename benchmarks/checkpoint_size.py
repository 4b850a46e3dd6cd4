"""Writing and reading a checkpoint past protobuf's 2 GB: time and peak memory, and MindSpore's ``.ckpt`` beside it.

The large checkpoint is one float32 matrix of ``--side`` x ``--side`` (23,200: 2.15 GB, a Dense layer of that size),
or that matrix in ``--pieces`` arrays of whole rows (a network of many layers), plus a bias, a 0-d step and metadata.
Each measurement runs in a process of its own, so its peak resident memory (``VmHWM``) is its own; a thread also
samples its anonymous memory (``RssAnon``: the arrays, and whatever copies a format makes) every 5 ms and reports the
peak above the start of the measurement (a file's pages mapped by a reader count in ``VmHWM``, not here): ``write``
makes the arrays and saves them (``engine.checkpoint.save_checkpoint``, safetensors), ``read`` loads the file
(``load_checkpoint``), and ``mindspore-write`` / ``mindspore-read`` do the same through ``mindspore.save_checkpoint``
/ ``load_checkpoint`` (the ``.ckpt`` format the project wrote before; protobuf documents a 2 GB limit, and a failed
read is printed as its result). The reads follow the writes, so the file is in the page cache (a warm read). One run
each.

``--small`` instead times both formats on ResNet-50's parameters plus Momentum moments (about 200 MB, the size of
most of the project's checkpoints), the median of ``--repeats`` saves and loads each.

    .venv/bin/python benchmarks/checkpoint_size.py --dir /tmp/checkpoint_size
    .venv/bin/python benchmarks/checkpoint_size.py --dir /tmp/checkpoint_size --side 30300 --pieces 900
    .venv/bin/python benchmarks/checkpoint_size.py --dir /tmp/checkpoint_size --small --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)

PHASES = ("write", "read", "mindspore-write", "mindspore-read")


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


class AnonymousPeak:
    """The peak of ``RssAnon`` above its value at the start, sampled every 5 ms by a thread while in the block."""

    def __enter__(self):
        self.start, self.peak, self.running = status_bytes("RssAnon"), 0, True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, status_bytes("RssAnon") - self.start)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, status_bytes("RssAnon") - self.start)


def large_checkpoint(side: int, pieces: int):
    import numpy as np

    from trainlib.engine.checkpoint import Checkpoint

    weight = np.random.default_rng(0).standard_normal((side, side), dtype=np.float32)
    if pieces > 1:
        weights = {f"layer{i:04d}.weight": rows.copy() for i, rows in enumerate(np.array_split(weight, pieces))}
        del weight
    else:
        weights = {"dense.weight": weight}
    params = {**weights, "dense.bias": np.zeros(side, np.float32), "optimizer.global_step": np.array(1)}
    return Checkpoint(params, {"epoch": 1, "fingerprint": "benchmark"})


def mindspore_entries(checkpoint):
    import mindspore as ms

    return [{"name": name, "data": ms.Tensor(value)} for name, value in checkpoint.params.items()]


def phase(name: str, path: Path, side: int, pieces: int) -> dict:
    """One measurement, in this process: seconds and peak resident memory before and after it."""
    import mindspore as ms

    from trainlib.engine.checkpoint import load_checkpoint, save_checkpoint

    result: dict = {"phase": name, "file": str(path)}
    if name in ("write", "mindspore-write"):
        checkpoint = large_checkpoint(side, pieces)
        result["arrays_gb"] = sum(v.nbytes for v in checkpoint.params.values()) / 1e9
        if name == "mindspore-write":
            entries = mindspore_entries(checkpoint)
            del checkpoint
            save = lambda: ms.save_checkpoint(entries, str(path), append_dict={"__metadata__": "{}"})  # noqa: E731
        else:
            save = lambda: save_checkpoint(checkpoint, path)  # noqa: E731
        result["peak_before_gb"] = peak_rss_bytes() / 1e9
        with AnonymousPeak() as anonymous:
            started = time.perf_counter()
            save()
            seconds = time.perf_counter() - started
    else:
        result["peak_before_gb"] = peak_rss_bytes() / 1e9
        with AnonymousPeak() as anonymous:
            started = time.perf_counter()
            try:
                loaded = load_checkpoint(path).params if name == "read" else ms.load_checkpoint(str(path))
                result["tensors"] = len(loaded)
            except Exception as error:  # the old format's failure is a result here
                result["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            seconds = time.perf_counter() - started
    result["seconds"] = round(seconds, 2)
    result["anonymous_peak_gb"] = anonymous.peak / 1e9
    result["peak_gb"] = peak_rss_bytes() / 1e9
    result["file_gb"] = path.stat().st_size / 1e9 if path.exists() else None
    return result


def run_phases(folder: Path, side: int, pieces: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in PHASES:
        path = folder / ("large.ckpt" if not name.startswith("mindspore") else "large_mindspore.ckpt")
        command = [sys.executable, __file__, "--dir", str(folder), "--side", str(side), "--pieces", str(pieces)]
        command += ["--phase", name]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        print(output.strip().splitlines()[-1], flush=True)
        if name.endswith("read"):
            path.unlink()


def small(folder: Path, repeats: int) -> None:
    """Both formats on ResNet-50's parameters and Momentum moments: median save and load seconds."""
    import mindspore as ms

    from trainlib.engine.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from trainlib.engine.state import network_state
    from trainlib.models.resnet import create_resnet

    params = network_state(create_resnet("resnet50", 1000))
    params |= {f"optimizer.moments.{k}": v.copy() for k, v in params.items()}
    checkpoint = Checkpoint(params, {"epoch": 1})
    entries = mindspore_entries(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    ours, theirs = folder / "resnet50.ckpt", folder / "resnet50_mindspore.ckpt"
    times: dict[str, list[float]] = {"save": [], "load": [], "mindspore save": [], "mindspore load": []}
    for _ in range(repeats):
        for key, action in (
            ("save", lambda: save_checkpoint(checkpoint, ours)),
            ("load", lambda: load_checkpoint(ours)),
            ("mindspore save", lambda: ms.save_checkpoint(entries, str(theirs))),
            ("mindspore load", lambda: ms.load_checkpoint(str(theirs))),
        ):
            if key == "mindspore save":
                theirs.unlink(missing_ok=True)  # MindSpore makes its file read-only
            started = time.perf_counter()
            action()
            times[key].append(time.perf_counter() - started)
    sizes = {"safetensors_mb": ours.stat().st_size / 1e6, "mindspore_ckpt_mb": theirs.stat().st_size / 1e6}
    print(json.dumps({**sizes, **{f"{k} median s": round(statistics.median(v), 3) for k, v in times.items()}}))
    ours.unlink()
    theirs.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, required=True, help="a folder with room for two 2.2 GB files")
    parser.add_argument("--side", type=int, default=23_200)
    parser.add_argument("--pieces", type=int, default=1, help="arrays the matrix is split into, by rows")
    parser.add_argument("--phase", choices=PHASES, help="one measurement in this process (what the others start)")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.small:
        small(args.dir, args.repeats)
    elif args.phase:
        path = args.dir / ("large_mindspore.ckpt" if args.phase.startswith("mindspore") else "large.ckpt")
        print(json.dumps(phase(args.phase, path, args.side, args.pieces)))
    else:
        run_phases(args.dir, args.side, args.pieces)


if __name__ == "__main__":
    main()
