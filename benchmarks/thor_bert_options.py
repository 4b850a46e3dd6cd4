"""THOR's options on the BERT default over seeds (issue 29, item 8): each option at the documented lr and at the lrs
where the documented THOR fails, beside the AdamWeightDecay control and the most frequent token's accuracy, all on
one set of examples.

One process prepares thor_bert's text as the pipeline does (``conf/base`` plus ``--params``), then trains each row of
``ROWS`` on each seed through the recipe's own functions (``train_bert_thor``, ``train_bert_control``: the
engine, its evaluations and ``CollapseWatch``), each from that seed's initial weights. A row that stops on
``ThorInverseError`` or ``ThorDivergenceError`` is recorded with its error. Each finished training is appended to
``--out`` at once; a second call skips the (row, seed) pairs already there, so a long grid can be stopped and
resumed (the examples' digest is in every line: a resumed grid on other examples says so and stops).

    .venv/bin/python benchmarks/thor_bert_options.py --seeds 0 1 2 [--rows control thor kl_clip_lr0.03] \
        [--out data/08_reporting/benchmarks/thor_bert_options.csv]
    .venv/bin/python benchmarks/thor_bert_options.py --table      # the markdown table of --out
    .venv/bin/python benchmarks/thor_bert_options.py --cost 6     # ms per THOR step by option, side by side
"""

from __future__ import annotations

import argparse
import hashlib
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from thor_bert_inverse import load_conf
from thor_options_cost import interleaved_medians
from thor_vs_momentum import PROJECT

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)
from trainlib.readable import write_csv

DOCUMENTED_LR = 0.006464
KL_CLIP = "thor_bert.thor.kl_clip=0.001"
FACTORED = "thor_bert.thor.damping_method=factored"
EIGEN = "thor_bert.thor.compute_method=eigen"
GRAFT = ",".join(
    f"thor_bert.thor.adam_graft.{key}={value}"
    for key, value in (("beta1", "0.9"), ("beta2", "0.999"), ("eps", "1.0e-8"))
)


WARMUP_100 = "thor_bert.thor.lr.warmup_steps=100"


def thor_row(lr: float, option: str = "") -> str:
    return ",".join(filter(None, (f"thor_bert.thor.lr.peak={lr}", option)))


# name -> (training, --params overrides), in the order a grid runs them: the references and the options at the
# documented lr first, then the lrs where the documented THOR stops with an inverse error, then the graft at a
# smaller lr and options combined
ROWS = {
    "control": ("control", ""),
    "thor": ("thor", thor_row(DOCUMENTED_LR)),
    "kl_clip": ("thor", thor_row(DOCUMENTED_LR, KL_CLIP)),
    "factored": ("thor", thor_row(DOCUMENTED_LR, FACTORED)),
    "eigen": ("thor", thor_row(DOCUMENTED_LR, EIGEN)),
    "adam_graft": ("thor", thor_row(DOCUMENTED_LR, GRAFT)),
    **{
        f"{name}_lr{lr}": ("thor", thor_row(lr, option))
        for lr in (0.03, 0.1, 0.015)
        for name, option in (("kl_clip", KL_CLIP), ("factored", FACTORED), ("eigen", EIGEN), ("adam_graft", GRAFT))
    },
    # the graft at AdamWeightDecay's own peak lr: the graft gives each layer the size of an Adam step
    "adam_graft_lr0.001": ("thor", thor_row(0.001, GRAFT)),
    # ... and with AdamWeightDecay's warm-up (100 steps), there and at an lr between it and THOR's documented one
    **{f"adam_graft_lr{lr}_warmup100": ("thor", thor_row(lr, f"{GRAFT},{WARMUP_100}")) for lr in (0.003, 0.001)},
    # the step-size bound on the two options that collapse at the documented lr
    "factored+kl_clip": ("thor", thor_row(DOCUMENTED_LR, f"{FACTORED},{KL_CLIP}")),
    "eigen+kl_clip": ("thor", thor_row(DOCUMENTED_LR, f"{EIGEN},{KL_CLIP}")),
    "factored+kl_clip_lr0.015": ("thor", thor_row(0.015, f"{FACTORED},{KL_CLIP}")),
}


COST_ROWS = ("thor", "kl_clip", "factored", "eigen", "adam_graft")


def digest(examples: dict) -> str:
    hashed = hashlib.sha256()
    for name in sorted(examples):
        hashed.update(examples[name].tobytes())
    return hashed.hexdigest()[:12]


