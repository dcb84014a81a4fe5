"""Compile-time parts of the DSL lowering: expanded unroll loops, constant `if`s and
selects, inlined integer scalars, and local arrays held as one buffer per row.

Why: a register tile needs its accumulator rows as separate small stack buffers (TVM 0.27
keeps only "global" allocations under 1024 B on the stack, where LLVM promotes them to
registers), and tiles of different heights (the M tails of a GEMM) need code specialised
per height. Both need row indices that are constants when the TVMScript is written, so
`unroll` loops with a constant trip count are expanded here rather than by TVM, and
branches on constants are taken here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sandwich.dsl import ast as A
from sandwich.dsl.interp import Interpreter

MAX_EXPANDED_TRIPS = 64  # longer constant unroll loops are left to TVM's T.unroll
MAX_INLINE_CHARS = 80  # longer scalar expressions are boxed, not substituted
SCALARS = ("box", "inline", "let")
_PURE_CALLS = ("min", "max", "abs", "select")


@dataclass
class SplitArray:
    """A local array whose rows (first index) are all constants: one buffer per used row."""

    buf: str
    rows: int
    rest: str  # TVMScript shape of the other dimensions
    dtype: str
    at: int  # line where the allocations go
    depth: int
    used: set[int] = field(default_factory=set)
    whole: bool = False  # a row index was not constant: fall back to one buffer


class StaticParts:
    """Mixed into the TVMScript emitter (compiler/lower_tir.py)."""

    def static(self, e) -> int | bool | None:
        """The value of an integer or bool expression of constants only, else None."""
        try:
            v = Interpreter(dict(self.consts)).expr(e)
        except Exception:  # a name that is not constant, a division by zero, ...
            return None
        return v if isinstance(v, (int, bool)) else None

    def identity(self, e: A.Binary) -> str | None:
        """`x * 1`, `x + 0`, `x / 1`, `x % 1`, `true && x`, ... without the no-op part."""
        left, right = self.static(e.left), self.static(e.right)
        if e.op == "and" and left is not None:
            return self.expr(e.right) if left else "T.bool(False)"
        if e.op == "or" and left is not None:
            return "T.bool(True)" if left else self.expr(e.right)
        if self.dtype(e) not in A.INT_DTYPES:
            return None
        if (e.op in ("+", "-") and right == 0) or (e.op in ("*", "/") and right == 1):
            return self.expr(e.left)
        if (e.op == "+" and left == 0) or (e.op == "*" and left == 1):
            return self.expr(e.right)
        if e.op == "%" and right == 1:
            return "0"
        return None

    def pure_int(self, e) -> bool:
        """True when `e` reads no array and no mutable scalar: it may be substituted."""
        if isinstance(e, (A.IntLit, A.BoolLit)):
            return True
        if isinstance(e, A.Name):
            return e.id in self.consts or (e.id in self.pure and e.id not in self.mutable)
        if isinstance(e, A.Unary):
            return self.pure_int(e.operand)
        if isinstance(e, A.Binary):
            return self.pure_int(e.left) and self.pure_int(e.right)
        if isinstance(e, A.Call):
            return e.func in _PURE_CALLS and all(self.pure_int(a) for a in e.args)
        if isinstance(e, A.Cast):
            return e.dtype in A.INT_DTYPES and self.pure_int(e.value)
        return False

    def inline_decl(self, s: A.Decl, depth: int) -> bool:
        """An immutable i32 scalar with a pure initialiser, unless scalars == "box".

        "inline": it becomes its expression, like a loop variable, when that is short (long
        ones stay boxed: nested substitutions slow TVM's build and, on flash_prefill, hit a
        TVM 0.27 simplifier bug, "Literal value 4294967279 exceeds range of int32").
        "let": a TVMScript assignment, as the hand template; TVM 0.27 gives each such
        variable a heap workspace slot, reloaded after every store (slower)."""
        if (self.scalars == "box" or s.shape or s.init is None or s.dtype != "i32"
                or s.name in self.mutable or s.name in self.lanes or not self.pure_int(s.init)
                or self.dtype(s.init) not in A.INT_DTYPES):
            return False
        value = self.expr(s.init)
        if self.scalars == "let":
            self.line(depth, f"{self.bind(s.name)} = {value}")
        elif len(value) <= MAX_INLINE_CHARS:
            self.names[s.name] = f"({value})"
        else:
            return False
        self.boxed.discard(s.name)
        self.pure.add(s.name)
        return True

    def split_decl(self, s: A.Decl, depth: int) -> bool:
        """Defer a local array with a constant first dimension (see `resolve_splits`)."""
        rows = self.const(s.shape[0]) if len(s.shape) >= 2 else None
        dims = [self.const(d) for d in s.shape[1:]]
        if rows is None or not 0 < rows <= 4096 or None in dims:
            return False
        buf = self.bind(s.name)
        self.boxed.discard(s.name)
        self.splits[buf] = SplitArray(buf, rows, ", ".join(map(str, dims)), s.dtype,
                                      len(self.lines), depth)
        self.pending.append(self.splits[buf])
        return True

    def split_index(self, buf: str, indices) -> str | None:
        """`buf_rN[...]` when `buf` is split and the row is a constant, else None."""
        sp = self.splits.get(buf)
        if sp is None:
            return None
        row = self.const(indices[0])
        rest = ", ".join(self.expr(i) for i in indices[1:])
        if row is None or not 0 <= row < sp.rows:
            sp.whole = True
            return None
        sp.used.add(row)
        return f"{buf}_r{row}[{rest}]"

    def resolve_splits(self, mark: int) -> None:
        """Allocate the arrays declared since `mark`, latest first (inserting lines at an
        earlier position would move a later one)."""
        while len(self.pending) > mark:
            sp = self.pending.pop()
            if sp.whole:
                pat = re.compile(rf"\b{re.escape(sp.buf)}_r(\d+)\[")
                self.lines[sp.at:] = [pat.sub(rf"{sp.buf}[\1, ", ln) for ln in self.lines[sp.at:]]
                allocs = [(sp.buf, f"{sp.rows}, {sp.rest}")]
            else:
                allocs = [(f"{sp.buf}_r{r}", sp.rest) for r in sorted(sp.used)]
            mark_len = len(self.lines)
            for name, shape in allocs:
                self.alloc(sp.depth, name, shape, sp.dtype)
            new = self.lines[mark_len:]
            del self.lines[mark_len:]
            self.lines[sp.at:sp.at] = new

    def expand_loop(self, s, depth: int) -> bool:
        """Emit an `unroll` loop with a constant, short trip count once per iteration, its
        variable a constant in each copy."""
        start, stop, step = (self.const(x) for x in (s.start, s.stop, s.step))
        if s.kind != "unroll" or None in (start, stop, step) or step <= 0:
            return False
        values = range(start, stop, step)
        if len(values) > MAX_EXPANDED_TRIPS:
            return False
        for v in values:
            self.consts[s.var] = v
            self.stmts(s.body, depth)
        self.consts.pop(s.var, None)
        return True

    def static_if(self, s: A.If, depth: int, emit) -> bool:
        """Emit only the taken branch of an `if` on constants (`emit` is one statement)."""
        cond = self.static(s.cond)
        if cond is None:
            return False
        for t in (s.then if cond else s.orelse):
            emit(t, depth)
        return True
