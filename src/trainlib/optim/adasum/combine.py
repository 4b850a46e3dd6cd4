"""Adasum (adaptive summation) of weight deltas across 2^k data-parallel ranks: the ``Adasum`` cell.

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

``optim.adasum.step`` trains with it (``AdasumTrainStep``); the float64 reference of the formula the tests
compare with is ``tests/support/adasum.py``, the traffic model ``benchmarks/adasum_traffic.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from trainlib.params import AdasumExchange

EXCHANGES = get_args(AdasumExchange)
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


def default_exchange(device_target: str, rank_size: int) -> str:
    """The half-swap collective: AllGather over the pair unless only the world group has AllGather (CPU, > 2 ranks)."""
    return "allreduce" if device_target == "CPU" and rank_size > 2 else "allgather"


def _padded_size(total: int, rank_size: int) -> int:
    return -(-total // rank_size) * rank_size


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
        flat = ops.concat(self.hyper_map(flatten, tensors))
        if self.pad:
            flat = ops.concat((flat, ops.zeros((self.pad,), ms.float32)))
        for level in self.levels:
            flat = level(flat)
        flat = self.assemble(flat)
        if self.reorder:
            flat = ops.reshape(ops.gather(ops.reshape(flat, (self.rank_size, self.chunk)), self.chunk_order, 0), (-1,))
        return self.hyper_map(F.partial(restore, flat), self.starts, self.ends, tensors)


flatten = C.MultitypeFuncGraph("adasum_flatten")


@flatten.register("Tensor")
def _flatten_tensor(tensor):
    return ops.reshape(F.cast(tensor, ms.float32), (-1,))


restore = C.MultitypeFuncGraph("adasum_restore")


@restore.register("Tensor", "Number", "Number", "Tensor")
def _restore_tensor(flat, start, end, like):
    return F.cast(ops.reshape(flat[start:end], F.shape(like)), F.dtype(like))
