"""What a `vector` loop may hold, which of its statements are reductions, and a SIMD exp.

TVM 0.27 vectorises a loop only when nothing in it forces a fallback to a serial loop: an
`if` whose condition depends on the lane, a reduction into a scalar, or a let-bound
scalar (only the last lane survives). The lowering avoids all three: the tail runs as a
separate serial loop, reductions keep one partial value per lane, and scalars declared
in the body get one slot per lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.dsl import ast as A
from sandwich.dsl.check import _names
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
        if isinstance(s, (H.For, A.Prefetch)) or (isinstance(s, A.Decl) and s.shape):
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


def fast_exp(x: str) -> str:
    """TVMScript expression for exp(x) in float32 that vectorises."""
    xc = f"T.max(T.min({x}, T.float32(88.3762626647950)), T.float32(-88.3762626647949))"
    n = f"T.floor({xc} * T.float32(1.44269504088896341) + T.float32(0.5))"
    f = f"({xc} - {n} * T.float32(0.6931471805599453))"
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


class VectorLoops:
    """The `vector` loop part of the TVMScript emitter (compiler/lower_tir.py)."""

    def vector(self, s, reds, u, start, step, trips, const_trips, depth: int) -> None:
        """Full vlen-wide chunks in a T.vectorized loop, then the tail as a serial loop."""
        vl = self.vlen
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
