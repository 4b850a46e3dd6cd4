"""A recipe is declared once (``trainlib.params.recipe_spec``): the study's tables read the specifications, and no
other place in ``src/`` lists recipe names by hand or branches on one, but for the places issue 51 has still to move
(``NOT_YET_DERIVED``, which only shrinks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainlib.params.recipe_spec import (
    RecipeRegistryError,
    RecipeSpec,
    ResultRow,
    _specs_in,
    budgeted_sections,
    paired_rows,
    recipe_specs,
    result_rows,
    row_sections,
    rows,
    tuned_trainings,
)

SRC = Path(__file__).parents[1] / "src"
# (file, the top-level name whose body lists two or more recipe or result-row names, or compares one): what issue 51
# has not derived yet. A new list or branch anywhere else fails the test; one moved to the specifications is taken
# out of here. Not seen by this scan: tables built by calls, and lists of pipeline names.
NOT_YET_DERIVED = {
    ("trainlib/params/study.py", "StudyParams"),
    ("trainlib/recipes/language_model.py", "compare_trainings"),
    ("trainlib/report/differences.py", "single_run_differences"),
}
# the same words, other meanings: mindspore.boost's algorithm names, and THOR's schedule shape
NOT_RECIPES = {
    ("trainlib/optim/adasum/mindspore_adasum.py", "BOOST_CONFIG"),
    ("trainlib/optim/schedules.py", "per_step"),
}


def test_the_studys_tables_are_the_specifications():
    """What the hand-kept tables held before issue 51 (``RESULT_ROWS``, ``PAIRS``, ``TUNED_TRAININGS``,
    ``tuning.SECTION``, ``BUDGETED_SECTIONS``), now read from the recipes' specifications."""
    assert result_rows() == {
        "adasum": ("adasum", "allreduce"),
        "baseline": ("baseline",),
        "dim_reduce": ("stage2", "control"),
        "thor": ("thor",),
        "thor_first_order": ("thor_first_order",),
        "thor_bert": ("thor_bert", "thor_bert_control"),
        "lars": ("lars",),  # added through its own specification (issue 51 item 4)
    }
    assert set(paired_rows()) == {
        ("thor", "baseline"),
        ("thor", "thor_first_order"),
        ("stage2", "control"),
        ("adasum", "allreduce"),
        ("thor_bert", "thor_bert_control"),
        ("lars", "baseline"),
    }
    assert tuned_trainings() == {
        "baseline": ("baseline",),
        "thor": ("thor",),
        "thor_first_order": ("thor_first_order",),
        "thor_bert": ("thor_bert", "thor_bert_control"),
        "lars": ("lars",),
    }
    tuned = {row for rows in tuned_trainings().values() for row in rows}
    assert {row: section for row, section in row_sections().items() if row in tuned} == {
        "baseline": "baseline",
        "thor": "thor",
        "thor_first_order": "thor",
        "thor_bert": "thor_bert.thor",
        "thor_bert_control": "thor_bert.control",
        "lars": "lars",
    }
    assert budgeted_sections() == {
        "baseline": ("epochs", "eval_every_steps"),
        "thor": ("epochs", "eval_every_steps"),
        "adasum": ("epochs", "eval_every_steps"),
        "thor_bert.thor": ("epochs", "eval_every_steps"),
        "thor_bert.control": ("epochs", "eval_every_steps"),
        "dim_reduce.stage2": ("eval_every_steps",),
        "lars": ("epochs", "eval_every_steps"),
    }


def test_the_colour_families_are_the_ones_the_runs_had():
    from trainlib.params.recipe_spec import colour_families

    assert colour_families() == {
        "baseline": "#4e79a7",
        "control": "#4e79a7",
        "thor_bert_control": "#4e79a7",
        "thor": "#f28e2b",
        "thor_bert": "#f28e2b",
        "thor_first_order": "#e15759",
        "adasum": "#59a14f",
        "allreduce": "#76b7b2",
        "stage2": "#b07aa1",
        "dim_reduce": "#b07aa1",
        "stage1": "#bab0ac",
        "lars": "#edc948",
    }


