"""High-level IR + tunable values -> TVMScript -> TIR PrimFunc (the DSL's kernel template).

Tunables and vlen become constants, and so do the scalar parameters the caller fixes
(`fixed`, e.g. a model's head_dim: loops over them get static trip counts and local arrays
shaped by them stay on the stack). The other scalar parameters stay PrimFunc arguments
and array parameters become buffers whose symbolic shapes TVM checks at call time.

Workarounds for TVM 0.27 (see compiler/lower_vector.py for the `vector` loops): every
loop is emitted zero-based and its variable is substituted as an expression, never
let-bound (a loop whose start depends on an outer loop variable is mislowered, and a
let-bound index into a local array breaks CompactBufferAllocation: "Buffer ... is used
before its definition"); every local scalar is a 1-element "global" array, not a let
binding (TVM 0.27 turns let variables into "local" arrays, which become heap workspace
that aliases everything) unless the caller asks for substitution (`scalars`); nested
parallel loops are fused or run serially, and a parallel loop whose trip count is 1 at run
time runs on the calling thread. `unroll` loops with constant bounds, `if`s on
constants and constant-row local arrays are resolved here (compiler/lower_static.py).
"""

from __future__ import annotations

from sandwich.compiler import lower_vector as V
from sandwich.compiler.lower_args import check_fixed, signature
from sandwich.compiler.lower_static import SCALARS, StaticParts
from sandwich.compiler.lower_tiles import TileStatements
from sandwich.dsl import ast as A
from sandwich.dsl.builtins import FUNCS
from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.highlevel.printer import print_expr
from sandwich.dsl.interp import Interpreter
from sandwich.dsl.space import constraints, require_valid
from sandwich.errors import first_line

_TVM = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "i32": "int32",
        "i64": "int64", "i8": "int8", "u8": "uint8", "bool": "bool"}
_FUNCS = {"exp": "T.exp", "log": "T.log", "sqrt": "T.sqrt", "rsqrt": "T.rsqrt",
          "tanh": "T.tanh", "sigmoid": "T.sigmoid", "sin": "T.sin", "cos": "T.cos",
          "erf": "T.erf", "floor": "T.floor", "ceil": "T.ceil", "pow": "T.pow", "max": "T.max",
          "min": "T.min", "abs": "T.abs", "select": "T.Select"}
_LOOP = {"range": "range", "parallel": "T.parallel", "unroll": "T.unroll"}


def _assigned(stmts) -> set[str]:
    """Names of scalars that are assigned after their declaration (they need a buffer)."""
    out = set()
    for s in H.walk(stmts):
        if isinstance(s, A.Assign) and isinstance(s.target, A.Name):
            out.add(s.target.id)
        elif isinstance(s, A.Decl) and not s.shape and s.init is None:
            out.add(s.name)
    return out


