"""Text data for BERT pre-training: ``corpus`` (reST sources to sentences, split by document), ``tokenizer``
(WordPiece trained on the train documents), ``examples`` (BERT's masked-LM / next-sentence examples) and
``dataset`` (the batched MindSpore dataset over them). Imports neither Kedro nor MLflow."""
