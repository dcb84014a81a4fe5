"""Low-level grammar -> low-level AST (frozen dataclasses); `parse` is the entry point."""

from __future__ import annotations

from functools import lru_cache

from lark import Lark, v_args

from sandwich.dsl import ast as A
from sandwich.dsl.lowlevel import ast as L
from sandwich.dsl.parsing import ExprTransformer, open_grammar, run_parser


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return open_grammar(__file__)


@v_args(meta=True)
class LowLevelTransformer(ExprTransformer):
    """One method per grammar rule; statements come back as tuples of nodes."""

    def start(self, meta, children):
        return L.Module(tuple(children), loc=self.loc(meta))

    def kernel(self, meta, children):
        name, *params, body = children
        return L.Kernel(str(name), tuple(p for p in params if p is not None), body,
                        loc=self.loc(meta))

    def tunable_param(self, meta, children):
        dtype, name, domain = children
        return A.Tunable(str(name), dtype, domain, loc=self.loc(meta))

    def domain(self, meta, children):
        return tuple(children)

    def scalar_param(self, meta, children):
        return A.Param(str(children[1]), children[0], (), loc=self.loc(meta))

    def array_param(self, meta, children):
        return A.Param(str(children[1]), children[0], children[2], loc=self.loc(meta))

    def block(self, meta, children):
        return tuple(children)

    def scalar_decl(self, meta, children):
        dtype, name, init = children
        return A.Decl(str(name), dtype, (), init, loc=self.loc(meta))

    def array_decl(self, meta, children):
        dtype, name, shape = children
        return A.Decl(str(name), dtype, shape, None, loc=self.loc(meta))

    def assign(self, meta, children):
        target, op, value = children
        return A.Assign(target, op, value, loc=self.loc(meta))

    def plain_assign(self, meta, children):
        target, value = children
        return A.Assign(target, "=", value, loc=self.loc(meta))

    def aug_op(self, meta, children):
        return str(children[0])

    def loop_cmp(self, meta, children):
        return str(children[0])

    def hint(self, meta, children):
        return str(children[0])

    def for_stmt(self, meta, children):
        hint, dtype, var, start, cond_var, cmp, stop, (step_var, step), body = children
        return L.For(hint, str(var), dtype, start, str(cond_var), cmp, stop, step_var, step,
                     body, loc=self.loc(meta))

    def step_post(self, meta, children):
        return str(children[0]), A.IntLit(1, loc=self.loc(meta))

    step_pre = step_post

    def step_by(self, meta, children):
        return str(children[0]), children[1]

    def if_stmt(self, meta, children):
        cond, then, orelse = children
        if orelse is None:
            orelse = ()
        elif not isinstance(orelse, tuple):
            orelse = (orelse,)
        return A.If(cond, then, orelse, loc=self.loc(meta))

    def assert_stmt(self, meta, children):
        return A.Assert(children[0], loc=self.loc(meta))

    def select(self, meta, children):
        return A.Call("select", tuple(children), loc=self.loc(meta))


def parse(source: str, file: str = "<source>") -> L.Module:
    """Parse low-level IR source; syntax errors raise DSLSyntaxError with file:line:col."""
    return run_parser(_lark(), LowLevelTransformer(file, source), source, file)
