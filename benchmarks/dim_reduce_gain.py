"""Stage-2 top-1 minus control top-1 of dim_reduce over several seeds, from the study pipeline.

Runs ``kedro run --pipelines=study`` with ``study.recipes=[dim_reduce]`` (``study_runner.run_study``): per
seed, stage 1, the PCA of its trajectory, then stage 2 (P-BFGS in the subspace) and the control (Momentum
continued from the same stage-1 checkpoint for the same epochs). Prints each run and stage 2 minus control
as the mean of the per-seed differences with its 95 % t-interval. Goal: >= +1.0 point, interval above 0.

    .venv/bin/python benchmarks/dim_reduce_gain.py [--seeds 0,1,2] [--env ENV] [--params "k=v,..."]
"""

from __future__ import annotations

import argparse

from study_runner import print_outcome, run_study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-every-steps", type=int, default=20)
    parser.add_argument("--env", default=None)
    parser.add_argument("--params", default="", help="further overrides, as kedro run --params takes them")
    args = parser.parse_args()
    overrides = {
        "study.recipes": ["dim_reduce"],
        "study.seeds": [int(seed) for seed in args.seeds.split(",")],
        "study.eval_every_steps": args.eval_every_steps,
    }
    print_outcome(run_study(overrides, env=args.env, extra_params=args.params))


if __name__ == "__main__":
    main()
