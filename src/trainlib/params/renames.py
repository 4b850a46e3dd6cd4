"""The parameter keys and values renamed so that each word means one thing (docs/glossary.md), old -> new.

The configuration loader (``pipelines.hooks``) looks for the old names in every parameter file and ``--params``
before a run starts and stops naming each one with its new name: an old name would otherwise fail validation as
an unknown key or an unknown choice, without saying what it became.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Dotted keys: thor_bert's first-order training beside THOR is its control, as dim_reduce's is (the word
# "baseline" means only the Momentum recipe), and so is the training its tuning space names.
RENAMED_KEYS: dict[str, str] = {
    "thor_bert.baseline": "thor_bert.control",
    "study.tuning.spaces.thor_bert_baseline": "study.tuning.spaces.thor_bert_control",
    # the settings of MindSpore's built-in THOR, named as the implementation that reads them
    "thor.mindspore": "thor.mindspore_builtin",
    # the ResNet's settings are the network section's; the model section is only the logged MLflow model's
    "model.name": "network.name",
    "model.num_classes": "network.num_classes",
    "model.conv_init": "network.conv_init",
    "model.dense_init": "network.dense_init",
}
# this project's implementation is trainlib's; MindSpore's own one (mindspore.nn.thor, mindspore.boost) is built in
_IMPLEMENTATIONS = {"own": "trainlib", "mindspore": "mindspore_builtin"}
# the damping mindspore.nn.thor adds to both factors: a fixed sqrt(damping) (against the factored one)
_DAMPING_METHODS = {"mindspore": "fixed"}
# Dotted key -> {old value: new value}.
RENAMED_VALUES: dict[str, dict[Any, Any]] = {
    "thor.implementation": _IMPLEMENTATIONS,
    "adasum.implementation": _IMPLEMENTATIONS,
    "dim_reduce.stage2.implementation": _IMPLEMENTATIONS,
    "thor.damping_method": _DAMPING_METHODS,
    "thor_bert.thor.damping_method": _DAMPING_METHODS,
}


def renamed_in(tree: Mapping[str, Any]) -> list[str]:
    """The old names in a parameters mapping (one file's, or ``--params``), one line each with its new name:
    ``thor_bert.baseline was renamed thor_bert.control``, ``thor.damping_method: 'mindspore' was renamed 'fixed'``.
    """
    lines = []
    for key, value in _items(tree):
        if key in RENAMED_KEYS:
            lines.append(f"{key} was renamed {RENAMED_KEYS[key]}")
            continue
        values = RENAMED_VALUES.get(key, {})
        if isinstance(value, str) and value in values:
            lines.append(f"{key}: {value!r} was renamed {values[value]!r}")
    return lines


def _items(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every key of ``tree``, the mappings' keys included, not only the leaves' (a renamed
    key may hold a mapping)."""
    for key, value in tree.items():
        yield f"{prefix}{key}", value
        if isinstance(value, Mapping):
            yield from _items(value, f"{prefix}{key}.")
