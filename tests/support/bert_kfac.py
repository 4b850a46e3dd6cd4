"""A float64 numpy forward and backward of ``trainlib.models.bert``'s pre-training network and loss, written from the
model's definition (no MindSpore autodiff), recording every Dense layer's input rows and output gradient for K-FAC.

Layout as in the model: activations are ``(batch * seq, hidden)`` rows around the encoder's dense layers,
``(batch * max_predictions, hidden)`` for the masked-LM transform, ``(batch, hidden)`` for the pooler and the
next-sentence classifier. LayerNorm is the population-variance one with BERT's epsilon 1e-12, GELU the tanh
approximation, the masked-LM output tied to the word-embedding table.
"""

from __future__ import annotations

import math

import numpy as np

LAYERNORM_EPS = 1e-12
MASK_ADDER = -10000.0
LOSS_EPS = 1e-5
GELU_C = math.sqrt(2.0 / math.pi)


def dense_names(layers: int) -> list[str]:
    """The weight names of every Dense layer of a BERT with ``layers`` encoder layers (6 per layer + 3)."""
    names = []
    for layer in range(layers):
        prefix = f"bert.encoder.{layer}"
        names += [f"{prefix}.attention.{p}.weight" for p in ("query", "key", "value", "output.dense")]
        names += [f"{prefix}.intermediate.weight", f"{prefix}.output.dense.weight"]
    return [*names, "bert.pooler.weight", "mlm.dense.weight", "nsp.weight"]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gelu(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tanh-GELU and its derivative."""
    t = np.tanh(GELU_C * (x + 0.044715 * x**3))
    derivative = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * GELU_C * (1 + 3 * 0.044715 * x**2)
    return 0.5 * x * (1 + t), derivative


class _Backprop:
    """Parameters, their gradient accumulators and the recorded (input rows, output gradient) of each Dense layer."""

    def __init__(self, params: dict[str, np.ndarray]):
        self.p = {k: np.asarray(v, np.float64) for k, v in params.items()}
        self.grads = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.inputs: dict[str, np.ndarray] = {}
        self.output_grads: dict[str, np.ndarray] = {}

    # forward ops record what their backward needs; backward ops accumulate the parameter gradients and return the
    # gradient w.r.t. the op's input

    def dense(self, name: str, x: np.ndarray) -> np.ndarray:
        self.inputs[f"{name}.weight"] = x
        return x @ self.p[f"{name}.weight"].T + self.p[f"{name}.bias"]

    def dense_back(self, name: str, dout: np.ndarray) -> np.ndarray:
        x = self.inputs[f"{name}.weight"]
        self.output_grads[f"{name}.weight"] = dout
        self.grads[f"{name}.weight"] += dout.T @ x
        self.grads[f"{name}.bias"] += dout.sum(axis=0)
        return dout @ self.p[f"{name}.weight"]

    def layernorm(self, name: str, x: np.ndarray):
        mean = x.mean(axis=-1, keepdims=True)
        inv_std = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + LAYERNORM_EPS)
        xhat = (x - mean) * inv_std
        return xhat * self.p[f"{name}.gamma"] + self.p[f"{name}.beta"], (xhat, inv_std)

    def layernorm_back(self, name: str, cache, dout: np.ndarray) -> np.ndarray:
        xhat, inv_std = cache
        self.grads[f"{name}.gamma"] += (dout * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
        self.grads[f"{name}.beta"] += dout.reshape(-1, xhat.shape[-1]).sum(axis=0)
        dxhat = dout * self.p[f"{name}.gamma"]
        return inv_std * (
            dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
        )


def forward_backward(params: dict[str, np.ndarray], columns: dict[str, np.ndarray], heads: int, layers: int):
    """Loss, gradients (by parameter name) and, per Dense weight name, (input rows, gradient of the batch-mean loss
    w.r.t. the output rows) of BERT pre-training on one batch, all float64."""
    net = _Backprop(params)
    p = net.p
    ids, types = columns["input_ids"], columns["token_type_ids"]
    batch, seq = ids.shape
    hidden = p["bert.word_embedding.embedding_table"].shape[1]
    head_size = hidden // heads
    scale = 1.0 / math.sqrt(head_size)

    def split(rows):  # (B*S, H) -> (B, heads, S, head_size)
        return rows.reshape(batch, seq, heads, head_size).transpose(0, 2, 1, 3)

    def merge(x):  # inverse of split
        return x.transpose(0, 2, 1, 3).reshape(batch * seq, hidden)

    # ---------------- forward
    embedded = (
        p["bert.word_embedding.embedding_table"][ids]
        + p["bert.position_embedding.embedding_table"][:seq][None]
        + p["bert.token_type_embedding.embedding_table"][types]
    )
    rows, emb_ln = net.layernorm("bert.embedding_layernorm", embedded)
    rows = rows.reshape(batch * seq, hidden)
    mask_adder = (1.0 - columns["input_mask"].astype(np.float64)).reshape(batch, 1, 1, seq) * MASK_ADDER
    caches = []
    for layer in range(layers):
        pre = f"bert.encoder.{layer}"
        x = rows
        q, k, v = (split(net.dense(f"{pre}.attention.{n}", x)) for n in ("query", "key", "value"))
        probs = _softmax(q @ k.transpose(0, 1, 3, 2) * scale + mask_adder)
        context = merge(probs @ v)
        attended, ln1 = net.layernorm(
            f"{pre}.attention.output.layernorm", x + net.dense(f"{pre}.attention.output.dense", context)
        )
        pre_gelu = net.dense(f"{pre}.intermediate", attended)
        activated, gelu_grad = _gelu(pre_gelu)
        rows, ln2 = net.layernorm(f"{pre}.output.layernorm", attended + net.dense(f"{pre}.output.dense", activated))
        caches.append((q, k, v, probs, ln1, gelu_grad, ln2))
    pooled = np.tanh(net.dense("bert.pooler", rows.reshape(batch, seq, hidden)[:, 0, :]))
    flat_positions = (columns["masked_lm_positions"] + seq * np.arange(batch)[:, None]).reshape(-1)
    mlm_activated, mlm_gelu_grad = _gelu(net.dense("mlm.dense", rows[flat_positions]))
    mlm_rows, mlm_ln = net.layernorm("mlm.layernorm", mlm_activated)
    table = p["bert.word_embedding.embedding_table"]
    mlm_probs = _softmax(mlm_rows @ table.T + p["mlm.output_bias"])
    nsp_probs = _softmax(net.dense("nsp", pooled))
    mlm_ids = columns["masked_lm_ids"].reshape(-1)
    nsp_labels = columns["next_sentence_labels"].reshape(-1)
    weights = columns["masked_lm_weights"].reshape(-1).astype(np.float64)
    denominator = weights.sum() + LOSS_EPS
    mlm_nll = -np.log(mlm_probs[np.arange(mlm_ids.size), mlm_ids])
    nsp_nll = -np.log(nsp_probs[np.arange(batch), nsp_labels])
    loss = float((weights * mlm_nll).sum() / denominator + nsp_nll.mean())

    # ---------------- backward
    d_mlm_logits = mlm_probs.copy()
    d_mlm_logits[np.arange(mlm_ids.size), mlm_ids] -= 1
    d_mlm_logits *= (weights / denominator)[:, None]
    d_nsp_logits = nsp_probs.copy()
    d_nsp_logits[np.arange(batch), nsp_labels] -= 1
    d_nsp_logits /= batch
    net.grads["mlm.output_bias"] += d_mlm_logits.sum(axis=0)
    net.grads["bert.word_embedding.embedding_table"] += d_mlm_logits.T @ mlm_rows
    d_mlm = net.layernorm_back("mlm.layernorm", mlm_ln, d_mlm_logits @ table)
    d_gathered = net.dense_back("mlm.dense", d_mlm * mlm_gelu_grad)
    d_rows = np.zeros_like(rows)
    np.add.at(d_rows, flat_positions, d_gathered)
    d_pooled = net.dense_back("nsp", d_nsp_logits)
    d_first = net.dense_back("bert.pooler", d_pooled * (1 - pooled**2))
    d_rows.reshape(batch, seq, hidden)[:, 0, :] += d_first
    for layer in reversed(range(layers)):
        pre = f"bert.encoder.{layer}"
        q, k, v, probs, ln1, gelu_grad, ln2 = caches[layer]
        d_sum2 = net.layernorm_back(f"{pre}.output.layernorm", ln2, d_rows)
        d_activated = net.dense_back(f"{pre}.output.dense", d_sum2)
        d_attended = d_sum2 + net.dense_back(f"{pre}.intermediate", d_activated * gelu_grad)
        d_sum1 = net.layernorm_back(f"{pre}.attention.output.layernorm", ln1, d_attended)
        d_context = split(net.dense_back(f"{pre}.attention.output.dense", d_sum1))
        d_probs = d_context @ v.transpose(0, 1, 3, 2)
        d_v = probs.transpose(0, 1, 3, 2) @ d_context
        d_scores = probs * (d_probs - (d_probs * probs).sum(axis=-1, keepdims=True)) * scale
        d_q, d_k = d_scores @ k, d_scores.transpose(0, 1, 3, 2) @ q
        d_rows = d_sum1  # the residual
        for name, d in (("query", d_q), ("key", d_k), ("value", d_v)):
            d_rows = d_rows + net.dense_back(f"{pre}.attention.{name}", merge(d))
    d_embedded = net.layernorm_back("bert.embedding_layernorm", emb_ln, d_rows.reshape(batch, seq, hidden))
    np.add.at(net.grads["bert.word_embedding.embedding_table"], ids, d_embedded)
    net.grads["bert.position_embedding.embedding_table"][:seq] += d_embedded.sum(axis=0)
    np.add.at(net.grads["bert.token_type_embedding.embedding_table"], types, d_embedded)
    layers_io = {name: (net.inputs[name], net.output_grads[name]) for name in dense_names(layers)}
    return loss, net.grads, layers_io