def test_the_reports_reference_is_the_recipe_declared_so():
    """The baseline, declared ``reference``, wherever it stands among the recipes; without it, the first."""
    from trainlib.params.recipe_spec import reference_among

    assert [name for name, spec in recipe_specs().items() if spec.reference] == ["baseline"]
    assert reference_among(["thor", "lars", "baseline"]) == "baseline"
    assert reference_among(["thor", "lars"]) == "thor"
    assert reference_among([]) is None


def test_a_registry_entry_that_is_not_a_specification_is_named():
    spec = RecipeSpec("lars", "lars", dict, (ResultRow("lars", "lars"),))
    assert _specs_in(spec, "here") == (spec,)
    with pytest.raises(RecipeRegistryError, match=r"entry point x holds something other than RecipeSpec"):
        _specs_in(["lars"], "entry point x")


def names_in(node: ast.AST, recipes: set[str]) -> set[str]:
    """The recipe names among the string constants directly inside a list, tuple, set, dict or subscript."""
    if isinstance(node, ast.Dict):
        elements = node.keys
    elif isinstance(node, ast.List | ast.Tuple | ast.Set):
        elements = node.elts
    elif isinstance(node, ast.Subscript):
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    else:
        return set()
    return {e.value for e in elements if isinstance(e, ast.Constant) and e.value in recipes}


def compared_names(node: ast.AST, recipes: set[str]) -> set[str]:
    """The recipe names a comparison tests against (``row == "adasum"``, ``"thor_bert" in recipes``)."""
    if not isinstance(node, ast.Compare):
        return set()
    return {o.value for o in [node.left, *node.comparators] if isinstance(o, ast.Constant) and o.value in recipes}


def hand_kept_sites(source: str, recipes: set[str]) -> set[str]:
    """The top-level names of ``source`` whose body lists two or more recipe names, or branches on one."""
    sites = set()
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            name = next((t.id for t in targets if isinstance(t, ast.Name)), "?")
        elif isinstance(statement, ast.FunctionDef | ast.ClassDef):
            name = statement.name
        else:
            continue
        if name == "RECIPES" and any(
            isinstance(n, ast.Call) and getattr(n.func, "id", "") == "RecipeSpec" for n in ast.walk(statement)
        ):
            continue  # a recipe module's own declarations
        for node in ast.walk(statement):
            if len(names_in(node, recipes)) >= 2 or compared_names(node, recipes):
                sites.add(name)
                break
    return sites


def test_no_hand_kept_list_of_recipe_names_outside_the_specifications():
    recipes = set(recipe_specs()) | set(rows())
    found = {
        (str(path.relative_to(SRC)), name)
        for path in sorted(SRC.rglob("*.py"))
        for name in hand_kept_sites(path.read_text(), recipes)
    }
    assert found - NOT_YET_DERIVED - NOT_RECIPES == set(), "recipes or rows listed or compared by hand: derive them"
    assert NOT_YET_DERIVED - found == set(), "derived since: take these out of NOT_YET_DERIVED"


def test_the_scan_finds_a_new_list_and_a_branch():
    """The check itself: a literal tuple of two recipes and an ``if`` on one are both found."""
    recipes = set(recipe_specs())
    assert hand_kept_sites('MINE = ("baseline", "thor")\n', recipes) == {"MINE"}
    assert hand_kept_sites('def f(r):\n    if r == "dim_reduce":\n        return 1\n', recipes) == {"f"}
    assert hand_kept_sites('X = ("baseline", "other")\n', recipes) == set()


def test_the_sections_that_checkpoint_are_found_in_the_parameters_not_listed():
    """``root.checkpointed_sections`` (the several-nodes ``keep_last`` rule) finds the sections root.py listed."""
    from tests.support.config import load_config
    from trainlib.params import validate_parameters
    from trainlib.params.root import checkpointed_sections

    found = {name for name, _ in checkpointed_sections(validate_parameters(load_config("local")))}
    assert found == {
        "baseline",
        "adasum",
        "thor",
        "dim_reduce.stage1",
        "dim_reduce.stage2",
        "dim_reduce.control",
        "thor_bert.thor",
        "thor_bert.control",
        "lars",
    }
