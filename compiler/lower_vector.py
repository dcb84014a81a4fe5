"""What a `vector` loop may hold, which of its statements are reductions, and a SIMD exp.

TVM 0.27 vectorises a loop only when nothing in it forces a fallback to a serial loop: an
`if` whose condition depends on the lane, a reduction into a scalar, or a let-bound
scalar (only the last lane survives). The lowering avoids all three: the tail runs as a
separate serial loop, reductions keep one partial value per lane, and scalars declared
in the body get one slot per lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.compiler.llvm_splice import BF16_PAIR, BF16_X32, DPBF16PS
from sandwich.dsl import ast as A
from sandwich.dsl.check import _names
from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel import ast as H

_IDENTITY = {"+": "T.float32(0.0)", "max": 'T.float32("-inf")', "min": 'T.float32("inf")'}
_INT_IDENTITY = {"+": "0", "max": "-2147483647", "min": "2147483647"}


@dataclass(frozen=True)
class Reduction:
    """`name op= value` inside a vector loop, with `name` declared outside it."""

    name: str
    op: str  # "+", "max" or "min"
    value: A.Expr

    def identity(self, dtype: str) -> str:
        return (_INT_IDENTITY if dtype in A.INT_DTYPES else _IDENTITY)[self.op]

    def combine(self, acc: str, value: str) -> str:
        return f"({acc} + {value})" if self.op == "+" else f"T.{self.op}({acc}, {value})"


def names_in(*exprs):
    for e in exprs:
        yield from _names(e)


def scalar_decls(stmts) -> list[A.Decl]:
    """Scalars declared in a loop body (at any `if` depth): each needs a slot per lane."""
    out = []
    for s in stmts:
        if isinstance(s, A.Decl):
            out.append(s)
        elif isinstance(s, A.If):
            out += scalar_decls(s.then) + scalar_decls(s.orelse)
    return out


def as_reduction(s, local: set[str]) -> Reduction | None:
    """The reduction a statement performs on an outer scalar, if it is one."""
    if not (isinstance(s, A.Assign) and isinstance(s.target, A.Name)) or s.target.id in local:
        return None
    x = s.target.id
    if s.op == "+=":
        return Reduction(x, "+", s.value)
    v = s.value
    if s.op == "=" and isinstance(v, A.Call) and v.func in ("max", "min"):
        a, b = v.args
        if isinstance(a, A.Name) and a.id == x:
            return Reduction(x, v.func, b)
        if isinstance(b, A.Name) and b.id == x:
            return Reduction(x, v.func, a)
    return None


def _statements(stmts):
    for s in stmts:
        yield s
        if isinstance(s, A.If):
            yield from _statements(s.then)
            yield from _statements(s.orelse)


def _reads(s) -> list[str]:
    if isinstance(s, A.Decl):
        return list(names_in(*s.shape, *([s.init] if s.init is not None else [])))
    if isinstance(s, A.Assign):
        idx = s.target.indices if isinstance(s.target, A.Index) else ()
        return list(names_in(s.value, *idx))
    if isinstance(s, (A.If, A.Assert)):
        return list(names_in(s.cond))
    return []


def reductions(loop: H.For) -> list[Reduction] | None:
    """The loop's reductions, or None when the loop cannot be vectorised.

    Vectorisable: no nested loops, local arrays or prefetches; every store is to an element indexed by
    the loop variable, to a scalar declared in the body, or a reduction of an outer scalar
    that the body reads nowhere else.
    """
    local = {d.name for d in scalar_decls(loop.body)}
    found: dict[str, Reduction] = {}
    reads: list[str] = []
    for s in _statements(loop.body):
        if isinstance(s, (H.For, A.Prefetch, A.Tile)) or (isinstance(s, A.Decl) and s.shape):
            return None
        red = as_reduction(s, local)
        if red is not None:
            if red.name in found:
                return None
            found[red.name] = red
            reads += list(names_in(red.value))
            continue
        if isinstance(s, A.Assign):
            t = s.target
            if isinstance(t, A.Name) and t.id not in local:
                return None
            if isinstance(t, A.Index) and loop.var not in set(names_in(*t.indices)):
                return None
        reads += _reads(s)
    if set(found) & set(reads):
        return None
    return list(found.values())


def horizontal(red: Reduction, vector: str, lanes: int) -> str:
    """A vector of `lanes` (a power of two) combined into one value by halving shuffles.

    Writing the halves back to a stack buffer instead costs a store-forwarding stall per
    step; as one expression, LLVM keeps it in registers (extract + add, log2(lanes) times).
    """
    while lanes > 1:
        half = lanes // 2
        lo = ", ".join(str(i) for i in range(half))
        hi = ", ".join(str(i) for i in range(half, lanes))
        vector = red.combine(f"T.Shuffle([{vector}], [{lo}])", f"T.Shuffle([{vector}], [{hi}])")
        lanes = half
    return vector


# Cephes-style exp (as TVM's topi.fast_exp): 2^n * p(f) with |f| <= ln2 / 2, relative
# error ~1e-7; LLVM turns it into a handful of SIMD instructions instead of vlen calls to
# expf. exp(-inf) is 0, as the online softmax needs.
_P = ("1.9875691500e-4", "1.3981999507e-3", "8.3334519073e-3", "4.1665795894e-2",
      "1.6666665459e-1", "5.0000001201e-1")
LN2_HIGH, LN2_LOW = 0.693359375, -2.12194440e-4  # ln2 = their sum to float32's precision


def fast_exp(x: str) -> str:
    """TVMScript expression for exp(x) in float32 that vectorises. The reduction x - n ln2
    takes ln2 in two parts (Cody and Waite): the first has 9 significant bits, so n times it
    is exact for every |n| <= 128; with ln2 as one float32, n ln2 near |x| = 88 was off by
    about 4e-6, which the polynomial then carried into a relative error of that size."""
    xc = f"T.max(T.min({x}, T.float32(88.3762626647950)), T.float32(-88.3762626647949))"
    n = f"T.floor({xc} * T.float32(1.44269504088896341) + T.float32(0.5))"
    f = f"(({xc} - {n} * T.float32({LN2_HIGH})) - {n} * T.float32({LN2_LOW}))"
    poly = f"T.float32({_P[0]})"
    for c in _P[1:]:
        poly = f"({poly} * {f} + T.float32({c}))"
    y = f"({poly} * {f} * {f} + {f} + T.float32(1.0))"
    scale = f'T.reinterpret("float32", T.shift_left(T.Cast("int32", {n}) + 127, 23))'
    return f"({scale} * {y})"


def affine(start: str, index: str, step: str) -> str:
    """start + index * step, without the no-op parts."""
    scaled = index if step == "1" else f"{index} * {step}"
    return f"({scaled})" if start == "0" else f"({start} + {scaled})"


# x86's pmaddwd by vector width: 16-bit pairs multiplied and summed into 32-bit lanes
PMADDWD = {8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"}


# the ISAs (compiler/target.CpuInfo.isa) with x86's integer vector instructions: pmaddwd,
# pmaddubsw (and, with AVX512-VNNI, vpdpbusd)
X86_ISAS = ("avx2", "avx512")


def sums_in_16_bits(isa: str | None, int8_dot: bool) -> bool:
    """Whether int4 and int5 tiles sum their products in 16 bits (the family's h16: dot8h,
    pmaddubsw + paddw) on this target: x86 without VNNI, whose vpdpbusd sums in 32 bits at
    no extra cost."""
    return isa in X86_ISAS and not int8_dot


# x86's vpdpbusd (AVX512-VNNI) by vector width: 4 unsigned bytes times 4 signed bytes, summed
# into each 32-bit lane; without VNNI, dot8 is two pmaddwd on the bytes split into 16 bits
DPBUSD = {16: "llvm.x86.avx512.vpdpbusd.512"}
# x86's pmaddubsw by vector width: unsigned bytes times signed bytes, adjacent pairs summed
# into 16-bit lanes with saturation, which cannot happen while the unsigned bytes stay < 128
PMADDUBSW = {8: "llvm.x86.avx2.pmadd.ub.sw", 16: "llvm.x86.avx512.pmaddubs.w.512"}
# the largest byte each of these builtins leaves in a lane (nibbles: 0x0F, high1: 0x10,
# high2: 0x30), so that dot8 knows when its weight bytes are below 128
_BYTE_MAX = {"nibbles": 15, "high1": 16, "high2": 48}
_LOW_BYTES = 0x00FF00FF  # bytes 0 and 2 of a 32-bit lane, each widened to its 16-bit half


def _byte(p: str, q: int) -> str:
    """Byte q of the int32 p, sign-extended."""
    return f"T.shift_right(T.shift_left({p}, {24 - 8 * q}), 24)" if q < 3 else f"T.shift_right({p}, 24)"


def _sext16(x: str) -> str:
    """The low 16 bits of the int32 x, sign-extended."""
    return f"T.shift_right(T.shift_left({x}, 16), 16)"


def _pmaddubsw(w: str, p: str, vl: int) -> str:
    """pmaddubsw of the vector w's bytes (unsigned) and p's 4 bytes in every lane (signed):
    adjacent products summed into 16-bit lanes, saturated."""
    return (f'T.call_llvm_pure_intrin("int16x{2 * vl}", "{PMADDUBSW[vl]}", '
            f'T.reinterpret("int8x{4 * vl}", {w}), '
            f'T.reinterpret("int8x{4 * vl}", T.Broadcast({p}, {vl})))')


def _pmaddwd_ones(x16: str, vl: int) -> str:
    """pmaddwd of the 2 vl 16-bit lanes x16 by ones: each pair summed into a 32-bit lane."""
    return (f'T.call_llvm_pure_intrin("int32x{vl}", "{PMADDWD[vl]}", {x16}, '
            f"T.Broadcast(T.int16(1), {2 * vl}))")


def _pmaddwd_bytes(acc: str, w: str, pairs: tuple[str, str], vl: int) -> str:
    """acc plus 2 pmaddwd: bytes 0 and 2 of each of w's lanes (unsigned, split into its 16-bit
    halves by an and) times pairs[0]'s signed halves, bytes 1 and 3 (a shift and an and)
    times pairs[1]'s; each pair one int32 for every lane."""
    mask = f"T.Broadcast({_LOW_BYTES}, {vl})"
    out = acc
    for wq, pq in zip((w, f"T.shift_right({w}, T.Broadcast(8, {vl}))"), pairs, strict=True):
        wide = f'T.reinterpret("int16x{2 * vl}", T.bitwise_and({wq}, {mask}))'
        p16 = f'T.reinterpret("int16x{2 * vl}", T.Broadcast({pq}, {vl}))'
        out = f'({out} + T.call_llvm_pure_intrin("int32x{vl}", "{PMADDWD[vl]}", {wide}, {p16}))'
    return out


