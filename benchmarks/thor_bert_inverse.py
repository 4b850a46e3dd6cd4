"""Why THOR's inverse fails on BERT: the statistics, their damping and the loss at every second-order step.

One process prepares thor_bert's text and initial weights as the pipeline does (``conf/base`` plus ``--params``
overrides, dotted keys as ``kedro run --params`` takes them), then trains THOR step by step on the pipeline's
batches in the pipeline's order. At every second-order step (each ``thor_bert.thor.frequency``-th, where THOR takes
its statistics) and at the step that fails, it prints per captured layer: the trace and the smallest and largest
eigenvalue (float64) of A and G, the shifts added to A and G (``sqrt(damping / P)`` to both, or split by pi under
``damping_method: factored``), the ratio of G's largest eigenvalue to G's shift, and the largest absolute input
activation of the layer on that step's batch; then the loss so far (every 10th step, and the last 10). A failed
step's statistics are the ones it took before its inverse failed. The run stops at the first error
(``ThorInverseError``, ``ThorDivergenceError``, a non-finite loss) or after ``--steps``.

    .venv/bin/python benchmarks/thor_bert_inverse.py --params "thor_bert.thor.lr.peak=0.03" [--steps 400]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import yaml
from thor_vs_momentum import PROJECT

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)


def load_conf(overrides: str):
    """conf/base validated, with ``key=value,key=value`` overrides (values parsed as YAML)."""
    from trainlib.params import validate_parameters

    params: dict = {}
    for path in sorted((PROJECT / "conf/base").glob("parameters*.yml")):
        params.update(yaml.safe_load(path.read_text()))
    for item in filter(None, overrides.split(",")):
        key, value = item.split("=", 1)
        *parents, leaf = key.split(".")
        section = params
        for parent in parents:  # a section that is null by default (an option: adam_graft) gets its keys
            section[parent] = section.get(parent) or {}
            section = section[parent]
        section[leaf] = yaml.safe_load(value)
    return validate_parameters(params)


def largest_inputs(net, wrappers, batch) -> list[float]:
    """max |input| of each captured layer on ``batch`` (a PyNative forward with pre-hooks on the bare layers)."""
    import mindspore as ms

    found = [0.0] * len(wrappers)

    def hook_of(i):
        def hook(cell, inputs):
            found[i] = max(found[i], float(np.abs(inputs[0].asnumpy()).max()))

        return hook

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    handles = [w.layer.register_forward_pre_hook(hook_of(i)) for i, w in enumerate(wrappers)]
    try:
        net(*batch[:3], batch[4])
    finally:
        for handle in handles:
            handle.remove()
        ms.set_context(mode=mode)
    return found


def eigenvalues(matrix: np.ndarray) -> tuple[float, float, float]:
    """(trace, smallest, largest eigenvalue) in float64; NaNs when the matrix is not finite."""
    matrix = matrix.astype(np.float64)
    if not np.isfinite(matrix).all():
        return float(np.trace(matrix)), math.nan, math.nan
    values = np.linalg.eigvalsh((matrix + matrix.T) / 2)
    return float(np.trace(matrix)), float(values[0]), float(values[-1])


def report(step: int, preconditioner, activations: list[float], damping: float, factored: bool, status: str) -> None:
    """One row per layer; the shifts are those added to A and G (``factored``: pi sqrt(damping/P) and
    sqrt(damping/P) / pi, pi = sqrt((tr A / dim A) / (tr G / dim G)), 1 where a trace is 0)."""
    print(f"\n== step {step} ({status}), damping {damping:.4g} ==")
    print(
        f"{'layer':52} {'tr A':>9} {'min A':>10} {'max A':>9} {'tr G':>9} {'min G':>10} {'max G':>9} "
        f"{'shift A':>8} {'shift G':>8} {'maxG/shG':>9} {'max|x|':>8}"
    )
    for i, name in enumerate(preconditioner.layer_names):
        positions = float(preconditioner.positions[i].asnumpy())
        a, g = preconditioner.a_stats[i].asnumpy(), preconditioner.g_stats[i].asnumpy()
        trace_a, min_a, max_a = eigenvalues(a)
        trace_g, min_g, max_g = eigenvalues(g)
        pi = 1.0
        if factored and trace_a > 0 and trace_g > 0:
            pi = math.sqrt((trace_a / len(a)) / (trace_g / len(g)))
        shift = math.sqrt(damping / positions)
        print(
            f"{name:52} {trace_a:9.3g} {min_a:10.3g} {max_a:9.3g} {trace_g:9.3g} {min_g:10.3g} {max_g:9.3g} "
            f"{shift * pi:8.3g} {shift / pi:8.3g} {max_g * pi / shift:9.3g} {activations[i]:8.3g}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="", help="overrides of conf/base, e.g. thor_bert.thor.lr.peak=0.03")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: the run's)")
    args = parser.parse_args()

    import mindspore as ms
    import mindspore.dataset as ds

    from trainlib.optim.schedules import per_step
    from trainlib.recipes.classifier import configure
    from trainlib.recipes.language_model import bert_from_checkpoint, build_bert, prepare_language_model
    from trainlib.recipes.thor_bert import thor_step_of
    from trainlib.text.dataset import create_text_dataset

    conf = load_conf(args.params)
    bert, runtime = conf.thor_bert, conf.runtime
    configure(runtime)
    context = prepare_language_model(bert, runtime, conf.distributed)
    start = build_bert(bert.network, context.vocab_size, runtime)
    net = bert_from_checkpoint(bert.network, context.vocab_size, start, "initial weights")
    thor = bert.thor
    dataset = create_text_dataset(
        context.train_examples, batch_size=thor.batch_size, training=True, rank=0, rank_size=1, seed=runtime.seed
    )
    steps_per_epoch = dataset.get_dataset_size()
    step = thor_step_of(thor, net, steps_per_epoch, rank_size=1)
    preconditioner = step.preconditioner
    damping = per_step(thor.damping, epochs=thor.epochs, steps_per_epoch=steps_per_epoch)
    total = thor.epochs * steps_per_epoch if args.steps is None else args.steps
    print(
        f"thor_bert THOR: {len(context.train_examples['input_ids'])} train examples, {steps_per_epoch} steps per "
        f"epoch, lr peak {thor.lr.peak:g}, frequency {thor.frequency}, {total} steps; overrides: {args.params!r}"
    )
    losses: list[float] = []
    global_step = 0
    for epoch in range(thor.epochs):
        ds.config.set_seed(runtime.seed + epoch)  # as the engine does before each epoch's iterator
        for batch in dataset.create_tuple_iterator(num_epochs=1):
            if global_step >= total:
                break
            second_order = preconditioner.second_order_now()
            error = None
            try:
                loss = float(step(*batch).asnumpy())
            except FloatingPointError as failed:  # ThorInverseError, ThorDivergenceError
                error, loss = failed, math.nan
            global_step += 1
            if second_order or error is not None:
                activations = largest_inputs(net, preconditioner.wrappers, batch)
                status = f"{type(error).__name__}: {error}" if error else f"second-order, loss {loss:.4g}"
                factored = getattr(thor, "damping_method", "fixed") == "factored"
                report(global_step, preconditioner, activations, float(damping[global_step - 1]), factored, status)
            if error is not None or not math.isfinite(loss):
                break
            losses.append(loss)
        else:
            continue
        break
    print("\nloss by step (every 10th, then the last 10):")
    shown = {i for i in range(0, len(losses), 10)} | set(range(max(len(losses) - 10, 0), len(losses)))
    print("  " + ", ".join(f"{i + 1}: {losses[i]:.3f}" for i in sorted(shown)))
    print(f"stopped after step {global_step} of {total}")
    ms.set_context(mode=ms.GRAPH_MODE)


if __name__ == "__main__":
    main()
