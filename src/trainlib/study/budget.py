"""What a study changes in the recipes' sections, in one place: each training trains ``study.epochs`` epochs and
evaluates every ``study.eval_every_steps`` steps (dim_reduce keeps its stages' own epochs; its stage 2 and control
take the step evaluation). The runner trains with these values, and the study's MLflow run logs them as its
parameters in place of the sections' configured ones (``baseline.epochs 1``, not the baseline's own 5)."""

from __future__ import annotations

from trainlib.params.recipe_spec import budgeted_sections


def budget_update(section: str, *, epochs: int, eval_every_steps: int) -> dict[str, int]:
    """The keys of ``section`` (``recipe_spec.budgeted_sections``) the study sets, with its values; none for a
    section it leaves as configured (dim_reduce's control: as many epochs as stage 2)."""
    values = {"epochs": epochs, "eval_every_steps": eval_every_steps}
    return {key: values[key] for key in budgeted_sections().get(section, ())}


def study_budget(*, epochs: int, eval_every_steps: int) -> dict[str, int]:
    """Every dotted parameter key the study sets, with its value (``baseline.epochs``: ``study.epochs``)."""
    return {
        f"{section}.{key}": value
        for section in budgeted_sections()
        for key, value in budget_update(section, epochs=epochs, eval_every_steps=eval_every_steps).items()
    }
