"""The project's own exception types: the CLI prints their message on one line and exits 1."""


class SandwichError(Exception):
    """Base of every error a user can cause; the message names the input and the fix."""


class ConfigError(SandwichError):
    """A model config, CLI argument or settings value is missing or invalid."""


class ShapeError(SandwichError):
    """An array handed to a kernel has the wrong shape or dtype."""


class CacheError(SandwichError):
    """The kernel cache is missing an entry, or a file in it is corrupt."""


class BuildError(SandwichError):
    """A kernel failed to compile, or produced wrong results against the reference."""


class DSLError(SandwichError):
    """A kernel source in the dual-level IR is malformed (syntax or semantics)."""


class TopologyError(SandwichError):
    """A CPU topology description is missing, inconsistent or asymmetric."""


class ToolError(SandwichError):
    """An external tool a check needs (llvm-mca) is missing or does not know the target."""


class ConfigWarning(UserWarning):
    """Something in a user's input that is probably a mistake but not an error (the CLI
    prints it as one `sandwichc: warning:` line)."""


def first_line(e: BaseException) -> str:
    """An exception as one line: its message's first line, or its type when it has none
    (TVM's errors carry a traceback below the line a user needs)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
