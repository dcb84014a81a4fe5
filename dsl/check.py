"""Semantic checks on the high-level AST: names, types, shapes, tunables, duplicates."""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.dsl import ast as A
from sandwich.dsl.builtins import FUNCS, RESERVED
from sandwich.dsl.errors import DSLSemanticError
from sandwich.dsl.highlevel import ast as H

LIT = "int"  # type of an integer literal: it adapts to any numeric type
_I64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Symbol:
    kind: str  # "param", "array", "tunable", "builtin", "loop", "local"
    dtype: str
    rank: int = 0


def category(t: str) -> str:
    if t == LIT or t in A.INT_DTYPES:
        return "int"
    return "float" if t in A.FLOAT_DTYPES else "bool"


def _join(a: str, b: str) -> str:
    if a == LIT:
        return b
    if b == LIT or a == b:
        return a
    return "i64" if category(a) == "int" else "f32"


class Checker:
    """Walks one module; the first problem raises DSLSemanticError at the node's location."""

    def __init__(self, source: str | None = None) -> None:
        self.source = source
        self.scopes: list[dict[str, Symbol]] = []

    # -- helpers -------------------------------------------------------------
    def fail(self, message: str, node) -> DSLSemanticError:
        loc = getattr(node, "loc", None)
        if loc is None:
            return DSLSemanticError(message)
        return DSLSemanticError(message, file=loc.file, line=loc.line, column=loc.column,
                                source=self.source)

    def lookup(self, name: str) -> Symbol | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def define(self, name: str, sym: Symbol, node) -> None:
        if name in RESERVED:
            raise self.fail(f"'{name}' is a reserved word; rename it", node)
        if self.lookup(name) is not None:
            raise self.fail(f"'{name}' is already defined; use a different name", node)
        self.scopes[-1][name] = sym

    # -- expressions ---------------------------------------------------------
    def expr(self, e) -> str:
        """The type of `e`: a dtype, or LIT for an integer literal."""
        if isinstance(e, A.IntLit):
            if e.value > _I64_MAX:
                raise self.fail(f"integer literal {e.value} does not fit in i64", e)
            return LIT
        if isinstance(e, A.FloatLit):
            return "f32"
        if isinstance(e, A.BoolLit):
            return "bool"
        if isinstance(e, A.Name):
            sym = self.lookup(e.id)
            if sym is None:
                raise self.fail(f"undefined name '{e.id}'", e)
            if sym.rank:
                raise self.fail(f"array '{e.id}' used without an index; write {e.id}[...]", e)
            return sym.dtype
        if isinstance(e, A.Index):
            return self.index(e)
        if isinstance(e, A.Unary):
            t = self.expr(e.operand)
            if t in A.STORAGE_DTYPES:
                raise self.fail(f"{t} is a storage type; cast it before '{e.op}', e.g. i32(...)", e)
            want = "bool" if e.op == "not" else None
            if (want and t != want) or (not want and category(t) == "bool"):
                raise self.fail(f"'{e.op}' cannot apply to {t}", e)
            return t
        if isinstance(e, A.Binary):
            return self.binary(e)
        if isinstance(e, A.Cast):
            self.expr(e.value)
            return e.dtype
        if isinstance(e, A.Call):
            return self.call(e)
        raise self.fail(f"not an expression: {type(e).__name__}", e)

    def int_expr(self, e, what: str) -> None:
        t = self.expr(e)
        if category(t) != "int":
            raise self.fail(f"{what} must be an integer, got {t}", e)

    def index(self, e: A.Index) -> str:
        sym = self.lookup(e.array)
        if sym is None:
            raise self.fail(f"undefined array '{e.array}'", e)
        if sym.rank == 0:
            raise self.fail(f"'{e.array}' is a scalar and cannot be indexed", e)
        if len(e.indices) != sym.rank:
            raise self.fail(f"shape mismatch: '{e.array}' has {sym.rank} dimension(s), "
                            f"indexed with {len(e.indices)}", e)
        for i in e.indices:
            self.int_expr(i, f"index of '{e.array}'")
        return sym.dtype

    def binary(self, e: A.Binary) -> str:
        a, b = self.expr(e.left), self.expr(e.right)
        for t, side in ((a, e.left), (b, e.right)):
            if t in A.STORAGE_DTYPES:
                raise self.fail(f"{t} is a storage type; cast it before '{e.op}', e.g. i32(...)", side)
        if e.op in ("and", "or"):
            if a != "bool" or b != "bool":
                raise self.fail(f"'{e.op}' needs bool operands, got {a} and {b}", e)
            return "bool"
        if e.op in ("==", "!=") and a == b == "bool":
            return "bool"
        ca, cb = category(a), category(b)
        if "bool" in (ca, cb):
            raise self.fail(f"'{e.op}' cannot apply to {a} and {b}", e)
        if ca != cb and LIT not in (a, b):
            raise self.fail(f"type mismatch: {a} {e.op} {b}; cast one side, e.g. "
                            f"f32(...) around the integer", e)
        if e.op == "%" and "float" in (ca, cb):
            raise self.fail("'%' needs integer operands", e)
        return "bool" if e.op in ("<", "<=", ">", ">=", "==", "!=") else _join(a, b)

    def call(self, e: A.Call) -> str:
        spec = FUNCS.get(e.func)
        if spec is None:
            raise self.fail(f"unknown function '{e.func}'", e)
        kinds, result = spec
        if len(e.args) != len(kinds):
            raise self.fail(f"{e.func} takes {len(kinds)} argument(s), got {len(e.args)}", e)
        joined = LIT
        for arg, kind in zip(e.args, kinds, strict=True):
            t = self.expr(arg)
            if kind == "bool":
                if t != "bool":
                    raise self.fail(f"{e.func} needs a bool condition, got {t}", arg)
                continue
            if category(t) == "bool":
                raise self.fail(f"{e.func} needs a number, got bool", arg)
            if kind == "float" and t != LIT and category(t) != "float":
                raise self.fail(f"{e.func} needs a float argument, got {t}; cast it: f32(...)",
                                arg)
            if kind == "int" and category(t) != "int":
                raise self.fail(f"{e.func} needs an integer argument, got {t}", arg)
            if kind == "int" and t in A.STORAGE_DTYPES:
                raise self.fail(f"{t} is a storage type; cast it for {e.func}, e.g. i32(...)", arg)
            if kind != "int" and LIT not in (t, joined) and category(t) != category(joined):
                raise self.fail(f"type mismatch in {e.func}: {joined} and {t}; add a cast", arg)
            joined = _join(joined, t)
        if result != "same":
            return result
        return "f32" if joined == LIT and "float" in kinds else joined

    # -- statements ----------------------------------------------------------
    def assignable(self, target_t: str, value_t: str, node, what: str) -> None:
        ct, cv = category(target_t), category(value_t)
        if ct != cv and not (ct == "float" and value_t == LIT):
            raise self.fail(f"type mismatch: cannot assign {value_t} to {what} of type "
                            f"{target_t}; add a cast such as {target_t}(...)", node)

    def shape(self, shape, node) -> None:
        for s in shape:
            self.int_expr(s, "array dimension")
            for name in _names(s):
                if self.lookup(name).kind not in ("param", "tunable", "builtin"):
                    raise self.fail(f"array dimension uses '{name}'; dimensions may use only "
                                    "scalar parameters, tunables and vlen", s)

    def block(self, stmts) -> None:
        self.scopes.append({})
        for s in stmts:
            self.stmt(s)
        self.scopes.pop()

    def stmt(self, s) -> None:
        if isinstance(s, A.Decl):
            self.shape(s.shape, s)
            if s.init is not None:
                if s.shape:
                    raise self.fail(f"array '{s.name}' cannot have an initialiser", s)
                self.assignable(s.dtype, self.expr(s.init), s.init, f"'{s.name}'")
            self.define(s.name, Symbol("array" if s.shape else "local", s.dtype,
                                       len(s.shape)), s)
        elif isinstance(s, A.Assign):
            self.assign(s)
        elif isinstance(s, A.Assert):
            if self.expr(s.cond) != "bool":
                raise self.fail("assert needs a bool condition", s.cond)
        elif isinstance(s, A.Prefetch):
            self.index(s.target)
            if self.lookup(s.target.array) is not self.scopes[1].get(s.target.array):
                raise self.fail(f"prefetch needs an array parameter; '{s.target.array}' is a "
                                "local array", s.target)
        elif isinstance(s, A.Tile):
            self.tile(s)
        elif isinstance(s, A.If):
            if self.expr(s.cond) != "bool":
                raise self.fail("if needs a bool condition", s.cond)
            self.block(s.then)
            self.block(s.orelse)
        elif isinstance(s, H.For):
            for part, what in ((s.start, "loop start"), (s.stop, "loop bound"),
                               (s.step, "loop step")):
                self.int_expr(part, what)
            self.scopes.append({})
            self.define(s.var, Symbol("loop", "i32"), s)
            self.block(s.body)
            self.scopes.pop()
        else:
            raise self.fail(f"not a statement: {type(s).__name__}", s)

    def tile(self, s: A.Tile) -> None:
        """Tile numbers are literals 0-7 (the registers are named in the instruction), the
        rows of a configuration and a load's or store's stride are integers, and a load or
        store names an element of an array of 4-byte values (i32 pairs of bf16, or f32)."""
        want = A.TILE_OPS[s.op]
        widths = s.op == "tile_config" and len(s.args) == A.TILE_CONFIG_WIDTHS
        if len(s.args) != want and not widths:
            takes = f"{want} or {A.TILE_CONFIG_WIDTHS}" if s.op == "tile_config" else str(want)
            raise self.fail(f"{s.op} takes {takes} argument{'s' if want != 1 else ''}, "
                            f"got {len(s.args)}", s)
        for t in s.args[:A.TILE_NUMBERS[s.op]]:
            if not isinstance(t, A.IntLit) or not 0 <= t.value < A.TILES:
                raise self.fail(f"{s.op}: a tile is an integer literal from 0 to {A.TILES - 1}", t)
        if s.op in ("tile_dpbf16", "tile_dpbsud") and len({t.value for t in s.args}) < 3:
            raise self.fail(f"{s.op} needs three different tiles", s)
        if s.op == "tile_config":
            for i, rows in enumerate(s.args):
                self.int_expr(rows, "tile rows" if i < A.TILES else "tile row bytes")
        if s.op in ("tile_load", "tile_store"):
            ref = s.args[1]
            if not isinstance(ref, A.Index):
                raise self.fail(f"{s.op} needs an array element, such as X[i, k]", ref)
            if self.index(ref) not in ("i32", "f32"):
                raise self.fail(f"{s.op} moves 4-byte elements (i32 or f32); '{ref.array}' is "
                                f"{self.lookup(ref.array).dtype}", ref)
            self.int_expr(s.args[2], "tile stride")

    def assign(self, s: A.Assign) -> None:
        t = s.target
        name = t.id if isinstance(t, A.Name) else t.array
        sym = self.lookup(name)
        if sym is None:
            raise self.fail(f"undefined name '{name}'", t)
        if isinstance(t, A.Name) and sym.kind != "local":
            what = "an array; assign to an element" if sym.rank else f"a {sym.kind}"
            raise self.fail(f"cannot assign to '{name}': it is {what}", t)
        target_t = self.expr(t)
        value_t = self.expr(s.value)
        if s.op != "=" and category(target_t) == "bool":
            raise self.fail(f"'{s.op}' cannot apply to bool '{name}'", s)
        self.assignable(target_t, value_t, s.value, f"'{name}'")

    def tunable(self, t: A.Tunable) -> None:
        if t.domain is None:
            raise self.fail(f"tunable '{t.name}' has no domain; declare its candidate values, "
                            f"e.g. `in (1, 2, 4)`", t)
        if not t.domain:
            raise self.fail(f"tunable '{t.name}' has an empty domain", t)
        if t.dtype not in A.INT_DTYPES or t.dtype in A.STORAGE_DTYPES:
            raise self.fail(f"tunable '{t.name}' is {t.dtype}; tunables are i32 or i64", t)
        for d in t.domain:
            if not _is_const(d):
                raise self.fail(f"domain of tunable '{t.name}' must be constant (integer "
                                "literals and vlen)", d)
            self.int_expr(d, f"domain value of '{t.name}'")

    def kernel(self, k: H.Kernel) -> None:
        self.scopes = [{A.VLEN: Symbol("builtin", "i32")}, {}]
        for t in k.tunables:
            self.define(t.name, Symbol("tunable", t.dtype), t)
        for p in k.params:
            self.define(p.name, Symbol("array" if p.shape else "param", p.dtype,
                                       len(p.shape)), p)
        for t in k.tunables:
            self.tunable(t)
        for p in k.params:
            self.shape(p.shape, p)
        self.block(k.body)

    def module(self, m: H.Module) -> None:
        seen: set[str] = set()
        for k in m.kernels:
            if k.name in seen:
                raise self.fail(f"kernel '{k.name}' is defined twice", k)
            if k.name in RESERVED:
                raise self.fail(f"'{k.name}' is a reserved word; rename the kernel", k)
            seen.add(k.name)
            self.kernel(k)


def _names(e):
    if isinstance(e, A.Name):
        yield e.id
    elif isinstance(e, A.Unary):
        yield from _names(e.operand)
    elif isinstance(e, A.Binary):
        yield from _names(e.left)
        yield from _names(e.right)
    elif isinstance(e, (A.Call, A.Index)):
        for a in (e.args if isinstance(e, A.Call) else e.indices):
            yield from _names(a)
    elif isinstance(e, A.Cast):
        yield from _names(e.value)


def _is_const(e) -> bool:
    if isinstance(e, A.IntLit) or (isinstance(e, A.Name) and e.id == A.VLEN):
        return True
    if isinstance(e, A.Unary):
        return e.op == "-" and _is_const(e.operand)
    if isinstance(e, A.Binary):
        return e.op in ("+", "-", "*", "/", "%") and _is_const(e.left) and _is_const(e.right)
    return False


def check(module: H.Module, source: str | None = None) -> H.Module:
    """Raise DSLSemanticError on the first problem; return the module unchanged otherwise."""
    try:
        Checker(source).module(module)
    except RecursionError:
        raise DSLSemanticError("source is nested too deeply") from None
    return module
