"""DSL error types: every bad source ends in one of these, with file:line:column and a caret."""

from __future__ import annotations

from sandwich.errors import DSLError


def _caret_lines(source: str | None, line: int, column: int) -> str:
    """The offending source line and a caret under `column` (tabs kept so the caret lines up)."""
    if not source or line < 1:
        return ""
    lines = source.splitlines()
    if line > len(lines):
        return ""
    text = lines[line - 1]
    col = max(1, min(column, len(text) + 1))
    pad = "".join(c if c == "\t" else " " for c in text[: col - 1])
    return f"\n    {text}\n    {pad}^"


class DSLLocatedError(DSLError):
    """A DSL error at a position: `file:line:column: message`, then the line and a caret."""

    kind = "error"

    def __init__(
        self, message: str, *, file: str = "<source>", line: int = 0, column: int = 0,
        source: str | None = None,
    ) -> None:
        self.message, self.file, self.line, self.column = message, file, line, column
        where = f"{file}:{line}:{column}" if line > 0 else file
        super().__init__(f"{where}: {self.kind}: {message}{_caret_lines(source, line, column)}")


class DSLSyntaxError(DSLLocatedError):
    """The source does not follow the grammar of its IR level."""

    kind = "syntax error"


class DSLSemanticError(DSLLocatedError):
    """The source parses but means nothing: undefined name, type or shape mismatch, bad tunable."""

    kind = "semantic error"
