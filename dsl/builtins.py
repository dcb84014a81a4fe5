"""Builtin functions and reserved words, shared by the checker and the lowerings."""

from __future__ import annotations

from sandwich.dsl.ast import TILE_OPS  # the x86 AMX tile statements: keywords at both levels

# name -> (argument kinds, result). Kinds: "float" (a float; an integer literal is fine),
# "int", "num" (int or float), "bool", "any" (numeric arguments of one category, joined).
# Result "same" is the joined type of the numeric arguments, else the type named.
FUNCS: dict[str, tuple[tuple[str, ...], str]] = {
    **{f: (("float",), "same") for f in (
        "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "erf", "floor",
        "ceil")},
    "pow": (("float", "float"), "same"),
    "fma": (("float", "float", "float"), "same"),
    "max": (("num", "num"), "same"),
    "min": (("num", "num"), "same"),
    "abs": (("num",), "same"),
    "select": (("bool", "any", "any"), "same"),
    # madd16(x, y, p) = x * lo(p) + y * hi(p), where p = lo + 65536 * hi holds two signed
    # 16-bit halves: one 32-bit lane of x86's pmaddwd (vpdpwssd with VNNI), which the
    # vector lowering emits when a `vectorize` loop's x and y vary along it and p does not
    "madd16": (("int", "int", "int"), "i32"),
    # dotbf16(acc, w, p) = acc + hi(w) * hi(p) + lo(w) * lo(p) in f32, where w and p each hold
    # two bf16 values as bits (lo + 65536 * hi): one lane of x86's vdpbf16ps, which the vector
    # lowering emits where the CPU has avx512_bf16 and w varies along a `vectorize` loop while
    # p does not; elsewhere the same products in f32 (bf16 values are exact in f32)
    "dotbf16": (("float", "int", "int"), "f32"),
    # dot8(acc, w, p) = acc + the sum over the 4 bytes q of w and p of unsigned(w_q) * signed(p_q):
    # one 32-bit lane of x86's vpdpbusd (AVX512-VNNI), which the vector lowering emits when acc
    # and w vary along a `vectorize` loop and p does not; elsewhere the same integer sum
    "dot8": (("int", "int", "int"), "i32"),
    # dot8p(acc, w, p02, p13): dot8 on activations already split into signed 16-bit pairs, bytes
    # 0 and 2 in p02's halves (lo + 65536 * hi), 1 and 3 in p13's: acc + unsigned(w_0) lo(p02)
    # + unsigned(w_2) hi(p02) + unsigned(w_1) lo(p13) + unsigned(w_3) hi(p13). x86 without VNNI
    # then runs 2 pmaddwd on w's bytes split into 16-bit halves and the pairs as loaded, where
    # dot8 splits p's bytes again for every row and tile on scalar registers
    "dot8p": (("int", "int", "int", "int"), "i32"),
    # dot8h(acc, w, p): dot8 into two 16-bit sums, acc's low and high halves: the low one adds
    # unsigned(w_0) * signed(p_0) + unsigned(w_1) * signed(p_1), the high one bytes 2 and 3's,
    # each pair's sum saturated to 16 bits and each half wrapping at 16 bits: x86's pmaddubsw
    # and paddw, where w's bytes stay below 128 (no saturation) and few enough are summed that
    # no half overflows (int4: a block of 32 values, int5 half of one); halves(x) sums the two
    "dot8h": (("int", "int", "int"), "i32"),
    # halves(x): the sum of x's low and high halves as signed 16-bit values (pmaddwd by ones)
    "halves": (("int",), "i32"),
    # nibbles(w, h): the low (h = 0) or high (h = 1) nibble of each of w's 4 bytes, each in
    # its byte: (w >> 4 h) & 0x0F0F0F0F, so that dot8 can take 8 int4 values packed in w
    "nibbles": (("int", "int"), "i32"),
    # high2(w, s): the 2-bit field s of each of w's 4 bytes, moved to bits 4 and 5 of its byte:
    # ((w >> 2 s) & 0x03030303) << 4, the high bits of 6-bit values whose low four are nibbles
    # (Q6_K), so that nibbles(...) + high2(...) is 4 bytes of 6-bit values for dot8
    "high2": (("int", "int"), "i32"),
    # high1(w, s): bit s of each of w's 4 bytes, moved to bit 4 of its byte:
    # ((w >> s) & 0x01010101) << 4, the fifth bits of 5-bit values whose low four are nibbles
    # (Q5_K), so that nibbles(...) + high1(...) is 4 bytes of 5-bit values for dot8
    "high1": (("int", "int"), "i32"),
    # bf16pair(x, y): x and y rounded to bf16 (nearest even), their bits as lo + 65536 * hi
    "bf16pair": (("float", "float"), "i32"),
}

LOW_KEYWORDS = frozenset({
    "kernel", "tunable", "in", "for", "if", "else", "assert", "parallel", "vectorize",
    "unroll", "true", "false", "inf", *TILE_OPS})
HIGH_KEYWORDS = frozenset({
    "def", "tunable", "in", "for", "if", "elif", "else", "and", "or", "not", "assert", "pass",
    "range", "parallel", "vector", "unroll", "True", "False", "inf", "int", "float", *TILE_OPS})
TYPE_NAMES = frozenset({"f32", "bf16", "f16", "i32", "i64", "i8", "u8", "bool"})
# A name must be usable at both levels (lowering must print), and not shadow vlen.
RESERVED = LOW_KEYWORDS | HIGH_KEYWORDS | TYPE_NAMES | {"vlen"}
