"""DECA's Roof-Surface model: a kernel's FLOPS bounded by the slowest of memory, vector and
matrix units, with the paper's SPR data and our own fp32-FMA GEMM kernels mapped onto it."""

# Source: Gerogiannis et al., "DECA: A Near-Core LLM Decompression Accelerator Grounded on a 3D
# Roofline Model" (../shared/papers/003_698edc724e19faf9.txt). Section, equation and table
# numbers below are the paper's. The roofline sees only memory and compute; the Roof-Surface
# adds the vector work that turns a compressed weight into one the matrix unit can take, which
# is what bounds the paper's compressed GEMMs on HBM (§3.3) and, on a CPU without a matrix
# engine, what our int8/int4 kernels spend beside their FMAs.

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sandwich.compiler.gemm_formats import ACT_BLOCK, amx_format, int_activations, weight_format
from sandwich.errors import ConfigError
from sandwich.weight_formats import parse_format

RESOURCES = ("MEM", "VEC", "MTX")  # ties go to the first: a point on a BORD line reads MEM over VEC


@dataclass(frozen=True)
class Machine:
    """The three architecture rates of Eq. 1: memory bytes/s, vector ops/s, matrix ops/s.

    `shared`: the vector and matrix work cannot overlap, so their times add (the bound's
    compute term is 1 / (1 / VEC + 1 / MTX)) while the memory stream still overlaps them.
    DECA's SPR has a TMUL beside the AVX units (Eq. 1's min); our family kernels run their
    dequantization and their products on the same vector ports, and the AMX kernel rounds a
    block of int weights before its tiles run on it."""

    mbw: float
    vos: float
    mos: float
    shared: bool = False


@dataclass(frozen=True)
class Signature:
    """A kernel's two intensities (§4.1): matrix ops per byte streamed (AI_XM) and matrix ops
    per vector op (AI_XV, inf when the weights need no vector work before the matrix unit)."""

    ai_xm: float
    ai_xv: float


@dataclass(frozen=True)
class Bound:
    """The Roof-Surface bound of one kernel on one machine and the term that sets it."""

    flops: float
    resource: str  # "MEM", "VEC" or "MTX"


def rates(machine: Machine, sig: Signature) -> dict[str, float]:
    """Matrix ops per second each resource can sustain (the three terms of Eq. 1)."""
    return {"MEM": machine.mbw * sig.ai_xm, "VEC": machine.vos * sig.ai_xv, "MTX": machine.mos}


def compute_rate(machine: Machine, sig: Signature) -> float:
    """Matrix ops per second the vector and matrix units sustain together: the slower of the
    two (Eq. 1), or where they share the ports (Machine.shared) their times added."""
    r = rates(machine, sig)
    if not machine.shared:
        return min(r["VEC"], r["MTX"])
    return 1.0 / (1.0 / r["VEC"] + 1.0 / r["MTX"])  # 1 / inf is 0: no vector work


def bound(machine: Machine, sig: Signature, flops_per_op: float) -> Bound:
    """Eq. 2: FLOPS = flops_per_op * min(MBW * AI_XM, VOS * AI_XV, MOS); on a machine whose
    vector and matrix work share the ports, min(MBW * AI_XM, compute_rate), the compute side
    named by the larger of its two times."""
    r = rates(machine, sig)
    compute = compute_rate(machine, sig)
    if r["MEM"] <= compute:  # ties go to MEM, as the first of RESOURCES
        return Bound(flops_per_op * r["MEM"], "MEM")
    return Bound(flops_per_op * compute, "VEC" if r["VEC"] <= r["MTX"] else "MTX")


def region(machine: Machine, sig: Signature) -> str:
    """The BORD region (§4.2) a signature falls in: the resource that bounds it."""
    return bound(machine, sig, 1.0).resource


@dataclass(frozen=True)
class BordLines:
    """The three lines of a Bounding Region Diagram (§4.2, Fig. 5a), x = AI_XM, y = AI_XV:
    MEM|VEC is y = mem_vec_slope * x, MEM|MTX is x = mtx_x, VEC|MTX is y = mtx_y; all three
    meet at (mtx_x, mtx_y)."""

    mem_vec_slope: float  # MBW / VOS
    mtx_x: float  # MOS / MBW
    mtx_y: float  # MOS / VOS


