"""Docs search: the word a newcomer types finds the guide page about it first (issue 53).

The site's search is mkdocs-material's: its web worker builds a lunr.js 2.3.9 index in the browser from
``site/search/search_index.json`` and ranks with lunr's BM25 plus a boost of its own. The ``lunr`` Python package is
not installed, and would still need the theme's tokenizer and boost, so :class:`ThemeSearch` reproduces the worker's
scoring from the sources in ``material/templates/assets/javascripts/workers/search.*.min.js.map``:

- tokens: the text between HTML tags (``extract``), split at the index's ``separator``, lower-cased; the index's
  ``pipeline`` is ``["stopWordFilter"]`` for English, so no stemmer: index terms are the words as written
  (``THOR,`` and ``thor`` are two terms);
- a query word ``w`` becomes ``w*``, a prefix matching every index term that starts with it;
- a field's weight for a term: ``idf * (k1 + 1) * tf / (k1 + tf)`` (``k1`` 1.2, ``b`` 0: length is not
  counted), times the field's boost (title 1000, text 1) and the page's ``search: boost:`` front matter, rounded
  to 3 decimals; ``idf = ln(1 + |(N - n + 0.5) / (n + 0.5)|)`` with ``n`` the (document, field) pairs holding it;
- a document's score: over fields, the sum of the matched terms' weights over the query vector's length;
- then the theme's own boost: ``score * (1 + boost**2)``, ``boost`` = 1 for a page's top entry (0 for a section)
  plus the share of query words it matched; results are grouped by page in the order of their best entry.

Checked against the real worker, run under node on a built index (``self``, ``addEventListener`` and
``postMessage`` stubbed; messages ``{type: 0, data: {config, docs, options: {suggest: false}}}`` then
``{type: 2, data: query}``): for 42 queries the first ten pages and their scores were this class's, but for the
order of pages with equal scores (lunr keeps its postings' order there, this class the index's), so the test asks
for a first hit ahead of the second.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The page a newcomer means by each word: the guide that explains it and says what to run.
FIRST_HITS = {
    "THOR": "recipes/",  # Recipes: what THOR is here, its options; THOR on BERT and the dated THOR studies come after
    "tuning": "study/",  # Study and regime search: the tuning study (trainlib.study's API page is reference)
    "resume": "troubleshooting/",  # Troubleshooting: interrupted runs and how to resume them
    "PostgreSQL": "team/",  # Team set-up: the shared MLflow server on PostgreSQL
    "predict": "use-a-model/",  # Use a trained model: the predict pipeline and a logged model's pyfunc
}

K1 = 1.2  # lunr.Builder's default; the theme sets b to 0 and leaves k1
# lunr.stopWordFilter's English list (lunr.js 2.3.9), the only step of the index's pipeline
STOP_WORDS = frozenset(
    "a able about across after all almost also am among an and any are as at be because been but by can cannot could "
    "dear did do does either else ever every for from get got had has have he her hers him his how however i if in "
    "into is it its just least let like likely may me might most must my neither no nor not of off often on only or "
    "other our own rather said say says she should since so some than that the their them then there these they "
    "this tis to too twas us wants was we were what when where which while who whom why will with would yet you "
    "your".split()
)
WORKER = "material/templates/assets/javascripts/workers"


def _text_sections(value: str) -> list[str]:
    """The theme's ``extract``: the runs of text outside ``<...>``, as its tokenizer reads them (ported as is)."""
    sections, start, end = [], 0, 0
    while end < len(value):
        if value[end] == "<" and end > start:
            sections.append(value[start:end])
            start = end
        elif value[end] == ">":
            start = end + 1
        end += 1
    if end > start:
        sections.append(value[start:end])
    return sections


