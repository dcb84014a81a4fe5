"""The x86 AMX tile registers in numpy, for the reference interpreter (dsl/interp.py).

A kernel with tile statements (dsl/ast.py, Tile) runs only on a CPU with AMX, which most of
our machines lack; this model of the eight tiles lets its index arithmetic and its tile
shapes be checked against numpy on any machine. It follows the instructions' definitions
(Intel SDM, AMX): ldtilecfg zeroes every tile, a tile row holds up to 64 bytes, tdpbf16ps
adds to each f32 element of C the products of a row of A's bf16 pairs and a column of B's,
tdpbsud to each i32 element the products of a row of A's signed bytes and a column of B's
unsigned ones, and a load or store touches exactly the configured rows and bytes. It checks
what the hardware would fault on or compute wrong: an unconfigured tile, a shape tdpbf16ps
or tdpbsud cannot take, a row outside its array.
"""

from __future__ import annotations

import numpy as np

from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLError


def _bf16(raw: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float32 values (exact)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


class TileFile:
    """Eight tiles of up to 16 rows x 64 bytes, and their configuration."""

    def __init__(self) -> None:
        self.rows: list[int] | None = None  # None until tile_config
        self.widths = [A.TILE_ROW_BYTES] * A.TILES  # each row's bytes
        self.data = np.zeros((A.TILES, A.TILE_ROWS, A.TILE_ROW_BYTES), dtype=np.uint8)

    def config(self, rows: list[int], widths: list[int] | None = None) -> None:
        bad = [r for r in rows if not 0 <= r <= A.TILE_ROWS]
        if bad:
            raise DSLError(f"tile_config: a tile has 0 to {A.TILE_ROWS} rows, got {bad[0]}")
        widths = widths or [A.TILE_ROW_BYTES] * A.TILES
        bad = [w for r, w in zip(rows, widths, strict=True)
               if r and not (0 < w <= A.TILE_ROW_BYTES and w % 4 == 0)]
        if bad:
            raise DSLError(f"tile_config: a tile row holds 4 to {A.TILE_ROW_BYTES} bytes, a "
                           f"multiple of 4, got {bad[0]}")
        self.rows, self.widths = list(rows), list(widths)
        self.data[...] = 0

    def _rows(self, t: int) -> int:
        if self.rows is None:
            raise DSLError("a tile statement before tile_config (the CPU faults)")
        if self.rows[t] == 0:
            raise DSLError(f"tile {t} has no rows in this tile_config")
        return self.rows[t]

    def zero(self, t: int) -> None:
        self.data[t, :self._rows(t)] = 0

    def _span(self, t: int, arr: np.ndarray, flat: int, stride: int, name: str):
        """Each configured row's element range in `arr` laid flat."""
        per = self.widths[t] // arr.itemsize
        for r in range(self._rows(t)):
            start = flat + r * stride
            if start < 0 or start + per > arr.size:
                raise DSLError(f"tile {t} row {r} reads or writes elements {start} to "
                               f"{start + per - 1} of '{name}' (size {arr.size})")
            yield r, start, start + per

    def load(self, t: int, arr: np.ndarray, flat: int, stride: int, name: str) -> None:
        mem = arr.reshape(-1)
        for r, a, b in self._span(t, arr, flat, stride, name):
            self.data[t, r, :self.widths[t]] = mem[a:b].view(np.uint8)

    def store(self, t: int, arr: np.ndarray, flat: int, stride: int, name: str) -> None:
        for r, a, b in self._span(t, arr, flat, stride, name):
            arr.flat[a:b] = self.data[t, r, :self.widths[t]].view(arr.dtype)  # row-major positions

    def dpbf16(self, c: int, a: int, b: int) -> None:
        """C[m, n] += sum over k of A[m, 2k] B[k, 2n] + A[m, 2k + 1] B[k, 2n + 1], in f32."""
        rc, ra, rb = self._rows(c), self._rows(a), self._rows(b)
        pairs = A.TILE_ROW_BYTES // 4  # a row of A holds 16 pairs: B needs a row for each
        if ra != rc or rb != pairs or any(self.widths[t] != A.TILE_ROW_BYTES for t in (c, a, b)):
            raise DSLError(f"tile_dpbf16({c}, {a}, {b}): C and A need the same rows and B "
                           f"{pairs}; the tile_config gives {rc}, {ra} and {rb}")
        av = _bf16(self.data[a, :ra].view(np.uint16)).reshape(ra, pairs, 2)
        bv = _bf16(self.data[b, :rb].view(np.uint16)).reshape(rb, pairs, 2)
        acc = self.data[c, :rc].view(np.float32).copy()
        for k in range(pairs):  # in order, each pair's two products summed in f32
            acc += av[:, k, 0:1] * bv[k, :, 0] + av[:, k, 1:2] * bv[k, :, 1]
        self.data[c, :rc] = acc.view(np.uint8)

    def dpbsud(self, c: int, a: int, b: int) -> None:
        """C[m, n] += sum over k of A[m, k] B[k // 4, 4 n + k % 4], A's bytes signed and B's
        unsigned, in i32 (wrapping, as the instruction does)."""
        rc, ra, rb = self._rows(c), self._rows(a), self._rows(b)
        quads = self.widths[a] // 4  # a row of A holds this many groups of 4 bytes: B a row each
        if ra != rc or rb != quads or self.widths[c] != A.TILE_ROW_BYTES or \
                self.widths[b] != A.TILE_ROW_BYTES:
            raise DSLError(f"tile_dpbsud({c}, {a}, {b}): C and A need the same rows, B a row for "
                           f"each 4 bytes of A's, C and B 64-byte rows; the tile_config gives "
                           f"{rc}, {ra} x {self.widths[a]} bytes and {rb} x {self.widths[b]}")
        av = self.data[a, :ra, :4 * quads].view(np.int8).astype(np.int64)
        bv = self.data[b, :rb].view(np.uint8).reshape(rb, 16, 4).transpose(0, 2, 1)
        prod = av @ bv.reshape(4 * quads, 16).astype(np.int64)  # k = 4 row + byte
        acc = self.data[c, :rc].view(np.int32).astype(np.int64) + prod
        self.data[c, :rc] = acc.astype(np.int32).view(np.uint8)  # wraps mod 2^32

    def release(self) -> None:
        self.rows = None
