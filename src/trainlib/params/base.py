"""What every section shares: the strict, frozen base model, the bases of the training templates' sections and
the checkpoint keys (the number types are in ``numbers``)."""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, TypeAdapter

from trainlib.params.numbers import PositiveInt


class Section(BaseModel):
    """Base of every parameter model: strict types, no unknown keys, read-only."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TemplateSection(Section):
    """Base of the sections one training template trains (``ImageRecipe``, ``LanguageRecipe``): a node of the
    template types its section with the base, and Kedro's ``model_validate`` of the base gives the section's own
    model, told apart by its keys (each model forbids the others'); the subclasses validate as usual."""

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Section:
        if cls.__base__ is not TemplateSection:  # a section's own model
            return super().model_validate(obj, **options)
        return TypeAdapter(Union[tuple(cls.__subclasses__())]).validate_python(obj, **options)  # noqa: UP007


class ImageRecipe(TemplateSection):
    """A section of the image training template (``pipelines.training``): ``baseline``, ``adasum`` or
    ``thor``. Every node that reads one of these sections types it so (the template's and the study's)."""


class LanguageRecipe(TemplateSection):
    """A section of the thor_bert pipeline's training template: ``thor_bert.thor`` or ``thor_bert.control``."""


class CheckpointParams(Section):
    """Full training state written every ``every_epochs`` epochs, the newest ``keep_last`` kept (removed once
    the training's final checkpoint is saved); of the ``stale-*`` folders, where another configuration's
    checkpoints are moved, the newest ``keep_stale`` kept."""

    dir: str
    every_epochs: PositiveInt
    keep_last: PositiveInt
    keep_stale: PositiveInt = 3  # the newest set moved aside is always kept
