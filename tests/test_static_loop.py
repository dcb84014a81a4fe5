"""Issue 30, item 3: the chosen micro-kernels, cross-compiled for Intel, AMD and Arm CPUs,
run their innermost loop within 10% of llvm-mca's FMA bound with no stack spill or reload
(compiler/static_check.py); on the CPUs with avx512_bf16 the bf16 family's loop too, within
10% of its vdpbf16ps alone. Nothing is run, so every host guards every target."""

import os

import pytest

os.environ.setdefault("TVM_NUM_THREADS", "2")

from sandwich.compiler.static_check import (  # noqa: E402
    TOLERANCE,
    check_kernel,
    find_llvm_mca,
    hot_loop,
    stack_traffic,
)
from sandwich.errors import ToolError  # noqa: E402
from sandwich.tuner.space import Isa, micro_kernels, pack_width  # noqa: E402
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization  # noqa: E402

pytestmark = pytest.mark.tvm

K = 768
# N of Llama-160M's o and down (768), qkv (2304) and intermediate size (3072), which pack
# 48 wide on AVX-512, and Sheared-LLaMA's hidden size (2048), which packs 64 wide
SHAPES = (768, 2304, 3072, 2048)
TARGETS = {  # LLVM CPU -> (arch, what bounds its register tile)
    "sapphirerapids": ("x86_64", Isa(lanes=16, registers=32)),
    "znver4": ("x86_64", Isa(lanes=16, registers=32)),
    "skylake-avx512": ("x86_64", Isa(lanes=16, registers=32)),
    "znver3": ("x86_64", Isa(lanes=8, registers=16)),  # AVX2: a 16-register file
    "neoverse-v1": ("aarch64", Isa(lanes=4, registers=32)),
}
# Where llvm-mca 19.1.7 (Debian llvm-19) puts a chosen tile's loop more than 10% over its FMA
# bound (TVM 0.27's LLVM 22 builds, 2026-11-25): (the ratio measured then, why). Such a case
# still fails on a spill or on a ratio worse than that, and reports xfail with today's figures.
_ZEN4 = ("the znver4 model puts every vbroadcastss zmm from memory on FP1, one of the two "
         "FMA pipes (FP1 busy 93% of cycles); on a real Zen 4 the 48- and 64-wide kernels "
         "reach 97-99% of the measured FMA peak at M = 256 (results/cpus/znver4), so the "
         "model is what is off")
KNOWN_SLOW = {
    ("znver4", "9x48"): (1.30, _ZEN4),  # 70.06 cycles/iter vs bound 54.02 (unrolled twice)
    # 120.06 vs 96.03 and 112.06 vs 96.03: prefill's loop, four k an iteration (2026-12-07;
    # before, one k an iteration with decode's prefetch branches in it: 1.21-1.27)
    ("znver4", "8x48"): (1.27, _ZEN4),
    ("znver4", "6x64"): (1.21, _ZEN4),
}


def chosen_tiles(isa: Isa) -> list[tuple[MicroKernel, int, int]]:
    """(tile, pack_n, N): for each shape, the tallest tile as wide as the panel pack_width
    picks, and the 8-row decode tile where that panel has one."""
    out: dict[MicroKernel, tuple[MicroKernel, int, int]] = {}
    for n in SHAPES:
        pack = pack_width(n, isa)
        tiles = micro_kernels(isa, pack, widths=1)
        for mk in [max(tiles, key=lambda t: t.mu_m)] + [t for t in tiles if t.mu_m == 8]:
            out.setdefault(mk, (mk, pack, n))
    return list(out.values())


# CPUs whose LLVM model has avx512_bf16: their bf16 family multiplies with vdpbf16ps (spliced
# into the IR after TVM, compiler/llvm_splice.py), which the check then counts as the products
BF16_TARGETS = ("sapphirerapids", "znver4")


def _cases():
    for target, (arch, isa) in TARGETS.items():
        for mk, pack, n in chosen_tiles(isa):
            yield pytest.param(target, arch, mk, pack, n, "float32",
                               id=f"{target}-{mk.mu_m}x{mk.mu_n}")
            if target in BF16_TARGETS:
                yield pytest.param(target, arch, mk, pack, n, "bf16",
                                   id=f"{target}-{mk.mu_m}x{mk.mu_n}-bf16")


def _schedule(mk: MicroKernel, pack: int, dtype: str = "float32") -> KernelSchedule:
    return KernelSchedule(mk, ComputeSlice(mk.mu_m, mk.mu_n, 16), Polymerization(1, 1, 1), pack,
                          dtype=dtype)


