"""The text corpus: prose sentences of reStructuredText sources, split by document into train and held-out.

The corpus is the Python 3.11 documentation's reST sources as Debian's ``python3.11-doc`` installs them
(``DEBIAN_SOURCE``). Each file is parsed by docutils; Sphinx's own roles and directives, which docutils does
not know, are read as plain text (roles) or as reST content without their arguments (directives), and
listing-like directives (toctree, index, grammar, doctest) are dropped. The prose of paragraph nodes outside
code, tables, comments, substitution definitions and docutils' own messages (``read_sources``) is cut into
sentences (``into_sentences``) by NLTK's unsupervised Punkt, trained on the train documents' own paragraphs
(``fit_sentence_splitter``: no NLTK data download), after ``split_documents`` has set the held-out documents apart:
nothing is fitted on held-out text.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import docutils.core
import pandas as pd
from docutils import nodes
from docutils.parsers.rst import Directive, directives, roles

if TYPE_CHECKING:
    from nltk.tokenize.punkt import PunktSentenceTokenizer

logger = logging.getLogger(__name__)

DEBIAN_SOURCE = Path("/usr/share/doc/python3.11/html/_sources")
SOURCE_SUFFIX = ".rst.txt"

# Sphinx directives whose content is a listing, not prose (a toctree's document names, index entries,
# grammar rules, doctest code): dropped whole.
_LISTING_DIRECTIVES = frozenset(
    {"toctree", "index", "productionlist", "doctest", "testcode", "testoutput", "testsetup", "testcleanup"}
)
# Ancestors whose paragraphs are not prose. A ``contents`` topic is the table of contents docutils builds
# from section titles; system messages are docutils' own reports (silenced, but still in the tree).
_NON_PROSE = (
    nodes.literal_block,
    nodes.doctest_block,
    nodes.table,
    nodes.comment,
    nodes.substitution_definition,
    nodes.system_message,
    nodes.raw,
)
# Silence every report (level 5 is above SEVERE) and never stop on one; never read other files or raw output.
_DOCUTILS_SETTINGS = {
    "report_level": 5,
    "halt_level": 5,
    "warning_stream": False,
    "file_insertion_enabled": False,
    "raw_enabled": False,
    "input_encoding": "utf-8",
}
# Sphinx's cross-reference syntax: "title <target>" shows the title.
_EXPLICIT_TITLE = re.compile(r"^(.+?)\s*<(.*?)>$", re.DOTALL)
_WHITESPACE = re.compile(r"\s+")


class CorpusNotFoundError(FileNotFoundError):
    """The corpus folder is missing or holds no reST source."""


@dataclass(frozen=True)
class Document:
    """One source file: ``name`` its path relative to the corpus root, ``sentences`` its prose in order."""

    name: str
    sentences: tuple[str, ...]


class _AnyOption(dict):
    """An option spec that accepts every option of an unknown directive as an unchecked string."""

    def __missing__(self, key: str):
        return directives.unchanged


class _SphinxDirective(Directive):
    """An unknown (Sphinx) directive: its content parsed as reST, its arguments and options dropped
    (they are signatures, version numbers, targets: not sentences)."""

    optional_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = _AnyOption()

    def run(self) -> list[nodes.Node]:
        if self.name in _LISTING_DIRECTIVES or not self.content:
            return []
        holder = nodes.Element()
        self.state.nested_parse(self.content, self.content_offset, holder)
        return holder.children


def _sphinx_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """An unknown (Sphinx) role as the text Sphinx shows: the title of ``title <target>``, the last part
    of ``~a.b.c``, the text otherwise."""
    match = _EXPLICIT_TITLE.match(text)
    if match:
        text = match.group(1)
    elif text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return [nodes.Text(text.lstrip("!"))], []


@contextlib.contextmanager
def _sphinx_markup_as_text() -> Iterator[None]:
    """Docutils' role and directive look-ups, falling back to ``_sphinx_role`` and ``_SphinxDirective``
    for names docutils does not know, for the duration of the block.

    Docutils has no hook for unknown names; Sphinx itself patches these two look-ups the same way
    (``sphinx.util.docutils.sphinx_domains``), so the patch is undone on exit.
    """
    known_directive, known_role = directives.directive, roles.role

    def directive(directive_name, language_module, document):
        found, messages = known_directive(directive_name, language_module, document)
        return found or _SphinxDirective, messages

    def role(role_name, language_module, lineno, reporter):
        found, messages = known_role(role_name, language_module, lineno, reporter)
        return found or _sphinx_role, messages

    directives.directive, roles.role = directive, role
    try:
        yield
    finally:
        directives.directive, roles.role = known_directive, known_role


def _is_prose(paragraph: nodes.paragraph) -> bool:
    """Whether ``paragraph`` lies outside code, tables, comments, messages and the table of contents."""
    parent = paragraph.parent
    while parent is not None:
        if isinstance(parent, _NON_PROSE) or (isinstance(parent, nodes.topic) and "contents" in parent["classes"]):
            return False
        parent = parent.parent
    return True


def _paragraphs(path: Path) -> list[str]:
    """The prose paragraphs of one reST file, whitespace collapsed to single spaces."""
    tree = docutils.core.publish_doctree(
        path.read_text(encoding="utf-8"), source_path=str(path), settings_overrides=_DOCUTILS_SETTINGS
    )
    texts = (
        _WHITESPACE.sub(" ", paragraph.astext()).strip()
        for paragraph in tree.findall(nodes.paragraph)
        if _is_prose(paragraph)
    )
    return [text for text in texts if text]


def _source_files(root: str | Path) -> list[Path]:
    """Every ``*.rst.txt`` under ``root``, sorted by relative path; ``CorpusNotFoundError`` when none."""
    root = Path(root)
    advice = (
        f"install Debian's python3.11-doc (apt-get install python3.11-doc) "
        f"or set the corpus root to a folder of {SOURCE_SUFFIX} files"
    )
    if not root.is_dir():
        raise CorpusNotFoundError(f"the corpus folder {root} does not exist: {advice}")
    files = sorted(root.rglob(f"*{SOURCE_SUFFIX}"), key=lambda path: path.relative_to(root).as_posix())
    if not files:
        raise CorpusNotFoundError(f"the corpus folder {root} holds no {SOURCE_SUFFIX} file: {advice}")
    return files


@dataclass(frozen=True)
class Source:
    """A corpus file's prose paragraphs, before they are cut into sentences."""

    name: str  # path relative to the corpus root
    paragraphs: tuple[str, ...]


