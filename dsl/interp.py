"""A slow reference interpreter of the high-level IR, to test kernel sources on tiny shapes.

It runs every loop serially in Python and checks every index, so a kernel source can be
validated against numpy before any TIR exists. Uninitialised float locals hold NaN so
that reading one shows up in the result.
"""

from __future__ import annotations

import math

import numpy as np

from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.tiles import TileFile
from sandwich.errors import ShapeError
from sandwich.weight_formats import round_bf16

# numpy type of each DSL type (bf16 values are held as float32)
NUMPY_DTYPES = {"f32": np.float32, "bf16": np.float32, "f16": np.float16, "i32": np.int32,
                "i64": np.int64, "i8": np.int8, "u8": np.uint8, "bool": np.bool_}


def _div(a, b):
    """Integer '/' rounds toward minus infinity and '%' takes the divisor's sign, as the
    compiled kernels do (TIR floordiv / floormod)."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return a / b if b else (math.copysign(math.inf, a) if a else math.nan)


def _mod(a, b):
    return a - _div(a, b) * b


_BIN = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
        "/": _div, "%": _mod, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b}


def _exp(x):
    return math.exp(x) if x < 700 else math.inf


def _madd16(x: int, y: int, p: int) -> int:
    """x * lo(p) + y * hi(p), p's two signed 16-bit halves (dsl/builtins.py)."""
    lo = ((p & 0xFFFF) ^ 0x8000) - 0x8000
    return x * lo + y * (p >> 16)


