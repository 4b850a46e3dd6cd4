"""BERT pre-training network: shapes, the loss and the masked-LM head against numpy, the attention mask, the
parameter names the weight-decay rule reads, THOR's coverage, graph-mode training and ``mlm_metrics``."""

from __future__ import annotations

import dataclasses

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.dataset import NumpySlicesDataset

from trainlib.models.bert import (
    BertConfig,
    BertNetworkWithLoss,
    BertPreTraining,
    create_bert,
    mlm_metrics,
)
from trainlib.models.resnet import count_parameters
from trainlib.optim.thor.capture import set_capture, wrap_layers
from trainlib.text.examples import COLUMNS

TINY = BertConfig(
    vocab_size=60,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=32,
    type_vocab_size=2,
    initializer_range=0.02,
)
BATCH, SEQ, PREDICTIONS = 4, 16, 3


def decays(param) -> bool:
    """The models repo's THOR decay filter (``Bert_thor/run_pretrain.py``)."""
    return "layernorm" not in param.name.lower() and "bias" not in param.name.lower()


def make_columns(examples: int, seed: int) -> dict[str, np.ndarray]:
    """Random pre-training columns: each row has 10..16 real tokens, masked positions among them, the last
    prediction of odd rows is padding (weight 0)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, SEQ + 1, examples)
    input_mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    positions = np.stack([rng.choice(length, PREDICTIONS, replace=False) for length in lengths]).astype(np.int32)
    weights = np.ones((examples, PREDICTIONS), np.float32)
    weights[1::2, -1] = 0.0
    return {
        "input_ids": rng.integers(0, TINY.vocab_size, (examples, SEQ)).astype(np.int32),
        "input_mask": input_mask,
        "token_type_ids": (np.arange(SEQ)[None, :] >= lengths[:, None] // 2).astype(np.int32) * input_mask,
        "next_sentence_labels": rng.integers(0, 2, (examples, 1)).astype(np.int32),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(0, TINY.vocab_size, (examples, PREDICTIONS)).astype(np.int32),
        "masked_lm_weights": weights,
    }


def tensors(columns: dict[str, np.ndarray]) -> list[ms.Tensor]:
    return [ms.Tensor(columns[name]) for name in COLUMNS]


@pytest.fixture(scope="module")
def net() -> BertPreTraining:
    ms.set_seed(0)
    network = create_bert(TINY)
    network.set_train(False)
    return network


@pytest.fixture(scope="module")
def columns() -> dict[str, np.ndarray]:
    return make_columns(BATCH, seed=1)


def logits(network: BertPreTraining, columns: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    ids, mask, types, _, positions, _, _ = tensors(columns)
    mlm, nsp = network(ids, mask, types, positions)
    return mlm.asnumpy().astype(np.float64), nsp.asnumpy().astype(np.float64)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def numpy_loss(mlm: np.ndarray, nsp: np.ndarray, columns: dict[str, np.ndarray]) -> float:
    """BERT's pre-training loss (models repo ``BertPretrainingLoss``) from the logits."""
    ids = columns["masked_lm_ids"].reshape(-1)
    weights = columns["masked_lm_weights"].reshape(-1).astype(np.float64)
    mlm_nll = -log_softmax(mlm)[np.arange(ids.size), ids]
    labels = columns["next_sentence_labels"].reshape(-1)
    nsp_nll = -log_softmax(nsp)[np.arange(labels.size), labels]
    return float((weights * mlm_nll).sum() / (weights.sum() + 1e-5) + nsp_nll.mean())


def test_config_is_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        BertConfig(60, 16, 2, 2, 32, 0.0, 0.0, 32, 2, 0.02)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TINY.hidden_size = 8  # type: ignore[misc]


def test_output_shapes(net, columns):
    ids, mask, types, _, positions, _, _ = tensors(columns)
    sequence, pooled = net.bert(ids, mask, types)
    assert sequence.shape == (BATCH, SEQ, TINY.hidden_size)
    assert pooled.shape == (BATCH, TINY.hidden_size)
    mlm, nsp = net(ids, mask, types, positions)
    assert mlm.shape == (BATCH * PREDICTIONS, TINY.vocab_size)
    assert nsp.shape == (BATCH, 2)


