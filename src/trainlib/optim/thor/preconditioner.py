"""``ThorPreconditioner``: the statistics, curvature and counters of THOR, and the compiled cells that turn a
step's gradients into THOR directions (every layer refreshed, the stored curvature reused, or per layer by the trace
rule). As in kfac-pytorch, the compute method is one object chosen at construction (``InverseMethod`` or
``EigenMethod``) and the options that rescale its directions are steps after it (``AdamGraft``, then ``KlClip``),
each holding only its own buffers. THOR's maths, the capture and the trace rule: the package docstring; the options'
maths: see docs/recipes.md, section "THOR's options"."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from trainlib.distributed.collectives import MeanOverRanks
from trainlib.optim.thor.capture import set_capture, wrap_layers
from trainlib.optim.thor.clip import KlClip
from trainlib.optim.thor.curvature import Curvature, scalar_parameter
from trainlib.optim.thor.eigen import EigenMethod
from trainlib.optim.thor.graft import AdamGraft
from trainlib.optim.thor.inverse import InverseMethod
from trainlib.optim.thor.linalg import INVERSE_METHODS
from trainlib.params.thor import ThorSettings

STATE_PREFIX = "thor."  # the preconditioner's keys in the optimizer state
COUNTERS = ("steps", "second_order_steps", "reuse_steps", "trace_skips", "inverses_computed")


class _Precondition(nn.Cell):
    """``grads -> THOR directions``: the compute method's direction per preconditioned layer (``second_order``,
    static: first refresh every layer's curvature from this step's statistics), then the Adam graft and kl_clip
    when they are on. With both off the graph is the compute method's alone."""

    def __init__(
        self,
        method: Curvature,
        graft: AdamGraft | None,
        clip: KlClip | None,
        layer_of_param: tuple[int, ...],
        param_of_layer: tuple[int, ...],
        second_order: bool,
    ):
        super().__init__(auto_prefix=False)
        self.method = method
        self.graft = graft
        self.clip = clip
        self.layer_of_param = layer_of_param
        self.param_of_layer = param_of_layer
        self.n_layers = len(param_of_layer)
        self.second_order = second_order

    def construct(self, grads, damping):
        fresh = ()
        if self.second_order:
            for i in range(self.n_layers):
                fresh += (self.method.refresh(i, grads[self.param_of_layer[i]], damping),)
        directions = ()
        for j, grad in enumerate(grads):
            layer = self.layer_of_param[j]
            direction = grad
            if layer >= 0:
                shape = grad.shape
                matrix = ops.reshape(grad, (shape[0], -1))
                if self.second_order:
                    direction = ops.reshape(self.method.apply(fresh[layer], matrix), shape)
                else:
                    direction = ops.reshape(self.method.apply_stored(layer, matrix), shape)
            directions += (direction,)
        if self.graft is not None:
            directions = self.graft(grads, directions)
        if self.clip is not None:
            directions = self.clip(grads, directions)
        return directions


class _DampedTraces(nn.Cell):
    """Per layer ``t = tr(A + sI) tr(G + sI)`` of this step's rank-mean statistics (the trace rule's measure)."""

    def __init__(self, preconditioner: ThorPreconditioner):
        super().__init__(auto_prefix=False)
        self.a_stats = preconditioner.a_stats
        self.g_stats = preconditioner.g_stats
        self.positions = preconditioner.positions
        self.param_of_layer = preconditioner.param_of_layer
        self.n_layers = len(preconditioner.param_of_layer)
        self.mean_over_ranks = MeanOverRanks(preconditioner.rank_size)

    def construct(self, grads, damping):
        traces = ()
        for i in range(self.n_layers):
            grad = grads[self.param_of_layer[i]]  # the statistics are read once the gradients exist
            a = ops.depend(self.a_stats[i], grad)
            g = ops.depend(self.g_stats[i], grad)
            sqrt_damping = ops.sqrt(damping / ops.depend(self.positions[i], grad))
            trace_a = self.mean_over_ranks(ops.trace(a)) + a.shape[0] * sqrt_damping  # tr of the rank mean
            trace_g = self.mean_over_ranks(ops.trace(g)) + g.shape[0] * sqrt_damping
            traces += (trace_a * trace_g,)
        return ops.stack(traces)


