"""Where do THOR and dim_reduce pay off on this machine? The study pipeline over a grid of settings.

Each setting is one ``kedro run --pipelines=study --params=...`` (a process of its own, as a user runs it):
the recipes over the same seeds on the same data, budgets and evaluation. After each, the study's paired
differences (``data/08_reporting/study/paired.csv``) and per-run table are copied to
``data/08_reporting/regime_search/<grid>/<setting>/``, and one row per (setting, measure) goes into
``<grid>.csv`` there; at the end the grid prints as a Markdown table (mean [95 % CI], n seeds) with the
issue's goal checked: THOR / Momentum time to target <= 0.6, stage 2 - control >= +1.0 point, each with an
interval that excludes no effect (ratio 1, difference 0).

Rerunning skips the settings already in ``<grid>.csv``, and the study itself never retrains a finished
(recipe, seed) run, so a killed search goes on where it stopped.

    .venv/bin/python benchmarks/regime_search.py --grid thor [--seeds 0,1,2] [--only small,batch128]
    .venv/bin/python benchmarks/regime_search.py --grid dim_reduce --table   # print the table only
"""

from __future__ import annotations

import argparse

import pandas as pd
from study_runner import PROJECT, TABLES, interval, params_argument, read_table, run_study

from trainlib.readable import write_csv

RESULTS = PROJECT / "data/08_reporting/regime_search"

# Every setting trains on 600 train images per class (6,000), 32 px, 3,000 val images (600 for the step
# evaluations) unless it says otherwise: about a minute per run on 2 cores.
SMALL = {"data.max_per_class.train": 600, "study.eval_every_steps": 10}

# the dim_reduce grid stops stage 1 at epoch 4 of a 6-epoch schedule and keeps the weights every 8 steps from
# epoch 2 (35 files at 94 steps per epoch), so that a seed takes about 2.5 minutes
DIM_REDUCE_SMALL = {
    "dim_reduce.stage1.epochs": 4,
    "dim_reduce.stage1.schedule_epochs": 6,
    "dim_reduce.stage1.trajectory.start_epoch": 2,
    "dim_reduce.stage1.trajectory.every_steps": 8,
    "dim_reduce.collect.n_files": 30,
    "target.top1": 0.8,
}
TARGET = {"study.epochs": 2, "target.top1": 0.7}
GRIDS: dict[str, dict[str, dict[str, object]]] = {
    "thor": {
        "small": TARGET,
        "block32": TARGET | {"thor.block_size": 32},
        "frequency100": TARGET | {"thor.frequency": 100},
        "frequency20": TARGET | {"thor.frequency": 20},
        # THOR's lead is largest early (top-1 after epoch 1: about 72 % against Momentum's 37 % in warm-up)
        "target60": {"study.epochs": 2, "target.top1": 0.6},
        "trace_rule": TARGET | {"thor.trace_rule": [0.01, 0.001]},
        "batch128": TARGET | {"baseline.batch_size": 128, "thor.batch_size": 128},
        "block32_frequency100": TARGET | {"thor.block_size": 32, "thor.frequency": 100},
        "full_data": {"study.epochs": 2, "target.top1": 0.75, "data.max_per_class.train": 1500},
    },
    "dim_reduce": {
        "small": DIM_REDUCE_SMALL,
        # stage 1 stops early in a long schedule: the control goes on at a high learning rate
        "early_stop": DIM_REDUCE_SMALL
        | {"dim_reduce.stage1.epochs": 3, "dim_reduce.stage1.schedule_epochs": 10, "dim_reduce.collect.n_files": 20},
        "stage2_epochs2": DIM_REDUCE_SMALL | {"dim_reduce.stage2.epochs": 2},
        "components8": DIM_REDUCE_SMALL | {"dim_reduce.pca.n_components": 8},
        "components24": DIM_REDUCE_SMALL | {"dim_reduce.pca.n_components": 24},
    },
}
RECIPES = {"thor": ["baseline", "thor"], "dim_reduce": ["dim_reduce"]}
SUBJECT = {"thor": "thor", "dim_reduce": "stage2"}  # the row compared across settings
# (comparison, measure, goal test, no-effect value): the goals
GOALS = {
    ("thor vs baseline", "time_to_target_ratio"): (lambda mean, high: high < 1 and mean <= 0.6),
    ("stage2 vs control", "final_top1_difference"): (lambda mean, low: low > 0 and mean >= 0.01),
}


def run_setting(grid: str, name: str, overrides: dict[str, object], seeds: list[int]) -> pd.DataFrame:
    print(f"[{grid}/{name}]", flush=True)
    outcome = run_study(SMALL | {"study.recipes": RECIPES[grid], "study.seeds": seeds} | overrides)
    folder = RESULTS / grid / name
    folder.mkdir(parents=True, exist_ok=True)
    for table in TABLES:
        write_csv(getattr(outcome, table), folder / f"{table}.csv")
    paired = outcome.paired.copy()
    paired.insert(0, "setting", name)
    paired.insert(1, "overrides", params_argument(overrides) or "(grid defaults)")
    paired["seeds"] = ",".join(map(str, seeds))
    paired["study_wall_s"] = round(outcome.wall_s, 1)
    print(f"[{grid}/{name}] {outcome.wall_s:.0f} s\n{paired.to_string(index=False)}", flush=True)
    return paired


