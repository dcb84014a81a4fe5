"""LLVM intrinsics TVM's codegen cannot type, spliced into a compiled module's LLVM IR.

TVM 0.27 legalizes every bfloat16 value to float32 (and its LLVM codegen crashes on bfloat
vectors when that pass is skipped), so x86's vdpbf16ps, whose operands are <32 x bfloat>,
cannot be called from TIR. The lowering calls a stand-in extern function with the same bits
as 32-bit integers instead (`DPBF16PS`); after TVM has compiled and optimized the module,
each call is rewritten into two bitcasts and the intrinsic, and the module is rebuilt from
that IR. Only the operand types change, so the rest of TVM's code is left as it compiled it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from sandwich.errors import BuildError, first_line

# the stand-in: <16 x float> f(<16 x float> acc, <16 x i32> pairs, <16 x i32> pairs)
DPBF16PS = "sandwich_dpbf16ps"
_INTRINSIC = "llvm.x86.avx512bf16.dpbf16ps.512"
_DECLARE = f"declare <16 x float> @{_INTRINSIC}(<16 x float>, <32 x bfloat>, <32 x bfloat>)"
_CALL = re.compile(r"^(\s*)(%[\w.]+ = .*call .*<16 x float> )@" + DPBF16PS + r"\((.*)$")


def _split_args(text: str) -> tuple[list[str], str]:
    """`a, b, c) rest` -> (["a", "b", "c"], " rest"): commas inside <>, [] or () stay."""
    depth, parts, start = 0, [], 0
    for i, ch in enumerate(text):
        if ch in "<[(":
            depth += 1
        elif ch in ">])":
            if depth == 0 and ch == ")":
                parts.append(text[start:i].strip())
                return parts, text[i + 1:]
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    raise BuildError(f"cannot read the arguments of a {DPBF16PS} call in the kernel's LLVM IR")


def splice_ir(ir: str) -> tuple[str, int]:
    """The IR with every stand-in call made a vdpbf16ps call; and how many there were."""
    out, count = [], 0
    for line in ir.splitlines():
        if line.startswith("declare") and f"@{DPBF16PS}(" in line:
            out.append(_DECLARE)
            continue
        m = _CALL.match(line)
        if m is None:
            out.append(line)
            continue
        indent, head, rest = m.groups()
        args, tail = _split_args(rest)
        if len(args) != 3 or not all(a.startswith(t) for a, t in zip(
                args, ("<16 x float> ", "<16 x i32> ", "<16 x i32> "), strict=True)):
            raise BuildError(f"unexpected {DPBF16PS} call in the kernel's LLVM IR: {line.strip()}")
        names = []
        for j, arg in enumerate(args[1:]):
            names.append(f"%sandwich_bf{count}_{j}")
            out.append(f"{indent}{names[-1]} = bitcast {arg} to <32 x bfloat>")
        out.append(f"{indent}{head}@{_INTRINSIC}({args[0]}, <32 x bfloat> {names[0]}, "
                   f"<32 x bfloat> {names[1]}){tail}")
        count += 1
    return "\n".join(out) + "\n", count


def splice_module(executable):
    """A compiled module whose IR calls the stand-in -> the same module calling vdpbf16ps."""
    import tvm

    ir, count = splice_ir(executable.mod.inspect_source("ll"))
    if count == 0:
        return executable
    with tempfile.TemporaryDirectory(prefix="sandwich-ll-") as tmp:
        path = Path(tmp) / "kernel.ll"
        path.write_text(ir)
        try:
            return tvm.runtime.load_module(str(path))
        except Exception as e:  # TVM raises many types; the user sees one line
            first = first_line(e)
            raise BuildError(f"LLVM rejected the kernel with vdpbf16ps spliced in: {first}") from e
