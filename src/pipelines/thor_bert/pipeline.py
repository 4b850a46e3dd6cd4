"""``thor_bert`` pipeline: corpus -> tokenizer -> examples -> BERT -> THOR and control, each evaluated -> comparison.

The modular pipeline ``thor_bert``, one nested namespace per stage, each a box in kedro-viz: ``thor_bert.corpus``
(train and held-out documents), ``thor_bert.tokenizer``, ``thor_bert.examples`` (pre-training examples of each),
``thor_bert.network`` (the initial weights both trainings start from), ``thor_bert.thor`` and ``thor_bert.control``
(one template, ``training_pipeline``: train, then held-out masked-LM evaluation, in a child run of its own, and the
export) and ``thor_bert.comparison``.
"""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import TRAINING_RUN_TAG, namespaced
from trainlib.params.recipe_spec import recipe_specs

from .nodes import (
    build_network,
    compare,
    create_examples,
    evaluate,
    export_model,
    fit_tokenizer,
    split_corpus,
    train,
)

NAMESPACE = "thor_bert"
# The trainings, each a namespace of its own under thor_bert: where the recipe's result rows train
# (``thor_bert.thor``, ``thor_bert.control``)
TRAININGS = tuple(recipe_specs()[NAMESPACE].result_trainings.values())
# The datasets each stage reads from the stages before it, by their names in the stage's template
SHARED = {
    "train_documents": f"{NAMESPACE}.corpus.train_documents",
    "held_out_documents": f"{NAMESPACE}.corpus.held_out_documents",
    "tokenizer": f"{NAMESPACE}.tokenizer.tokenizer",
    "train_examples": f"{NAMESPACE}.examples.train_examples",
    "held_out_examples": f"{NAMESPACE}.examples.held_out_examples",
    "initial_weights": f"{NAMESPACE}.network.initial_weights",
}
# What a training and its evaluation read besides their weights and own sections (trainlib's LanguageModelContext);
# sub-sections only: Kedro 1.7 cannot validate a pipeline reading both params:thor_bert and params:thor_bert.<key>
CONTEXT_INPUTS = [
    "train_examples",
    "held_out_examples",
    "tokenizer",
    "params:network",
    "params:eval_batch_size",
    "params:step_eval_examples",
    "params:runtime",
    "params:distributed",
]
SECTIONS = {
    key: f"{NAMESPACE}.{key}"
    for key in (
        "corpus",
        "tokenizer",
        "examples",
        "network",
        "eval_batch_size",
        "step_eval_examples",
        "target_mlm_accuracy",
        *TRAININGS,
    )
}


def training_pipeline(training: str) -> Pipeline:
    """The language training template for ``thor_bert.<training>`` (``thor``, ``control``): ``train`` from the
    shared initial weights, then ``evaluate`` on the held-out examples, both reading the examples and the shared
    sections (``CONTEXT_INPUTS``) in the training's child run, which so logs them; ``export_model`` beside."""
    template = pipeline(
        [
            node(
                train,
                ["initial_weights", *CONTEXT_INPUTS, "params:recipe", "params:target_mlm_accuracy"],
                ["final_checkpoint", "history", "step_history"],
                name="train",
            ),
            node(evaluate, ["final_checkpoint", *CONTEXT_INPUTS], "eval_report", name="evaluate"),
        ],
        tags=TRAINING_RUN_TAG,
    ) + pipeline(
        [
            node(
                export_model,
                ["final_checkpoint", "held_out_examples", "tokenizer", "params:network", "params:runtime"],
                "model",
                name="export_model",
            )
        ]
    )
    sections = {**SECTIONS, "recipe": f"{NAMESPACE}.{training}"}
    return namespaced(template, f"{NAMESPACE}.{training}", inputs=_used(template), sections=sections)


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``thor_bert.<stage>.<node>``: ``thor_bert.corpus.split_corpus``, ``thor_bert.thor.train``, …"""
    stages = {
        "corpus": pipeline(
            [node(split_corpus, "params:corpus", ["train_documents", "held_out_documents"], name="split_corpus")]
        ),
        "tokenizer": pipeline(
            [node(fit_tokenizer, ["train_documents", "params:tokenizer"], "tokenizer", name="fit_tokenizer")]
        ),
        "examples": pipeline(
            [
                node(
                    create_examples,
                    ["train_documents", "held_out_documents", "tokenizer", "params:examples"],
                    ["train_examples", "held_out_examples"],
                    name="create_examples",
                )
            ]
        ),
        "network": pipeline(
            [
                node(
                    build_network,
                    ["params:network", "tokenizer", "params:runtime"],
                    "initial_weights",
                    name="build_network",
                )
            ]
        ),
    }
    comparison = pipeline(
        [
            node(
                compare,
                [
                    "thor_report",
                    "control_report",
                    "params:thor",
                    "params:control",
                    "train_examples",
                    "held_out_examples",
                    "tokenizer",
                    "params:runtime",
                ],
                "comparison",
                name="compare",
            )
        ]
    )
    reports = {f"{t}_report": f"{NAMESPACE}.{t}.eval_report" for t in TRAININGS} | _used(comparison)
    return (
        sum(
            (
                namespaced(stage, f"{NAMESPACE}.{name}", inputs=_used(stage), sections=SECTIONS)
                for name, stage in stages.items()
            ),
            Pipeline([]),
        )
        + sum((training_pipeline(training) for training in TRAININGS), Pipeline([]))
        + namespaced(comparison, f"{NAMESPACE}.comparison", inputs=reports, sections=SECTIONS)
    )


def _used(template: Pipeline) -> dict[str, str]:
    """The shared datasets ``template`` reads, mapped to their namespaced names."""
    return {name: SHARED[name] for name in template.inputs() if name in SHARED}
