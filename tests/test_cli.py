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
    assert parse("baseline.lr.peak=0.1, model.name=resnet18") == {
        "baseline": {"lr": {"peak": 0.1}},
        "model": {"name": "resnet18"},
    }
    assert parse("") == {}


def test_an_item_without_equals_names_the_item():
    with pytest.raises(click.UsageError, match="study.epochs"):
        parse("study.epochs")


def test_kedro_viz_offline_shows_no_update_banner(monkeypatch):
    """Offline (PyPI unreachable), kedro-viz 12.5 would report version "None" as newer than the installed one."""
    from kedro_viz import __version__
    from kedro_viz.api.rest.responses import version

    from pipelines.cli import _kedro_viz_without_a_false_update_banner

    monkeypatch.setattr(version, "get_latest_version", lambda: None)  # PyPI's answer when it cannot be reached
    assert version.get_version_response().is_outdated  # the bug: "Kedro-Viz None is here!"
    _kedro_viz_without_a_false_update_banner()
    response = version.get_version_response()
    assert not response.is_outdated and response.latest == __version__
