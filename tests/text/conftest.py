"""Fixtures of the text tests: a few real files of the installed corpus (Debian's python3.11-doc), read once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.text import read_documents
from trainlib.text.corpus import DEBIAN_SOURCE, Document, split_documents
from trainlib.text.tokenizer import train_wordpiece


@pytest.fixture(scope="session")
def real_root(tmp_path_factory) -> Path:
    """A corpus folder holding the tutorial (17 files) and the built-in functions page copied from the installed
    corpus at their relative paths: about 2,000 sentences, read in under 2 s."""
    if not (DEBIAN_SOURCE / "tutorial").is_dir():
        pytest.fail(f"{DEBIAN_SOURCE} is missing: apt-get install python3.11-doc (scripts/setup.sh does)")
    root = tmp_path_factory.mktemp("corpus")
    shutil.copytree(DEBIAN_SOURCE / "tutorial", root / "tutorial")
    (root / "library").mkdir()
    shutil.copy(DEBIAN_SOURCE / "library/functions.rst.txt", root / "library")
    return root


@pytest.fixture(scope="session")
def real_documents(real_root) -> list[Document]:
    return read_documents(real_root)


@pytest.fixture(scope="session")
def train_documents(real_documents) -> list[Document]:
    return split_documents(real_documents, held_out_fraction=0.2, seed=0)[0]


@pytest.fixture(scope="session")
def tokenizer(train_documents):
    return train_wordpiece(train_documents, vocab_size=2000, min_frequency=2, lowercase=True)
