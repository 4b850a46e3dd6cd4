"""Ingest and loader figures on a generated ImageNet-like tree, in one run.

The tree: ``<root>/ilsvrc/<synset>/<synset>_<n>.JPEG`` and ``<root>/ilsvrc_eval/<synset>/
ILSVRC2012_val_<n>.JPEG`` (one val image per 25 train images, as ImageNet's 50,000 per 1.28 M),
``--classes`` synset folders, JPEGs of ImageNet's mixed sizes (sides of 150-500 pixels, mostly
500 x 375 and 375 x 500, about 110 KB at quality 90), with one CMYK, one greyscale and one PNG
under a .JPEG name per 1,000 files. Generated once under ``--root`` and reused by later runs.

Each stage runs in its own process, so its peak memory (maximum resident set size) is its own:

1. first scan: ``scan_image_tree`` at ``verify: decode`` with an empty verdict cache (files/s,
   peak memory of the manifest stage, that of one verification worker);
2. rerun scan: the same on the unchanged tree (it reads no image: only ``stat`` and the cache);
3. conversion: ``create_dataset`` building the train split's link tree (s per 1,000 images, disk
   used), then ``create_dataset`` again as a training's start reuses it (every file's ``stat``);
4. loaders, alternated ``--repeats`` times: images/s of ``create_dataset`` (``ImageFolderDataset``
   over the link tree of the manifest's files) against ``ImageFolderDataset`` over the tree itself with the same ops
   (RandomCropDecodeResize 224, flip, normalise, HWC2CHW, ``--workers`` map workers, batches of
   ``--batch-size``), and the rows/s of each source alone (no decode), with each loader's peak memory.

    .venv/bin/python benchmarks/loader_throughput.py --files 20000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)
from trainlib.data.verify import worker_count

SPLIT_DIRS = {"train": "ilsvrc", "val": "ilsvrc_eval"}
VAL_EVERY = 26  # one val image per 25 train ones
# ImageNet's typical shapes (width, height): most are 500 x 375 or 375 x 500.
COMMON_SHAPES = ((500, 375), (375, 500), (500, 333), (500, 500))
COMPLETE_MARKER = ".complete"


def synset(label: int) -> str:
    return f"n{1440764 + 7919 * label:08d}"


def _write_images(job: tuple[str, list[tuple[str, int, int]]]) -> int:
    """Worker: write one class folder's files (name, index, seed) as ImageNet-like JPEGs."""
    from PIL import Image

    folder, files = job
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, index, seed in files:
        rng = np.random.default_rng(seed)
        if rng.random() < 0.7:
            width, height = COMMON_SHAPES[rng.integers(len(COMMON_SHAPES))]
        else:
            width, height = (int(v) for v in rng.integers(150, 501, 2))
        # smooth colour fields plus fine noise: compresses like photographs do (about 110 KB)
        coarse = rng.integers(0, 256, (height // 32 + 2, width // 32 + 2, 3)).astype(np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)
        pixels = np.asarray(image, dtype=np.int16) + rng.integers(-24, 25, (height, width, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        path = Path(folder) / name
        if index % 1000 == 1:
            image.convert("CMYK").save(path, "JPEG", quality=90)
        elif index % 1000 == 2:
            image.convert("L").save(path, "JPEG", quality=90)
        elif index % 1000 == 3:
            image.save(path, "PNG")  # a PNG under a .JPEG name, as ImageNet has one
        else:
            image.save(path, "JPEG", quality=90)
    return len(files)


def generate_tree(root: Path, files: int, classes: int) -> None:
    """Write the ImageNet-like tree (once: a complete tree of this size is reused)."""
    marker = root / COMPLETE_MARKER
    wanted = f"{files} {classes}"
    if marker.is_file() and marker.read_text() == wanted:
        return
    shutil.rmtree(root, ignore_errors=True)
    jobs: dict[str, list] = {}
    for index in range(files):
        label = index % classes
        if index % VAL_EVERY == VAL_EVERY - 1:
            folder, name = SPLIT_DIRS["val"], f"ILSVRC2012_val_{index + 1:08d}.JPEG"
        else:
            folder, name = SPLIT_DIRS["train"], f"{synset(label)}_{index + 1}.JPEG"
        jobs.setdefault(str(root / folder / synset(label)), []).append((name, index, index))
    started = time.perf_counter()
    with ProcessPoolExecutor() as pool:
        written = sum(pool.map(_write_images, jobs.items()))
    marker.write_text(wanted)
    print(f"generated {written} files in {time.perf_counter() - started:.0f} s under {root}", flush=True)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def disk_bytes(folder: Path) -> int:
    """Space ``folder`` takes on disk: allocated blocks of its entries, links not followed."""
    total = 0
    for directory, names, files in os.walk(folder):
        for name in (*names, *files):
            total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total + os.lstat(folder).st_blocks * 512


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# ---------------------------------------------------------------- stages (each in its own process)


class _DescendantPeak:
    """Peak resident memory of this process's descendants (verification workers), polled every 0.1 s."""

    def __init__(self):
        import threading

        self.peak_mb, self.running = 0.0, True
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        import psutil

        me = psutil.Process()
        while self.running:
            for child in me.children(recursive=True):
                try:
                    self.peak_mb = max(self.peak_mb, child.memory_info().rss / 2**20)
                except psutil.Error:
                    pass
            time.sleep(0.1)

    def stop(self) -> float:
        self.running = False
        self.thread.join()
        return self.peak_mb


def stage_scan(args: argparse.Namespace) -> dict:
    import pandas as pd

    from trainlib.data.folder import scan_image_tree

    pd.array(["loaded"], dtype="str")  # pandas loads pyarrow for its first string column: not the manifest's memory
    before = current_rss_mb()
    workers = _DescendantPeak()
    started = time.perf_counter()
    result = scan_image_tree(args.root, SPLIT_DIRS, "decode", "exclude", cache_path=args.cache / "verified.sqlite")
    elapsed = time.perf_counter() - started
    worker_peak = workers.stop()
    result.manifest.to_pickle(args.cache / "manifest.pkl")
    files = len(result.manifest) + len(result.bad_files)
    return {
        "files": files,
        "verified": result.verified_files,
        "bad": len(result.bad_files),
        "seconds": elapsed,
        "files_per_s": files / elapsed,
        "rss_before_mb": before,
        "peak_rss_mb": peak_rss_mb(),
        "worker_peak_rss_mb": worker_peak,
        "cache_bytes": (args.cache / "verified.sqlite").stat().st_size,
    }


def stage_convert(args: argparse.Namespace) -> dict:
    import mindspore.dataset  # noqa: F401  (loaded before the clock starts: seconds, not the build's)
    import pandas as pd

    from trainlib.data.folder import create_dataset

    manifest = pd.read_pickle(args.cache / "manifest.pkl")
    train = manifest[manifest["split"] == "train"]
    before = current_rss_mb()
    started = time.perf_counter()
    create_dataset(manifest, "train", 224, args.batch_size, training=True, cache_dir=args.cache)
    elapsed = time.perf_counter() - started
    started = time.perf_counter()
    create_dataset(manifest, "train", 224, args.batch_size, training=True, cache_dir=args.cache)
    reuse = time.perf_counter() - started
    links = args.cache / "links"
    return {
        "images": len(train),
        "seconds": elapsed,
        "s_per_1000": 1000 * elapsed / len(train),
        "reuse_seconds": reuse,
        "disk_bytes": disk_bytes(links),
        "images_bytes": int(train["size"].sum()),
        "rss_before_mb": before,
        "peak_rss_mb": peak_rss_mb(),
    }


def _image_ops():
    from mindspore.dataset import vision

    from mindir_serving.images import normalise_ops

    return [
        vision.RandomCropDecodeResize(224, scale=(0.08, 1.0), ratio=(0.75, 1.333)),
        vision.RandomHorizontalFlip(prob=0.5),
        *normalise_ops(),
    ]


def _loader(args: argparse.Namespace, which: str, decode: bool):
    """The train loader ``which`` (ours | image_folder); without ``decode`` its source alone."""
    import mindspore.dataset as ds
    import pandas as pd

    from trainlib.data.folder import create_dataset

    if which == "ours":
        manifest = pd.read_pickle(args.cache / "manifest.pkl")
        dataset = create_dataset(
            manifest, "train", 224, args.batch_size, training=True, num_workers=args.workers, cache_dir=args.cache
        )
        if decode:
            return dataset
        return dataset.children[0].children[0]  # batch <- map <- ImageFolderDataset: the reader alone
    dataset = ds.ImageFolderDataset(str(Path(args.root) / SPLIT_DIRS["train"]), shuffle=True, decode=False)
    if not decode:
        return dataset
    dataset = dataset.map(operations=_image_ops(), input_columns="image", num_parallel_workers=args.workers)
    return dataset.batch(args.batch_size, drop_remainder=True)


def stage_loader(args: argparse.Namespace) -> dict:
    """Images/s (or source rows/s) of one loader over ``--batches`` batches after a warm-up."""
    which, decode = args.which, args.stage == "loader"
    before = current_rss_mb()
    dataset = _loader(args, which, decode)
    rows = args.batches * args.batch_size
    warm_up = 5 if decode else 5 * args.batch_size
    wanted = (args.batches if decode else rows) + warm_up
    iterator = dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)
    count, started = 0, None
    for index, item in enumerate(iterator):
        if index == warm_up:
            started = time.perf_counter()
        if index >= warm_up:
            count += len(item[1]) if decode else 1
        if index + 1 >= wanted:
            break
    elapsed = time.perf_counter() - started
    rate = count / elapsed
    return {"which": which, "rate": rate, "counted": count, "rss_before_mb": before, "peak_rss_mb": peak_rss_mb()}


STAGES = {"scan": stage_scan, "convert": stage_convert, "loader": stage_loader, "source": stage_loader}


def run_stage(args: argparse.Namespace, stage: str, *extra: str) -> dict:
    """Run ``stage`` in a fresh process; returns the JSON figures it printed last."""
    command = [sys.executable, __file__, "--stage", stage, *extra, *sys.argv[1:]]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"stage {stage} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000, help="images in the tree (train and val)")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--root", type=Path, default=Path("/tmp/loader-benchmark/tree"))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/loader-benchmark/cache"))
    parser.add_argument("--workers", type=int, default=2, help="map workers of both loaders")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=150, help="timed batches per loader run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stage", choices=tuple(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--which", choices=("ours", "image_folder"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        print(json.dumps(STAGES[args.stage](args)))
        return

    generate_tree(args.root, args.files, args.classes)
    shutil.rmtree(args.cache, ignore_errors=True)
    args.cache.mkdir(parents=True)
    first = run_stage(args, "scan")
    rerun = run_stage(args, "scan")
    convert = run_stage(args, "convert")
    rates: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):  # alternated, so machine noise hits both alike
        for stage in ("loader", "source"):
            for which in ("ours", "image_folder"):
                rates.setdefault((stage, which), []).append(run_stage(args, stage, "--which", which))

    def median(stage: str, which: str) -> float:
        return statistics.median(r["rate"] for r in rates[stage, which])

    def peak(stage: str, which: str) -> float:
        return max(r["peak_rss_mb"] for r in rates[stage, which])

    tree_mb = folder_bytes(args.root) / 2**20
    print(f"\ntree: {first['files']} files, {args.classes} classes, {tree_mb:.0f} MB, {os.cpu_count()} cores")
    cores = worker_count()

    def per_file(scan: dict) -> float:
        return (scan["peak_rss_mb"] - scan["rss_before_mb"]) * 2**20 / scan["files"]

    print(
        f"first scan (verify decode): {first['seconds']:.1f} s, {first['files_per_s']:.0f} files/s on {cores} "
        f"cores ({first['files_per_s'] / cores:.0f} files/s per core), {first['verified']} read, {first['bad']} bad; "
        f"peak memory {first['peak_rss_mb']:.0f} MB ({first['rss_before_mb']:.0f} MB before: "
        f"{per_file(first):.0f} bytes per file), each worker at most {first['worker_peak_rss_mb']:.0f} MB; "
        f"verdict cache {first['cache_bytes'] / first['files']:.0f} bytes per file"
    )
    print(
        f"rerun scan: {rerun['seconds']:.1f} s, {rerun['files_per_s']:.0f} files/s, {rerun['verified']} read; "
        f"peak memory {rerun['peak_rss_mb']:.0f} MB ({per_file(rerun):.0f} bytes per file)"
    )
    print(
        f"link tree: {convert['images']} images in {convert['seconds']:.2f} s = {convert['s_per_1000']:.3f} s per "
        f"1,000, {convert['disk_bytes'] / convert['images']:.0f} bytes on disk per image; reused (stat of every "
        f"file) in {convert['reuse_seconds']:.2f} s; peak memory {convert['peak_rss_mb']:.0f} MB "
        f"({convert['rss_before_mb']:.0f} MB before)"
    )
    ours, folder = median("loader", "ours"), median("loader", "image_folder")
    print(
        f"train loader, {args.workers} workers, batch {args.batch_size}: ours {ours:.0f} img/s "
        f"(peak memory {peak('loader', 'ours'):.0f} MB), ImageFolderDataset {folder:.0f} img/s "
        f"({peak('loader', 'image_folder'):.0f} MB): ratio {ours / folder:.2f}"
    )
    print(
        f"source alone: over the link tree {median('source', 'ours'):.0f} rows/s, over the tree "
        f"{median('source', 'image_folder'):.0f} rows/s; runs: "
        + "; ".join(f"{s}/{w} " + ",".join(f"{r['rate']:.0f}" for r in v) for (s, w), v in rates.items())
    )


if __name__ == "__main__":
    main()
