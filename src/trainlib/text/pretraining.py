"""The thor_bert pipeline's text, from its parameter sections: the corpus split into train and held-out documents,
the WordPiece tokenizer of the train documents, the pre-training examples of each."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trainlib.params import BertCorpusParams, BertExampleParams, BertTokenizerParams
from trainlib.text.corpus import Document, fit_sentence_splitter, into_sentences, read_sources, split_documents
from trainlib.text.examples import create_pretraining_examples
from trainlib.text.tokenizer import train_wordpiece

logger = logging.getLogger(__name__)


def split_corpus(corpus: BertCorpusParams) -> tuple[list[Document], list[Document]]:
    """The corpus's documents (the first ``max_documents`` by name), split into train and held-out documents before
    anything is fitted, then cut into sentences by Punkt trained on the train documents."""
    sources = read_sources(corpus.root, limit=corpus.max_documents)
    train_sources, held_out_sources = split_documents(
        sources, held_out_fraction=corpus.held_out_fraction, seed=corpus.split_seed
    )
    splitter = fit_sentence_splitter(train_sources)
    train_documents, held_out = into_sentences(train_sources, splitter), into_sentences(held_out_sources, splitter)
    logger.info(
        "Corpus %s: %d documents, %d train (%d sentences), %d held out (%d sentences)",
        corpus.root,
        len(sources),
        len(train_documents),
        sum(len(d.sentences) for d in train_documents),
        len(held_out),
        sum(len(d.sentences) for d in held_out),
    )
    return train_documents, held_out


def fit_tokenizer(train_documents: Sequence[Document], tokenizer: BertTokenizerParams):
    """A WordPiece tokenizer trained on the train documents only."""
    return train_wordpiece(train_documents, **tokenizer.model_dump())  # vocab_size, min_frequency, lowercase


def pretraining_examples(documents: Sequence[Document], tokenizer, examples: BertExampleParams) -> dict:
    """Masked-LM and next-sentence examples of ``documents`` (create_pretraining_data's rules)."""
    return create_pretraining_examples(documents, tokenizer, **examples.model_dump())  # the section's every key