def _byte_pair(p: str, q: int) -> str:
    """Signed bytes q and q + 2 of p as the two 16-bit halves of an int32 (pmaddwd's pair)."""
    return f"T.bitwise_or(T.bitwise_and({_byte(p, q)}, 65535), T.shift_left({_byte(p, q + 2)}, 16))"


# vector widths with x86's vdpbf16ps (avx512_bf16): pairs of bf16 multiplied and added to
# f32 lanes, and vcvtne2ps2bf16 for bf16pair; called through stand-ins that
# compiler/llvm_splice.py turns into the intrinsics
DPBF16PS_LANES = (16,)


def _bf16_bits(x: str, lanes: str = "") -> str:
    """x (float32, or a vector of them with `lanes` such as "x32") rounded to bf16, nearest
    even: its 16 bits in a uint32. A NaN is first made quiet in its upper half, so that
    rounding cannot carry its payload into an infinity (as weight_formats._to_bf16, ggml's
    rounding, does for the weights)."""
    raw = f'T.reinterpret("uint32{lanes}", {x})'
    b = (f"T.Select(T.bitwise_and({raw}, T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000), "
         f"T.bitwise_or(T.bitwise_and({raw}, T.uint32(0xFFFF0000)), T.uint32(0x400000)), {raw})")
    return (f"T.shift_right({b} + T.uint32(32767) + T.bitwise_and(T.shift_right({b}, "
            f"T.uint32(16)), T.uint32(1)), T.uint32(16))")


