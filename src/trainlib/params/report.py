"""``conf/base/parameters_report.yml``: the recipes the report compares, and the MLflow runs it reads."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from trainlib.params.base import Section
from trainlib.params.errors import CrossKeyProblems
from trainlib.params.recipe_spec import reported_recipes, unknown_names


class ReportParams(Section):
    # recipes with a report entry in their specification (trainlib.params.recipe_spec.reported_recipes)
    recipes: Annotated[list[str], Field(min_length=1)]
    # by recipe: an MLflow run id pins the recipe's run; None (or no entry) takes its latest complete FINISHED run
    run_ids: dict[str, str | None]

    @model_validator(mode="after")
    def _known_recipes(self) -> ReportParams:
        reported = reported_recipes()
        problems = []
        for key, names in (("report.recipes", self.recipes), ("report.run_ids", list(self.run_ids))):
            unknown = unknown_names(names, "recipes the report cannot compare", reported)
            if unknown:
                problems.append((key, unknown))
        CrossKeyProblems.raise_if_any(problems)
        return self