def _check(mk, pack, n, *, target, arch, dtype="float32"):
    try:
        find_llvm_mca()
        return check_kernel(_schedule(mk, pack, dtype), mcpu=target, n=n, k=K, arch=arch)
    except ToolError as e:  # no llvm-mca, or one (or a TVM) that does not know the CPU
        pytest.skip(str(e))


@pytest.mark.parametrize("target,arch,mk,pack,n,dtype", list(_cases()))
def test_hot_loop_within_fma_bound(target, arch, mk, pack, n, dtype):
    r = _check(mk, pack, n, target=target, arch=arch, dtype=dtype)
    print(f"{target} {r.tile} {dtype}: {r.cycles_per_iter:.2f} cycles/iter, bound "
          f"{r.fma_bound:.2f}, ratio {r.ratio:.3f}, {r.fmas} x {'/'.join(r.products)}, "
          f"{len(r.spills)} stack ops, {r.sign_extensions} sign-extensions, "
          f"llvm-mca {r.mca_version}")
    if dtype == "bf16":  # the loop multiplies bf16 pairs as they are, not widened to f32
        assert r.products == ("vdpbf16ps",), f"{target} {r.tile} bf16 multiplies with {r.products}"
    assert not r.spills, f"{target} {r.tile}: stack spill/reload in the hot loop: {r.spills}"
    figures = (f"{r.cycles_per_iter:.2f} cycles/iter, {r.ratio:.2f}x the FMA bound "
               f"{r.fma_bound:.2f} (llvm-mca {r.mca_version})")
    known = KNOWN_SLOW.get((target, r.tile)) if dtype == "float32" else None
    if known and r.ratio > TOLERANCE:
        assert r.ratio <= known[0] + 0.02, f"{target} {r.tile}: {figures}, worse than {known[0]}x"
        pytest.xfail(f"{figures}: {known[1]}")
    assert r.ratio <= TOLERANCE, f"{target} {r.tile}: {figures}"


def test_spilling_tile_fails():
    """8x64 on AVX-512 needs 8*4 accumulators + 4 W vectors + 1 broadcast = 37 > 32
    registers: the check must catch the spills (llvm-mca's cycles alone barely move)."""
    r = _check(MicroKernel(8, 64), 64, 2048, target="sapphirerapids", arch="x86_64")
    print(f"spilling 8x64: {r.cycles_per_iter:.2f} cycles/iter, bound {r.fma_bound:.2f}, "
          f"stack ops: {r.spills}")
    assert r.spills and not r.ok


def test_loop_finder_and_stack_rules():
    """No tools needed: the main tile's loop wins over an unrolled tail with more FMAs, and
    %rbp is a stack slot only when the function keeps a frame pointer."""
    main = [f"\tvfmadd231ps\t%zmm30, %zmm31, %zmm{i}" for i in range(9)]
    tail = [f"\tvfmadd231ps\t%zmm30, %zmm31, %zmm{i % 4}" for i in range(12)]
    asm = "\n".join(
        [".LBB0_1:", *tail, "\tjne\t.LBB0_1",
         ".LBB0_2:", "\tvbroadcastss\t(%rbp,%rax,4), %zmm31", "\tvmovups\t64(%rsp), %zmm9",
         "\tleaq\t8(%rsp), %rcx", *main, "\tjne\t.LBB0_2  # loop"])
    loop = hot_loop(asm)
    assert loop[0] == ".LBB0_2:" and loop[-1].split() == ["jne", ".LBB0_2"]
    assert stack_traffic(loop, asm=asm) == ("vmovups\t64(%rsp), %zmm9",)
    framed = "\tmovq\t%rsp, %rbp\n" + asm
    assert len(stack_traffic(hot_loop(framed), asm=framed)) == 2


def test_x29_is_a_stack_slot_only_in_a_frame():
    """AArch64 likewise: LLVM may use x29 as a pointer into A (ld1r {v9.4s}, [x29], #4) when
    the function keeps no frame; only [sp], or [x29] after `mov x29, sp`, is a stack slot."""
    asm = "\n".join([".LBB0_1:", "\tld1r\t{ v9.4s }, [x29], #4", "\tldr\tq1, [sp, #560]",
                     "\tfmla\tv0.4s, v9.4s, v30.4s", "\tb.ne\t.LBB0_1"])
    loop = hot_loop(asm, arch="aarch64")
    assert stack_traffic(loop, asm=asm, arch="aarch64") == ("ldr\tq1, [sp, #560]",)
    framed = "\tmov\tx29, sp\n" + asm
    assert len(stack_traffic(hot_loop(framed, arch="aarch64"), asm=framed, arch="aarch64")) == 2