def bf16_pair(x: str, y: str, lanes: str = "") -> str:
    """TVMScript of bf16pair(x, y) (dsl/builtins.py): the two bf16s' bits in an int32."""
    return (f'T.reinterpret("int32{lanes}", T.bitwise_or({_bf16_bits(x, lanes)}, '
            f"T.shift_left({_bf16_bits(y, lanes)}, T.uint32(16))))")


def calls(stmts, func: str) -> bool:
    """Whether any expression of `stmts` (assignments only) calls `func`."""
    def walk(e):
        if isinstance(e, A.Call):
            return e.func == func or any(walk(a) for a in e.args)
        kids = {A.Unary: lambda: [e.operand], A.Binary: lambda: [e.left, e.right],
                A.Cast: lambda: [e.value], A.Index: lambda: list(e.indices)}.get(type(e))
        return bool(kids) and any(walk(k) for k in kids())
    return any(isinstance(s, A.Assign) and walk(s.value) for s in stmts)


def _lane_plus(e, lane: str) -> bool:
    """Whether `e` is the lane variable plus a lane-free term (coefficient 1)."""
    if isinstance(e, A.Name):
        return e.id == lane
    return (isinstance(e, A.Binary) and e.op == "+" and any(
        _lane_plus(a, lane) and lane not in set(names_in(b))
        for a, b in ((e.left, e.right), (e.right, e.left))))


