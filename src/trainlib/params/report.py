"""``conf/base/parameters_report.yml``: the recipes the report compares, and the MLflow runs it reads."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trainlib.params.base import Section
from trainlib.params.choices import RecipeName


class ReportRunIds(Section):
    """An MLflow run id pins a recipe's run; ``None`` takes its latest complete FINISHED run."""

    baseline: str | None
    dim_reduce: str | None
    thor: str | None
    adasum: str | None


class ReportParams(Section):
    recipes: Annotated[list[RecipeName], Field(min_length=1)]
    run_ids: ReportRunIds
