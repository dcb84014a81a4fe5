"""DECA-style bitmask sparsity over a stored weight: a bitmask of its nonzero values, those
values packed column by column, and the format's group scales, as separate arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sandwich.errors import ConfigError, ShapeError
from sandwich.weight_formats import QuantizedWeight, WeightFormat, layout


@dataclass
class SparseWeight:
    """A `QuantizedWeight` without its zero values. `mask[n]` holds column n's K bits, bit j
    of byte i (little-endian) standing for value 8i + j, set where a value is stored;
    `values[offsets[n]:offsets[n + 1]]` are column n's stored values in K order, in the dense
    format's value dtype; `scales` and `mins` are the dense format's, unchanged. A kernel
    walking a column group by group takes each group's count from the popcount of its bits."""

    fmt: WeightFormat
    shape: tuple[int, int]  # (K, N)
    mask: np.ndarray  # uint8 (N, ceil(K / 8))
    values: np.ndarray  # (nonzeros,)
    offsets: np.ndarray  # int64 (N + 1,)
    scales: np.ndarray | None = None
    mins: np.ndarray | None = None

    def __post_init__(self) -> None:
        k, n = self.shape
        dtype = layout(self.fmt, k, n)["q"][1]
        ok = self.mask.dtype == np.uint8 and self.mask.shape == (n, -(-k // 8))
        counts = np.unpackbits(self.mask, axis=1, count=k, bitorder="little").sum(axis=1) \
            if ok else None
        if (counts is None or self.values.dtype != dtype
                or self.offsets.shape != (n + 1,) or self.offsets[0] != 0
                or not np.array_equal(np.diff(self.offsets), counts)
                or self.offsets[-1] != self.values.size):
            raise ShapeError(f"sparse {self.fmt.name} weight of shape (K, N) = {self.shape}: "
                             f"its mask, offsets and {self.values.size} values do not agree")

    @property
    def nbytes(self) -> int:
        """Bytes of the stored arrays: what one decode step streams from memory."""
        arrays = (self.mask, self.values, self.offsets, self.scales, self.mins)
        return sum(a.nbytes for a in arrays if a is not None)

    @property
    def density(self) -> float:
        """The share of the K x N values that are stored."""
        k, n = self.shape
        return self.values.size / (k * n) if k * n else 0.0


def sparsify(qw: QuantizedWeight) -> SparseWeight:
    """`qw` with its zero values (all bits zero) dropped: exact, `densify` gives `qw` back."""
    if qw.fmt.bits < 8:
        raise ConfigError(f"bitmask sparsity stores whole values (fp32, bf16 and the int8 "
                          f"formats), not {qw.fmt.name}'s packed nibbles")
    nonzero = qw.q.view(f"u{qw.q.itemsize}") != 0  # -0.0 is kept: the round trip is exact
    mask = np.packbits(nonzero, axis=1, bitorder="little")
    offsets = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))]).astype(np.int64)
    return SparseWeight(qw.fmt, qw.shape, mask, qw.q[nonzero], offsets, qw.scales, qw.mins)


def densify(sw: SparseWeight) -> QuantizedWeight:
    """The dense weight `sw` stands for, zeros put back."""
    k, n = sw.shape
    nonzero = np.unpackbits(sw.mask, axis=1, count=k, bitorder="little").astype(bool)
    q = np.zeros((n, k), sw.values.dtype)
    q[nonzero] = sw.values
    return QuantizedWeight(sw.fmt, sw.shape, q, sw.scales, sw.mins)