def side_by_side(x, y, lane: str) -> bool:
    """Whether y is x applied to the element after each of x's lane-varying loads, whose
    last index is 2 * (... + lane): then x and y interleaved lane by lane are x on 2 vlen
    consecutive elements (one load, elementwise ops after it)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, A.Index):
        if lane not in set(names_in(*x.indices)):
            return x == y
        last = x.indices[-1]
        doubled = (isinstance(last, A.Binary) and last.op == "*"
                   and A.IntLit(2) in (last.left, last.right)
                   and _lane_plus(last.right if last.left == A.IntLit(2) else last.left, lane))
        return (doubled and x.array == y.array and x.indices[:-1] == y.indices[:-1]
                and lane not in set(names_in(*x.indices[:-1]))
                and y.indices[-1] == A.Binary("+", last, A.IntLit(1)))
    if isinstance(x, A.Cast):
        return x.dtype == y.dtype and side_by_side(x.value, y.value, lane)
    if isinstance(x, A.Unary):
        return x.op == y.op and side_by_side(x.operand, y.operand, lane)
    if isinstance(x, A.Binary):
        return (x.op == y.op and side_by_side(x.left, y.left, lane)
                and side_by_side(x.right, y.right, lane))
    return x == y and lane not in set(names_in(x))


class VectorLoops:
    """The `vector` loop part of the TVMScript emitter (compiler/lower_tir.py)."""

    def explicit(self, s, reds, step, const_trips) -> bool:
        """Whether a `vector` loop is written as explicit vector statements (T.Ramp lanes)
        rather than left to TVM's vectoriser: loops of plain assignments that call madd16 or
        dot8 (dot8p, dot8h, halves) on x86, or dotbf16 where vdpbf16ps exists (TVM vectorises
        calls lane by lane, and neither instruction is lane-wise), or bf16pair (TVM loads
        its x and y lane by lane, 48 vinsertps a vector on AVX-512; see bf16pair)."""
        intrinsic = ((self.isa in X86_ISAS and self.vlen in PMADDWD
                      and any(calls(s.body, f) for f in ("madd16", "dot8", "dot8p", "dot8h", "halves")))
                     or (self.bf16_dot and self.vlen in DPBF16PS_LANES and calls(s.body, "dotbf16"))
                     or calls(s.body, "bf16pair"))
        return (intrinsic and not reds and step == "1" and const_trips is not None
                and const_trips % self.vlen == 0 and all(isinstance(t, A.Assign) for t in s.body))

    def ramp_loop(self, s, u, start, const_trips, depth: int) -> None:
        vl, chunks = self.vlen, const_trips // self.vlen
        self.line(depth, f"for {u}o in {'T.unroll' if chunks <= 8 else 'range'}({chunks}):")
        saved = self.ramp, self.ramp_start
        self.ramp_start = affine(start, f"{u}o", str(vl))
        self.names[s.var] = f"T.Ramp({self.ramp_start}, 1, {vl})"
        self.ramp = s.var
        for stmt in s.body:
            self.stmt(stmt, depth + 1)
        self.ramp, self.ramp_start = saved

    def lanes_of(self, e) -> str:
        """The TVM lanes suffix of a vector expression in an explicit vector loop."""
        if not self.varies(e):
            return ""
        return f"x{2 * self.vlen if self.wide else self.vlen}"

    def wide_index(self, e: A.Index) -> str:
        """A lane-varying load of a side_by_side pair: 2 vlen consecutive elements."""
        lane = self.names[self.ramp]
        self.names[self.ramp] = self.ramp_start
        try:
            head = [self.expr(i) for i in e.indices]
        finally:
            self.names[self.ramp] = lane
        last = head.pop()
        return f"{self.names[e.array]}[{', '.join(head + [f'T.Ramp({last}, 1, {2 * self.vlen})'])}]"

    def varies(self, e) -> bool:
        """Inside an explicit vector loop: whether `e` is a vector (names the lane)."""
        return self.ramp is not None and self.ramp in set(names_in(e))

    def madd16(self, e, x: str, y: str, p: str) -> str:
        """pmaddwd when x and y are vectors and p is one pair for every lane, else the same
        arithmetic on 32-bit values (scalars, or vectors TVM widens)."""
        vx, vy, vp = (self.varies(a) for a in e.args)
        if vx and vy and not vp:
            vl = self.vlen
            if side_by_side(*e.args[:2], self.ramp):  # one load of x's and y's elements
                self.wide = True
                try:
                    w = f'T.Cast("int16x{2 * vl}", {self.expr(e.args[0])})'
                finally:
                    self.wide = False
            else:
                pairs = ", ".join(f"{i}, {i + vl}" for i in range(vl))
                w = f'T.Shuffle([T.Cast("int16x{vl}", {x}), T.Cast("int16x{vl}", {y})], [{pairs}])'
            a = f'T.reinterpret("int16x{2 * vl}", T.Broadcast({p}, {vl}))'
            return f'T.call_llvm_pure_intrin("int32x{vl}", "{PMADDWD[vl]}", {w}, {a})'
        return f"({x} * {_sext16(p)} + {y} * T.shift_right({p}, 16))"

    def bf16pair(self, e, x: str, y: str) -> str:
        """bf16pair of vectors: where x and y are side_by_side (x on the even elements, y on
        the odd ones, as a row of A is paired along K), one load of 2 vlen consecutive
        floats, each rounded in its 32-bit lane, then narrowed to 16 bits, so that each pair
        of 16-bit lanes is one int32 lane (vpmovdw); TVM's own vectoriser loaded every
        element apart (the AMX kernel's rounding of A, 64 x 3072 in cache: x1.86 on SPR).
        Where the target has avx512_bf16 (`bf16_dot`), the rounding is vcvtne2ps2bf16 (a stand-in
        call, compiler/llvm_splice.py) instead of eight integer ops a vector."""
        vl = self.vlen

        def f32(a, s: str, lanes: str) -> str:
            """A bf16 or f16 operand (a retyped array: a bf16 KV cache) widened to f32 first,
            exactly, as the interpreter loads it: the rounding reads f32 bits."""
            return s if self.dtype(a) == "f32" else f'T.Cast("float32{lanes}", {s})'

        if not any(self.varies(a) for a in e.args):
            return bf16_pair(*(f32(a, s, "") for a, s in zip(e.args, (x, y), strict=True)))
        native = self.bf16_dot and vl in DPBF16PS_LANES  # vcvtne2ps2bf16 (llvm_splice)
        if side_by_side(*e.args, self.ramp):
            self.wide = True
            try:
                w = f32(e.args[0], self.expr(e.args[0]), f"x{2 * vl}")
            finally:
                self.wide = False
            if native:
                return f'T.call_pure_extern("int32x{vl}", "{BF16_X32}", {w})'
            return (f'T.reinterpret("int32x{vl}", '
                    f'T.Cast("uint16x{2 * vl}", {_bf16_bits(w, f"x{2 * vl}")}))')
        x, y = (f32(a, s, f"x{vl}" if self.varies(a) else "")
                for a, s in zip(e.args, (x, y), strict=True))
        if native:
            return f'T.call_pure_extern("int32x{vl}", "{BF16_PAIR}", {", ".join(self.lanes_alike(e, [x, y]))})'
        return bf16_pair(*self.lanes_alike(e, [x, y]), f"x{vl}")

    def lanes_alike(self, e: A.Call, args: list[str]) -> list[str]:
        """An elementwise call's operands in an explicit vector loop (bf16pair's, select's
        values, min's and max's), the loop-invariant ones broadcast where another varies (or
        select's condition does): TVM takes no scalar beside a vector there (select(i < n,
        x[i], 0.0) failed to build)."""
        first = 1 if e.func == "select" else 0
        if not any(self.varies(a) for a in e.args):
            return args
        return [x if i < first or self.varies(a) else f"T.Broadcast({x}, {self.vlen})"
                for i, (a, x) in enumerate(zip(e.args, args, strict=True))]

    def dot8(self, e, acc: str, w: str, p: str) -> str:
        """vpdpbusd where the target has AVX512-VNNI, else, where w's bytes stay below 128
        (the 4- to 6-bit fields of nibbles, high1 and high2), pmaddubsw and a pmaddwd by ones
        (an int4 tile x2.1 at M = 512 on a Zen 3), else two pmaddwd on the bytes split into
        16-bit halves (bytes 0 and 2, 1 and 3), when acc and w are vectors and p is one set of
        4 bytes for every lane; else the same sum on 32-bit values."""
        va, vw, vp = (self.varies(a) for a in e.args)
        if va and vw and not vp:
            vl = self.vlen
            if self.int8_dot and vl in DPBUSD:
                return (f'T.call_llvm_pure_intrin("int32x{vl}", "{DPBUSD[vl]}", {acc}, '
                        f'T.reinterpret("int8x{4 * vl}", {w}), '
                        f'T.reinterpret("int8x{4 * vl}", T.Broadcast({p}, {vl})))')
            if vl in PMADDUBSW and self.byte_max(e.args[1]) < 128:
                return f"({acc} + {_pmaddwd_ones(_pmaddubsw(w, p, vl), vl)})"
            return _pmaddwd_bytes(acc, w, (_byte_pair(p, 0), _byte_pair(p, 1)), vl)
        if self.ramp is not None:
            raise DSLError("dot8 in an explicit vector loop needs its accumulator and weight to "
                           "vary along the loop and its activation bytes not to")
        terms = " + ".join(f"T.bitwise_and(T.shift_right({w}, {8 * q}), 255) * {_byte(p, q)}"
                           for q in range(4))
        return f"({acc} + {terms})"

    def dot8p(self, e, acc: str, w: str, p02: str, p13: str) -> str:
        """Two pmaddwd on w's bytes split into 16-bit halves and the pairs p02, p13 as they
        are, when acc and w are vectors and the pairs one for every lane on x86 (where VNNI
        exists, vpdpbusd on the pairs' low bytes put back together would do no better than
        dot8, so the family keeps dot8 there); else the same sum on 32-bit values."""
        va, vw, v02, v13 = (self.varies(a) for a in e.args)
        vl = self.vlen
        if va and vw and not (v02 or v13) and self.isa in X86_ISAS and vl in PMADDWD:
            return _pmaddwd_bytes(acc, w, (p02, p13), vl)
        if self.ramp is not None:
            raise DSLError("dot8p in an explicit vector loop needs its accumulator and weight to "
                           "vary along the loop and its activation pairs not to")
        halves = (_sext16(p02), _sext16(p13), f"T.shift_right({p02}, 16)", f"T.shift_right({p13}, 16)")
        terms = " + ".join(f"T.bitwise_and(T.shift_right({w}, {8 * q}), 255) * {h}"
                           for q, h in enumerate(halves))
        return f"({acc} + {terms})"

    def dot8h(self, e, acc: str, w: str, p: str) -> str:
        """pmaddubsw and paddw (acc's halves as 16-bit lanes) when acc and w are vectors and
        p is one set of 4 bytes for every lane on x86; else the same sums on 32-bit values,
        each pair saturated and each half wrapped to 16 bits."""
        va, vw, vp = (self.varies(a) for a in e.args)
        vl = self.vlen
        if va and vw and not vp and self.isa in X86_ISAS and vl in PMADDUBSW:
            return (f'T.reinterpret("int32x{vl}", T.reinterpret("int16x{2 * vl}", {acc}) + '
                    f"{_pmaddubsw(w, p, vl)})")
        if self.ramp is not None:
            raise DSLError("dot8h in an explicit vector loop needs its accumulator and weight to "
                           "vary along the loop and its activation bytes not to")
        halves = []
        for h in range(2):
            pair = " + ".join(f"T.bitwise_and(T.shift_right({w}, {8 * q}), 255) * {_byte(p, q)}"
                              for q in (2 * h, 2 * h + 1))
            sat = f"T.max(T.min({pair}, 32767), -32768)"
            half = _sext16(acc if h == 0 else f"T.shift_right({acc}, 16)")
            halves.append(f"({half} + {sat})")
        return f"T.bitwise_or(T.bitwise_and({halves[0]}, 65535), T.shift_left({halves[1]}, 16))"

    def halves(self, e, x: str) -> str:
        """pmaddwd by ones when x is a vector on x86, else the two halves sign-extended."""
        vl = self.vlen
        if self.varies(e.args[0]) and self.isa in X86_ISAS and vl in PMADDWD:
            return _pmaddwd_ones(f'T.reinterpret("int16x{2 * vl}", {x})', vl)
        return f"({_sext16(x)} + T.shift_right({x}, 16))"

    def byte_max(self, e) -> int:
        """The largest value any byte of the int32 `e` can hold, as far as its form shows
        (255 when it does not): a sum of fields whose maxima add up below 256 carries
        nothing from one byte into the next."""
        if isinstance(e, A.Call):
            if e.func == "select" and (cond := self.static(e.args[0])) is not None:
                return self.byte_max(e.args[1] if cond else e.args[2])
            return _BYTE_MAX.get(e.func, 255)
        if isinstance(e, A.Binary) and e.op == "+":
            return min(255, self.byte_max(e.left) + self.byte_max(e.right))
        return 0 if self.static(e) == 0 else 255

    def nibbles(self, e, w: str, h: str) -> str:
        """(w >> 4 h) & 0x0F0F0F0F, on a vector w in an explicit vector loop."""
        if self.varies(e.args[0]):
            vl = self.vlen
            return (f"T.bitwise_and(T.shift_right({w}, T.Broadcast(4 * {h}, {vl})), "
                    f"T.Broadcast({0x0F0F0F0F}, {vl}))")
        return f"T.bitwise_and(T.shift_right({w}, 4 * {h}), {0x0F0F0F0F})"

    def high2(self, e, w: str, s: str) -> str:
        """((w >> 2 s) & 0x03030303) << 4: on a vector w in an explicit vector loop, w
        rotated left by 4 - 2 s and masked (`_rotated_field`)."""
        if self.varies(e.args[0]):
            return self._rotated_field(w, f"4 - 2 * {s}", 0x30303030)
        return f"T.shift_left(T.bitwise_and(T.shift_right({w}, 2 * {s}), {0x03030303}), 4)"

    def high1(self, e, w: str, s: str) -> str:
        """((w >> s) & 0x01010101) << 4: on a vector w, w rotated left by 4 - s and masked."""
        if self.varies(e.args[0]):
            return self._rotated_field(w, f"4 - {s}", 0x10101010)
        return f"T.shift_left(T.bitwise_and(T.shift_right({w}, {s}), {0x01010101}), 4)"

    def _rotated_field(self, w: str, left: str, mask: int) -> str:
        """A bit field of each byte of w moved to bit 4 of its byte in two vector ops, a
        rotate (llvm.fshl: vprold / vprolvd) and an and, where a shift, an and and a shift
        took three (an int6-k tile x1.06-1.12 at M 8-512, int5-k's x0.99-1.04; Zen 4). For
        the fields high1 and high2 take (s < 8, s < 4) the bits the rotate wraps around land
        outside `mask`."""
        vl = self.vlen
        return (f'T.bitwise_and(T.call_llvm_pure_intrin("int32x{vl}", "llvm.fshl.v{vl}i32", {w}, '
                f'{w}, T.Broadcast({left}, {vl})), T.Broadcast({mask}, {vl}))')

    def dotbf16(self, e, acc: str, w: str, p: str) -> str:
        """vdpbf16ps when acc and w are vectors and p is one pair for every lane, else the
        same products on the bf16 values widened to f32 (exact), in the same order."""
        va, vw, vp = (self.varies(a) for a in e.args)
        if va and vw and not vp and self.bf16_dot:
            vl = self.vlen
            return (f'T.call_pure_extern("float32x{vl}", "{DPBF16PS}", {acc}, {w}, '
                    f'T.Broadcast({p}, {vl}))')
        if self.ramp is not None:
            raise DSLError("dotbf16 in an explicit vector loop needs its accumulator and weight "
                           "to vary along the loop and its activation pair not to")

        def hi(x: str) -> str:
            return f'T.reinterpret("float32", T.bitwise_and({x}, -65536))'

        def lo(x: str) -> str:
            return f'T.reinterpret("float32", T.shift_left({x}, 16))'

        return f"(({acc} + {hi(w)} * {hi(p)}) + {lo(w)} * {lo(p)})"

    def vector(self, s, reds, u, start, step, trips, const_trips, depth: int) -> None:
        """Full vlen-wide chunks in a T.vectorized loop, then the tail as a serial loop; a
        constant trip count below vlen that is a power of two is one narrower vector."""
        vl = self.vlen
        if const_trips is not None and 1 < const_trips < vl and const_trips & (const_trips - 1) == 0:
            vl = const_trips
        if self.explicit(s, reds, step, const_trips):
            self.ramp_loop(s, u, start, const_trips, depth)
            return
        saved = dict(self.lanes), self.lane, self.in_vector
        parts = {}
        for r in reds:
            dtype = self.types.get(r.name, "f32")
            parts[r.name] = buf = f"{r.name}_{u}_part"
            self.alloc(depth, buf, str(vl), dtype)
            self.line(depth, f"for {u}z in T.vectorized({vl}):")
            self.line(depth + 1, f"{buf}[{u}z] = {r.identity(dtype)}")
        for d in scalar_decls(s.body):
            self.types[d.name] = d.dtype
            self.lanes[d.name] = buf = f"{d.name}_{u}_lane"
            self.alloc(depth, buf, str(vl), d.dtype)
        if const_trips is not None:
            full, tail = str(const_trips // vl), str(const_trips % vl)
        else:
            full = f"T.floordiv({trips}, {vl})"
            tail = f"{trips} - {full} * {vl}"
        if full != "0":
            # a few constant chunks are unrolled, so per-lane accumulators become registers
            outer = "T.unroll" if const_trips is not None and const_trips // vl <= 8 else "range"
            self.line(depth, f"for {u}o in {outer}({full}):")
            self.line(depth + 1, f"for {u}i in T.vectorized({vl}):")
            self.vector_body(s, reds, parts, f"{u}i", f"{u}o * {vl} + {u}i", start, step,
                             depth + 2)
        if tail != "0":
            self.line(depth, f"for {u}t in range({tail}):")
            self.vector_body(s, reds, parts, f"{u}t", f"{full} * {vl} + {u}t", start, step,
                             depth + 1)
        self.lanes, self.lane, self.in_vector = saved
        for r in reds:  # horizontal reduction of the per-lane partials
            target = self.expr(A.Name(r.name))
            if vl & (vl - 1) == 0:  # in registers: a tree of vector halves
                total = horizontal(r, f"{parts[r.name]}[T.Ramp(0, 1, {vl})]", vl)
                self.line(depth, f"{target} = {r.combine(target, total)}")
            else:
                self.line(depth, f"for {u}h in T.unroll({vl}):")
                self.line(depth + 1, f"{target} = {r.combine(target, f'{parts[r.name]}[{u}h]')}")

    def vector_body(self, s, reds, parts, lane, index, start, step, depth: int) -> None:
        self.lane, self.in_vector = lane, True
        self.names[s.var] = affine(start, f"({index})", step)
        for stmt in s.body:
            self.vector_stmt(stmt, reds, parts, lane, depth)

    def vector_stmt(self, stmt, reds, parts, lane, depth: int) -> None:
        if isinstance(stmt, A.If):
            if self.static_if(stmt, depth, lambda t, d: self.vector_stmt(t, reds, parts, lane, d)):
                return
            self.line(depth, f"if {self.expr(stmt.cond)}:")
            for t in stmt.then or ():
                self.vector_stmt(t, reds, parts, lane, depth + 1)
            if not stmt.then:
                self.line(depth + 1, "T.evaluate(0)")
            if stmt.orelse:
                self.line(depth, "else:")
                for t in stmt.orelse:
                    self.vector_stmt(t, reds, parts, lane, depth + 1)
            return
        red = as_reduction(stmt, set(self.lanes))
        if red is not None:
            acc = f"{parts[red.name]}[{lane}]"
            self.line(depth, f"{acc} = {red.combine(acc, self.expr(red.value))}")
            return
        self.stmt(stmt, depth)