def bord_lines(machine: Machine) -> BordLines:
    """Where a machine's BORD splits into its MEM, VEC and MTX regions."""
    return BordLines(machine.mbw / machine.vos, machine.mos / machine.mbw,
                     machine.mos / machine.vos)


# --- The paper's SPR system and Table 2 ----------------------------------------------------

SPR_FREQ_HZ = 2.5e9  # §7.1: "Both cores and DECA PEs run at 2.5GHz"
SPR_CORES = 56  # §7.1: "a 56-core server with SPR-like parameters"
HBM_BW = 850e9  # §7.1 (and Table 1, Table 7): "about ... 850GB/s achievable" with HBM
DDR_BW = 260e9  # §7.1 (and Table 1): "about 260GB/s" with DDR5
TMUL_CYCLES = 16  # §2.3 and §4.1: one tile multiplication every 16 cycles per core
TILE_WEIGHTS = 512  # §2.3: a BF16 weight tile is 16 rows x 32 columns
TABLE2_N = 16
# Table 2 does not state its batch size; Figures 3 and 5 beside it are N = 16 and only N = 16
# gives the table's magnitudes (BF8 at N = 4 would be a quarter of 13.3).
TABLE2_TFLOPS = 1.024e12
# Table 2's "TFLOPS" are 1024 GFLOPS, not 10^12: the TMUL peak 512 * 16 * f * c / 16 =
# 71.68e12 FMA/s is printed 72 in Table 7 but 70 in Table 2 (BF8_5%'s R-L), and BF8's R-L,
# 850e9 B/s * 16 FMA/B = 13.6e12, is printed 13.3; both are exactly 1.024x. The other ten R-L
# entries then agree within rounding, which decimal TFLOPS (2.4% high on every one) do not.
TABLE2_TOLERANCE = (0.1, 0.01)  # a printed value matches within 0.1 TFLOPS or 1%


def spr(mbw: float, vector_units_per_core: float = 1.0) -> Machine:
    """The paper's SPR: MOS = f * c / 16 (§4.1); VOS = f * c * SIMD units per core (§4.1). The
    paper never says how many SIMD units a core has, nor how many AVX ops decompress a tile
    (§2.4: "we omit the specifics"). Eq. 1 only uses their ratio VOS * AI_XV, so we count
    one unit: AI_XV of an SPR kernel is then tiles per core cycle of vector issue."""
    return Machine(mbw=mbw, vos=SPR_FREQ_HZ * SPR_CORES * vector_units_per_core,
                   mos=SPR_FREQ_HZ * SPR_CORES / TMUL_CYCLES)


SPR_HBM = spr(HBM_BW)
SPR_DDR = spr(DDR_BW)


def tmul_flops_per_op(n: int) -> int:
    """Eq. 2: a tile operation is 512 N FMAs (§2.3; the paper's FLOPs are FMAs). Only for
    N <= 16: a larger batch reuses each tile, which changes AI_XM too (Appendix 12.2)."""
    if not 1 <= n <= 16:
        raise ConfigError(f"the TMUL model takes a batch of 1..16 rows, got N = {n}")
    return TILE_WEIGHTS * n


@dataclass(frozen=True)
class PaperKernel:
    """One column of Table 2: a compression scheme (§2.2, §7.3) and its printed R-L and R-S."""

    name: str
    bits: int  # Q: 16 for BF16, 8 for BF8, 4 for MXFP4
    density: float  # d: the fraction of nonzeros; 1.0 is dense, with no bitmask
    scale_bits: float  # bits of group scale per weight
    table_rl: float
    table_rs: float

    @property
    def bits_per_weight(self) -> float:
        """§2.2: a sparse weight costs Q d bits of nonzeros plus its 1-bit mask (the Q d + 1 of
        the compression factor 16 / (Q d + 1)); a dense one its Q bits and its share of scale."""
        if self.density < 1.0:
            return self.bits * self.density + 1.0 + self.scale_bits
        return self.bits + self.scale_bits

    @property
    def ai_xm(self) -> float:
        """§4.1: 1 / Bytes_tile, one 512-weight tile per matrix op."""
        return 8.0 / (TILE_WEIGHTS * self.bits_per_weight)


