"""``Parameters``, the whole merged configuration (one section per top-level key of ``conf/*/parameters*.yml``)
with the rules that span sections, and ``validate_parameters``, which every run calls before it starts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError, create_model, model_validator

from trainlib.params.base import CheckpointParams, Section
from trainlib.params.choices import GRAD_CENTRALIZATION_TARGETS
from trainlib.params.common import (
    BoostParams,
    DataParams,
    DistributedParams,
    ModelParams,
    NetworkParams,
    RuntimeParams,
    TargetParams,
    TrackingParams,
)
from trainlib.params.errors import CrossKeyProblems, ParameterError, problem_lines
from trainlib.params.migrate import MigrateParams
from trainlib.params.predict import PredictParams
from trainlib.params.recipe_spec import recipe_specs, row_section
from trainlib.params.report import ReportParams
from trainlib.params.schedules import PolynomialSchedule, WarmupSchedule
from trainlib.params.study import StudyParams


class SharedParameters(Section):
    """The configuration's sections that are no recipe's, with the rules that span sections; ``Parameters`` adds
    every recipe's section."""

    runtime: RuntimeParams
    distributed: DistributedParams
    data: DataParams
    network: NetworkParams
    model: ModelParams
    boost: BoostParams
    migrate: MigrateParams
    predict: PredictParams
    report: ReportParams
    study: StudyParams
    target: TargetParams
    tracking: TrackingParams

    @model_validator(mode="after")
    def _runnable_on_this_target(self) -> SharedParameters:
        problems = []
        device_target = self.runtime.device_target
        # each recipe's own rules (a section shared by two recipes, thor's, brings its rule once)
        rules = (spec.cross_section_problems for spec in recipe_specs().values() if spec.cross_section_problems)
        for rule in dict.fromkeys(rules):
            problems += rule(self)
        if self.boost.less_bn and self.runtime.mode != "graph":
            problems.append(
                (
                    "boost.less_bn",
                    f"needs runtime.mode graph (it is {self.runtime.mode}): LessBN is a graph-compiler pass and "
                    "changes nothing in pynative mode",
                )
            )
        if (
            self.boost.less_bn
            and self.boost.grad_centralization == "on"
            and device_target not in GRAD_CENTRALIZATION_TARGETS
        ):
            problems.append(
                (
                    "boost.grad_centralization",
                    f"is on, but MindSpore has no Centralization kernel on {device_target} (only on "
                    f"{', '.join(GRAD_CENTRALIZATION_TARGETS)}); use auto (off there) or off",
                )
            )
        if self.distributed.nodes > 1:
            sections = dict(checkpointed_sections(self))
            problems += [
                (
                    f"{name}.checkpoint.keep_last",
                    f"is 1, but the job spans {self.distributed.nodes} nodes, each writing its own checkpoints: a "
                    "node killed between two epochs' checkpoints is one epoch behind, and the rerun resumes from an "
                    "epoch every node holds; use 2 or more",
                )
                for name, section in sections.items()
                if section.checkpoint.keep_last < 2
            ]
        CrossKeyProblems.raise_if_any(problems)
        return self

    @model_validator(mode="after")
    def _tuning_spaces_fit_their_sections(self) -> SharedParameters:
        """A tuned warm-up needs a learning-rate schedule with one in that unit (THOR's ResNet schedule has none;
        the Momentum schedules count epochs, the BERT ones steps)."""
        problems = []
        for recipe, space in self.study.tuning.spaces.items():
            lr = row_section(self, recipe).lr
            for warmup, schedule in (("warmup_epochs", WarmupSchedule), ("warmup_steps", PolynomialSchedule)):
                if space.lr is not None and getattr(space.lr, warmup) is not None and not isinstance(lr, schedule):
                    problems.append(
                        (
                            f"study.tuning.spaces.{recipe}.lr.{warmup}",
                            f"is set, but {recipe}'s lr schedule (shape {lr.shape}) has no {warmup}",
                        )
                    )
        CrossKeyProblems.raise_if_any(problems)
        return self


# The whole merged configuration: the shared sections and every recipe's, each from its specification (this package's
# and other installed packages', ``recipe_spec``), so a new recipe's section is validated with the rest
Parameters = create_model(
    "Parameters",
    __base__=SharedParameters,
    __module__=__name__,
    **{spec.section: (spec.parameters, ...) for spec in recipe_specs().values()},
)
Parameters.__doc__ = "The whole merged configuration (every recipe's section too), with the rules that span sections."


def checkpointed_sections(parameters: BaseModel, prefix: str = "") -> Iterator[tuple[str, BaseModel]]:
    """Every section that trains and checkpoints (has a ``checkpoint`` key), by its dotted key, found in the model
    itself: a new recipe's training is checked with the others."""
    for name in type(parameters).model_fields:
        value = getattr(parameters, name)
        if isinstance(value, BaseModel):
            if isinstance(getattr(value, "checkpoint", None), CheckpointParams):
                yield f"{prefix}{name}", value
            yield from checkpointed_sections(value, f"{prefix}{name}.")


def validate_parameters(raw: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Parameters:
    """The merged configuration as ``Parameters``, or a ``ParameterError`` listing every problem.

    ``sources`` maps dotted keys to the file (or ``--params``) that last set them; each problem line
    ends with its key's source.
    """
    try:
        return Parameters.model_validate(raw)
    except ValidationError as error:
        lines = problem_lines(error, Parameters, sources or {})
        raise ParameterError("invalid parameters:\n" + "\n".join(lines)) from None