class ThorPreconditioner:
    """THOR's gradient preconditioner (kfac-pytorch's shape): the statistics, curvature and counters of ``net``.

    Wraps every supported layer of ``net`` (in place, see ``wrap_layers``) so that the A/G statistics are captured,
    and holds two compiled cells that turn the gradients of ``net.trainable_params()`` (in that order, unscaled) into
    THOR directions: ``second_order_cell`` (refresh the curvature from this step's statistics, then apply it) and
    ``reuse_cell`` (apply the stored one). ``ThorStep`` picks one per step with ``second_order_now`` and calls
    ``capture`` / ``count_step`` around it. ``settings``: the section (``params.ThorSettings``, validated with it).
    Step ``k`` (counted from 0, continued by ``load_state``) is second-order when ``k % settings.frequency == 0`` (or
    no curvature exists yet); its damping is ``damping[k]`` (the last value past the end). ``settings.block_size``
    None inverts the full A and G, an int their diagonal blocks (Ascend: 128). ``trace_rule`` ``(skip, stop)``, e.g.
    ``(0.01, 0.001)``, enables the paper's trace rule. ``settings.loss_scale``: the factor the differentiated loss
    carries, removed from G when it is taken. ``inverse_method`` (``block_inverse``): None
    picks "cholesky", or "matrix_inverse" on Ascend. Counters: ``steps``, ``second_order_steps``, ``reuse_steps``,
    ``trace_skips``, ``inverses_computed`` ((layer, step) pairs whose curvature was computed; ``refreshed_layers``
    names those of the last second-order step).

    Options of ``settings``, each off by default (today's THOR, whose graph is then unchanged), their maths in
    docs/recipes.md, section "THOR's options": ``damping_method`` "fixed" or "factored" and ``compute_method``
    "inverse" or "eigen" pick ``method`` (``InverseMethod`` or ``EigenMethod``: full factors, no trace rule, CPU/GPU);
    ``adam_graft`` ``(beta1, beta2, eps)`` adds the step ``graft`` (``AdamGraft``), then ``kl_clip`` (a bound) the
    step ``clip`` (``KlClip``); each is None when off. ``last_clip_factor``, ``last_graft_scales`` and ``eigen()``
    show them. ``statistics_dtype`` "float64" takes A and G's products in float64 (``capture.CapturedLayer``), so
    that they, and all that follows from them, do not depend on the CPU's cores and L2 cache (the CPU family still
    matters: docs/troubleshooting.md#thor-cpu).
    """

    def __init__(
        self,
        net: nn.Cell,
        damping: np.ndarray,
        settings: ThorSettings,
        *,
        rank_size: int,
        trace_rule: tuple[float, float] | None = None,
        inverse_method: str | None = None,
    ):
        self.damping = np.asarray(damping, np.float32).ravel()
        if not len(self.damping):
            raise ValueError("damping needs at least one value (one per step)")
        if inverse_method is None:
            inverse_method = "matrix_inverse" if ms.get_context("device_target") == "Ascend" else "cholesky"
        if inverse_method not in INVERSE_METHODS:
            raise ValueError(f"unknown inverse_method {inverse_method!r}; choose one of {INVERSE_METHODS}")
        # the settings were validated with their section (ThorSettings.option_problems); what is checked here is
        # what they cannot know: the device, and the trace rule that only the ResNet section sets
        compute_method = settings.compute_method
        if compute_method == "eigen" and trace_rule is not None:
            raise ValueError(
                "compute_method eigen decomposes the full factors at every second-order step: no trace_rule"
            )
        if compute_method == "eigen" and ms.get_context("device_target") == "Ascend":
            raise ValueError("compute_method eigen needs MindSpore's Eigh, which runs on CPU and GPU, not Ascend")
        self.damping_method = damping_method = settings.damping_method
        self.compute_method = compute_method
        self.statistics_dtype = statistics_dtype = settings.statistics_dtype
        self.kl_clip = settings.kl_clip
        graft = settings.adam_graft
        self.adam_graft = None if graft is None else (graft.beta1, graft.beta2, graft.eps)
        self.frequency = settings.frequency
        self.block_size = block_size = settings.block_size
        self.trace_rule = None if trace_rule is None else (float(trace_rule[0]), float(trace_rule[1]))
        self.rank_size = rank_size
        self.inverse_method = inverse_method

        self.wrappers = wrap_layers(net, settings.loss_scale, statistics_dtype)
        if not self.wrappers:
            raise ValueError("the network has no Conv2d (group 1) or Dense (no activation) layer for THOR")
        weights = net.trainable_params()
        index_of = {id(p): j for j, p in enumerate(weights)}
        self.param_of_layer = tuple(index_of[id(w.layer.weight)] for w in self.wrappers)
        layer_of = dict.fromkeys(range(len(weights)), -1)
        for i, j in enumerate(self.param_of_layer):
            layer_of[j] = i
        self.layer_of_param = tuple(layer_of[j] for j in range(len(weights)))
        self.layer_names = [w.layer.weight.name for w in self.wrappers]

        self.a_stats = ms.ParameterTuple([w.a_stat for w in self.wrappers])
        self.g_stats = ms.ParameterTuple([w.g_stat for w in self.wrappers])
        self.positions = ms.ParameterTuple([w.positions for w in self.wrappers])
        factored = damping_method == "factored"
        if compute_method == "eigen":
            self.method: InverseMethod | EigenMethod = EigenMethod(self.wrappers, self.layer_names, rank_size, factored)
        else:
            self.method = InverseMethod(
                self.wrappers,
                self.layer_names,
                rank_size,
                factored,
                block_size=block_size,
                inverse_method=inverse_method,
            )
        self.graft = (
            AdamGraft(
                self.adam_graft,
                [tuple(w.layer.weight.shape) for w in self.wrappers],
                self.layer_names,
                self.layer_of_param,
            )
            if self.adam_graft is not None
            else None
        )
        self.clip = KlClip(self.kl_clip, self.layer_of_param) if self.kl_clip is not None else None
        self.trace_ref = ms.ParameterTuple([scalar_parameter(f"thor_trace_ref.{n}") for n in self.layer_names])
        self.stopped = ms.ParameterTuple([scalar_parameter(f"thor_stopped.{n}") for n in self.layer_names])

        self.second_order_cell, self.reuse_cell = (
            _Precondition(self.method, self.graft, self.clip, self.layer_of_param, self.param_of_layer, second_order)
            for second_order in (True, False)
        )
        self.traces_cell = _DampedTraces(self)
        self.steps = 0
        self.second_order_steps = 0
        self.reuse_steps = 0
        self.trace_skips = 0
        self.inverses_computed = 0
        self.refreshed_layers: list[str] = []  # the layers whose curvature the last second-order step computed
        self._have_inverses = False

    @property
    def current_damping(self) -> float:
        """The damping of the next step (of the last step taken, once the schedule is over)."""
        return float(self.damping[min(self.steps, len(self.damping) - 1)])

    def second_order_now(self) -> bool:
        """Whether the next step refreshes the statistics and inverses."""
        return self.steps % self.frequency == 0 or not self._have_inverses

    def capture(self, on: bool) -> None:
        """Statistics capture on (for a second-order step) or off; the flag is read when a cell compiles."""
        set_capture(self.wrappers, on)

    def count_step(self, second_order: bool) -> None:
        """Move the counters past a step (a fused second-order step computed every layer's inverses)."""
        if second_order:
            self.second_order_steps += 1
            self._have_inverses = True
            if self.trace_rule is None:
                self.inverses_computed += len(self.wrappers)
                self.refreshed_layers = list(self.layer_names)
        else:
            self.reuse_steps += 1
        self.steps += 1

    def refresh_by_trace_rule(self, traces: np.ndarray, damping: ms.Tensor) -> None:
        """The trace rule at a second-order step whose statistics are captured: per layer, compare ``traces``
        (``_DampedTraces``) with the trace at its last refresh; compute the inverses of the layers that changed
        by more than ``skip`` (and of layers never computed), keep the others' untouched, stop layers that changed
        by less than ``stop``. Updates ``trace_skips``, ``inverses_computed``, ``refreshed_layers``."""
        skip, stop = self.trace_rule
        refs = np.array([float(p.asnumpy()) for p in self.trace_ref], np.float32)
        stopped = np.array([float(p.asnumpy()) for p in self.stopped], np.float32) > 0.5
        first = refs <= 0.0
        change = np.abs(traces - refs) / np.maximum(refs, np.float32(1e-30))
        update = first | (~stopped & (change > skip))
        stopping = ~first & ~stopped & (change < stop)
        self.refreshed_layers = []
        for i in np.flatnonzero(update):
            self.method.refresh_layer(int(i), damping)
            self.trace_ref[i].set_data(ms.Tensor(traces[i], ms.float32))
            self.refreshed_layers.append(self.layer_names[i])
        for i in np.flatnonzero(stopping):
            self.stopped[i].set_data(ms.Tensor(1.0, ms.float32))
        self.inverses_computed += int(update.sum())
        self.trace_skips += int((~update).sum())

    @property
    def stopped_layers(self) -> list[str]:
        """Layers the trace rule stopped refreshing for good."""
        return [n for n, p in zip(self.layer_names, self.stopped, strict=True) if float(p.asnumpy()) > 0.5]

    @property
    def last_clip_factor(self) -> float | None:
        """kl_clip's factor ``nu`` of the last step (0 before the first; None without ``kl_clip``)."""
        return None if self.clip is None else self.clip.last_factor

    @property
    def last_graft_scales(self) -> dict[str, float]:
        """Per layer, the last step's Adam-graft scale ``|adam update| / |THOR direction|`` (empty without it)."""
        return {} if self.graft is None else self.graft.last_scales()

    def eigen(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per layer, the eigen method's stored A and G eigenbases and reciprocal damped eigenvalues (or none)."""
        return self.method.eigenbases() if isinstance(self.method, EigenMethod) else {}

    def inverses(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer (weight name): the stored A and G inverses as dense numpy matrices (the eigen method: none)."""
        return self.method.dense_inverses() if isinstance(self.method, InverseMethod) else {}

    def statistics(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer (weight name): the A and G last captured on this rank."""
        return {
            name: (w.a_stat.asnumpy().copy(), w.g_stat.asnumpy().copy())
            for name, w in zip(self.layer_names, self.wrappers, strict=True)
        }

    def _state_params(self) -> list[ms.Parameter]:
        return [
            *self.a_stats,
            *self.g_stats,
            *self.positions,
            *self.method.state_params(),
            *self.trace_ref,
            *self.stopped,
            *(self.graft.state_params() if self.graft is not None else []),
        ]

    def state(self) -> dict[str, np.ndarray]:
        """The preconditioner's buffers (numpy, names under ``thor.``): last statistics, inverses, trace rule,
        counters. ``steps`` is the position in ``damping`` and in the ``frequency`` cycle, so a
        preconditioner given this state by ``load_state`` continues the run."""
        # asnumpy() can share memory with the parameter on CPU: copy, so later steps do not change it
        state = {STATE_PREFIX + p.name: p.asnumpy().copy() for p in self._state_params()}
        for counter in COUNTERS:
            state[STATE_PREFIX + counter] = np.array(getattr(self, counter), np.int64)
        state[STATE_PREFIX + "have_inverses"] = np.array(int(self._have_inverses), np.int64)
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what ``state()`` returned (e.g. after a checkpoint round trip); the next step continues.

        Keys other than the preconditioner's (``thor.`` prefix) are ignored, so the whole optimizer state may be
        passed.
        """
        missing = [STATE_PREFIX + p.name for p in self._state_params() if STATE_PREFIX + p.name not in state]
        if missing:
            raise ValueError(f"THOR state lacks {missing[:5]}")
        for param in self._state_params():
            value = np.asarray(state[STATE_PREFIX + param.name], np.float32)
            if value.size == 1 and not param.shape:  # checkpoints may store 0-d arrays as shape (1,)
                value = value.reshape(())
            if value.shape != tuple(param.shape):
                raise ValueError(f"THOR state {param.name} has shape {value.shape}, expected {tuple(param.shape)}")
            param.set_data(ms.Tensor(value))

        def scalar(key: str, default: int) -> int:
            return int(np.asarray(state.get(STATE_PREFIX + key, default)).reshape(-1)[0])

        for counter in COUNTERS:
            setattr(self, counter, scalar(counter, 0))
        self._have_inverses = bool(scalar("have_inverses", 1))
