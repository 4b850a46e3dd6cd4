"""The WordPiece tokenizer: special token ids, training on the given documents only, the JSON round trip."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models

from trainlib.text.corpus import Document
from trainlib.text.tokenizer import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    UNK_ID,
    pieces,
    tokenizer_from_json,
    tokenizer_to_json,
    train_wordpiece,
)


def test_special_tokens_have_fixed_ids(tokenizer):
    ids = [tokenizer.token_to_id(token) for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    assert ids == [PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID] == [0, 1, 2, 3, 4]
    assert 1000 < tokenizer.get_vocab_size() <= 2000


def test_pieces_are_the_vocabulary_by_id(tokenizer):
    vocabulary = pieces(tokenizer)
    assert len(vocabulary) == tokenizer.get_vocab_size()
    assert vocabulary[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert all(tokenizer.id_to_token(i) == piece for i, piece in enumerate(vocabulary))


def test_train_sentences_become_known_pieces(tokenizer, train_documents):
    sentences = [s for d in train_documents for s in d.sentences]
    encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
    ids = [i for encoding in encodings for i in encoding.ids]
    assert sum(i == UNK_ID for i in ids) / len(ids) < 0.01
    assert not any(i in (PAD_ID, CLS_ID, SEP_ID, MASK_ID) for i in ids)
    assert encodings[0].tokens == tokenizer.encode(sentences[0], add_special_tokens=False).tokens


def test_json_round_trip_gives_identical_ids(tokenizer, real_documents):
    text = tokenizer_to_json(tokenizer)
    assert isinstance(text, str)
    restored = tokenizer_from_json(text)
    sentences = [s for d in real_documents for s in d.sentences]  # held-out sentences included
    assert [e.ids for e in restored.encode_batch(sentences, add_special_tokens=False)] == [
        e.ids for e in tokenizer.encode_batch(sentences, add_special_tokens=False)
    ]
    assert tokenizer_to_json(restored) == text


def test_the_same_learnt_pieces_get_the_same_ids_every_time(train_documents):
    """The trainer numbers pieces of equal rank in a hash map's order, which changes between calls: before the
    pieces were renumbered, four trainings in one process gave three numberings. Ties at the vocabulary's cut-off
    can also swap a piece or two between calls (here 2 pieces in 2 of 6 trainings; never in 11 trainings of the
    thor_bert default): trainings that learnt the same pieces must give the same tokenizer."""
    by_pieces: dict[frozenset, set[str]] = {}
    for _ in range(5):
        tokenizer = train_wordpiece(train_documents, vocab_size=300, min_frequency=2, lowercase=True)
        by_pieces.setdefault(frozenset(tokenizer.get_vocab()), set()).add(tokenizer_to_json(tokenizer))
    assert max(len(tokenizers) for tokenizers in by_pieces.values()) == 1
    assert len(by_pieces) < 5  # at least two trainings learnt the same pieces, so the check above compared them


def test_lowercase_and_training_documents_decide_the_vocabulary():
    train = [Document(name="a", sentences=("Python runs Python code.",) * 20)]
    lower = train_wordpiece(train, vocab_size=200, min_frequency=1, lowercase=True)
    cased = train_wordpiece(train, vocab_size=200, min_frequency=1, lowercase=False)
    assert lower.encode("PYTHON", add_special_tokens=False).tokens == ["python"]
    assert cased.encode("Python", add_special_tokens=False).tokens == ["Python"]
    assert "Python" not in lower.get_vocab() and "python" not in cased.get_vocab()
    # A word of no training sentence is not a token of its own.
    assert "zyzzyva" not in lower.get_vocab()


def test_a_tokenizer_with_other_special_ids_is_refused():
    other = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}))
    with pytest.raises(ValueError, match="special token ids"):
        tokenizer_from_json(other.to_str())
