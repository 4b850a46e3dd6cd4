"""Adasum (adaptive summation) of weight deltas across 2^k data-parallel ranks.

Two vectors combine as ``Adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b``: parallel
deltas are averaged, orthogonal ones summed. 2^k ranks combine recursively in pairs, in the order
MindSpore's ``mindspore.boost.adasum`` and Horovod use: (0, 1), (2, 3), ... first, then the pairs'
results, (01, 23), ... . As in MindSpore, the inputs are the weight deltas of each rank's local
optimizer step (the optimizer need not be linear in the gradient), and the formula is applied to
each parameter tensor separately (dot products and norms per tensor).

The collective scheme is MindSpore's/Horovod's vector-halving, distance-doubling one, on a single
fused buffer of all deltas: at level ``l`` a rank and its partner ``rank ^ 2^l`` swap halves of
their current range, each computes per-tensor partial dot products and norms on the half it keeps,
the partials are summed (AllReduce) over the 2^(l+1) ranks whose halves make up the whole vectors,
and each rank combines its half. After k levels every rank owns 1/2^k of the result; one AllGather
assembles it on all ranks. Every element of the result is computed by exactly one rank, so all
ranks receive bitwise the same values.

MindSpore's own implementation swaps the halves with Send/Receive, which MindSpore has on Ascend
and GPU but not on CPU; here the swap is an AllGather over the two ranks (``exchange="allgather"``,
as cheap as Send/Receive) or, where AllGather is limited to the world group (MindSpore CPU with more
than 2 ranks), an AllReduce over the pair of a buffer that carries each rank's half in its
partner's slot and zeros in its own (``exchange="allreduce"``, exact, twice the traffic of the
swap). Differences from ``mindspore.boost``: there Adasum runs across servers after a gradient
AllReduce inside each 8-device server (so it needs 16+ devices) and each device handles 1/8 of the
tensors; here every rank is its own Adasum participant, so 2 ranks suffice. MindSpore averages
tensors with a single element instead of applying Adasum; here the formula applies to them too.

Zero vectors: ``a.b / |a|^2`` is 0/0 when ``a`` is zero. The term it scales, ``(...) a``, is zero
whatever the ratio, so the ratio is taken as 0: ``Adasum(0, b) = b`` and ``Adasum(0, 0) = 0`` (the
limit as ``a -> 0``; MindSpore's ``eps = 1e-12`` in the norms gives the same results).
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

EXCHANGES = ("allgather", "allreduce")
# A dot product and two squared norms per tensor, summed across ranks at every level.
_STATS_PER_TENSOR = 3
_created_groups: set[str] = set()


def check_rank_size(rank_size: int) -> int:
    """Return ``rank_size`` if it is a power of two (1, 2, 4, ...); otherwise raise ``ValueError``."""
    if isinstance(rank_size, bool) or not isinstance(rank_size, (int, np.integer)) or rank_size < 1:
        raise ValueError(f"Adasum needs a positive integer rank count, got {rank_size!r}")
    if rank_size & (rank_size - 1):
        raise ValueError(
            f"Adasum combines ranks recursively in pairs and needs a power-of-two number of ranks "
            f"(1, 2, 4, 8, ...); got {rank_size} ranks"
        )
    return int(rank_size)


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b`` in float64, with a ratio of 0 for a zero vector."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a64.shape != b64.shape:
        raise ValueError(f"Adasum needs vectors of one shape, got {a64.shape} and {b64.shape}")
    dot, aa, bb = float(np.vdot(a64, b64)), float(np.vdot(a64, a64)), float(np.vdot(b64, b64))
    ratio_a = dot / (2.0 * aa) if aa > 0 else 0.0
    ratio_b = dot / (2.0 * bb) if bb > 0 else 0.0
    return (1.0 - ratio_a) * a64 + (1.0 - ratio_b) * b64


def adasum_reference(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """Adasum of 2^k same-shape arrays (one tensor of each rank), combined recursively in pairs.

    Order: (0, 1), (2, 3), ... first, then the pairs' results in pairs, as MindSpore and Horovod do.
    Computed in float64. For a network, apply it to each parameter tensor separately.
    """
    check_rank_size(len(vectors))
    level = [np.asarray(v, np.float64) for v in vectors]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def default_exchange(device_target: str, rank_size: int) -> str:
    """The half-swap collective: AllGather over the pair unless only the world group has AllGather (CPU, > 2 ranks)."""
    return "allreduce" if device_target == "CPU" and rank_size > 2 else "allgather"


def _padded_size(total: int, rank_size: int) -> int:
    return -(-total // rank_size) * rank_size


def communication_bytes_per_step(
    param_sizes: Sequence[int],
    rank_size: int,
    exchange: str = "allgather",
    stat_count: int = 0,
    bytes_per_element: int = 4,
) -> dict[str, float]:
    """Bytes each rank sends per step: plain gradient AllReduce vs this module's Adasum.

    Collectives are costed with the ring algorithm: an AllReduce of ``m`` elements over ``g`` ranks
    sends ``2 m (g-1)/g`` elements per rank, an AllGather of ``m`` elements per rank sends
    ``m (g-1)``. ``param_sizes`` are the element counts of the trainable tensors; ``stat_count``
    is the number of BatchNorm moving-statistic elements, averaged once per step by
    ``AdasumTrainStep`` (plain data parallel leaves them local). Keys: ``allreduce`` (plain data
    parallel), ``adasum_exchange`` (half swaps), ``adasum_scalars`` (per-tensor dot products and
    norms), ``adasum_allgather`` (final assembly), ``batchnorm``, ``adasum`` (sum of the four).
    """
    check_rank_size(rank_size)
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    p = rank_size
    total = int(sum(param_sizes))
    padded = _padded_size(total, p)
    stats_len = _STATS_PER_TENSOR * (len(param_sizes) + 1)
    levels = p.bit_length() - 1
    swap = scalars = 0.0
    for level in range(levels):
        current = padded / 2**level
        # An AllGather over 2 ranks sends the half; an AllReduce over 2 ranks sends 2 * current * 1/2.
        swap += current / 2 if exchange == "allgather" else current
        group = 2 ** (level + 1)
        scalars += 2 * stats_len * (group - 1) / group
    assemble = (padded / p) * (p - 1)
    batchnorm = 2 * stat_count * (p - 1) / p
    parts = {
        "allreduce": 2 * total * (p - 1) / p,
        "adasum_exchange": swap,
        "adasum_scalars": scalars,
        "adasum_allgather": assemble,
        "batchnorm": batchnorm,
    }
    result = {key: value * bytes_per_element for key, value in parts.items()}
    result["adasum"] = sum(
        result[key] for key in ("adasum_exchange", "adasum_scalars", "adasum_allgather", "batchnorm")
    )
    return result


def _group(ranks: Sequence[int], rank_size: int, name: str) -> str:
    """Name of a communication group over ``ranks``, created once per process; the world group by its own name."""
    from mindspore.communication import GlobalComm, create_group

    if len(ranks) == rank_size:
        return GlobalComm.WORLD_COMM_GROUP
    if name not in _created_groups:
        create_group(name, list(ranks))
        _created_groups.add(name)
    return name


def _bit_reverse(value: int, bits: int) -> int:
    return int(format(value, f"0{bits}b")[::-1], 2) if bits else 0


class _AdasumLevel(nn.Cell):
    """One level of the recursion: swap halves with the partner ``rank ^ 2^level``, combine the kept half."""

    def __init__(
        self, level: int, rank: int, rank_size: int, start: int, length: int, segments: np.ndarray, exchange: str
    ):
        super().__init__()
        half = length // 2
        bit = (rank >> level) & 1
        self.keep_first = bit == 0
        self.half = half
        # Offsets inside the current range: the rank with bit 0 keeps the first half.
        self.keep_lo = bit * half
        self.send_lo = (1 - bit) * half
        # The kept half as pieces of whole tensors (a tensor may straddle its ends): per-piece
        # reductions and scalings are several times faster on CPU than segment sums and gathers.
        kept = segments[start + self.keep_lo : start + self.keep_lo + half]
        bounds = [0, *(np.flatnonzero(np.diff(kept)) + 1).tolist(), half]
        self.piece_starts, self.piece_ends = tuple(bounds[:-1]), tuple(bounds[1:])
        self.piece_index = tuple(range(len(self.piece_starts)))
        self.piece_segments = Tensor(kept[list(self.piece_starts)], ms.int32)
        self.num_segments = int(segments.max()) + 1
        self.hyper_map = C.HyperMap()
        pair = sorted((rank, rank ^ (1 << level)))
        block = 1 << (level + 1)
        first = rank // block * block
        self.use_allgather = exchange == "allgather"
        pair_group = _group(pair, rank_size, f"adasum_pair_{level}_{pair[0]}")
        if self.use_allgather:
            # The gathered buffer is ordered by rank: the partner's half is at its position in the pair.
            self.swap = ops.AllGather(group=pair_group)
            self.recv_lo = (1 - bit) * half
        else:
            self.swap = ops.AllReduce(ops.ReduceOp.SUM, group=pair_group)
            self.recv_lo = bit * half
        self.sum_stats = ops.AllReduce(
            ops.ReduceOp.SUM, group=_group(range(first, first + block), rank_size, f"adasum_block_{level}_{first}")
        )

    def construct(self, x):
        half = self.half
        keep = x[self.keep_lo : self.keep_lo + half]
        send = x[self.send_lo : self.send_lo + half]
        if self.use_allgather:
            received = self.swap(send)[self.recv_lo : self.recv_lo + half]
        else:
            # Partner's slot carries this rank's half, own slot zeros: the sum is an exact swap.
            zeros = ops.zeros_like(send)
            slots = ops.concat((zeros, send)) if self.keep_first else ops.concat((send, zeros))
            received = self.swap(slots)[self.recv_lo : self.recv_lo + half]
        a, b = (keep, received) if self.keep_first else (received, keep)
        pieces_a = self.hyper_map(F.partial(_slice, a), self.piece_starts, self.piece_ends)
        pieces_b = self.hyper_map(F.partial(_slice, b), self.piece_starts, self.piece_ends)
        stats = ops.stack(
            (
                ops.stack(self.hyper_map(_dot, pieces_a, pieces_b)),
                ops.stack(self.hyper_map(_dot, pieces_a, pieces_a)),
                ops.stack(self.hyper_map(_dot, pieces_b, pieces_b)),
            ),
            axis=1,
        )
        # Per-tensor partial sums (one row per tensor, zeros for tensors outside this half) summed
        # over the ranks whose halves together cover the whole vectors.
        stats = self.sum_stats(ops.unsorted_segment_sum(stats, self.piece_segments, self.num_segments))
        stats = ops.gather(stats, self.piece_segments, 0)
        coef_a = 1.0 - _safe_half_ratio(stats[:, 0], stats[:, 1])
        coef_b = 1.0 - _safe_half_ratio(stats[:, 0], stats[:, 2])
        return ops.concat(self.hyper_map(F.partial(_combine, coef_a, coef_b), self.piece_index, pieces_a, pieces_b))


_slice = C.MultitypeFuncGraph("adasum_slice")


@_slice.register("Tensor", "Number", "Number")
def _slice_tensor(flat, start, end):
    return flat[start:end]


_dot = C.MultitypeFuncGraph("adasum_dot")


@_dot.register("Tensor", "Tensor")
def _dot_tensor(x, y):
    return ops.ReduceSum()(x * y)


_combine = C.MultitypeFuncGraph("adasum_combine")


@_combine.register("Tensor", "Tensor", "Number", "Tensor", "Tensor")
def _combine_tensor(coef_a, coef_b, index, a, b):
    return coef_a[index] * a + coef_b[index] * b


def _safe_half_ratio(dot, norm_sq):
    """``dot / (2 norm_sq)``, 0 where ``norm_sq`` is 0 (that vector is zero, so the term it scales is 0)."""
    positive = norm_sq > 0
    return ops.select(positive, dot / (2.0 * ops.select(positive, norm_sq, ops.ones_like(norm_sq))), 0.0 * dot)


class Adasum(nn.Cell):
    """Per-tensor Adasum of one tuple of tensors per rank over all ``rank_size`` ranks (GRAPH or PyNative).

    ``shapes`` are the tensors' shapes (the same on every rank); ``construct(tensors)`` returns the
    tuple of combined tensors, identical on all ranks, in the input dtypes (computed in float32).
    Needs ``mindspore.communication.init()`` when ``rank_size > 1``; ``rank_size == 1`` returns the
    inputs. ``exchange`` is ``"allgather"`` or ``"allreduce"`` (module docstring); by default the
    cheaper one the device supports.
    """

    def __init__(self, shapes: Sequence[Sequence[int]], rank: int, rank_size: int, exchange: str | None = None):
        super().__init__()
        check_rank_size(rank_size)
        if not 0 <= rank < rank_size:
            raise ValueError(f"rank {rank} is outside 0..{rank_size - 1}")
        exchange = exchange or default_exchange(ms.get_context("device_target"), rank_size)
        if exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
        if not shapes:
            raise ValueError("Adasum needs at least one tensor")
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        self.sizes = tuple(int(np.prod(s, dtype=np.int64)) for s in self.shapes)
        self.rank_size = rank_size
        self.exchange = exchange
        total = sum(self.sizes)
        self.ends = tuple(int(e) for e in np.cumsum(self.sizes))
        self.starts = (0, *self.ends[:-1])
        padded = _padded_size(total, rank_size)
        self.pad = padded - total
        # Segment id of each fused element; padding is its own (all-zero) segment.
        segments = np.repeat(np.arange(len(self.sizes) + 1, dtype=np.int32), [*self.sizes, self.pad])
        levels = rank_size.bit_length() - 1
        cells, start, length = [], 0, padded
        for level in range(levels):
            cells.append(_AdasumLevel(level, rank, rank_size, start, length, segments, exchange))
            length //= 2
            start += ((rank >> level) & 1) * length
        self.levels = nn.CellList(cells)
        self.chunk = length
        if rank_size > 1:
            self.assemble = ops.AllGather()
        # Rank r ends with chunk number bit_reverse(r) of the result; gathered chunks arrive by rank.
        order = [_bit_reverse(position, levels) for position in range(rank_size)]
        self.chunk_order = Tensor(order, ms.int32)
        self.reorder = order != sorted(order)
        self.hyper_map = C.HyperMap()

    def construct(self, tensors):
        if self.rank_size == 1:
            return tensors
        # hyper_map and slices, not comprehensions or ops.split: those recurse once per tensor in
        # graph compilation and exceed its call-depth limit at ResNet-50's 161 tensors.
        flat = ops.concat(self.hyper_map(_flatten, tensors))
        if self.pad:
            flat = ops.concat((flat, ops.zeros((self.pad,), ms.float32)))
        for level in self.levels:
            flat = level(flat)
        flat = self.assemble(flat)
        if self.reorder:
            flat = ops.reshape(ops.gather(ops.reshape(flat, (self.rank_size, self.chunk)), self.chunk_order, 0), (-1,))
        return self.hyper_map(F.partial(_restore, flat), self.starts, self.ends, tensors)


_flatten = C.MultitypeFuncGraph("adasum_flatten")


@_flatten.register("Tensor")
def _flatten_tensor(tensor):
    return ops.reshape(F.cast(tensor, ms.float32), (-1,))


_restore = C.MultitypeFuncGraph("adasum_restore")


@_restore.register("Tensor", "Number", "Number", "Tensor")
def _restore_tensor(flat, start, end, like):
    return F.cast(ops.reshape(flat[start:end], F.shape(like)), F.dtype(like))


_assign = C.MultitypeFuncGraph("adasum_assign")


@_assign.register("Tensor", "Tensor")
def _assign_tensor(target, value):
    return F.assign(target, value)


_delta = C.MultitypeFuncGraph("adasum_delta")


@_delta.register("Tensor", "Tensor")
def _delta_tensor(after, before):
    return after - before


_apply = C.MultitypeFuncGraph("adasum_apply")


@_apply.register("Tensor", "Tensor", "Tensor")
def _apply_tensor(param, before, delta):
    return F.assign(param, before + delta.astype(before.dtype))


def batchnorm_statistics(network: nn.Cell) -> list[Parameter]:
    """The non-trainable floating-point parameters of ``network`` (BatchNorm moving mean and variance)."""
    return [p for p in network.untrainable_params() if p.dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16)]


class AdasumTrainStep(nn.Cell):
    """Drop-in for ``nn.TrainOneStepCell(network, optimizer, sens)`` that combines ranks with Adasum.

    Each step: forward and backward on the local batch (no gradient AllReduce), the local optimizer
    step, then the per-tensor Adasum of every rank's weight delta (weights after minus before the
    step) is added to the weights from before the step, so all ranks hold the same trainable
    weights. Optimizer state (momentum) stays local, as in MindSpore's boost Adasum. With
    ``average_statistics`` the non-trainable float parameters (BatchNorm moving statistics) are
    averaged over the ranks by one AllReduce each step, which keeps the ranks' networks identical;
    otherwise they stay local. Ranks must start from the same weights (same checkpoint or seed).

    ``rank``/``rank_size`` default to ``mindspore.communication.get_rank()``/``get_group_size()``
    (needs ``init()`` first); a ``rank_size`` that is not a power of two raises ``ValueError``
    before any communication call. ``rank_size == 1`` trains like ``TrainOneStepCell``. Returns
    the local loss.
    """

    def __init__(
        self,
        network: nn.Cell,
        optimizer: nn.Optimizer,
        sens: float = 1.0,
        rank: int | None = None,
        rank_size: int | None = None,
        exchange: str | None = None,
        average_statistics: bool = True,
    ):
        super().__init__(auto_prefix=False)
        if rank_size is None:
            from mindspore.communication import get_group_size

            rank_size = get_group_size()
        check_rank_size(rank_size)
        if rank is None:
            from mindspore.communication import get_rank

            rank = get_rank() if rank_size > 1 else 0
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.sens = float(sens)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = C.HyperMap()
        self.distributed = rank_size > 1
        self.rank_size = rank_size
        if self.distributed:
            self.before = self.weights.clone(prefix="adasum_before", init="same")
            self.adasum = Adasum([w.shape for w in self.weights], rank, rank_size, exchange)
        stats = batchnorm_statistics(network) if average_statistics and self.distributed else []
        self.average_statistics = bool(stats)
        if stats:
            self.statistics = ParameterTuple(stats)
            self.stat_ends = tuple(int(e) for e in np.cumsum([np.prod(p.shape, dtype=np.int64) for p in stats]))
            self.stat_starts = (0, *self.stat_ends[:-1])
            self.sum_statistics = ops.AllReduce()

    def construct(self, *inputs):
        weights = self.weights
        if self.distributed:
            saved = self.hyper_map(_assign, self.before, weights)
        loss = self.network(*inputs)
        sens = F.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, weights)(*inputs, sens)
        if self.distributed:
            # The copy must be taken before the optimizer, which consumes the gradients, changes the weights.
            grads = F.depend(grads, saved)
        loss = F.depend(loss, self.optimizer(grads))
        if self.distributed:
            deltas = self.hyper_map(_delta, F.depend(weights, loss), self.before)
            combined = self.adasum(deltas)
            loss = F.depend(loss, self.hyper_map(_apply, weights, self.before, combined))
        if self.average_statistics:
            loss = F.depend(loss, self._average_statistics(F.depend(self.statistics, loss)))
        return loss

    def _average_statistics(self, stats):
        flat = self.sum_statistics(ops.concat(self.hyper_map(_flatten, stats))) / self.rank_size
        averaged = self.hyper_map(F.partial(_restore, flat), self.stat_starts, self.stat_ends, stats)
        return self.hyper_map(_assign, self.statistics, averaged)
