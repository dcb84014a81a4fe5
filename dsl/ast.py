"""AST nodes shared by both IR levels: expressions, parameters, tunables, plain statements.

Every node is a frozen dataclass; `loc` (where it came from) is left out of equality so
that `parse(print(ir)) == ir` compares meaning, not positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

DTYPES = ("f32", "bf16", "f16", "i32", "i64", "i8", "u8", "bool")
# i8 and u8 are storage types (quantized weights): arrays hold them, arithmetic casts them
INT_DTYPES = ("i32", "i64", "i8", "u8")
STORAGE_DTYPES = ("i8", "u8")
FLOAT_DTYPES = ("f32", "bf16", "f16")
VLEN = "vlen"  # builtin symbol: SIMD lanes of f32 on the target, fixed when a kernel is built


@dataclass(frozen=True)
class Loc:
    """A position in a source file (1-based line and column)."""

    file: str
    line: int
    column: int


def _loc():
    return field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Name:
    id: str
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class IntLit:
    """A non-negative integer literal; `-3` is Unary('-', IntLit(3))."""

    value: int
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class FloatLit:
    """A non-negative float literal (may be inf); negative values are Unary('-', ...)."""

    value: float
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class BoolLit:
    value: bool
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Unary:
    """op is '-' or 'not'."""

    op: str
    operand: Expr
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Binary:
    """op is one of + - * / % < <= > >= == != and or (integer '/' and '%' are floor division
    and its remainder, as TIR's floordiv and floormod: -7 / 2 is -4, -7 % 2 is 1)."""

    op: str
    left: Expr
    right: Expr
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Call:
    """A builtin call: exp, max, rsqrt, select(cond, a, b), ..."""

    func: str
    args: tuple[Expr, ...]
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Cast:
    dtype: str
    value: Expr
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Index:
    """Element of a multi-dimensional array: A[i, j]."""

    array: str
    indices: tuple[Expr, ...]
    loc: Loc | None = _loc()


Expr = Union[Name, IntLit, FloatLit, BoolLit, Unary, Binary, Call, Cast, Index]


@dataclass(frozen=True)
class Param:
    """A kernel argument: a scalar (shape == ()) or an array with symbolic shape."""

    name: str
    dtype: str
    shape: tuple[Expr, ...] = ()
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Tunable:
    """A key parameter the tuner searches; domain entries are constant in literals and vlen."""

    name: str
    dtype: str
    domain: tuple[Expr, ...] | None
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Decl:
    """A local scalar (optionally initialised) or a local array (shape != (), no init)."""

    name: str
    dtype: str
    shape: tuple[Expr, ...] = ()
    init: Expr | None = None
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Assign:
    """target op value, op in = += -= *= /=."""

    target: Name | Index
    op: str
    value: Expr
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple
    orelse: tuple = ()
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Assert:
    """A requirement on parameters and tunables (e.g. pack_n % mu_n == 0)."""

    cond: Expr
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Prefetch:
    """A hint to fetch the cache line holding an array element into L2, for data needed
    soon but not right away (e.g. the next weight tile of a DRAM-streaming GEMM). It has no
    effect on results, and its element may lie past the array's end (it is never read)."""

    target: Index
    loc: Loc | None = _loc()


# x86 AMX tile statements and their argument counts (Tile)
TILE_OPS = {"tile_config": 8, "tile_zero": 1, "tile_load": 3, "tile_store": 3,
            "tile_dpbf16": 3, "tile_dpbsud": 3, "tile_release": 0}
TILE_CONFIG_WIDTHS = 16  # tile_config's other form: eight rows, then eight row widths in bytes
# how many of a tile statement's first arguments are tile numbers (literals 0 to TILES - 1)
TILE_NUMBERS = {"tile_config": 0, "tile_zero": 1, "tile_load": 1, "tile_store": 1,
                "tile_dpbf16": 3, "tile_dpbsud": 3, "tile_release": 0}
TILES, TILE_ROWS, TILE_ROW_BYTES = 8, 16, 64


@dataclass(frozen=True)
class Tile:
    """An x86 AMX statement (AMX-TILE, AMX-BF16, AMX-INT8), for CPUs with matrix tiles:
    eight tile registers of up to 16 rows of 64 bytes. `tile_config(r0, ..., r7)` gives each
    tile its rows (0: unused; every row 64 bytes) and zeroes them all; `tile_config(r0, ...,
    r7, w0, ..., w7)` also each row's width in bytes (4 to 64, a multiple of 4);
    `tile_zero(t)`; `tile_load(t, X[i, ...], stride)` and `tile_store(t, X[i, ...], stride)`
    move tile t's rows from or to X, row r at the element `stride * r` after X[i, ...] in
    memory order; `tile_dpbf16(c, a, b)` adds to f32 tile c (rows x 16) the products of a's
    bf16 pairs (rows x 16 pairs) and b's (16 rows of pairs along K x 16 columns), as
    tdpbf16ps does; `tile_dpbsud(c, a, b)` adds to i32 tile c (rows x 16) the products of
    a's signed bytes (rows x 4 k) and b's unsigned ones (k rows of 4 bytes along K x 16
    columns), as tdpbsud does; `tile_release()` frees them. Tile numbers are integer
    literals."""

    op: str
    args: tuple
    loc: Loc | None = _loc()


ASSIGN_OPS = ("=", "+=", "-=", "*=", "/=")