# MXFP4 shares one scale per 32 weights (§2.2); its width is the MX format's 8-bit E8M0 (the
# paper's [63]), which the paper does not restate: 4.25 bits per weight gives R-L 25.0 against
# the printed 25.2 (a 16-bit scale would give 23.6).
TABLE2 = (
    PaperKernel("MXFP4", 4, 1.0, 8 / 32, 25.2, 11.5),
    PaperKernel("BF8", 8, 1.0, 0.0, 13.3, 13.3),
    *(PaperKernel(f"BF8_{d}%", 8, d / 100, 0.0, rl, 16.1)
      for d, rl in ((50, 21.2), (30, 31.2), (20, 40.8), (10, 59.2), (5, 70.0))),
    *(PaperKernel(f"BF16_{d}%", 16, d / 100, 0.0, rl, rs)
      for d, rl, rs in ((50, 11.8, 11.8), (30, 18.4, 18.4), (20, 25.2, 23.0), (10, 40.8, 23.0),
                        (5, 59.2, 23.0))),
)


def matches_table(value: float, printed: float) -> bool:
    """True when a computed value agrees with a printed Table 2 value (TABLE2_TOLERANCE)."""
    absolute, relative = TABLE2_TOLERANCE
    return abs(value - printed) <= max(absolute, relative * abs(printed))


def table2_roofline(kernel: PaperKernel, machine: Machine = SPR_HBM) -> Bound:
    """The R-L row from the paper's constants alone: Eq. 2 with no vector term (AI_XV = inf);
    `flops` in Table 2's TFLOPS. For BF8, BF16_50% and BF16_30%, which §4.1 says are MEM-bound
    in both models, this is also their R-S."""
    b = bound(machine, Signature(kernel.ai_xm, math.inf), tmul_flops_per_op(TABLE2_N))
    return Bound(b.flops / TABLE2_TFLOPS, b.resource)


def implied_ai_xv(kernel: PaperKernel) -> float | None:
    """The AI_XV that Table 2's printed R-S implies on SPR_HBM (the table's system: its BF8
    R-L is HBM's 850 GB/s at N = 16), read back from the table, not predicted.

    None when the printed R-S equals the memory/matrix bound (the vector term does not bind,
    so the table only says AI_XV is large enough). The paper's other R-S entries cannot be
    reproduced from its constants: they need the AVX ops per tile of libxsmm's decompression
    sequence (§2.4 omits them; footnote 1 adds the core's bubbles) and the SIMD units per core
    (§4.1 names the product, not the number). Read back, a tile takes about 49 cycles of one
    vector unit per core for sparse BF16, 70 for sparse BF8 and 97 for MXFP4, the same at
    every density of a family."""
    if matches_table(table2_roofline(kernel, SPR_HBM).flops, kernel.table_rs):
        return None
    tiles_per_s = kernel.table_rs * TABLE2_TFLOPS / tmul_flops_per_op(TABLE2_N)
    return tiles_per_s / SPR_HBM.vos


def table2_signature(kernel: PaperKernel) -> Signature:
    """AI_XM from the constants; AI_XV read back from the table (inf where it does not bind).
    A signature belongs to the kernel, so it places the kernel on SPR_DDR's BORD too."""
    ai_xv = implied_ai_xv(kernel)
    return Signature(kernel.ai_xm, math.inf if ai_xv is None else ai_xv)