def prepared_text(conf, saved: Path):
    """thor_bert's examples as the pipeline prepares them, saved to ``saved`` the first time and read from it after:
    the WordPiece trainer does not give the same pieces in every process, and a resumed grid must train on the
    examples of the trainings it continues."""
    import numpy as np

    from trainlib.recipes.context import LanguageModelContext
    from trainlib.recipes.language_model import prepare_language_model

    bert = conf.thor_bert
    if not saved.is_file():
        context = prepare_language_model(bert, conf.runtime, conf.distributed)
        columns = {f"train.{k}": v for k, v in context.train_examples.items()}
        columns |= {f"held_out.{k}": v for k, v in context.held_out_examples.items()}
        saved.parent.mkdir(parents=True, exist_ok=True)
        np.savez(saved, vocabulary=np.array(context.vocabulary), **columns)
    with np.load(saved) as arrays:
        split = {
            part: {k.split(".", 1)[1]: arrays[k] for k in arrays if k.startswith(part + ".")}
            for part in ("train", "held_out")
        }
        vocabulary = tuple(arrays["vocabulary"].tolist())
    return LanguageModelContext(
        split["train"],
        split["held_out"],
        vocabulary,
        bert.network,
        bert.eval_batch_size,
        bert.step_eval_examples,
        conf.runtime,
        conf.distributed,
    )


def train_row(context, conf, training: str, checkpoint_dir: str) -> dict:
    """One training of ``training`` (thor | control) from the seed's initial weights; its figures or its error."""
    from trainlib.metrics import TRAIN_LOSS, VAL_MLM_ACCURACY
    from trainlib.recipes.language_model import COLLAPSE_STEP, COLLAPSED, MOST_FREQUENT_TOKEN_ACCURACY, build_bert
    from trainlib.recipes.thor_bert import train_bert_control, train_bert_thor

    bert = conf.thor_bert
    section = getattr(bert, training).model_copy(
        update={"checkpoint": getattr(bert, training).checkpoint.model_copy(update={"dir": checkpoint_dir})}
    )
    start = build_bert(bert.network, context.vocab_size, conf.runtime)
    train = train_bert_thor if training == "thor" else train_bert_control
    started = time.perf_counter()
    try:
        result = train(context, start, section)
    except FloatingPointError as error:  # ThorInverseError, ThorDivergenceError
        return {"error": f"{type(error).__name__}: {error}"[:300], "wall_s": time.perf_counter() - started}
    history = pd.DataFrame(result.history)
    figures = {
        "error": "",
        "wall_s": time.perf_counter() - started,
        "train_s": float(history["train/epoch_time_s"].sum()),
        "steps": int(result.steps_per_epoch * len(history)),
        "final_loss": float(history[TRAIN_LOSS].iloc[-1]),
        "mlm_accuracy": float(history[VAL_MLM_ACCURACY].iloc[-1]),
        "most_frequent_token_accuracy": float(result.summary[MOST_FREQUENT_TOKEN_ACCURACY]),
        "collapsed": bool(result.summary[COLLAPSED]),
        "collapse_step": result.summary.get(COLLAPSE_STEP, math.nan),
    }
    figures |= {f"mlm_accuracy_epoch{int(row.epoch)}": row[VAL_MLM_ACCURACY] for _, row in history.iterrows()}
    nsp = [column for column in history if column.endswith("nsp_accuracy")]
    return figures | ({"nsp_accuracy": float(history[nsp[0]].iloc[-1])} if nsp else {})


