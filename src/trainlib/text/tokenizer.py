"""A BERT WordPiece tokenizer (Hugging Face ``tokenizers``) trained on the train documents only, kept as its JSON
text so that a text dataset can store it."""

from __future__ import annotations

from collections.abc import Iterator

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

# the special tokens and the reader are a logged model's too (``mindir_serving`` ships with it): defined there once
from mindir_serving.tokens import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    check_special_tokens,
    tokenizer_from_json,
)
from trainlib.text.corpus import Document

__all__ = [
    "CLS_ID",
    "MASK_ID",
    "PAD_ID",
    "SEP_ID",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "check_special_tokens",
    "pieces",
    "tokenizer_from_json",
    "tokenizer_to_json",
    "train_wordpiece",
]


def _sentences(documents: list[Document]) -> Iterator[str]:
    for document in documents:
        yield from document.sentences


def train_wordpiece(documents: list[Document], *, vocab_size: int, min_frequency: int, lowercase: bool) -> Tokenizer:
    """A WordPiece tokenizer of at most ``vocab_size`` tokens (special tokens included) learnt from the sentences
    of ``documents``; pieces seen fewer than ``min_frequency`` times are left out. BERT's normaliser (accents
    stripped and text lowercased when ``lowercase``) and pre-tokeniser (whitespace and punctuation)."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(_sentences(documents), trainer=trainer)
    # The trainer numbers pieces of equal rank in a hash map's order, which changes from one call to the next: the
    # special tokens keep 0 to 4, the other pieces are numbered in sorted order, so the same pieces get the same ids,
    # examples and embedding rows in every run. (Ties at the vocabulary's cut-off can still swap a rare piece: seen
    # at 300 pieces of a small corpus, never at thor_bert's default.)
    learnt = tokenizer.get_vocab()
    pieces = list(SPECIAL_TOKENS) + sorted(set(learnt) - set(SPECIAL_TOKENS))
    tokenizer.model = models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]")
    check_special_tokens(tokenizer)
    return tokenizer


def pieces(tokenizer: Tokenizer) -> tuple[str, ...]:
    """The tokenizer's vocabulary, each piece at its id: ``pieces(t)[1844]`` is ``'the'``."""
    vocabulary = tokenizer.get_vocab()
    return tuple(sorted(vocabulary, key=vocabulary.__getitem__))


def tokenizer_to_json(tokenizer: Tokenizer) -> str:
    """The tokenizer as its JSON text (model, vocabulary, normaliser, pre-tokeniser)."""
    return tokenizer.to_str()
