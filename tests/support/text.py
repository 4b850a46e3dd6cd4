"""A corpus folder read as documents of sentences, Punkt fitted on all of it (the tests' tiny corpora; the
recipe fits it on the train documents only)."""

from __future__ import annotations

from pathlib import Path

from trainlib.text.corpus import Document, fit_sentence_splitter, into_sentences, read_sources


def read_documents(root: str | Path) -> list[Document]:
    sources = read_sources(root, limit=None)
    return into_sentences(sources, fit_sentence_splitter(sources))
