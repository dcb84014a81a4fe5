"""High-level grammar -> high-level AST; `parse` is the entry point."""

from __future__ import annotations

from functools import lru_cache

from lark import Lark, Token, v_args
from lark.lark import PostLex

from sandwich.dsl import ast as A
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.parsing import ExprTransformer, IndentError, open_grammar, run_parser

_ALIASES = {"int": "i32", "float": "f32"}


class HighLevelIndenter(PostLex):
    """Python-style INDENT/DEDENT tokens; bad indentation raises IndentError with a position.

    Written out rather than subclassing lark's Indenter, whose errors carry no position
    and which asserts on unbalanced brackets.
    """

    tab_len = 8
    always_accept = ("_NL",)

    def process(self, stream):
        levels, depth, last = [0], 0, None
        for tok in stream:
            last = tok
            if tok.type == "_NL":
                if depth > 0:
                    continue
                yield tok
                indent_str = tok.rsplit("\n", 1)[1]
                indent = indent_str.count(" ") + indent_str.count("\t") * self.tab_len
                if indent > levels[-1]:
                    levels.append(indent)
                    yield Token.new_borrow_pos("_INDENT", indent_str, tok)
                    continue
                while indent < levels[-1]:
                    levels.pop()
                    yield Token.new_borrow_pos("_DEDENT", indent_str, tok)
                if indent != levels[-1]:
                    line = (tok.end_line or tok.line or 1)
                    raise IndentError("dedent does not match any outer indentation level",
                                      line, len(indent_str) + 1)
                continue
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RSQB"):
                depth = max(0, depth - 1)
            yield tok
        while len(levels) > 1:
            levels.pop()
            yield (Token.new_borrow_pos("_DEDENT", "", last) if last
                   else Token("_DEDENT", "", 0, 1, 1, 1, 1, 0))


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return open_grammar(__file__, postlex=HighLevelIndenter())


@v_args(meta=True)
class HighLevelTransformer(ExprTransformer):
    """One method per grammar rule; suites come back as tuples of statements."""

    def start(self, meta, children):
        return H.Module(tuple(children), loc=self.loc(meta))

    def kernel(self, meta, children):
        name, rest = str(children[0]), [c for c in children[1:] if c is not None]
        params = tuple(c for c in rest if isinstance(c, A.Param))
        tunables = tuple(c for c in rest if isinstance(c, A.Tunable))
        body = tuple(c for c in rest if not isinstance(c, (A.Param, A.Tunable)))
        return H.Kernel(name, tunables, params, body, loc=self.loc(meta))

    def dtype(self, meta, children):
        return _ALIASES.get(str(children[0]), str(children[0]))

    def param(self, meta, children):
        name, dtype, shape = children
        return A.Param(str(name), dtype, shape or (), loc=self.loc(meta))

    def tunable(self, meta, children):
        name, dtype, domain = children
        return A.Tunable(str(name), dtype, domain, loc=self.loc(meta))

    def domain(self, meta, children):
        return tuple(children)

    def decl(self, meta, children):
        name, dtype, shape, init = children
        return A.Decl(str(name), dtype, shape or (), init, loc=self.loc(meta))

    def assign(self, meta, children):
        return A.Assign(children[0], "=", children[1], loc=self.loc(meta))

    def aug_assign(self, meta, children):
        target, op, value = children
        return A.Assign(target, op, value, loc=self.loc(meta))

    def aug_op(self, meta, children):
        return str(children[0])

    def assert_stmt(self, meta, children):
        return A.Assert(children[0], loc=self.loc(meta))

    def pass_stmt(self, meta, children):
        return None

    def loop_kind(self, meta, children):
        return str(children[0])

    def for_stmt(self, meta, children):
        var, kind, a, b, c, body = children
        start, stop, step = ((A.IntLit(0), a, A.IntLit(1)) if b is None
                             else (a, b, c if c is not None else A.IntLit(1)))
        return H.For(str(var), kind, start, stop, step, body, loc=self.loc(meta))

    def if_stmt(self, meta, children):
        cond, then, *elifs, orelse = children
        tail = orelse or ()
        for clause in reversed(elifs):
            tail = (A.If(clause[0], clause[1], tail, loc=clause[2]),)
        return A.If(cond, then, tail, loc=self.loc(meta))

    def elif_clause(self, meta, children):
        return children[0], children[1], self.loc(meta)

    def suite(self, meta, children):
        return tuple(c for c in children if c is not None)


def parse(source: str, file: str = "<source>") -> H.Module:
    """Parse high-level IR source; syntax errors raise DSLSyntaxError with file:line:col."""
    if not source.endswith("\n"):
        source += "\n"
    return run_parser(_lark(), HighLevelTransformer(file, source), source, file)
