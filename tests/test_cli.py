"""``kedro run --params`` of this project: Kedro's key=value items, plus lists in brackets."""

from __future__ import annotations

import click
import pytest

from pipelines.cli import split_params


def parse(value: str):
    context = click.Context(click.Command("run"))
    return split_params(context, click.Option(["--params"]), value)


def test_a_comma_inside_brackets_stays_with_its_list():
    assert parse("study.seeds=[0,1,2],study.epochs=3,thor.trace_rule=[0.01,0.001]") == {
        "study": {"seeds": [0, 1, 2], "epochs": 3},
        "thor": {"trace_rule": [0.01, 0.001]},
    }


def test_plain_items_parse_as_kedro_parses_them():
    assert parse("baseline.lr.lr_max=0.1, model.name=resnet18") == {
        "baseline": {"lr": {"lr_max": 0.1}},
        "model": {"name": "resnet18"},
    }
    assert parse("") == {}


def test_an_item_without_equals_names_the_item():
    with pytest.raises(click.UsageError, match="study.epochs"):
        parse("study.epochs")