# --- Our kernels ---------------------------------------------------------------------------
# The GEMM family (dsl/kernels/gemm_family.sw) has no matrix engine: its "matrix op" is one
# weight vector of `lanes` floats used in M FMAs, one per activation row, so MOS (weight
# vectors/s) = FMA vector ops/s / M and an op is 2 lanes M FLOPs. Its "vector ops" are the
# dequantization instructions that turn a vector of stored weights into f32, shared by the M
# rows. Counts per weight vector, from the hot loop of the AVX2 (8-lane) assembly, taken to
# hold per vector at any width; the counts are read from assembly, not measured (the rate
# they run at, VOS, is: machine_bench.dequant_gops times each sequence alone, on registers):
#   fp32: none, the weights are loaded as they are used.
#   int8, int8-g32: 2 (vpmovsxbd load-widen, vcvtdq2ps).
#   int4-*: 5 per two vectors (one vpmovzxbd widens the bytes of both, vpand for the low
#     nibbles, vpsrld for the high ones, two vcvtdq2ps).
# Per group of G values along K, each weight vector's group epilogue (gemm_family.sw) adds
# one FMA per scale array plus a vcvtph2ps per fp16 scale array, and symmetric int4 one more
# for its "- 8 sum(a)" term; the epilogue runs once per activation row, which the model folds
# into one (exact at M = 1). Those run at the FMA rate, the sequence at its own (vos_for).
# Here the FMAs (or dot products) and the dequantization share the same vector ports, so
# the VEC and MTX terms are not independent as TMUL and AVX are: their times add
# (Machine.shared; Sapphire Rapids VM, int4-g32 on VNNI, 11008 x 2048 from the LLC, 2 threads:
# 686-737 GFLOPS at M = 4-16, 53-57% of Eq. 1's min, 65-86% of the added times). The int
# formats on 8-bit activations count their group scaling twice there: in the dot8 block's
# measured rate and in the epilogue share of VEC (3 of int4-g32's 27 ops per 32 weight
# vectors, once per row where the model counts it once). What the model leaves out: above
# the register tile's rows the kernel converts each weight vector once per row block, not
# once per M rows, so at large M the VEC term is optimistic.
# dequantization ops per weight vector, by bits; bf16 takes none into vdpbf16ps and one (a
# shift or a mask to f32) where the CPU has no bf16 dot product (BF16_WIDEN_OPS)
VALUE_OPS = {32: 0.0, 16: 0.0, 8: 2.0, 4: 2.5}
# Int formats whose groups are whole blocks of 32 (gemm_formats.int_activations) multiply
# 8-bit activations instead: the "matrix op" is then dot8 (vpdpbusd with AVX512-VNNI, else for
# int8 the bytes split into 16-bit pairs and 2 pmaddwd + 2 paddd, a split the micro-benchmark
# counts in the dot8 rate, and for the 4- to 6-bit formats, whose bytes stay below 128,
# int4's pmaddubsw and paddw into 16-bit sums, a pmaddwd by ones a block, at that sequence's
# own rate; int5 and int6 fold their sums more often, so the rate is an upper bound for them),
# four weight vectors' bytes (4 values along K, `lanes` columns) per
# instruction and row, at its own measured rate. A weight vector's dequantization: int8 is
# stored as unsigned bytes (value + 128) that vpdpbusd takes as they are, 0 ops; int4 keeps 8
# nibbles in a 32-bit lane, split with an and, a shift and an and for 8 weight vectors, 3/8 op
# a weight vector; the znver4 assembly of an 8 x 32 tile does it twice (LLVM recomputes the
# split rather than keep it in registers for 8 rows), 0.75. 6-bit (int6-k) adds each byte's
# high two bits to the nibbles (high2: a rotate and an and; then an add) for both words of
# an element: 9 ops per 8 weight vectors, counted at the nibble split's rate. 5-bit (int5-k)
# adds each byte's fifth bit the same way (high1), from one word a block for both.
ACT8_VALUE_OPS = {8: 0.0, 6: 9 / 8, 5: 9 / 8, 4: 0.75}
# Per row and block of 32 values, besides its 8 dot8 per column vector, the kernel converts
# the block's integer sums to f32 and scales them by the activation scale (vcvtdq2ps and an
# FMA), and per group of G values once more by the weight scale (an FMA). The dot8 rates are
# measured on that block, with groups of 32 (machine_bench.int8_block_gops), not assumed:
# the model used to count the 3 ops at the bare dot8 rate (8 / 11 of it for the block), as
# where they take the ports vpdpbusd needs (Zen 4), and a Zen 3's int8 tile ran above that
# bound (in a run whose bare rate read low: that rate spread 2x there, the block rate less);
# other groups scale the block by its op count, 8 + 2 + 32 / G against the measured 8 + 2 + 1.
ACT8_BLOCK_DOTS, ACT8_BLOCK_SCALING = 8, 2
ACT8_MEASURED_BLOCK = ACT8_BLOCK_DOTS + ACT8_BLOCK_SCALING + 1
BF16_WIDEN_OPS = 1.0
SIGNATURE_K = 4096  # K for the per-column formats' share of scale bytes and scaling ops
# The AMX kernel on int weights (gemm_amx_bf16.sw; int8 and int4 in groups of 32) rounds each
# block of W to bf16 pairs (wq) once per chunk of its b_m rows, before the tiles run on it.
# Vector instructions per weight vector in its build for sapphirerapids (with avx512_bf16,
# 2026-12-07; every vector instruction of the block's loop, loads and stores included, over
# the weight vectors it rounds): the field's mask or shuffle (or shift and mask), its offset,
# the conversion to f32, value x scale (an FMA with the minimum where asymmetric: int4-g32-asym
# 6.75); and for each two weight vectors one vcvtne2ps2bf16, one vpermw that pairs them, one
# store and the scale's vcvtph2ps. With the rounding in integer ops instead (no avx512_bf16
# conversion), 14.76 and 14.63. They run on the vector ports the FMAs use: at the FMA rate.
AMX_ROUND_OPS = {8: 7.25, 4: 7.125}
AMX_ROWS = 256  # the AMX schedules' largest b_m: rows one rounding serves, where no schedule says
# The AMX kernel with byte products (gemm_amx_int8.sw) on 32 weight vectors (a block of 32
# values along K, 16 columns): per row, the block's i32 sums converted, scaled by the
# activation's scale and offset and by the weights' scale (vcvtdq2ps and two FMAs); per block,
# the scales converted once (vcvtph2ps), and int4's nibbles split into bytes (an and, a shift
# and an and for each of 4 vectors: 12) before the B tiles load them. Counted in its build for
# sapphirerapids (2026-12-07), at the FMA rate; its tiles' products are AMX's tile rate (a
# tdpbsud on 32 values of K takes as many products as a tdpbf16ps).
AMX8_ROW_OPS = 3 / 32
AMX8_BLOCK_OPS = {8: 1 / 32, 4: 13 / 32}


