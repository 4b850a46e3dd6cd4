"""How a configuration's problems are worded: ``ParameterError``, one line per problem naming its dotted key and
the file (or ``--params``) that set it, and ``CrossKeyProblems``, the error a model validator raises for a rule
across keys."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError


class ParameterError(ValueError):
    """Parameters that are unknown, mistyped, out of range or inconsistent; one line per problem."""


class CrossKeyProblems:
    """Builds the error of a model validator: (dotted key, problem) pairs, every one reported.

    The pairs travel in the error's context under ``problems``; ``validate_parameters`` prints each
    with the file its key came from.
    """

    @staticmethod
    def raise_if_any(problems: list[tuple[str, str]]) -> None:
        if problems:
            text = "; ".join(f"{key} {problem}" for key, problem in problems)
            raise PydanticCustomError("cross_key", "{text}", {"text": text, "problems": problems})


def problem_lines(error: ValidationError, root: type[BaseModel], sources: Mapping[str, str]) -> list[str]:
    """One line per problem of ``error`` (raised by ``root``'s validation): the dotted key, the problem, and the
    key's source in ``sources`` (dotted key -> file or ``--params``)."""
    return [
        f"  {key} {problem} ({_source(key, sources)})"
        for details in error.errors()
        for key, problem in _problems(details, root)
    ]


def _problems(details: ErrorDetails, root: type[BaseModel]) -> list[tuple[str, str]]:
    """(dotted key, problem) pairs of one pydantic error."""
    if details["type"] == "cross_key":
        return [(key, problem) for key, problem in details["ctx"]["problems"]]
    loc, parent = _resolve(details["loc"], root)
    key = _dotted(loc)
    if details["type"] == "extra_forbidden":
        return [(key, "is not a known parameter" + _suggestion(loc, parent))]
    if details["type"] == "missing":
        return [(key, "is missing")]
    if details["type"] in ("union_tag_invalid", "union_tag_not_found"):  # a schedule's shape
        ctx = details["ctx"]
        tags = _tagged_members(parent.model_fields[str(loc[-1])].annotation) if parent is not None else {}
        found = f"is {ctx['tag']!r}" if details["type"] == "union_tag_invalid" else "is missing"
        return [(f"{key}.{ctx['discriminator'].strip(chr(39))}", f"{found}; choose one of {', '.join(tags)}")]
    value, ctx = _yaml_text(details["input"]), details.get("ctx", {})
    if details["type"] == "literal_error":  # ctx: "'trainlib' or 'mindspore_builtin'"
        allowed = ctx["expected"].replace(" or ", ", ").replace("'", "")
        return [(key, f"is {value}; choose one of {allowed}")]
    if details["type"] in _BOUNDS:
        bound, symbol = _BOUNDS[details["type"]]
        limit = ctx[bound]  # pydantic turns a float field's bound into a float: 0 -> 0.0
        return [(key, f"is {value} but must be {symbol} {int(limit) if float(limit).is_integer() else limit}")]
    if details["type"] in _TYPES:
        return [(key, f"is {value} but must be {_TYPES[details['type']]}")]
    message = details["msg"]  # the rest, e.g. "List should have at least 2 items after validation, not 1"
    return [(key, f"is {value}: {message[0].lower()}{message[1:]}")]


# pydantic error types -> the words of the problem lines
_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}
_TYPES = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
}


def _resolve(loc: tuple[int | str, ...], root: type[BaseModel]) -> tuple[tuple[int | str, ...], type[BaseModel] | None]:
    """A pydantic location below ``root`` as its dotted key's parts, and the model holding its last part (None
    inside a list).

    Inside a discriminated union pydantic adds the member's tag to the location (``thor.lr.thor.power`` for the
    key ``thor.lr.power``): the tag is dropped, and the member it names is the model of the keys below it.
    """
    parts: list[int | str] = []
    model: type[BaseModel] | None = root
    parent = model
    remaining = list(loc)
    while remaining:
        part = remaining.pop(0)
        parts.append(part)
        parent = model
        field = model.model_fields.get(str(part)) if model is not None and isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        members = _tagged_members(annotation)
        if members and remaining and remaining[0] in members:
            model = members[remaining.pop(0)]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            model = None
    return tuple(parts), parent


def _tagged_members(annotation) -> dict[str, type[BaseModel]]:
    """Tag -> member model of a union of models told apart by a ``Literal`` field (``Schedule``: ``shape``)."""
    members = {}
    for member in get_args(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel) and "shape" in member.model_fields:
            members |= dict.fromkeys(get_args(member.model_fields["shape"].annotation), member)
    return members


def _suggestion(loc: tuple[int | str, ...], parent: type[BaseModel] | None) -> str:
    """``"; did you mean <key>?"`` with the closest known key of ``parent`` beside an unknown one, or ``""``."""
    if parent is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1)
    return f"; did you mean {_dotted((*loc[:-1], close[0]))}?" if close else ""


def _dotted(loc: tuple[int | str, ...]) -> str:
    """A location as it is written in ``--params``: ``thor.lr.peak``, ``thor.trace_rule[1]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def _source(key: str, sources: Mapping[str, str]) -> str:
    """Where ``key`` was set: a list item or an unknown mapping takes its nearest known key's source."""
    parts = key.split("[", 1)[0].split(".")
    while parts:
        dotted = ".".join(parts)
        if dotted in sources:
            return sources[dotted]
        below = next((source for name, source in sources.items() if name.startswith(dotted + ".")), None)
        if below is not None:
            return below
        parts.pop()
    return "unknown source"


def _yaml_text(value: Any) -> str:
    """A value as it is written in YAML (``null``, ``true``, ``'ten'``)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)
