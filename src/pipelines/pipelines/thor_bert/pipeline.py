"""``thor_bert`` pipeline: corpus -> tokenizer -> examples -> BERT -> THOR and baseline -> evaluation.

The modular pipeline ``thor_bert``, one nested namespace per stage, each a box in kedro-viz: ``thor_bert.corpus``
(train and held-out documents), ``thor_bert.tokenizer``, ``thor_bert.examples`` (pre-training examples of each),
``thor_bert.network`` (the initial weights both trainings start from), ``thor_bert.thor`` and ``thor_bert.baseline``
(the trainings), ``thor_bert.evaluation`` (held-out masked-LM accuracy of both, and their comparison).
"""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import namespaced

from .nodes import (
    build_network,
    compare,
    create_examples,
    evaluate_baseline,
    evaluate_thor,
    fit_tokenizer,
    split_corpus,
    train_baseline,
    train_thor,
)

NAMESPACE = "thor_bert"
TOKENIZER = f"{NAMESPACE}.tokenizer.tokenizer"
TRAIN_EXAMPLES = f"{NAMESPACE}.examples.train_examples"
HELD_OUT_EXAMPLES = f"{NAMESPACE}.examples.held_out_examples"
# sub-sections only: Kedro 1.7 cannot validate a pipeline reading both params:thor_bert and params:thor_bert.<key>
EXAMPLES = ["held_out_examples", "tokenizer", "params:thor_bert.network", "params:thor_bert.eval_batch_size"]


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``thor_bert.<stage>.<node>``: ``thor_bert.corpus.split_corpus``, ``thor_bert.thor.train``, …"""
    corpus = pipeline(
        [
            node(
                split_corpus,
                "params:thor_bert.corpus",
                ["train_documents", "held_out_documents"],
                name="split_corpus",
            )
        ]
    )
    tokenizer = pipeline(
        [node(fit_tokenizer, ["train_documents", "params:thor_bert.tokenizer"], "tokenizer", name="fit_tokenizer")]
    )
    examples = pipeline(
        [
            node(
                create_examples,
                ["train_documents", "held_out_documents", "tokenizer", "params:thor_bert.examples"],
                ["train_examples", "held_out_examples"],
                name="create_examples",
            )
        ]
    )
    shared = {
        "train_documents": f"{NAMESPACE}.corpus.train_documents",
        "held_out_documents": f"{NAMESPACE}.corpus.held_out_documents",
        "tokenizer": TOKENIZER,
        "train_examples": TRAIN_EXAMPLES,
        "held_out_examples": HELD_OUT_EXAMPLES,
    }
    network = pipeline(
        [
            node(
                build_network,
                ["params:thor_bert.network", "tokenizer", "params:runtime"],
                "initial_weights",
                name="build_network",
            )
        ]
    )
    shared["initial_weights"] = f"{NAMESPACE}.network.initial_weights"
    trainings = Pipeline([])
    for name, train in (("thor", train_thor), ("baseline", train_baseline)):
        training = pipeline(
            [
                node(
                    train,
                    [
                        "initial_weights",
                        "train_examples",
                        *EXAMPLES,
                        "params:thor_bert.step_eval_examples",
                        f"params:thor_bert.{name}",
                        "params:runtime",
                        "params:distributed",
                    ],
                    ["final_checkpoint", "history"],
                    name="train",
                )
            ]
        )
        trainings += namespaced(training, f"{NAMESPACE}.{name}", inputs=_used(training, shared))
    evaluation = pipeline(
        [
            node(
                evaluate_thor,
                ["thor_checkpoint", *EXAMPLES, "params:runtime"],
                "thor_report",
                name="evaluate_thor",
            ),
            node(
                evaluate_baseline,
                ["baseline_checkpoint", *EXAMPLES, "params:runtime"],
                "baseline_report",
                name="evaluate_baseline",
            ),
            node(
                compare,
                ["thor_report", "baseline_report", "params:thor_bert.thor", "params:thor_bert.baseline"],
                "comparison",
                name="compare",
            ),
        ]
    )
    return (
        namespaced(corpus, f"{NAMESPACE}.corpus")
        + namespaced(tokenizer, f"{NAMESPACE}.tokenizer", inputs=_used(tokenizer, shared))
        + namespaced(examples, f"{NAMESPACE}.examples", inputs=_used(examples, shared))
        + namespaced(network, f"{NAMESPACE}.network", inputs=_used(network, shared))
        + trainings
        + namespaced(
            evaluation,
            f"{NAMESPACE}.evaluation",
            inputs={
                **_used(evaluation, shared),
                **{f"{t}_checkpoint": f"{NAMESPACE}.{t}.final_checkpoint" for t in ("thor", "baseline")},
            },
            outputs={f"{t}_report": f"{NAMESPACE}.{t}.eval_report" for t in ("thor", "baseline")},
        )
    )


def _used(template: Pipeline, shared: dict[str, str]) -> dict[str, str]:
    """The shared datasets ``template`` reads, mapped to their namespaced names."""
    return {name: shared[name] for name in template.inputs() if name in shared}