@dataclass(frozen=True)
class Dequantization:
    """A weight vector's vector work before its products: the sequence it runs (one of
    machine_bench.DEQUANT_KINDS, None for none) and that sequence's ops, and its share of the
    group epilogue's ops (FMAs and fp16 conversions, which run at the FMA rate)."""

    kind: str | None
    ops: float
    epilogue_ops: float

    @property
    def total(self) -> float:
        return self.ops + self.epilogue_ops


def dequantization(fmt_name: str, k: int = SIGNATURE_K, *, bf16_dot: bool = True) -> Dequantization:
    """What our GEMM family does to one weight vector of this format before its products."""
    fmt = parse_format(fmt_name)
    if int_activations(fmt, k):
        kind = "nibbles" if fmt.bits < 8 else None
        ops = ACT8_VALUE_OPS[fmt.bits]
    elif fmt.bits == 16:
        kind, ops = (None, 0.0) if bf16_dot else ("bf16-widen", BF16_WIDEN_OPS)
    elif fmt.bits in (8, 4):
        kind, ops = f"int{fmt.bits}-widen", VALUE_OPS[fmt.bits]
    else:
        kind, ops = None, VALUE_OPS[fmt.bits]
    epilogue = 0.0
    if fmt.quantized:
        arrays = 1 if fmt.symmetric else 2  # scales, and minimums when asymmetric
        per_group = arrays * (2 if fmt.scale_dtype == "float16" else 1)
        if fmt.bits == 4 and fmt.symmetric:
            per_group += 1
        if fmt.super_group and not fmt.symmetric:  # a scale and a minimum each made from a
            per_group = 2 * 3  # byte factor and an fp16 multiplier: widen, convert, multiply
        elif fmt.super_group:  # int6-k: each group's signed factor widened, converted and
            per_group = 3 + 1  # applied; d (converted, applied) once a block of two groups
        epilogue = per_group / fmt.group_size(k)
    return Dequantization(kind, ops, epilogue)


def kernel_signature(fmt_name: str, lanes: int, *, k: int = SIGNATURE_K,
                     bf16_dot: bool = True) -> Signature:
    """AI_XM and AI_XV of our GEMM kernel for one weight format: AI_XM = 1 / the stored bytes
    of one weight vector (values plus its share of scales and minimums), AI_XV = 1 / its
    dequantization ops (inf for fp32, and for bf16 where `bf16_dot`: the CPU multiplies
    bf16 pairs as they are). ConfigError for a format with no kernel."""
    fmt = parse_format(fmt_name)
    weight_format(fmt.name)  # a format the GEMM family does not build: its one-line error
    if lanes < 1 or k < 1 or (fmt.group and k % fmt.group):
        raise ConfigError(f"need lanes >= 1 and K a multiple of {fmt.group or 1}, "
                          f"got lanes={lanes}, K={k}")
    ai_xm = 1.0 / (fmt.nbytes(k, lanes) / (k * lanes) * lanes)
    ops = dequantization(fmt.name, k, bf16_dot=bf16_dot).total
    return Signature(ai_xm, math.inf if ops == 0 else 1.0 / ops)