def test_parameter_count_is_bert_closed_form(net):
    v, h, p, t, i, layers = 60, 16, 32, 2, 32, 2
    dense = lambda n_in, n_out: n_in * n_out + n_out  # noqa: E731
    embeddings = (v + p + t) * h + 2 * h
    encoder_layer = 4 * dense(h, h) + 2 * h + dense(h, i) + dense(i, h) + 2 * h
    heads = dense(h, h) + (dense(h, h) + 2 * h + v) + dense(h, 2)  # pooler, MLM transform + output bias, NSP
    assert count_parameters(net) == embeddings + layers * encoder_layer + heads == 6654


def test_loss_is_the_weighted_mlm_plus_nsp_cross_entropy(net, columns):
    loss = BertNetworkWithLoss(net)(*tensors(columns)).asnumpy()
    assert loss.shape == ()
    assert np.isfinite(loss)
    assert float(loss) == pytest.approx(numpy_loss(*logits(net, columns), columns), rel=1e-5)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def test_masked_lm_head_gathers_the_masked_positions(net, columns):
    """Logit row (b, k) is the MLM head (dense, GELU, LayerNorm, tied embedding + bias) on sequence[b, pos[b, k]]."""
    ids, mask, types, _, positions, _, _ = tensors(columns)
    sequence = net.bert(ids, mask, types)[0].asnumpy().astype(np.float64)
    head = {p.name: p.asnumpy().astype(np.float64) for p in net.get_parameters()}
    pos = columns["masked_lm_positions"]
    rows = sequence[np.arange(BATCH)[:, None], pos].reshape(-1, TINY.hidden_size)
    rows = gelu_tanh(rows @ head["mlm.dense.weight"].T + head["mlm.dense.bias"])
    rows = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-12)
    rows = rows * head["mlm.layernorm.gamma"] + head["mlm.layernorm.beta"]
    expected = rows @ head["bert.word_embedding.embedding_table"].T + head["mlm.output_bias"]
    np.testing.assert_allclose(logits(net, columns)[0], expected, rtol=1e-4, atol=1e-5)


def test_padding_tokens_do_not_change_the_real_positions(net, columns):
    changed = dict(columns)
    padded = columns["input_mask"] == 0
    assert padded.any()
    changed["input_ids"] = np.where(padded, (columns["input_ids"] + 7) % TINY.vocab_size, columns["input_ids"])
    before = net.bert(*[ms.Tensor(columns[c]) for c in COLUMNS[:3]])[0].asnumpy()
    after = net.bert(*[ms.Tensor(changed[c]) for c in COLUMNS[:3]])[0].asnumpy()
    real = ~padded
    np.testing.assert_allclose(after[real], before[real], rtol=1e-6, atol=1e-6)
    assert not np.allclose(after[padded], before[padded])  # the padded rows themselves did change
    np.testing.assert_allclose(logits(net, changed)[0], logits(net, columns)[0], rtol=1e-6, atol=1e-6)
    # and a real token does reach the other real positions
    changed["input_ids"] = columns["input_ids"].copy()
    changed["input_ids"][:, 1] = (changed["input_ids"][:, 1] + 7) % TINY.vocab_size
    moved = net.bert(*[ms.Tensor(changed[c]) for c in COLUMNS[:3]])[0].asnumpy()
    assert not np.allclose(moved[:, 0], before[:, 0])


def test_the_loss_wrapper_keeps_the_parameter_names():
    network = create_bert(TINY)
    names = [p.name for p in network.trainable_params()]
    nn.TrainOneStepCell(BertNetworkWithLoss(network), nn.AdamWeightDecay(network.trainable_params()))
    assert [p.name for p in network.trainable_params()] == names
    assert names[0] == "bert.word_embedding.embedding_table"


