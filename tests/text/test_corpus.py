"""Reading reST sources into prose sentences, and the split by document."""

from __future__ import annotations

import logging
import textwrap

import pytest

from tests.support.text import read_documents
from trainlib.text.corpus import CorpusNotFoundError, Document, split_documents

SPHINX_PAGE = """\
    .. _target-label:

    Spam and eggs
    =============

    .. module:: spam
       :synopsis: Secret module arguments.

    .. index:: single: hidden index entry

    The :func:`spam.open` function opens a tin. See :ref:`the manual <target-label>` and
    :class:`~spam.tins.BigTin` for more. It never fails.

    .. function:: spam(eggs, *, secretsignature=None)

       Return the spam of *eggs*. The spam is salted.

       .. versionadded:: 3.99

    .. code-block:: python

       secret_code_block = 1

    Example::

       secret_literal_block = 2

    >>> secret_doctest = 3

    .. doctest::

       >>> secret_doctest_directive = 4

    .. toctree::
       :maxdepth: 2

       secretdocname

    .. productionlist::
       secret_rule: "a" | "b"

    .. |secretsub| replace:: secret substitution

    .. a comment holding a secret

    +---------------+-----+
    | secret cell   | 1   |
    +---------------+-----+

    * A list item sentence.

    term
       A definition sentence.

    .. note::

       A note sentence.

    .. unknownthing:: secretargument
       :secretoption: value

       Content of an unknown directive.
    """


def write(root, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_sphinx_markup_keeps_prose_and_drops_code_listings_and_arguments(tmp_path):
    write(tmp_path, "spam.rst.txt", SPHINX_PAGE)
    [document] = read_documents(tmp_path)
    text = " ".join(document.sentences)
    assert "secret" not in text.lower()
    assert document.sentences[:3] == (
        "The spam.open function opens a tin.",
        "See the manual and BigTin for more.",
        "It never fails.",
    )
    for sentence in (
        "Return the spam of eggs.",
        "The spam is salted.",
        "A list item sentence.",
        "A definition sentence.",
        "A note sentence.",
        "Content of an unknown directive.",
    ):
        assert sentence in document.sentences


def test_real_paragraph_splits_at_sentence_ends_only(real_documents):
    names = [document.name for document in real_documents]
    assert names == sorted(names)
    assert names[0] == "library/functions.rst.txt" and len(names) == 18
    floating_point = next(d for d in real_documents if d.name == "tutorial/floatingpoint.rst.txt")
    # The first paragraph: decimal points and "1/8." inside sentences; the testsetup code and the
    # sectionauthor argument above it are not prose.
    assert floating_point.sentences[:3] == (
        "Floating-point numbers are represented in computer hardware as base 2 (binary) fractions.",
        "For example, the decimal fraction 0.125 has value 1/10 + 2/100 + 5/1000, and in the same way "
        "the binary fraction 0.001 has value 0/2 + 0/4 + 1/8.",
        "These two fractions have identical values, the only real difference being that the first is "
        "written in base 10 fractional notation, and the second in base 2.",
    )
    assert not any("import math" in s or "Tim Peters" in s for s in floating_point.sentences)
    functions = next(d for d in real_documents if d.name == "library/functions.rst.txt")
    assert "Return a Boolean value, i.e. one of True or False." in functions.sentences  # an abbreviation Punkt learnt
    assert all(s and s == s.strip() and "\n" not in s and "  " not in s for d in real_documents for s in d.sentences)


def test_documents_without_prose_are_left_out_and_logged(tmp_path, caplog):
    write(tmp_path, "a.rst.txt", "Some prose here.\n")
    write(tmp_path, "sub/code_only.rst.txt", ".. code-block:: python\n\n   x = 1\n\n.. index:: x\n")
    with caplog.at_level(logging.DEBUG, logger="trainlib.text.corpus"):
        documents = read_documents(tmp_path)
    assert documents == [Document(name="a.rst.txt", sentences=("Some prose here.",))]
    assert "sub/code_only.rst.txt" in caplog.text


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_missing_corpus_is_a_clear_error(tmp_path, make):
    root = tmp_path / "corpus"
    if make == "empty":
        root.mkdir()
        (root / "readme.txt").write_text("not a source")
    with pytest.raises(FileNotFoundError) as raised:
        read_documents(root)
    assert isinstance(raised.value, CorpusNotFoundError)
    assert str(root) in str(raised.value) and "apt-get install python3.11-doc" in str(raised.value)


def documents(n: int) -> list[Document]:
    return [Document(name=f"doc{i:03d}.rst.txt", sentences=(f"Sentence {i}.",)) for i in range(n)]


def test_split_is_by_document_disjoint_and_seeded():
    corpus = documents(100)
    train, held_out = split_documents(corpus, held_out_fraction=0.1, seed=0)
    assert len(held_out) == 10 and len(train) == 90
    assert {d.name for d in train}.isdisjoint({d.name for d in held_out})
    assert sorted(train + held_out, key=lambda d: d.name) == corpus
    assert train == sorted(train, key=lambda d: d.name)  # input order kept
    assert split_documents(corpus, held_out_fraction=0.1, seed=0) == (train, held_out)
    assert split_documents(list(reversed(corpus)), held_out_fraction=0.1, seed=0)[1] == held_out[::-1]
    assert split_documents(corpus, held_out_fraction=0.1, seed=1)[1] != held_out


def test_split_keeps_a_document_on_each_side():
    train, held_out = split_documents(documents(3), held_out_fraction=0.01, seed=0)
    assert (len(train), len(held_out)) == (2, 1)
    for corpus, fraction in ((documents(2), 0.9), (documents(1), 0.5)):
        with pytest.raises(ValueError, match=f"held_out_fraction {fraction}"):
            split_documents(corpus, held_out_fraction=fraction, seed=0)
    with pytest.raises(ValueError, match="held_out_fraction"):
        split_documents(documents(10), held_out_fraction=0.0, seed=0)
