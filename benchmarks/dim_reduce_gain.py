"""Stage-2 top-1 minus control top-1 of the dim_reduce pipeline, from one run.

Runs ``kedro run --pipelines=dim_reduce`` (the CPU default unless ``--env`` is given) in this
project and prints the report: stage 1, stage 2 (P-BFGS in the PCA subspace) and the control
(Momentum continued from the same stage-1 checkpoint for the same epochs). Goal: >= +1.0 point.

    .venv/bin/python benchmarks/dim_reduce_gain.py [--env ENV] [--params "k=v,..."]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

PROJECT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default=None)
    parser.add_argument("--params", default=None)
    args = parser.parse_args()
    command = [sys.executable, "-m", "kedro", "run", "--pipelines=dim_reduce"]
    command += [f"--env={args.env}"] if args.env else []
    command += [f"--params={args.params}"] if args.params else []
    started = time.perf_counter()
    subprocess.run(command, cwd=PROJECT, check=True)
    elapsed = time.perf_counter() - started
    report = pd.read_csv(PROJECT / "data/08_reporting/dim_reduce/report.csv")
    steps = pd.read_csv(PROJECT / "data/08_reporting/dim_reduce/stage2_steps.csv")
    print(f"\ndim_reduce run: {elapsed / 60:.1f} min")
    print(report.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if "step_size" in steps:
        print(
            f"stage 2: {len(steps)} steps, {100 * (steps['step_size'] > 0).mean():.0f}% accepted a step, "
            f"mean trials {steps['trials'].mean():.2f}"
        )
    gain = report.set_index("model").loc["stage2", "top1_minus_control"]
    print(f"stage-2 top-1 minus control top-1: {100 * gain:+.2f} points (goal >= +1.00)")


if __name__ == "__main__":
    main()