def test_decay_filter_spares_exactly_the_layernorms_and_biases(net):
    layernorms = ["bert.embedding_layernorm", "mlm.layernorm"]
    biases = ["bert.pooler.bias", "mlm.dense.bias", "mlm.output_bias", "nsp.bias"]
    for layer in range(TINY.num_hidden_layers):
        prefix = f"bert.encoder.{layer}"
        layernorms += [f"{prefix}.attention.output.layernorm", f"{prefix}.output.layernorm"]
        biases += [f"{prefix}.attention.{dense}.bias" for dense in ("query", "key", "value", "output.dense")]
        biases += [f"{prefix}.intermediate.bias", f"{prefix}.output.dense.bias"]
    spared = {f"{name}.{p}" for name in layernorms for p in ("gamma", "beta")} | set(biases)
    params = net.trainable_params()
    assert {p.name for p in params if not decays(p)} == spared
    decayed = {p.name for p in params if decays(p)}
    assert all(name.endswith(("weight", "embedding_table")) for name in decayed)
    assert len(decayed) == 3 + 6 * TINY.num_hidden_layers + 3  # 3 embedding tables, every Dense weight


def test_thor_captures_every_dense_layer_and_no_embedding():
    network = create_bert(TINY)
    dense_weights = {cell.weight.name for _, cell in network.cells_and_names() if isinstance(cell, nn.Dense)}
    wrappers = wrap_layers(network, 1.0)
    assert len(wrappers) == 6 * TINY.num_hidden_layers + 3 == len(dense_weights)
    assert {w.weight.name for w in wrappers} == dense_weights
    assert not any("embedding" in w.weight.name for w in wrappers)
    # one captured training step runs in graph mode and fills A and G of every layer
    set_capture(wrappers, True)
    step = nn.TrainOneStepCell(BertNetworkWithLoss(network), nn.Momentum(network.trainable_params(), 1e-3, 0.9))
    step.set_train()
    assert np.isfinite(step(*tensors(make_columns(BATCH, seed=1))).asnumpy())
    for wrapper in wrappers:
        assert np.abs(wrapper.a_stat.asnumpy()).sum() > 0, wrapper.weight.name
        assert np.abs(wrapper.g_stat.asnumpy()).sum() > 0, wrapper.weight.name


def test_dropout_cells_only_where_the_probability_is_positive():
    def dropouts(config: BertConfig) -> int:
        return sum(isinstance(cell, nn.Dropout) for _, cell in create_bert(config).cells_and_names())

    assert dropouts(TINY) == 0
    hidden_only = dataclasses.replace(TINY, hidden_dropout_prob=0.1)
    assert dropouts(hidden_only) == 1 + 2 * TINY.num_hidden_layers  # embeddings, attention output, feed-forward
    both = dataclasses.replace(hidden_only, attention_probs_dropout_prob=0.1)
    assert dropouts(both) == 1 + 3 * TINY.num_hidden_layers


def test_adamweightdecay_steps_in_graph_mode_reduce_the_loss(columns):
    ms.set_seed(0)
    network = create_bert(dataclasses.replace(TINY, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    params = network.trainable_params()
    groups = [
        {"params": [p for p in params if decays(p)], "weight_decay": 0.01},
        {"params": [p for p in params if not decays(p)], "weight_decay": 0.0},
    ]
    step = nn.TrainOneStepCell(BertNetworkWithLoss(network), nn.AdamWeightDecay(groups, learning_rate=1e-2, eps=1e-6))
    step.set_train()
    batch = tensors(columns)
    losses = [float(step(*batch).asnumpy()) for _ in range(8)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.5, losses


def test_mlm_metrics_match_numpy_from_the_logits(net):
    data = make_columns(3 * BATCH, seed=2)
    dataset = NumpySlicesDataset(data, column_names=list(COLUMNS), shuffle=False).batch(BATCH)
    net.set_train(True)
    metrics = mlm_metrics(net, dataset)
    assert net.training  # the mode it had before
    net.set_train(False)
    mlm, nsp = logits(net, data)  # all 12 examples at once: a separate path from the metric's batches
    ids = data["masked_lm_ids"].reshape(-1)
    weights = data["masked_lm_weights"].reshape(-1).astype(np.float64)
    log_probs = log_softmax(mlm)
    assert metrics["examples"] == 3 * BATCH
    assert metrics["mlm_accuracy"] == pytest.approx((weights * (mlm.argmax(-1) == ids)).sum() / weights.sum())
    nll = -log_probs[np.arange(ids.size), ids]
    assert metrics["mlm_loss"] == pytest.approx((weights * nll).sum() / weights.sum(), rel=1e-5)
    nsp_labels = data["next_sentence_labels"].reshape(-1)
    assert metrics["nsp_accuracy"] == pytest.approx((nsp.argmax(-1) == nsp_labels).mean())