def print_table(frame: pd.DataFrame) -> None:
    """Per row: final masked-LM accuracy per seed (or the step its training stopped at), mean [95 % CI] of the
    finished seeds, the paired differences to AdamWeightDecay and to the documented THOR on the same seeds, collapsed
    runs, stopped runs, training ms per step; markdown, for docs/results.md."""
    from trainlib.study.statistics import t_interval

    def paired(rows: pd.DataFrame, reference: str) -> str:
        other = frame[frame["row"] == reference].set_index("seed")["mlm_accuracy"]
        mean, low, high, n = t_interval(
            [100 * (a - other[s]) for s, a in zip(rows["seed"], rows["mlm_accuracy"], strict=True) if s in other]
        )
        if n == 0 or rows["row"].iloc[0] == reference:
            return ""
        return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] (n={n})" if n > 1 else f"{mean:+.2f} (n=1)"

    def final(accuracy: float, error: str) -> str:
        stopped = re.search(r"step (\d+)", error)
        return f"{100 * accuracy:.2f}" if not error else f"stopped at {stopped[1] if stopped else '?'}"

    print(
        "| row | seeds | final masked-LM accuracy % per seed | mean [95 % CI] | vs AdamWeightDecay, paired (pt) "
        "| vs THOR, paired (pt) | collapsed (step) | stopped by | training ms per step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, group in frame.groupby("row", sort=False):
        rows = group.sort_values("seed")
        errors = rows["error"].fillna("")
        mean, low, high, n = t_interval(100 * rows["mlm_accuracy"].astype(float))
        collapsed = [
            f"{s} ({int(c)})"
            for s, k, c in zip(rows["seed"], rows["collapsed"], rows["collapse_step"], strict=True)
            if k is True or k == "True"
        ]
        stopped_by = sorted({e.split(":")[0] for e in errors if e})
        per_step = 1000 * rows["train_s"] / rows["steps"]
        print(
            f"| {name} | {', '.join(map(str, rows['seed']))} "
            f"| {' / '.join(final(a, e) for a, e in zip(rows['mlm_accuracy'], errors, strict=True))} "
            f"| {'' if n == 0 else f'{mean:.2f}' if n == 1 else f'{mean:.2f} [{low:.2f}, {high:.2f}]'} "
            f"| {paired(rows, 'control')} | {paired(rows, 'thor')} | {', '.join(collapsed) or 'none'} "
            f"| {', '.join(stopped_by) or 'none'} | {'' if per_step.isna().all() else f'{per_step.median():.0f}'} |"
        )
    print(f"most frequent token's accuracy: {100 * frame['most_frequent_token_accuracy'].dropna().iloc[0]:.2f} %")


def print_cost(context, common, params: str, repeats: int) -> None:
    """Training ms per THOR step on the BERT default by option at the documented lr, the second-order step and the
    step reusing its inverses: medians of ``repeats`` interleaved repeats on one batch in one process (every option's
    graphs compiled first), so the machine's load falls on all alike; ratios against the documented THOR."""
    import mindspore as ms

    from trainlib.recipes.language_model import bert_from_checkpoint, build_bert
    from trainlib.recipes.thor_bert import thor_step_of
    from trainlib.text.examples import COLUMNS

    batch_size = common.thor_bert.thor.batch_size
    batch = [ms.Tensor(context.train_examples[name][:batch_size]) for name in COLUMNS]
    start = build_bert(common.thor_bert.network, context.vocab_size, common.runtime)
    steps = {}
    for name in COST_ROWS:
        # frequency 2: second-order and reuse steps alternate
        conf = load_conf(",".join(filter(None, (params, ROWS[name][1], "thor_bert.thor.frequency=2"))))
        net = bert_from_checkpoint(conf.thor_bert.network, context.vocab_size, start, "start checkpoint")
        steps[name] = thor_step_of(conf.thor_bert.thor, net, 4 * repeats + 4, rank_size=1)
    medians = {
        name: {kind: 1000 * seconds for kind, seconds in kinds.items()}
        for name, kinds in interleaved_medians(steps, batch, repeats).items()
    }
    frequency = common.thor_bert.thor.frequency
    per_cycle = {name: m["second_order"] + (frequency - 1) * m["reuse"] for name, m in medians.items()}
    for name, m in medians.items():
        print(
            f"{name}: second-order {m['second_order']:.0f} ms, reuse {m['reuse']:.0f} ms, mean over a cycle of "
            f"{frequency} steps {per_cycle[name] / frequency:.0f} ms ({per_cycle[name] / per_cycle['thor']:.2f} x thor)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--params", default="", help="overrides of conf/base for every row (dotted keys)")
    parser.add_argument("--out", type=Path, default=PROJECT / "data/08_reporting/benchmarks/thor_bert_options.csv")
    parser.add_argument("--table", action="store_true", help="print the table of --out's trainings and stop")
    parser.add_argument(
        "--cost", type=int, metavar="REPEATS", help="time each option's THOR steps side by side (REPEATS) and stop"
    )
    args = parser.parse_args()
    if args.table:
        print_table(pd.read_csv(args.out))
        return

    from trainlib.recipes.classifier import configure

    common = load_conf(args.params)
    configure(common.runtime)
    context = prepared_text(common, args.out.with_suffix(".examples.npz"))
    if args.cost:
        print_cost(context.with_seed(0), common, args.params, args.cost)
        return
    examples = digest(context.train_examples)
    done = pd.read_csv(args.out) if args.out.is_file() else pd.DataFrame(columns=["row", "seed", "examples"])
    if len(done) and set(done["examples"]) != {examples}:
        sys.exit(f"{args.out} holds trainings on other examples ({set(done['examples'])}, now {examples})")
    finished = set(zip(done["row"], done["seed"], strict=True))
    print(f"{len(context.train_examples['input_ids'])} train examples (digest {examples}); rows {args.rows}")
    for name in args.rows:
        training, overrides = ROWS[name]
        for seed in args.seeds:
            if (name, seed) in finished:
                continue
            conf = load_conf(",".join(filter(None, (args.params, overrides, f"runtime.seed={seed}"))))
            with tempfile.TemporaryDirectory(prefix="thor-bert-options-") as checkpoint_dir:
                figures = train_row(context.with_seed(seed), conf, training, checkpoint_dir)
            line = {"row": name, "seed": seed, "examples": examples, "overrides": overrides, **figures}
            print(" ".join(f"{key}={value}" for key, value in line.items()), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            earlier = [pd.read_csv(args.out)] if args.out.is_file() else []  # rows differ in columns: no plain append
            write_csv(pd.concat([*earlier, pd.DataFrame([line])]), args.out)


if __name__ == "__main__":
    main()