def _tokens(value: str | list[str] | None, separator: re.Pattern[str]) -> list[str]:
    """The theme's ``tokenize`` then lunr's stop-word filter: the terms one field adds to the index."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    tokens = []
    for section in (section for item in values for section in _text_sections(item)):
        index = 0
        for match in separator.finditer(section):
            if index < match.start():
                tokens.append(section[index : match.start()].lower())
            index = match.end()
        if index < len(section):
            tokens.append(section[index:].lower())
    return [token for token in tokens if token not in STOP_WORDS]


def _round3(score: float) -> float:
    """JavaScript's ``Math.round(score * 1000) / 1000`` (halves round up, Python's ``round`` rounds them to even)."""
    return math.floor(score * 1000 + 0.5) / 1000


class ThemeSearch:
    """mkdocs-material's search worker over one ``search_index.json`` (see the module docstring)."""

    def __init__(self, index: dict) -> None:
        config = index["config"]
        # Another pipeline (a stemmer, the trimmer) would change the terms: this class would need it too
        assert config["pipeline"] == ["stopWordFilter"] and config["lang"] == ["en"], config
        separator = re.compile(config["separator"])
        self.fields = list(config["fields"])
        self.docs = index["docs"]
        self.page = {}  # location -> the page's top entry (the theme's document map: a page's first entry)
        # lunr keys by location: a second entry with the same location replaces the first's vector, but both
        # count in N and in the postings
        frequencies: dict[tuple[str, str], Counter] = {}
        postings: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for doc in self.docs:
            self.page.setdefault(doc["location"].split("#")[0], doc["location"])
            for field in config["fields"]:
                terms = Counter(_tokens(doc.get(field), separator))
                frequencies[doc["location"], field] = terms
                for term in terms:
                    postings[term][field].add(doc["location"])
        self.terms = sorted(postings)
        count = len(self.docs)
        idf = {}
        for term, fields in postings.items():
            holders = sum(len(refs) for refs in fields.values())
            idf[term] = math.log(1 + abs((count - holders + 0.5) / (holders + 0.5)))
        boosts = {doc["location"]: doc.get("boost") or 1 for doc in self.docs}
        self.weights: dict[tuple[str, str], dict[str, float]] = {}
        for (location, field), terms in frequencies.items():
            field_boost = config["fields"][field].get("boost") or 1
            self.weights[location, field] = {
                term: _round3(idf[term] * (K1 + 1) * tf / (K1 + tf) * field_boost * boosts[location])
                for term, tf in terms.items()
            }

    def search(self, query: str) -> list[tuple[str, float]]:
        """The pages for ``query`` in the theme's order, each with its best entry's score."""
        # The theme turns every plain word into a prefix query; modifiers (+ - ~ ^ : "") are not reproduced here
        assert not re.search(r'[+\-~^:*"]', query), query
        words = [word.lower() for word in query.split()]
        expanded = {word: [term for term in self.terms if term.startswith(word)] for word in words}
        vector = Counter(term for terms in expanded.values() for term in terms)  # lunr's query vector: 1 per clause
        length = math.sqrt(sum(weight * weight for weight in vector.values()))
        scored = []
        for doc in self.docs:
            location = doc["location"]
            fields = [self.weights[location, field] for field in self.fields]
            matched = {term for weights in fields for term in weights if term in vector}
            if not matched:
                continue
            score = sum(weights.get(term, 0) * vector[term] for weights in fields for term in matched) / length
            share = sum(any(term.startswith(word) for term in matched) for word in words) / len(words)
            boost = (self.page[location.split("#")[0]] == location) + share
            scored.append((score * (1 + boost**2), location))
        pages: dict[str, float] = {}
        for score, location in sorted(scored, key=lambda item: -item[0]):  # stable, as Array.prototype.sort
            pages.setdefault(location.split("#")[0], score)
        return list(pages.items())


@pytest.fixture(scope="module")
def search(tmp_path_factory) -> ThemeSearch:
    """The index of a fresh build of the docs (about 10 s): site/ may be stale or absent."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)]
    result = subprocess.run(build, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return ThemeSearch(json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8")))


def test_the_guide_page_is_the_first_hit(search):
    # One test, not one per word: pytest-xdist would build the site once on each worker that ran one
    wrong = []
    for query, page in FIRST_HITS.items():
        pages = search.search(query)
        tied = len(pages) > 1 and pages[0][1] <= pages[1][1] * (1 + 1e-9)  # a tie's order is lunr's, not known here
        if not pages or pages[0][0] != page or tied:
            ranking = ", ".join(f"{hit or '(home)'} {score:.0f}" for hit, score in pages[:5])
            wrong.append(f"{query!r} should find {page} first, finds: {ranking}")
    assert not wrong, "\n".join(wrong)


def test_the_theme_scores_as_this_test_does():
    """The installed worker still has the lines ThemeSearch reproduces; a new theme version is checked again."""
    import material

    worker = next((Path(material.__file__).parents[1] / WORKER).glob("search.*.min.js")).read_text(encoding="utf-8")
    assert 'version="2.3.9"' in worker, "lunr.js is no longer 2.3.9"
    assert "this.b(0)" in worker, "the theme no longer sets lunr's b to 0"
    assert "_k1=1.2" in worker and "Math.round(w*1e3)/1e3" in worker, "lunr's BM25 weights changed"
    assert re.search(r"=\+!\w\.parent\+Object\.values\(\w\)\.filter\(", worker), "the theme's boost changed"
    assert re.search(r"score:\w\*\(1\+\w+\(\w,2\)\)", worker), "the theme's boost changed"