def amx_signature(fmt_name: str, lanes: int, *, m: int, rows: int = AMX_ROWS, t_m: int = 1,
                  k: int = SIGNATURE_K) -> Signature:
    """AI_XM and AI_XV of the AMX kernel on an int format's weights (an M-row GEMM): AI_XM is
    the family's (the same bytes stream); AI_XV = 1 / the ops that round one weight vector
    (AMX_ROUND_OPS) times how often it is rounded: once per chunk of `rows` (b_m) rows of
    each of the t_m threads that split the rows. ConfigError for a format it does not take."""
    fmt = parse_format(fmt_name)
    if fmt.bits not in AMX_ROUND_OPS or not amx_format(fmt.name, k):
        raise ConfigError(f"the AMX kernel does not take {fmt.name} weights as int values "
                          f"(int8 and int4 in groups of 32 values do)")
    roundings = t_m * math.ceil(m / (t_m * rows))
    return Signature(kernel_signature(fmt.name, lanes, k=k).ai_xm,
                     1.0 / (AMX_ROUND_OPS[fmt.bits] * roundings))


def amx8_signature(fmt_name: str, lanes: int, *, m: int, k: int = SIGNATURE_K) -> Signature:
    """AI_XM and AI_XV of the byte-product AMX kernel on an int format's weights (an M-row
    GEMM): AI_XM the family's; AI_XV = 1 / its vector ops per weight vector, the block's
    (AMX8_BLOCK_OPS) and each row's (AMX8_ROW_OPS). ConfigError for a format it does not take."""
    fmt = parse_format(fmt_name)
    if fmt.bits not in AMX8_BLOCK_OPS or not amx_format(fmt.name, k):
        raise ConfigError(f"the AMX byte-product kernel does not take {fmt.name} weights "
                          f"(int8 and int4 in groups of 32 values do)")
    return Signature(kernel_signature(fmt.name, lanes, k=k).ai_xm,
                     1.0 / (AMX8_BLOCK_OPS[fmt.bits] + m * AMX8_ROW_OPS))


def gemm_flops_per_op(lanes: int, m: int) -> int:
    """FLOPs of one of our matrix ops: a weight vector in M FMAs of `lanes` lanes."""
    return 2 * lanes * m