class _Emitter(V.VectorLoops, StaticParts, TileStatements):
    def __init__(self, kernel: H.Kernel, consts: dict, vlen: int, scalars: str = "box",
                 fold: bool = False, isa: str | None = None, bf16_dot: bool = False,
                 int8_dot: bool = False, amx: bool = False, amx_int8: bool = False) -> None:
        self.consts, self.vlen, self.scalars, self.fold = consts, vlen, scalars, fold
        self.amx = amx  # AMX-BF16: the tile statements (compiler/lower_tiles.py)
        self.amx_int8 = amx and amx_int8  # AMX-INT8 as well: tile_dpbsud
        self.isa = isa  # the target's vector ISA (compiler/target.py), for intrinsics
        self.bf16_dot = bf16_dot and isa == "avx512"  # vdpbf16ps for dotbf16, vcvtne2ps2bf16 for bf16pair
        self.int8_dot = int8_dot and isa == "avx512"  # vpdpbusd for dot8
        self.ramp: str | None = None  # the lane variable of an explicit vector loop
        self.ramp_start = ""  # its first lane, as TVMScript
        self.wide = False  # lowering a side_by_side pair: vectors of 2 vlen lanes
        self.types: dict[str, str] = {p.name: p.dtype for p in kernel.params}
        self.mutable = _assigned(kernel.body)
        self.boxed: set[str] = set()  # local scalars, held in 1-element arrays
        self.lines: list[str] = []
        self.fresh = 0
        # user names end in "_" (so `T` or `range` cannot clash with TVMScript), and every
        # local binding gets its own name: TVM wants each variable bound once
        self.names = {p.name: p.name + "_" for p in kernel.params}
        self.lanes: dict[str, str] = {}  # scalar -> its per-lane buffer, inside a vector loop
        self.lane = ""  # the lane index inside a vector loop body
        self.in_vector = False
        self.parallel_depth = 0
        self.pure = {p.name for p in kernel.params if not p.shape}  # substitutable names
        self.splits: dict = {}  # buffer name -> SplitArray
        self.pending: list = []  # split arrays not yet allocated

    def bind(self, name: str) -> str:
        self.fresh += 1
        self.names[name] = f"{name}_{self.fresh}_"
        return self.names[name]

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def const(self, e) -> int | None:
        """The value of an integer expression of constants only, else None."""
        try:
            v = Interpreter(dict(self.consts)).expr(e)
        except Exception:  # a name that is not constant, a division by zero, ...
            return None
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def dtype(self, e) -> str:
        """Just enough type inference to pick integer or float division."""
        if isinstance(e, A.IntLit):
            return "i32"
        if isinstance(e, A.FloatLit):
            return "f32"
        if isinstance(e, A.BoolLit):
            return "bool"
        if isinstance(e, A.Name):
            return self.types.get(e.id, "i32")
        if isinstance(e, A.Index):
            return self.types[e.array]
        if isinstance(e, A.Cast):
            return e.dtype
        if isinstance(e, A.Binary) and e.op in ("<", "<=", ">", ">=", "==", "!=", "and", "or"):
            return "bool"
        if isinstance(e, A.Call) and FUNCS[e.func][1] != "same":
            return FUNCS[e.func][1]
        parts = {A.Unary: lambda: [e.operand], A.Binary: lambda: [e.left, e.right],
                 A.Call: lambda: list(e.args[-2:])}[type(e)]()
        types = [self.dtype(p) for p in parts]
        return next((t for t in types if t in ("f32", "bf16", "f16")), types[0])

    def expr(self, e) -> str:
        if self.fold and isinstance(e, (A.Binary, A.Unary, A.Call)):
            v = self.static(e)  # fold constant integer parts: shorter source, faster build
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                return str(v)
        if isinstance(e, A.Name):
            if e.id in self.consts:
                v = self.consts[e.id]
                return f"T.float32({v!r})" if isinstance(v, float) else str(v)
            if e.id in self.lanes:
                return f"{self.lanes[e.id]}[{self.lane}]"
            name = self.names[e.id]
            return f"{name}[0]" if e.id in self.boxed else name
        if isinstance(e, A.IntLit):
            return str(e.value)
        if isinstance(e, A.FloatLit):
            return f'T.float32("{e.value}")' if e.value == float("inf") else f"T.float32({e.value!r})"
        if isinstance(e, A.BoolLit):
            return f"T.bool({e.value})"
        if isinstance(e, A.Index):
            if e.array not in self.names:
                raise DSLError(f"the kernel uses array {e.array}, which this build leaves out")
            if self.wide and self.varies(e):
                return self.wide_index(e)
            split = self.split_index(self.names[e.array], e.indices)
            if split is not None:
                return split
            return f"{self.names[e.array]}[{', '.join(self.expr(i) for i in e.indices)}]"
        if isinstance(e, A.Unary):
            return f"T.Not({self.expr(e.operand)})" if e.op == "not" else f"(-{self.expr(e.operand)})"
        if isinstance(e, A.Cast):
            lanes = self.lanes_of(e.value)
            return f'T.Cast("{_TVM[e.dtype]}{lanes}", {self.expr(e.value)})'
        if isinstance(e, A.Call):
            if e.func == "select" and (cond := self.static(e.args[0])) is not None:
                return self.expr(e.args[1] if cond else e.args[2])  # the other may name a left-out array
            args = [self.expr(a) for a in e.args]
            if e.func == "fma":
                return f"({args[0]} * {args[1]} + {args[2]})"
            if e.func == "madd16":
                return self.madd16(e, *args)
            if e.func == "dotbf16":
                return self.dotbf16(e, *args)
            if e.func == "dot8":
                return self.dot8(e, *args)
            if e.func == "dot8p":
                return self.dot8p(e, *args)
            if e.func == "dot8h":
                return self.dot8h(e, *args)
            if e.func == "halves":
                return self.halves(e, *args)
            if e.func == "nibbles":
                return self.nibbles(e, *args)
            if e.func == "high2":
                return self.high2(e, *args)
            if e.func == "high1":
                return self.high1(e, *args)
            if e.func == "bf16pair":
                return self.bf16pair(e, *args)
            if e.func == "exp" and self.in_vector and self.dtype(e) == "f32":
                return V.fast_exp(args[0])
            if e.func in ("select", "min", "max") and self.ramp is not None:
                args = self.lanes_alike(e, args)
            return f"{_FUNCS[e.func]}({', '.join(args)})"
        short = self.identity(e) if self.fold else None
        if short is not None:
            return short
        a, b = self.expr(e.left), self.expr(e.right)
        if e.op in ("and", "or"):
            return f"T.{'And' if e.op == 'and' else 'Or'}({a}, {b})"
        if e.op in ("/", "%") and self.dtype(e) in A.INT_DTYPES:
            return f"T.floordiv({a}, {b})" if e.op == "/" else f"T.floormod({a}, {b})"
        return f"({a} {e.op} {b})"

    def block(self, stmts, depth: int) -> None:
        start, mark = len(self.lines), len(self.pending)
        self.stmts(stmts, depth)
        self.resolve_splits(mark)
        if len(self.lines) == start:
            self.line(depth, "T.evaluate(0)")

    def stmts(self, stmts, depth: int) -> None:
        for s in stmts:
            self.stmt(s, depth)

    def cast(self, dtype: str, e) -> str:
        return f'T.Cast("{_TVM[dtype]}", {self.expr(e)})'

    def alloc(self, depth: int, name: str, shape: str, dtype: str) -> None:
        # "global" scope: TVM keeps small constant-size allocations on the stack (LLVM can
        # then promote them to registers); "local" ones become heap workspace
        self.line(depth, f'{name} = T.alloc_buffer(({shape},), "{_TVM[dtype]}", scope="global")')

    def stmt(self, s, depth: int) -> None:
        if isinstance(s, A.Decl):
            self.types[s.name] = s.dtype
            self.consts.pop(s.name, None)
            if (not s.shape and s.name not in self.mutable and s.name not in self.lanes
                    and s.dtype in A.INT_DTYPES and s.init is not None):
                value = self.const(s.init)
                if value is not None:  # e.g. `group = H / KVH` with H and KVH fixed
                    self.consts[s.name] = value
                    return
            if self.inline_decl(s, depth) or (s.shape and self.split_decl(s, depth)):
                return
            init = None if s.init is None else self.cast(s.dtype, s.init)
            if s.name in self.lanes:  # a scalar inside a vector loop: one slot per lane
                if init is not None:
                    self.line(depth, f"{self.lanes[s.name]}[{self.lane}] = {init}")
                return
            # a scalar is a 1-element stack array, not a let binding: TVM 0.27 turns let
            # variables into "local" arrays, which live on the heap (slow, and they alias)
            shape = ", ".join(self.expr(d) for d in s.shape) if s.shape else "1"
            name = self.bind(s.name)
            self.boxed.add(s.name) if not s.shape else self.boxed.discard(s.name)
            self.alloc(depth, name, shape, s.dtype)
            if init is not None:
                self.line(depth, f"{name}[0] = {init}")
        elif isinstance(s, A.Assign):
            target = self.expr(s.target)
            value = self.expr(s.value)
            if s.op != "=":
                value = f"({target} {s.op[0]} {value})"
            self.line(depth, f"{target} = {value}")
        elif isinstance(s, A.Prefetch):  # rw 0 (read), locality 2 (L2), cache type 1 (data)
            self.line(depth, 'T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", '
                             f"T.address_of({self.expr(s.target)}), 0, 2, 1))")
        elif isinstance(s, A.Tile):
            self.tile(s, depth)
        elif isinstance(s, A.Assert):
            text = print_expr(s.cond).replace('"', "'")
            self.line(depth, f'assert {self.expr(s.cond)}, "kernel requirement failed: {text}"')
        elif isinstance(s, A.If):
            if self.static_if(s, depth, self.stmt):
                return
            self.line(depth, f"if {self.expr(s.cond)}:")
            self.block(s.then, depth + 1)
            if s.orelse:
                self.line(depth, "else:")
                self.block(s.orelse, depth + 1)
        elif isinstance(s, H.For):
            self.loop(s, depth)

    def trips(self, s: H.For) -> tuple[str, int | None]:
        """Trip count of a loop as TVMScript, and its value when it is a constant."""
        n = self.const(A.Binary("-", s.stop, s.start))
        step = self.const(s.step)
        if n is not None and step is not None and step > 0:
            c = max(0, -(-n // step))
            return str(c), c
        start, stop, step_s = self.expr(s.start), self.expr(s.stop), self.expr(s.step)
        diff = f"({stop}) - ({start})" if start != "0" else f"({stop})"
        count = f"T.ceildiv({diff}, {step_s})" if step_s != "1" else diff
        return f"T.max({count}, 0)", None

    def loop(self, s: H.For, depth: int) -> None:
        self.types[s.var] = "i32"
        self.consts.pop(s.var, None)
        if self.expand_loop(s, depth):
            return
        self.pure.add(s.var)
        trips, const_trips = self.trips(s)
        start, step = self.expr(s.start), self.expr(s.step)
        self.fresh += 1
        u = f"t{self.fresh}"
        inner = s.body[0] if len(s.body) == 1 else None
        if (s.kind == "parallel" and isinstance(inner, H.For) and inner.kind == "parallel"
                and s.var not in set(V.names_in(inner.start, inner.stop, inner.step))):
            self.fused(s, inner, u, start, step, trips, depth)
            return
        reds = V.reductions(s) if s.kind == "vector" else None
        if reds is None:
            kind = _LOOP.get(s.kind, "range")
            if s.kind == "unroll" and const_trips is None:
                kind = "range"  # TVM unrolls only constant trip counts
            if s.kind == "parallel" and self.parallel_depth:
                kind = "range"  # TVM's thread pool does not nest parallel loops
            if kind == "T.parallel" and const_trips is None:
                # a trip count known only at run time may be 1 (a decode step's one row):
                # then the loop runs on the calling thread, without waking the pool (a
                # one-row RMSNorm: 0.46 us a call against 2.1-2.4 us through the pool)
                self.line(depth, f"if {trips} > 1:")
                self.parallel_loop(s, u, "T.parallel", trips, start, step, depth + 1)
                self.line(depth, "else:")
                self.fresh += 1
                self.parallel_loop(s, f"t{self.fresh}", "range", trips, start, step, depth + 1)
                return
            self.parallel_loop(s, u, kind, trips, start, step, depth)
            return
        self.vector(s, reds, u, start, step, trips, const_trips, depth)

    def parallel_loop(self, s: H.For, u: str, kind: str, trips: str, start: str, step: str,
                      depth: int) -> None:
        """A loop of `kind` over `trips`, its body inside (a parallel one counted as such, so
        no loop inside it asks the pool again)."""
        self.parallel_depth += s.kind == "parallel"
        self.line(depth, f"for {u} in {kind}({trips}):")
        self.names[s.var] = V.affine(start, u, step)
        self.block(s.body, depth + 1)
        self.parallel_depth -= s.kind == "parallel"

    def fused(self, s: H.For, inner: H.For, u, start, step, trips, depth: int) -> None:
        """Two directly nested parallel loops become one parallel loop over both."""
        i_trips, _ = self.trips(inner)
        self.types[inner.var] = "i32"
        self.pure.add(inner.var)
        self.line(depth, f"for {u} in T.parallel({trips} * {i_trips}):")
        self.names[s.var] = V.affine(start, f"({u} // {i_trips})", step)
        self.names[inner.var] = V.affine(self.expr(inner.start), f"({u} % {i_trips})",
                                        self.expr(inner.step))
        self.parallel_depth += 1
        self.block(inner.body, depth + 1)
        self.parallel_depth -= 1


def to_tvmscript(kernel: H.Kernel, *, tunables: dict[str, int], vlen: int,
                 fixed: dict | None = None, args: tuple[str, ...] | None = None,
                 align: int | None = None, scalars: str = "box", fold: bool = False,
                 isa: str | None = None, bf16_dot: bool = False, int8_dot: bool = False,
                 amx: bool = False, amx_int8: bool = False) -> str:
    """TVMScript source of `main(<params in order>)` for one point of the search space.

    `fixed` scalar parameters keep their place in the signature (a call with another value
    fails the kernel's entry assertion) unless `args` (the argument names, in order)
    leaves them out. `align` relaxes the data alignment TVM demands of array arguments.
    `scalars` says how immutable integer scalars are held (compiler/lower_static.py:
    "box", "inline" or "let"); `fold` writes constant parts of expressions as numbers.
    `isa` (CpuInfo.isa) lets the lowering use that ISA's intrinsics (madd16 and dot8:
    pmaddwd), `bf16_dot` (the target has avx512_bf16) vdpbf16ps for dotbf16 and
    vcvtne2ps2bf16 for bf16pair, and `int8_dot`
    (the target has AVX512-VNNI) vpdpbusd for dot8; `amx` (AMX-BF16) the tile statements,
    which are an error without it, and `amx_int8` (AMX-INT8 too) tile_dpbsud.
    """
    if scalars not in SCALARS:
        raise DSLError(f"scalars must be one of {SCALARS}, got {scalars!r}")
    require_valid(kernel, tunables, vlen=vlen)
    fixed = dict(fixed or {})
    check_fixed(kernel, fixed)
    consts = {**tunables, A.VLEN: vlen, **fixed}
    e = _Emitter(kernel, consts, vlen, scalars, fold, isa, bf16_dot, int8_dot, amx, amx_int8)
    sig = signature(kernel, args, fixed)
    for p in kernel.params:
        if p.shape and p not in sig:
            del e.names[p.name]  # an array left out: any use is an error
    params = ", ".join(f"{p.name}_h: T.handle" if p.shape else f"{p.name}_: T.{_TVM[p.dtype]}"
                       for p in sig)
    e.line(0, "@T.prim_func")
    e.line(0, f"def main({params}):")
    e.line(1, 'T.func_attr({"global_symbol": "main", "tir.noalias": True})')
    for p in kernel.params:
        if p not in sig and not p.shape and p.name not in fixed:
            e.line(1, f"{p.name}_ = T.{_TVM[p.dtype]}()")  # bound by a buffer's shape
    extra = f", align={align}" if align else ""
    for p in sig:
        if p.shape:
            shape = ", ".join(e.expr(d) for d in p.shape)
            e.line(1, f'{p.name}_ = T.match_buffer({p.name}_h, ({shape},), '
                   f'"{_TVM[p.dtype]}"{extra})')
    for name, value in fixed.items():
        if any(p.name == name for p in sig):
            e.line(1, f'assert {name}_ == {e.expr(A.Name(name))}, "{name} must be {value}: '
                   'the kernel was built for it"')
    skip = set(constraints(kernel))  # already checked above, with the tunable values
    e.block(tuple(s for s in kernel.body if s not in skip), 1)
    return "\n".join(e.lines) + "\n"


def lower_to_tir(kernel: H.Kernel, *, tunables: dict[str, int], vlen: int,
                 fixed: dict | None = None):
    """The TIR PrimFunc, in an IRModule ready for tvm.compile."""
    from sandwich.compiler.build import parse_tvmscript

    source = to_tvmscript(kernel, tunables=tunables, vlen=vlen, fixed=fixed)
    try:
        return parse_tvmscript(source)
    except Exception as err:  # TVMScript raises many types; name the kernel
        raise DSLError(f"kernel {kernel.name}: cannot lower to TIR: "
                       f"{first_line(err)}") from err