def read_sources(root: str | Path, *, limit: int | None) -> list[Source]:
    """The prose paragraphs of every ``*.rst.txt`` under ``root`` (the first ``limit`` by relative path; None: all),
    sorted by relative path."""
    root = Path(root)
    files = _source_files(root)[:limit]
    with _sphinx_markup_as_text():
        return [Source(path.relative_to(root).as_posix(), tuple(_paragraphs(path))) for path in files]


def fit_sentence_splitter(sources: Sequence[Source]) -> PunktSentenceTokenizer:
    """Punkt trained on the paragraphs of ``sources`` (the train documents): its abbreviations, collocations and
    sentence starters."""
    # imported here: importing NLTK loads all of it (about 1 s), and every `kedro run` and msrun worker imports
    # this module through the pipelines' registry, BERT or not
    from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTrainer

    trainer = PunktTrainer()
    for source in sources:
        trainer.train("\n\n".join(source.paragraphs), finalize=False)
    trainer.finalize_training()
    return PunktSentenceTokenizer(trainer.get_params())


def into_sentences(sources: Sequence[Source], splitter: PunktSentenceTokenizer) -> list[Document]:
    """``sources`` as documents of sentences (``splitter``'s cuts of each paragraph, stripped; only empty strings
    dropped). Documents without a sentence are left out (named in the debug log)."""
    documents = []
    for source in sources:
        sentences = tuple(
            sentence.strip() for text in source.paragraphs for sentence in splitter.tokenize(text) if sentence.strip()
        )
        if sentences:
            documents.append(Document(name=source.name, sentences=sentences))
        else:
            logger.debug("%s has no prose sentence: left out", source.name)
    return documents


def documents_table(documents: Sequence[Document]) -> pd.DataFrame:
    """One row per sentence: ``document`` (its name) and ``sentence``, in document order."""
    rows = [(document.name, sentence) for document in documents for sentence in document.sentences]
    return pd.DataFrame(rows, columns=["document", "sentence"])


def documents_from_table(table: pd.DataFrame) -> list[Document]:
    """The documents of a ``documents_table``, in their order."""
    return [
        Document(name=str(name), sentences=tuple(group["sentence"].astype(str)))
        for name, group in table.groupby("document", sort=False)
    ]


def _rank(seed: int, name: str) -> bytes:
    """A document's place in the seed's order: a hash of (seed, name), the same on every machine and run."""
    return hashlib.sha256(f"{seed}\0{name}".encode()).digest()


Named = TypeVar("Named", Source, Document)


def split_documents(
    documents: Sequence[Named], *, held_out_fraction: float, seed: int
) -> tuple[list[Named], list[Named]]:
    """Train and held-out documents: ``round(held_out_fraction * n)`` documents (at least one) held out, in an
    order that depends only on ``seed`` and the names; each side keeps the input order. Raises ``ValueError``
    when the fraction leaves either side empty."""
    if not 0 < held_out_fraction < 1:
        raise ValueError(f"held_out_fraction must lie strictly between 0 and 1, got {held_out_fraction}")
    held_out_count = max(1, round(held_out_fraction * len(documents)))
    if held_out_count >= len(documents):
        raise ValueError(
            f"held_out_fraction {held_out_fraction} of {len(documents)} document(s) leaves no document "
            f"to train on: use more documents or a smaller fraction"
        )
    held_out_names = {
        document.name for document in sorted(documents, key=lambda d: _rank(seed, d.name))[:held_out_count]
    }
    train = [document for document in documents if document.name not in held_out_names]
    held_out = [document for document in documents if document.name in held_out_names]
    return train, held_out
