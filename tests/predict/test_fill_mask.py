"""BERT's MindIR export filling masks: the exported network's masked-LM logits are the network's, each mask gets
the network's most probable token, and a text it cannot read is named while the others are filled."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

import pipelines  # noqa: F401  (the CPU defaults before MindSpore loads)
from mindir_serving.fill_mask import MindirFillMask
from trainlib.models.bert import BertConfig, create_bert
from trainlib.predict.export import export_fill_mask, save_model
from trainlib.predict.fill_mask import masked_text
from trainlib.text.corpus import Document
from trainlib.text.tokenizer import MASK_ID, SEP_ID, tokenizer_to_json, train_wordpiece

SENTENCES = ("the cat sat on the mat", "a dog ran in the park", "the bird sang in the tree") * 4
SEQ_LENGTH, PREDICTIONS = 16, 3


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import mindspore as ms

    ms.set_seed(0)
    tokenizer = train_wordpiece([Document("a.txt", SENTENCES)], vocab_size=60, min_frequency=1, lowercase=True)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=SEQ_LENGTH,
        type_vocab_size=2,
        initializer_range=0.5,  # wide weights: distinct logits for a random network
    )
    net = create_bert(config)
    model = export_fill_mask(
        net,
        tokenizer=tokenizer_to_json(tokenizer),
        max_seq_length=SEQ_LENGTH,
        max_predictions=PREDICTIONS,
        network="bert",
        training="thor",
        example_text="the [MASK] sat on the mat",
    )
    folder = tmp_path_factory.mktemp("bert") / "model"
    save_model(model, folder)
    return net, tokenizer, MindirFillMask.from_folder(folder), folder


def network_logits(net, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The network's masked-LM logits (inference mode), ``(batch, predictions, vocab)``."""
    import mindspore as ms

    net.set_train(False)
    inputs = [ms.Tensor(ids), ms.Tensor((ids != 0).astype(np.int32)), ms.Tensor(np.zeros_like(ids))]
    logits, _ = net(*inputs, ms.Tensor(positions))
    return logits.asnumpy().reshape(len(ids), PREDICTIONS, -1)


def test_each_mask_gets_the_networks_most_probable_token(exported):
    net, tokenizer, model, _ = exported
    texts = ["the [MASK] sat on the [MASK]", "a dog [MASK] in the park"]
    encoded = [model.encode(text) for text in texts]
    ids, positions = np.stack([e[0] for e in encoded]), np.stack([e[1] for e in encoded])
    assert ids[0][0] == 2 and list(ids[0]).count(MASK_ID) == 2 and SEP_ID in ids[0]  # [CLS] … [SEP], padded
    expected = network_logits(net, ids, positions)
    filled = model.predict(texts, top_k=2, batch_size=8)  # a batch of 2 of at most 8: no padding row
    assert (filled["error"] == "").all()
    for row, text, logits in zip(filled.itertuples(), texts, expected, strict=True):
        candidates = json.loads(row.candidates)
        assert len(candidates) == text.count("[MASK]") and all(len(c) == 2 for c in candidates)
        best = [tokenizer.id_to_token(int(np.argmax(mask))) for mask in logits[: len(candidates)]]
        assert [c[0][0] for c in candidates] == best
        expected_text = text
        for token in best:
            expected_text = expected_text.replace("[MASK]", token.removeprefix("##"), 1)
        assert row.filled == expected_text


def test_a_text_it_cannot_read_is_named_and_the_others_are_filled(exported):
    _, _, model, _ = exported
    texts = ["no mask here", "[MASK] " * (PREDICTIONS + 1), "the cat " * 10 + "[MASK]", "the [MASK] ran"]
    filled = model.predict(texts, top_k=1, batch_size=4)
    assert list(filled["error"][:3]) == [
        "no [MASK] in the text",
        f"{PREDICTIONS + 1} masks: the model predicts at most {PREDICTIONS} per text",
        f"23 tokens with [CLS] and [SEP]: the model reads at most {SEQ_LENGTH}",
    ]
    assert filled["error"].iloc[3] == "" and "[MASK]" not in filled["filled"].iloc[3]


def test_an_example_input_is_the_first_segment_with_its_masks(exported):
    _, tokenizer, _, _ = exported
    ids = [2, *tokenizer.encode("the cat sat", add_special_tokens=False).ids, SEP_ID, 7, SEP_ID, 0]
    assert masked_text(np.array(ids), tokenizer) == "the [MASK] sat"  # none masked: the middle token is
    ids[2] = MASK_ID
    assert masked_text(np.array(ids), tokenizer) == "the [MASK] sat"


def test_the_mlflow_model_fills_the_masks_of_a_text_column(exported, tmp_path):
    import mlflow
    import pandas as pd
    from mlflow.pyfunc.scoring_server import predictions_to_json

    from pipelines.tracking.models import load_model, log_model
    from tests.support.runner import empty_store, process_state_kept
    from tests.support.standalone import strict_json

    _, _, model, folder = exported
    texts = ["the [MASK] sat on the mat", "no mask here"]
    with process_state_kept(tmp_path):
        shutil.copy(empty_store(), tmp_path / "mlflow.db")
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        with mlflow.start_run() as run:
            log_model(folder)
        logged = load_model(run.info.run_id)
        answer = logged.predict(pd.DataFrame({"text": texts}), params={"top_k": 2})
    assert logged.metadata.get_input_schema().input_names() == ["text"]
    pd.testing.assert_frame_equal(answer, model.predict(texts, top_k=2, batch_size=250))
    # what the REST server writes: strict JSON (no NaN), a text without a mask null but for its error
    reply = io.StringIO()
    predictions_to_json(answer, reply)
    rows = strict_json(reply.getvalue())["predictions"]
    assert rows[1] == {"filled": None, "candidates": None, "error": "no [MASK] in the text"}