@dataclass(frozen=True)
class HostRates:
    """This machine's rates, measured once by `calibrate`; `machine(m)` turns them into the
    Roof-Surface machine of an M-row GEMM."""

    threads: int
    lanes: int
    mbw: float  # bytes/s, streaming read from DRAM
    fma_vector_ops: float  # FMA vector instructions per second, all threads
    vos: Mapping[str, float]  # vector ops/s of each dequantization sequence, all threads
    bf16_dot_ops: float | None = None  # vdpbf16ps per second, all threads (None: no avx512_bf16)
    # dot8 (vpdpbusd, or pmaddwd) per second, all threads, in the tile's blocks (8 dot8 and
    # their scaling, groups of 32: ACT8_MEASURED_BLOCK)
    int8_dot_ops: float | None = None
    # the same on weight bytes below 128 (4- to 6-bit values; without VNNI int4's pmaddubsw +
    # paddw, the others' bound); None: int8_dot_ops
    narrow_dot_ops: float | None = None
    # AMX's bf16 tile product (tdpbf16ps) in FLOPS, all threads (None: no AMX-BF16)
    amx_flops: float | None = None

    def machine(self, m: int, fmt: str = "fp32", k: int = SIGNATURE_K, *,
                amx: bool = False) -> Machine:
        """MOS is weight vectors/s: each one takes M FMA vector ops; for bf16 weights on a
        CPU with a bf16 dot product, M / 2 of them (one takes two weight vectors' pairs); for
        int weights multiplied on 8-bit activations (K as in kernel_signature), M / 4 dot8
        (one takes four weight vectors' bytes) at their rate in the tile's blocks, whose
        scaling that rate includes for groups of 32 (ACT8_MEASURED_BLOCK). With `amx` (bf16
        weights in the AMX kernel) MOS is AMX's tile rate in the same weight vectors (one takes
        2 M lanes of FLOPs), and on int weights (int8, int4 in groups of 32) VOS the FMA rate,
        at which it rounds them to bf16 (amx_signature); ConfigError where this machine has none
        measured. Every kernel here is Machine.shared: the family's products and conversions
        take the same vector ports, and the AMX kernel rounds a block before its tiles run."""
        f = parse_format(fmt)
        vos = self.vos_for(f.name, k)
        if amx:
            if not self.amx_flops or not amx_format(f.name, k):
                raise ConfigError(f"no AMX rate for {f.name} weights on this machine")
            vos = vos if f.bits == 16 else self.fma_vector_ops  # int: the rounding to bf16
            return Machine(self.mbw, vos, self.amx_flops / gemm_flops_per_op(self.lanes, m), True)
        if f.bits == 16 and self.bf16_dot_ops:
            return Machine(self.mbw, vos, 2 * self.bf16_dot_ops / m, True)
        if self.int8_dot_ops and int_activations(f, k):
            block = ACT8_BLOCK_DOTS + ACT8_BLOCK_SCALING + ACT_BLOCK / f.group_size(k)
            dots = (self.narrow_dot_ops or self.int8_dot_ops) if f.bits < 8 else self.int8_dot_ops
            per_dot = ACT_BLOCK / ACT8_BLOCK_DOTS  # weight vectors a dot8 takes
            return Machine(self.mbw, vos, per_dot * ACT8_MEASURED_BLOCK / block * dots / m, True)
        return Machine(self.mbw, vos, self.fma_vector_ops / m, True)

    def vos_for(self, fmt: str, k: int = SIGNATURE_K) -> float:
        """The format's VOS: a weight vector's dequantization ops over their time, its
        sequence at that sequence's measured rate and its epilogue share at the FMA rate; the
        FMA rate for a format with no sequence (whose only vector work is the epilogue)."""
        d = dequantization(fmt, k, bf16_dot=self.bf16_dot_ops is not None)
        if d.kind is None or d.ops == 0:
            return self.fma_vector_ops
        return d.total / (d.ops / self.vos[d.kind] + d.epilogue_ops / self.fma_vector_ops)


def calibrate(threads: int, *, lanes: int | None = None, read_gbs: float | None = None,
              peak_gflops: float | None = None) -> HostRates:
    """Measure MBW, the FMA rate, the int8 dot product's (dot8) rate in the tile's blocks,
    where the CPU has them the bf16 dot product's and AMX's bf16 tile product's, and the rate
    of each dequantization sequence (VOS), with the tuner's C micro-benchmarks (a few
    seconds), not from vendor tables. A caller that has
    just measured the read (GB/s) and the FMA peak (GFLOPS) passes them, and they are not
    measured again."""
    from sandwich.compiler.target import detect_cpu
    from sandwich.tuner import machine_bench

    lanes = lanes or detect_cpu().lanes_f32
    if read_gbs is None:
        read_gbs = machine_bench.read_bandwidth_gbs(threads)
    if peak_gflops is None:
        peak_gflops = machine_bench.peak_gflops(threads)
    mbw = read_gbs * 1e9
    fma = peak_gflops * 1e9 / (2 * lanes)
    bf16 = machine_bench.peak_bf16_gflops(threads)
    amx = machine_bench.peak_amx_bf16_gflops(threads)
    int8 = machine_bench.int8_block_gops(threads)  # 8 ops per lane of a dot8
    narrow = machine_bench.int8_block_gops(threads, narrow=True) if int8 else None
    vos = {kind: machine_bench.dequant_gops(kind, threads) * 1e9
           for kind in machine_bench.DEQUANT_KINDS}
    return HostRates(threads=threads, lanes=lanes, mbw=mbw, fma_vector_ops=fma, vos=vos,
                     bf16_dot_ops=bf16 * 1e9 / (4 * lanes) if bf16 else None,
                     int8_dot_ops=int8 * 1e9 / (8 * lanes) if int8 else None,
                     narrow_dot_ops=narrow * 1e9 / (8 * lanes) if narrow else None,
                     amx_flops=amx * 1e9 if amx else None)
