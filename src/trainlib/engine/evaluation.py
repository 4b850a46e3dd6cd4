"""Top-1 / top-5 accuracy of a network over an evaluation dataset."""

from __future__ import annotations

import numpy as np

from trainlib.data.folder import checked_batches
from trainlib.engine.progress import announce_compile


def evaluate(net, dataset, top_k: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Accuracy (fractions in [0, 1]) at each ``k`` of ``top_k`` over every image of ``dataset``.

    Runs the network in inference mode (BatchNorm uses its moving statistics) and restores
    the previous mode afterwards. Returns ``{"top1": ..., "top5": ..., "images": n}``.
    """
    was_training = net.training
    net.set_train(False)
    announce_compile(net, "the evaluation graph")
    hits = dict.fromkeys(top_k, 0)
    seen = 0
    try:
        for images, labels in checked_batches(dataset.create_tuple_iterator(num_epochs=1)):
            logits = net(images).asnumpy()
            truth = labels.asnumpy()
            ranked = np.argsort(-logits, axis=1)
            for k in top_k:
                hits[k] += int((ranked[:, : min(k, logits.shape[1])] == truth[:, None]).any(axis=1).sum())
            seen += len(truth)
    finally:
        net.set_train(was_training)
    if seen == 0:
        raise ValueError("the evaluation dataset is empty")
    return {**{f"top{k}": hits[k] / seen for k in top_k}, "images": float(seen)}