def markdown(grid: str, done: pd.DataFrame) -> str:
    """Each setting's paired comparisons, recomputed from its per-run table with the study's own statistics;
    a setting's overrides are shown as its changes to the grid's ``small`` setting."""
    from trainlib.study.statistics import paired_differences

    lines = [
        "| setting | overrides | comparison | measure | mean [95 % CI] | n | goal | study wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    small = GRIDS[grid]["small"]
    for setting, rows in done.groupby("setting", sort=False):
        first = rows.iloc[0]
        own = {k: v for k, v in GRIDS[grid].get(setting, {}).items() if small.get(k) != v}
        changes = params_argument(own) if setting != "small" else first["overrides"]
        for _, row in paired_differences(read_table(RESULTS / grid / setting / "runs.csv")).iterrows():
            goal = GOALS.get((row["comparison"], row["measure"]))
            bound = row["ci_high"] if "ratio" in row["measure"] else row["ci_low"]
            met = "" if goal is None else ("met" if goal(row["mean"], bound) else "not met")
            cell = interval(row["mean"], row["ci_low"], row["ci_high"], "difference" in row["measure"])
            lines.append(
                f"| {setting} | `{changes or '(as small)'}` | {row['comparison']} | {row['measure']} | {cell} | "
                f"{row['n']} | {met} | {first['study_wall_s']:.0f} |"
            )
    return "\n".join(lines)


def against_small(grid: str, row: str) -> str:
    """Each setting's ``row`` (thor, stage2) against the grid's ``small`` setting's on the same seeds: the
    per-seed differences of final top-1 and ratios of time to target, mean [95 % CI] (e.g. the trace rule's
    cost in accuracy)."""
    from trainlib.study.statistics import t_interval

    def runs_of(setting: str) -> pd.DataFrame:
        runs = read_table(RESULTS / grid / setting / "runs.csv")
        return runs[runs["result"] == row].set_index("seed")

    reference = runs_of("small")
    lines = [f"| setting | {row} final top-1 vs small | {row} time to target / small | n |", "|---|---|---|---|"]
    for folder in sorted((RESULTS / grid).iterdir()):
        if folder.name == "small" or not (folder / "runs.csv").exists():
            continue
        runs = runs_of(folder.name)
        seeds = sorted(set(runs.index) & set(reference.index))
        top1 = t_interval([runs.at[s, "final_top1"] - reference.at[s, "final_top1"] for s in seeds])
        ratio = t_interval([runs.at[s, "time_to_target_s"] / reference.at[s, "time_to_target_s"] for s in seeds])
        lines.append(
            f"| {folder.name} | {interval(*top1[:3], points=True)} | {interval(*ratio[:3], False)} | {top1[3]} |"
        )
    return "\n".join(lines)


def summary_table(grid: str) -> str:
    """Per setting and result row: mean final top-1 and time to target with their 95 % CIs."""
    lines = [
        "| setting | row | final top-1 % | time to target (s) | epochs to target | reached |",
        "|---|---|---|---|---|---|",
    ]
    for folder in sorted((RESULTS / grid).iterdir()):
        if not (folder / "summary.csv").exists():
            continue
        for _, row in read_table(folder / "summary.csv").iterrows():
            top1, time_s, epochs = (
                f"{scale * row[m]:.{digits}f} [{scale * row[f'{m}_ci_low']:.{digits}f}, "
                f"{scale * row[f'{m}_ci_high']:.{digits}f}]"
                for m, scale, digits in (("final_top1", 100, 2), ("time_to_target_s", 1, 1), ("epochs_to_target", 1, 2))
            )
            lines.append(
                f"| {folder.name} | {row['result']} | {top1} | {time_s} | {epochs} | "
                f"{row['time_to_target_s_n']}/{row['runs']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=sorted(GRIDS), required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    parser.add_argument("--table", action="store_true", help="print the table of the settings done; run nothing")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    table = RESULTS / f"{args.grid}.csv"
    done = pd.read_csv(table) if table.exists() else pd.DataFrame()
    if not args.table:
        chosen = args.only.split(",") if args.only else list(GRIDS[args.grid])
        for name in chosen:
            if len(done) and name in set(done["setting"]):
                print(f"[{args.grid}/{name}] done earlier: {table}")
                continue
            done = pd.concat([done, run_setting(args.grid, name, GRIDS[args.grid][name], seeds)], ignore_index=True)
            table.parent.mkdir(parents=True, exist_ok=True)
            write_csv(done, table)
    if not len(done):
        print("nothing run yet")
        return
    print(markdown(args.grid, done), summary_table(args.grid), against_small(args.grid, SUBJECT[args.grid]), sep="\n\n")


if __name__ == "__main__":
    main()
