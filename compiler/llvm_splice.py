"""LLVM intrinsics TVM's codegen cannot type, spliced into a compiled module's LLVM IR.

TVM 0.27 legalizes every bfloat16 value to float32 (and its LLVM codegen crashes on bfloat
vectors when that pass is skipped), so avx512_bf16's instructions, whose operands or results
are <32 x bfloat>, cannot be called from TIR. The lowering calls stand-in extern functions
with the same bits as 32-bit integers instead; after TVM has compiled and optimized the
module, each call is rewritten into the intrinsic and bitcasts (and a shuffle), and the
module is rebuilt from that IR. Only the operand types change, so the rest of TVM's code is
left as it compiled it. The stand-ins:
- `DPBF16PS` (acc, pairs, pairs): vdpbf16ps, the bf16 dot product;
- `BF16_PAIR` (x, y): x and y rounded to bf16, x's in each int32's low half and y's in its
  high half, as compiler/lower_vector.bf16_pair computes in software: vcvtne2ps2bf16 and a
  vpermw that interleaves its two halves;
- `BF16_X32` (v): the 32 floats of v rounded to bf16, two consecutive ones in each int32:
  vcvtne2ps2bf16 on v's halves.
vcvtne2ps2bf16 rounds to nearest even and quiets NaNs as the software rounding does, but
reads denormal inputs as zero (never the case for weights times their scales or for
activations, whose bf16 values would be denormal too).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from sandwich.errors import BuildError, first_line

# the stand-ins: <16 x float> f(<16 x float> acc, <16 x i32> pairs, <16 x i32> pairs);
# <16 x i32> f(<16 x float> x, <16 x float> y); <16 x i32> f(<32 x float> v)
DPBF16PS = "sandwich_dpbf16ps"
BF16_PAIR = "sandwich_bf16pair"
BF16_X32 = "sandwich_bf16x32"
STAND_INS = (DPBF16PS, BF16_PAIR, BF16_X32)
_DOT = "llvm.x86.avx512bf16.dpbf16ps.512"
_CVT = "llvm.x86.avx512bf16.cvtne2ps2bf16.512"  # (hi, lo): lanes 0-15 lo's, 16-31 hi's
_DECLARES = {DPBF16PS: f"declare <16 x float> @{_DOT}(<16 x float>, <32 x bfloat>, <32 x bfloat>)",
             BF16_PAIR: f"declare <32 x bfloat> @{_CVT}(<16 x float>, <16 x float>)"}
_DECLARES[BF16_X32] = _DECLARES[BF16_PAIR]
_ARGS = {DPBF16PS: ("<16 x float> ", "<16 x i32> ", "<16 x i32> "),
         BF16_PAIR: ("<16 x float> ", "<16 x float> "), BF16_X32: ("<32 x float> ",)}
_CALL = re.compile(r"^(\s*)(%[\w.]+) = (.*call .*)@(" + "|".join(STAND_INS) + r")\((.*)$")


def _mask(lanes) -> str:
    """A shufflevector mask: the source lanes, in order."""
    lanes = list(lanes)
    return f"<{len(lanes)} x i32> <" + ", ".join(f"i32 {i}" for i in lanes) + ">"


_INTERLEAVE = _mask(i // 2 + 16 * (i % 2) for i in range(32))  # lo 0, hi 0, lo 1, hi 1, ...
_LOW, _HIGH = _mask(range(16)), _mask(range(16, 32))


def _split_args(text: str, name: str) -> tuple[list[str], str]:
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
    raise BuildError(f"cannot read the arguments of a {name} call in the kernel's LLVM IR")


def _rewrite(name: str, indent: str, result: str, call: str, args: list[str], tail: str,
             tag: str) -> list[str]:
    """The instructions that replace one stand-in call (`tag` names their temporaries)."""
    if name == DPBF16PS:
        names = [f"%{tag}_{j}" for j in range(2)]
        return [f"{indent}{n} = bitcast {a} to <32 x bfloat>" for n, a in zip(names, args[1:], strict=True)] + [
            f"{indent}{result} = {call}@{_DOT}({args[0]}, "
            f"<32 x bfloat> {names[0]}, <32 x bfloat> {names[1]}){tail}"]
    if name == BF16_PAIR:
        lo, hi = args
        return [f"{indent}%{tag}_c = call <32 x bfloat> @{_CVT}({hi}, {lo})",
                f"{indent}%{tag}_s = shufflevector <32 x bfloat> %{tag}_c, <32 x bfloat> poison, {_INTERLEAVE}",
                f"{indent}{result} = bitcast <32 x bfloat> %{tag}_s to <16 x i32>"]
    return [f"{indent}%{tag}_lo = shufflevector {args[0]}, <32 x float> poison, {_LOW}",
            f"{indent}%{tag}_hi = shufflevector {args[0]}, <32 x float> poison, {_HIGH}",
            f"{indent}%{tag}_c = call <32 x bfloat> @{_CVT}(<16 x float> %{tag}_hi, <16 x float> %{tag}_lo)",
            f"{indent}{result} = bitcast <32 x bfloat> %{tag}_c to <16 x i32>"]


def splice_ir(ir: str) -> tuple[str, int]:
    """The IR with every stand-in call made its intrinsic; and how many there were."""
    out, count, declared = [], 0, set()
    for line in ir.splitlines():
        if line.startswith("declare") and (name := next((n for n in STAND_INS if f"@{n}(" in line), None)):
            if _DECLARES[name] not in declared:
                declared.add(_DECLARES[name])
                out.append(_DECLARES[name])
            continue
        m = _CALL.match(line)
        if m is None:
            out.append(line)
            continue
        indent, result, call, name, rest = m.groups()
        args, tail = _split_args(rest, name)
        if len(args) != len(_ARGS[name]) or not all(
                a.startswith(t) for a, t in zip(args, _ARGS[name], strict=True)):
            raise BuildError(f"unexpected {name} call in the kernel's LLVM IR: {line.strip()}")
        out += _rewrite(name, indent, result, call, args, tail, f"sandwich_bf{count}")
        count += 1
    return "\n".join(out) + "\n", count


def splice_module(executable):
    """A compiled module whose IR calls stand-ins -> the same module calling their intrinsics."""
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
            raise BuildError(f"LLVM rejected the kernel with its bf16 intrinsics spliced in: "
                             f"{first}") from e