def _i32(v: int) -> int:
    """v wrapped to a signed 32-bit value."""
    return ((v & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _dot8(acc: int, w: int, p: int) -> int:
    """acc + sum of unsigned(byte q of w) * signed(byte q of p) over q < 4 (dsl/builtins.py)."""
    total = 0
    for q in range(4):
        wq, pq = (w >> 8 * q) & 0xFF, (p >> 8 * q) & 0xFF
        total += wq * (pq - 256 if pq >= 128 else pq)
    return _i32(acc + total)


def _s16(v: int) -> int:
    """The low 16 bits of v as a signed value."""
    return ((v & 0xFFFF) ^ 0x8000) - 0x8000


def _dot8p(acc: int, w: int, p02: int, p13: int) -> int:
    """acc + unsigned(byte q of w) times the signed 16-bit half of p02 (q = 0, 2) or p13
    (q = 1, 3) that holds activation q (dsl/builtins.py)."""
    total = 0
    for q in range(4):
        pair = p02 if q % 2 == 0 else p13
        total += ((w >> 8 * q) & 0xFF) * _s16(pair >> 16 * (q // 2))
    return _i32(acc + total)


def _dot8h(acc: int, w: int, p: int) -> int:
    """dot8 into acc's two 16-bit halves, each pair's sum saturated to 16 bits and each half
    wrapping (dsl/builtins.py)."""
    out = 0
    for h in range(2):
        pair = 0
        for q in (2 * h, 2 * h + 1):
            wq, pq = (w >> 8 * q) & 0xFF, (p >> 8 * q) & 0xFF
            pair += wq * (pq - 256 if pq >= 128 else pq)
        out |= (((acc >> 16 * h) + max(-32768, min(32767, pair))) & 0xFFFF) << 16 * h
    return _i32(out)


def _halves(x: int) -> int:
    """x's low and high halves, signed 16-bit values, summed (dsl/builtins.py)."""
    return _s16(x) + _s16(x >> 16)


def _nibbles(w: int, h: int) -> int:
    """The low (h = 0) or high (h = 1) nibble of each byte of w, in place (dsl/builtins.py)."""
    return _i32((w >> 4 * h) & 0x0F0F0F0F)


def _high2(w: int, s: int) -> int:
    """The 2-bit field s of each byte of w, at bits 4 and 5 of its byte (dsl/builtins.py)."""
    return _i32(((w >> 2 * s) & 0x03030303) << 4)


def _high1(w: int, s: int) -> int:
    """Bit s of each byte of w, at bit 4 of its byte (dsl/builtins.py)."""
    return _i32(((w >> s) & 0x01010101) << 4)


def _bf16(bits: int) -> float:
    """The f32 value of 16 bf16 bits."""
    return float(np.array([(bits & 0xFFFF) << 16], np.uint32).view(np.float32)[0])


def _bf16_bits(x: float) -> int:
    """x rounded to bf16 as the weights are (weight_formats.round_bf16: nearest even, a NaN
    kept a quiet NaN): what bf16pair packs."""
    return int(round_bf16(np.array([x], np.float32)).view(np.uint32)[0] >> 16)


def _dotbf16(acc: float, w: int, p: int) -> float:
    """acc + hi(w) hi(p) + lo(w) lo(p) (dsl/builtins.py), summed in f32 as vdpbf16ps does."""
    f32 = np.float32
    hi = f32(acc) + f32(_bf16(w >> 16)) * f32(_bf16(p >> 16))
    return float(hi + f32(_bf16(w)) * f32(_bf16(p)))


def _bf16pair(x: float, y: float) -> int:
    """x and y as bf16 bits, lo + 65536 * hi, as a signed 32-bit value."""
    return _i32(_bf16_bits(x) | (_bf16_bits(y) << 16))


_FUNCS = {"exp": _exp, "log": math.log, "sqrt": math.sqrt, "rsqrt": lambda x: 1 / math.sqrt(x),
          "tanh": math.tanh, "sigmoid": lambda x: 1 / (1 + _exp(-x)), "sin": math.sin,
          "cos": math.cos, "erf": math.erf, "floor": math.floor, "ceil": math.ceil,
          "pow": math.pow, "fma": lambda a, b, c: a * b + c, "max": max, "min": min, "abs": abs,
          "select": lambda c, a, b: a if c else b, "madd16": _madd16, "dot8": _dot8, "nibbles": _nibbles,
          "dot8p": _dot8p,
          "dot8h": _dot8h, "halves": _halves,
          "high2": _high2, "high1": _high1,
          "dotbf16": _dotbf16, "bf16pair": _bf16pair}


def _cast(dtype: str, v):
    if dtype in A.INT_DTYPES:
        return int(v)
    return bool(v) if dtype == "bool" else float(v)


class Interpreter:
    def __init__(self, env: dict, prefetches: list | None = None) -> None:
        self.env = env
        self.tiles: TileFile | None = None  # made by the first tile statement
        # (array, index) of each prefetch run, where a caller asks (a test of what a kernel
        # brings in ahead); else a prefetch computes nothing
        self.prefetches = prefetches

    def fail(self, message: str, node) -> DSLError:
        loc = getattr(node, "loc", None)
        where = f"{loc.file}:{loc.line}:{loc.column}: " if loc else ""
        return DSLError(f"{where}{message}")

    def expr(self, e):
        if isinstance(e, (A.IntLit, A.FloatLit, A.BoolLit)):
            return e.value
        if isinstance(e, A.Name):
            return self.env[e.id]
        if isinstance(e, A.Index):
            arr, idx = self.element(e)
            v = arr[idx]
            return float(v) if arr.dtype.kind == "f" else (bool(v) if arr.dtype == bool else int(v))
        if isinstance(e, A.Unary):
            v = self.expr(e.operand)
            return (not v) if e.op == "not" else -v
        if isinstance(e, A.Binary):
            if e.op == "and":
                return self.expr(e.left) and self.expr(e.right)
            if e.op == "or":
                return self.expr(e.left) or self.expr(e.right)
            return _BIN[e.op](self.expr(e.left), self.expr(e.right))
        if isinstance(e, A.Cast):
            return _cast(e.dtype, self.expr(e.value))
        if isinstance(e, A.Call):
            if e.func == "select":  # only the chosen side: the other may name what is not there
                return self.expr(e.args[1] if self.expr(e.args[0]) else e.args[2])
            return _FUNCS[e.func](*(self.expr(a) for a in e.args))
        raise self.fail(f"cannot evaluate {type(e).__name__}", e)

    def element(self, e: A.Index):
        arr = self.env[e.array]
        idx = tuple(self.expr(i) for i in e.indices)
        for axis, (i, n) in enumerate(zip(idx, arr.shape, strict=True)):
            if not 0 <= i < n:
                raise self.fail(f"index {i} out of bounds for axis {axis} of '{e.array}' "
                                f"(size {n})", e)
        return arr, idx

    def block(self, stmts) -> None:
        for s in stmts:
            self.stmt(s)

    def stmt(self, s) -> None:
        if isinstance(s, A.Decl):
            if s.shape:
                shape = tuple(self.expr(d) for d in s.shape)
                fill = np.nan if s.dtype in ("f32", "bf16", "f16") else 0
                self.env[s.name] = np.full(shape, fill, dtype=NUMPY_DTYPES[s.dtype])
            else:
                self.env[s.name] = None if s.init is None else _cast(s.dtype, self.expr(s.init))
        elif isinstance(s, A.Assign):
            self.assign(s)
        elif isinstance(s, A.Assert):
            if not self.expr(s.cond):
                raise self.fail("assertion failed", s)
        elif isinstance(s, A.If):
            self.block(s.then if self.expr(s.cond) else s.orelse)
        elif isinstance(s, A.Tile):
            self.tile(s)
        elif isinstance(s, A.Prefetch) and self.prefetches is not None:
            # a cache hint: recorded, not checked (its element may lie past the end)
            target = s.target
            self.prefetches.append((target.array, tuple(self.expr(i) for i in target.indices)))
        elif isinstance(s, H.For):
            start, stop, step = (self.expr(x) for x in (s.start, s.stop, s.step))
            if step <= 0:
                raise self.fail(f"loop step must be positive, got {step}", s)
            for i in range(start, stop, step):
                self.env[s.var] = i
                self.block(s.body)

    def tile(self, s: A.Tile) -> None:
        tiles = self.tiles = self.tiles or TileFile()
        try:
            if s.op == "tile_config":
                values = [self.expr(r) for r in s.args]
                tiles.config(values[:A.TILES], values[A.TILES:] or None)
            elif s.op in ("tile_load", "tile_store"):
                arr, idx = self.element(s.args[1])
                flat = int(np.ravel_multi_index(idx, arr.shape))
                move = tiles.load if s.op == "tile_load" else tiles.store
                move(s.args[0].value, arr, flat, self.expr(s.args[2]), s.args[1].array)
            elif s.op == "tile_dpbf16":
                tiles.dpbf16(*(t.value for t in s.args))
            elif s.op == "tile_dpbsud":
                tiles.dpbsud(*(t.value for t in s.args))
            elif s.op == "tile_zero":
                tiles.zero(s.args[0].value)
            else:
                tiles.release()
        except DSLError as e:
            raise self.fail(str(e), s) from None

    def assign(self, s: A.Assign) -> None:
        value = self.expr(s.value)
        if isinstance(s.target, A.Index):
            arr, idx = self.element(s.target)
            old = arr[idx]
        else:
            old = self.env[s.target.id]
        if s.op != "=":
            value = _BIN[s.op[0]](old.item() if hasattr(old, "item") else old, value)
        if isinstance(s.target, A.Index):
            arr[idx] = value
        else:
            self.env[s.target.id] = value


def run(kernel: H.Kernel, *, tunables: dict[str, int], vlen: int = 16,
        prefetches: list | None = None, **args) -> None:
    """Run `kernel` in place on numpy arrays; scalar and array arguments by name; each
    prefetch's (array, index) appended to `prefetches` when given."""
    env: dict = {A.VLEN: vlen, **tunables}
    missing = [t.name for t in kernel.tunables if t.name not in tunables]
    missing += [p.name for p in kernel.params if p.name not in args]
    if missing:
        raise ShapeError(f"kernel {kernel.name}: missing arguments {', '.join(missing)}")
    interp = Interpreter(env, prefetches)
    for p in kernel.params:
        if not p.shape:
            env[p.name] = _cast(p.dtype, args[p.name])
    for p in kernel.params:
        if p.shape:
            want = tuple(interp.expr(d) for d in p.shape)
            arr = args[p.name]
            if tuple(arr.shape) != want:
                raise ShapeError(f"kernel {kernel.name}: '{p.name}' has shape {arr.shape}, "
                                 f"expected {want}")
            env[p.name] = arr
    interp.block(kernel.body)
