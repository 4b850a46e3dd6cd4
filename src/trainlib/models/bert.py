"""BERT for pre-training (masked LM + next sentence), in the 2-D layout of the models repo's
``official/nlp/Bert_thor/src/bert_model.py`` and ``bert_for_pre_training.py``.

Activations are reshaped to ``(batch * seq, hidden)`` around every dense layer, as in the models repo, and every
projection is a plain ``nn.Dense`` without activation (GELU and tanh are separate ops after it), so that THOR's
``optim.thor.capture.supported`` takes every one of them: per encoder layer query, key, value, attention output,
intermediate and output (6), then the pooler, the masked-LM transform and the next-sentence classifier.

Parameter names follow the models repo's rule for weight decay (``'layernorm' not in name.lower() and 'bias' not in
name.lower()`` decays): LayerNorm cells are attributes named ``*layernorm`` and every bias is named ``*bias``.
Everything is float32 (the models repo computes in float16 on Ascend; this project runs on CPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import TruncatedNormal

LAYERNORM_EPS = 1e-12  # BERT's LayerNorm epsilon (MindSpore's nn.LayerNorm defaults to 1e-7)
MASK_ADDER = -10000.0  # added to the attention scores of keys whose input_mask is 0 (models repo: multiply_data)
LOSS_EPS = 1e-5  # added to the masked-LM weight sum (models repo: BertPretrainingLoss)


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    """Shape and regularisation of a BERT encoder (the models repo's ``BertConfig`` without seq_length / dtypes:
    the sequence length is the input's, the compute type float32)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_dropout_prob: float
    attention_probs_dropout_prob: float
    max_position_embeddings: int
    type_vocab_size: int
    initializer_range: float  # standard deviation of the truncated-normal weight initialiser


def _dense(config: BertConfig, in_channels: int, out_channels: int) -> nn.Dense:
    """A THOR-capturable projection: no activation, a bias, truncated-normal weights, zero bias."""
    return nn.Dense(
        in_channels,
        out_channels,
        weight_init=TruncatedNormal(config.initializer_range),
        bias_init="zeros",
        has_bias=True,
    )


def _dropout(prob: float) -> nn.Cell:
    # a probability of 0 adds no dropout op to the graph at all
    return nn.Dropout(p=prob) if prob > 0 else nn.Identity()


def _layernorm(hidden_size: int) -> nn.LayerNorm:
    return nn.LayerNorm((hidden_size,), epsilon=LAYERNORM_EPS)


def _embedding(config: BertConfig, rows: int) -> nn.Embedding:
    return nn.Embedding(rows, config.hidden_size, embedding_table=TruncatedNormal(config.initializer_range))


class BertOutput(nn.Cell):
    """Dense, dropout, residual add and LayerNorm on ``(batch * seq, width)`` rows."""

    def __init__(self, config: BertConfig, in_channels: int):
        super().__init__()
        self.dense = _dense(config, in_channels, config.hidden_size)
        self.dropout = _dropout(config.hidden_dropout_prob)
        self.layernorm = _layernorm(config.hidden_size)

    def construct(self, hidden, residual):
        return self.layernorm(residual + self.dropout(self.dense(hidden)))


class BertSelfAttention(nn.Cell):
    """Multi-head self-attention with its output block, on ``(batch * seq, hidden)`` rows."""

    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                f"{config.num_attention_heads}"
            )
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.hidden_size = config.hidden_size
        self.scale = 1.0 / math.sqrt(self.head_size)
        self.query = _dense(config, config.hidden_size, config.hidden_size)
        self.key = _dense(config, config.hidden_size, config.hidden_size)
        self.value = _dense(config, config.hidden_size, config.hidden_size)
        self.dropout = _dropout(config.attention_probs_dropout_prob)
        self.output = BertOutput(config, config.hidden_size)

    def _heads(self, rows, seq_length: int):
        """(batch * seq, hidden) -> (batch, heads, seq, head_size)."""
        return ops.transpose(ops.reshape(rows, (-1, seq_length, self.heads, self.head_size)), (0, 2, 1, 3))

    def construct(self, rows, mask_adder):
        seq_length = mask_adder.shape[-1]
        query = self._heads(self.query(rows), seq_length)
        key = self._heads(self.key(rows), seq_length)
        value = self._heads(self.value(rows), seq_length)
        scores = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2))) * self.scale + mask_adder
        probs = self.dropout(ops.softmax(scores, -1))
        context = ops.transpose(ops.matmul(probs, value), (0, 2, 1, 3))
        return self.output(ops.reshape(context, (-1, self.hidden_size)), rows)


