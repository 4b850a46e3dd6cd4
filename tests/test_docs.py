"""The README stays a newcomer's page, and no relative link of the README or the docs site points nowhere.

Cheap checks without MkDocs (CI's ``mkdocs build --strict`` checks the site itself): the README's length, every
relative link of README.md, CHANGELOG.md, tests/README.md and docs/**/*.md to an existing file and, where it names
one, to an existing anchor of a Markdown file, and an API page for every top-level module of ``src/pipelines``.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 150
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "tests" / "README.md", *DOCS.rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
ATTR_ID = re.compile(r"\{\s*#([\w.-]+)[^}]*\}")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (their brackets are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """Python-Markdown's default heading id (MkDocs' toc), for a heading without an explicit ``{#id}``."""
    text = heading.replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    """The ids of ``page``'s headings and of the ``{#id}`` attributes in it."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    anchors = set(ATTR_ID.findall(text))
    for heading in HEADING.findall(text):
        explicit = ATTR_ID.search(heading)
        if not explicit:
            anchors.add(_slug(heading))
    return anchors


def _relative_links(page: Path) -> list[str]:
    links = LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link) and not link.startswith("//")]


def test_readme_is_at_most_150_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES} and move the rest to a page of docs/"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_point_to_existing_files_and_anchors(page):
    broken = []
    for link in _relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link} (no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path})")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link} (no heading or {{#{anchor}}} in {path.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: " + "; ".join(broken)


@pytest.mark.parametrize("package", ["trainlib", "pipelines", "mindir_serving"])
def test_every_top_level_module_has_an_api_page(package):
    modules = {
        path.stem
        for path in (ROOT / "src" / package).iterdir()
        if (path.suffix == ".py" and not path.name.startswith("__")) or (path / "__init__.py").is_file()
    }
    pages = {page.stem for page in (DOCS / "api" / package).glob("*.md")}
    assert modules <= pages, (
        f"add docs/api/{package}/<name>.md (and its mkdocs.yml nav entry) for {sorted(modules - pages)}"
    )
    assert pages <= modules, f"docs/api/{package}/ has pages of modules that no longer exist: {sorted(pages - modules)}"
    for name in modules:
        assert f"::: {package}.{name}" in (DOCS / "api" / package / f"{name}.md").read_text(encoding="utf-8")


def _findings(page: Path) -> tuple[dict[str, str], list[str]]:
    """A page's Findings: each table row's recipe and first interval, and the bold kinds of user of "which to pick"."""
    text = page.read_text(encoding="utf-8").split("## Findings", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    intervals = {row[0].removeprefix("| "): re.search(r"[+-]\d+\.\d+ pt \[[^\]]+\]", row[1])[0] for row in rows}
    return intervals, re.findall(r"^- \*\*(.+?)\*\*", text, re.MULTILINE)


def test_the_docs_home_page_gives_the_readmes_findings():
    """docs/index.md's short form of the README's Findings: the same recipes, headline figures and picks."""
    assert _findings(ROOT / "docs" / "index.md") == _findings(ROOT / "README.md")
