"""What both IR parsers share: Lark errors -> DSLSyntaxError, and the expression Transformer."""

from __future__ import annotations

from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLError, DSLSyntaxError
from sandwich.private_dir import private_dir

_OPS = {"&&": "and", "||": "or", "!": "not"}
_MAX_INT_DIGITS = 40  # well beyond i64; also keeps int() away from Python's digit limit
_NAMED = {"NAME": "a name", "INT": "an integer", "FLOAT": "a float", "$END": "end of input",
          "_NL": "a newline", "_INDENT": "an indented block", "_DEDENT": "a dedent"}


class IndentError(Exception):
    """Raised by the high-level postlexer; turned into a DSLSyntaxError with the file name."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.line, self.column = line, column


def open_grammar(here: str, **options) -> Lark:
    """The LALR parser of the `grammar.lark` beside `here`, its tables kept between processes
    in this user's private temp dir (0.29 s -> 0.02 s a process for both grammars). Not in
    Lark's default place: a predictable name in a shared /tmp that Lark unpickles; where the
    private dir cannot be had, the tables are built each time."""
    try:
        cache: str | bool = str(private_dir("lark") / f"{Path(here).parent.name}.tables")
    except OSError:
        cache = False
    return Lark.open("grammar.lark", rel_to=here, parser="lalr", lexer="basic", cache=cache,
                     propagate_positions=True, maybe_placeholders=True, **options)


def _describe(lark: Lark, names) -> str:
    out = set()
    for name in names:
        if name in _NAMED:
            out.add(_NAMED[name])
            continue
        try:
            term = lark.get_terminal(name)
            out.add(repr(term.pattern.value) if term.pattern.type == "str" else name.lower())
        except (KeyError, AttributeError):
            out.add(name.lower())
    items = sorted(out)
    more = f" (and {len(items) - 8} more)" if len(items) > 8 else ""
    return ", ".join(items[:8]) + more


def _token_text(tok: Token) -> str:
    if tok.type == "$END":
        return "end of input"
    if tok.type in ("_NL", "_INDENT", "_DEDENT"):
        return {"_NL": "newline", "_INDENT": "indent", "_DEDENT": "dedent"}[tok.type]
    return repr(str(tok))


def _syntax_message(lark: Lark, e: UnexpectedInput) -> str:
    if isinstance(e, UnexpectedCharacters):
        return f"unexpected character {e.char!r}"
    if isinstance(e, UnexpectedToken):
        return f"unexpected {_token_text(e.token)}, expected {_describe(lark, e.expected)}"
    if isinstance(e, UnexpectedEOF):
        return f"unexpected end of input, expected {_describe(lark, e.expected)}"
    return "invalid syntax"


def _eof_position(source: str) -> tuple[int, int]:
    lines = source.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1


def run_parser(lark: Lark, transformer: Transformer, source: str, file: str):
    """Parse and transform `source`; anything wrong becomes a DSLError naming file:line:col."""
    try:
        tree = lark.parse(source)
    except UnexpectedInput as e:
        line, col = getattr(e, "line", -1), getattr(e, "column", -1)
        if not isinstance(line, int) or line < 1:
            line, col = _eof_position(source)
        raise DSLSyntaxError(_syntax_message(lark, e), file=file, line=line, column=col,
                             source=source) from None
    except IndentError as e:
        raise DSLSyntaxError(str(e), file=file, line=e.line, column=e.column,
                             source=source) from None
    except LarkError as e:
        raise DSLSyntaxError(f"invalid syntax ({e})", file=file) from None
    try:
        return transformer.transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, DSLError):
            raise e.orig_exc from None
        if isinstance(e.orig_exc, RecursionError):
            raise DSLSyntaxError("source is nested too deeply", file=file) from None
        raise
    except RecursionError:
        raise DSLSyntaxError("source is nested too deeply", file=file) from None


@v_args(meta=True)
class ExprTransformer(Transformer):
    """Expression rules, identical in meaning at both levels; subclasses add statements."""

    def __init__(self, file: str, source: str) -> None:
        super().__init__()
        self.file, self.source = file, source

    def loc(self, meta) -> A.Loc | None:
        return None if getattr(meta, "empty", True) else A.Loc(self.file, meta.line, meta.column)

    def error(self, message: str, where) -> DSLSyntaxError:
        line, col = (where.line, where.column) if where is not None else (0, 0)
        return DSLSyntaxError(message, file=self.file, line=line, column=col, source=self.source)

    def _binary(self, meta, children):
        left, op, right = children
        return A.Binary(_OPS.get(str(op), str(op)), left, right, loc=self.loc(meta))

    or_expr = and_expr = compare = sum = product = _binary
    or_test = and_test = comparison = arith = term = _binary

    def neg(self, meta, children):
        return A.Unary("-", children[0], loc=self.loc(meta))

    def not_(self, meta, children):
        return A.Unary("not", children[0], loc=self.loc(meta))

    def cast(self, meta, children):
        return A.Cast(children[0], children[1], loc=self.loc(meta))

    def index(self, meta, children):
        return A.Index(str(children[0]), tuple(children[1:]), loc=self.loc(meta))

    def prefetch_stmt(self, meta, children):
        """The same statement at both levels: `prefetch(X[i, j])`."""
        target = A.Index(str(children[0]), tuple(children[1:]), loc=self.loc(meta))
        return A.Prefetch(target, loc=self.loc(meta))

    def tile_op(self, meta, children):
        return str(children[0])

    def tile_stmt(self, meta, children):
        """The same statement at both levels: `tile_load(4, X[i, k], K / 2)`."""
        return A.Tile(children[0], tuple(c for c in children[1:] if c is not None),
                      loc=self.loc(meta))

    def call(self, meta, children):
        args = tuple(c for c in children[1:] if c is not None)
        return A.Call(str(children[0]), args, loc=self.loc(meta))

    def int_lit(self, meta, children):
        tok = children[0]
        if len(tok) > _MAX_INT_DIGITS:
            raise self.error("integer literal is too large", tok)
        return A.IntLit(int(tok), loc=self.loc(meta))

    def float_lit(self, meta, children):
        return A.FloatLit(float(children[0]), loc=self.loc(meta))

    def true(self, meta, children):
        return A.BoolLit(True, loc=self.loc(meta))

    def false(self, meta, children):
        return A.BoolLit(False, loc=self.loc(meta))

    def inf(self, meta, children):
        return A.FloatLit(float("inf"), loc=self.loc(meta))

    def name(self, meta, children):
        return A.Name(str(children[0]), loc=self.loc(meta))

    def dtype(self, meta, children):
        return str(children[0])

    def shape(self, meta, children):
        return tuple(children)