class BertEncoderLayer(nn.Cell):
    """Self-attention, then the feed-forward block (dense, GELU, dense + residual + LayerNorm)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.intermediate = _dense(config, config.hidden_size, config.intermediate_size)
        self.output = BertOutput(config, config.intermediate_size)

    def construct(self, rows, mask_adder):
        attended = self.attention(rows, mask_adder)
        # tanh-approximated GELU, the models repo's "gelu" (nn.GELU(approximate=True)) as a separate op
        return self.output(ops.gelu(self.intermediate(attended), approximate="tanh"), attended)


class BertModel(nn.Cell):
    """Embeddings and encoder; returns the sequence output (batch, seq, hidden) and the pooled first token
    (batch, hidden)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.word_embedding = _embedding(config, config.vocab_size)
        self.position_embedding = _embedding(config, config.max_position_embeddings)
        self.token_type_embedding = _embedding(config, config.type_vocab_size)
        self.embedding_layernorm = _layernorm(config.hidden_size)
        self.embedding_dropout = _dropout(config.hidden_dropout_prob)
        self.encoder = nn.CellList([BertEncoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.pooler = _dense(config, config.hidden_size, config.hidden_size)
        self.position_ids = ms.Tensor(np.arange(config.max_position_embeddings, dtype=np.int32)[None, :])

    def construct(self, input_ids, input_mask, token_type_ids):
        batch, seq_length = input_ids.shape
        embedded = (
            self.word_embedding(input_ids)
            + self.position_embedding(self.position_ids[:, :seq_length])
            + self.token_type_embedding(token_type_ids)
        )
        rows = ops.reshape(self.embedding_dropout(self.embedding_layernorm(embedded)), (-1, self.hidden_size))
        # (batch, 1, 1, seq): 0 where a key may be attended, -10000 where input_mask is 0
        mask_adder = (1.0 - ops.cast(ops.reshape(input_mask, (batch, 1, 1, seq_length)), ms.float32)) * MASK_ADDER
        for layer in self.encoder:
            rows = layer(rows, mask_adder)
        sequence = ops.reshape(rows, (batch, seq_length, self.hidden_size))
        pooled = ops.tanh(self.pooler(sequence[:, 0, :]))
        return sequence, pooled


class MaskedLMHead(nn.Cell):
    """Gathers the masked positions, transforms them (dense, GELU, LayerNorm) and scores them against the
    word-embedding table (tied output weights) plus an output bias: logits (batch * predictions, vocab)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.dense = _dense(config, config.hidden_size, config.hidden_size)
        self.layernorm = _layernorm(config.hidden_size)
        self.output_bias = ms.Parameter(ms.Tensor(np.zeros(config.vocab_size, np.float32)), name="output_bias")

    def construct(self, sequence, positions, embedding_table):
        batch, seq_length, _ = sequence.shape
        # flat offsets as in the models repo's GetMaskedLMOutput: row b's position p is row b * seq + p
        offsets = ops.reshape(ops.arange(0, batch, dtype=ms.int32) * seq_length, (-1, 1))
        flat_positions = ops.reshape(ops.cast(positions, ms.int32) + offsets, (-1,))
        rows = ops.gather(ops.reshape(sequence, (-1, self.hidden_size)), flat_positions, 0)
        rows = self.layernorm(ops.gelu(self.dense(rows), approximate="tanh"))
        return ops.matmul(rows, ops.transpose(embedding_table, (1, 0))) + self.output_bias


class BertPreTraining(nn.Cell):
    """BERT with its two pre-training heads; ``construct`` returns the masked-LM logits
    (batch * max_predictions, vocab) and the next-sentence logits (batch, 2), both before softmax."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = MaskedLMHead(config)
        self.nsp = _dense(config, config.hidden_size, 2)

    def construct(self, input_ids, input_mask, token_type_ids, masked_lm_positions):
        sequence, pooled = self.bert(input_ids, input_mask, token_type_ids)
        mlm_logits = self.mlm(sequence, masked_lm_positions, self.bert.word_embedding.embedding_table)
        return mlm_logits, self.nsp(pooled)


def create_bert(config: BertConfig) -> BertPreTraining:
    """A freshly initialised BERT pre-training network of ``config``."""
    return BertPreTraining(config)


class BertNetworkWithLoss(nn.Cell):
    """The pre-training loss of ``network`` on one batch in the dataset's column order (the models repo's
    ``BertNetworkWithLoss`` + ``BertPretrainingLoss``): masked-LM cross entropy weighted by masked_lm_weights and
    divided by their sum + 1e-5, plus the mean next-sentence cross entropy (nats)."""

    def __init__(self, network: BertPreTraining):
        # no prefix, as nn.WithLossCell: the network's parameter names (and checkpoints) stay those of the bare net
        super().__init__(auto_prefix=False)
        self.network = network

    def construct(
        self,
        input_ids,
        input_mask,
        token_type_ids,
        next_sentence_labels,
        masked_lm_positions,
        masked_lm_ids,
        masked_lm_weights,
    ):
        mlm_logits, nsp_logits = self.network(input_ids, input_mask, token_type_ids, masked_lm_positions)
        mlm_nll = _nll(mlm_logits, ops.reshape(masked_lm_ids, (-1,)))
        weights = ops.cast(ops.reshape(masked_lm_weights, (-1,)), ms.float32)
        mlm_loss = ops.reduce_sum(weights * mlm_nll) / (ops.reduce_sum(weights) + LOSS_EPS)
        nsp_loss = ops.reduce_mean(_nll(nsp_logits, ops.reshape(next_sentence_labels, (-1,))))
        return mlm_loss + nsp_loss


def _nll(logits, labels):
    """Per-row negative log-likelihood of integer ``labels`` under softmax(``logits``)."""
    log_probs = ops.log_softmax(logits, -1)
    return -ops.reduce_sum(log_probs * ops.one_hot(ops.cast(labels, ms.int32), logits.shape[-1], 1.0, 0.0), -1)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def mlm_metrics(network: BertPreTraining, dataset) -> dict[str, float]:
    """Masked-LM and next-sentence figures of ``network`` over ``dataset`` (batches of the 7 pre-training columns
    in the order input_ids, input_mask, token_type_ids, next_sentence_labels, masked_lm_positions, masked_lm_ids,
    masked_lm_weights).

    ``mlm_accuracy``: weighted fraction of masked positions whose argmax is masked_lm_ids (the models repo's
    ``pretrain_eval.py``); ``mlm_loss``: weighted mean cross entropy (nats); ``nsp_accuracy``; ``examples``.
    The network runs in inference mode (no dropout) and gets its previous mode back.
    """
    was_training = network.training
    network.set_train(False)
    correct = nll = weight_sum = 0.0
    nsp_correct = examples = 0
    try:
        for batch in dataset.create_tuple_iterator(num_epochs=1):
            input_ids, input_mask, token_type_ids, nsp_labels, positions, mlm_ids, mlm_weights = batch
            mlm_logits, nsp_logits = network(input_ids, input_mask, token_type_ids, positions)
            log_probs = _log_softmax(mlm_logits.asnumpy().astype(np.float64))
            ids = mlm_ids.asnumpy().reshape(-1)
            weights = mlm_weights.asnumpy().reshape(-1).astype(np.float64)
            correct += float(np.sum(weights * (log_probs.argmax(axis=-1) == ids)))
            nll -= float(np.sum(weights * log_probs[np.arange(ids.size), ids]))
            weight_sum += float(weights.sum())
            nsp_correct += int(np.sum(nsp_logits.asnumpy().argmax(axis=-1) == nsp_labels.asnumpy().reshape(-1)))
            examples += int(input_ids.shape[0])
    finally:
        network.set_train(was_training)
    return {
        "mlm_accuracy": correct / weight_sum if weight_sum else math.nan,
        "mlm_loss": nll / weight_sum if weight_sum else math.nan,
        "nsp_accuracy": nsp_correct / examples if examples else math.nan,
        "examples": examples,
    }
