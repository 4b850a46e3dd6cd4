"""BERT's special tokens at fixed ids, and a tokenizer read back from its JSON text (Hugging Face ``tokenizers``):
what a fill-mask model needs of the training's tokenizer (``trainlib.text.tokenizer`` trains it)."""

from __future__ import annotations

from tokenizers import Tokenizer

# BERT's special tokens at fixed ids: the examples and the network refer to them by these numbers.
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def check_special_tokens(tokenizer: Tokenizer) -> None:
    """Raise ``ValueError`` unless [PAD], [UNK], [CLS], [SEP], [MASK] have ids 0 to 4."""
    found = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    if list(found.values()) != list(range(len(SPECIAL_TOKENS))):
        raise ValueError(f"the tokenizer's special token ids are {found}, expected 0 to 4 in this order")


def tokenizer_from_json(text: str) -> Tokenizer:
    """The tokenizer of its JSON text (``Tokenizer.to_str``), its special token ids checked."""
    tokenizer = Tokenizer.from_str(text)
    check_special_tokens(tokenizer)
    return tokenizer
