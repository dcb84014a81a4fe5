"""The sandwich-kernel search space: micro-kernels, polymerizations and slice limits."""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

K_UNIT = 16  # b_k grows in cache lines of fp32 (64 bytes)


@dataclass(frozen=True)
class Isa:
    """What bounds a register tile: fp32 lanes per vector and the number of vector registers."""

    lanes: int
    registers: int


def registers_used(mk: MicroKernel, isa: Isa) -> int:
    """Accumulators + one row of W vectors + one broadcast register."""
    vec_n = mk.mu_n // isa.lanes
    return mk.mu_m * vec_n + vec_n + 1


def tallest_rows(isa: Isa, vec_n: int) -> int:
    """Rows of the tallest register tile `vec_n` vectors wide (see registers_used)."""
    return (isa.registers - 1 - vec_n) // vec_n


# a register tile narrower than the packed panel is tried only where the machine model's
# probe of its width's tallest tile comes this close to the panel width's own
NARROW_KEEP = 0.85


# dsl/kernels/gemm_family.sw runs prefill's fp32 loop (M > 8) four k an iteration for tiles
# of up to this many accumulators, one k above (unrolled, LLVM's schedule spills a 9 x 48
# tile on skylake-avx512); a test ties the two
PREFILL_UNROLLED_ACCUMULATORS = 24


def unrolled_in_prefill(mk: MicroKernel, lanes: int) -> bool:
    """Whether the fp32 family runs this tile's prefill loop four k an iteration."""
    return mk.mu_m * (mk.mu_n // lanes) <= PREFILL_UNROLLED_ACCUMULATORS


def tile_widths(isa: Isa, pack_n: int) -> list[int]:
    """The register tile widths (mu_n) a packed panel of pack_n floats holds: the multiples
    of the vector that divide it, widest first."""
    return [v * isa.lanes for v in range(pack_n // isa.lanes, 0, -1) if pack_n % (v * isa.lanes) == 0]


def micro_kernels(isa: Isa, pack_n: int, *, widths: int = 3, max_rows: int = 8,
                  panel_gflops: dict[int, float] | None = None) -> list[MicroKernel]:
    """Register tiles that fit the register file without spilling, widest first.

    mu_n takes the `widths` widest multiples of the vector that divide the packed width;
    mu_m takes 1..max_rows (skinny M wants exact row counts) plus the tallest tile that fits
    (the most register reuse, which large M wants).

    With the machine model's panel probe, a narrower width whose probe falls short of the
    packed width's by more than NARROW_KEEP is left out: on a 16-register AVX2 Zen 3 a
    one-vector tile reaches 46 GFLOPS against 75 for two vectors, and in three default tunes
    there (Llama-160M, Sheared-LLaMA-1.3B twice: 311 winners) no narrow tile ever won, while
    each was built, checked and probed at every M of the sliding window. With 32 registers
    a one-vector tile is tall enough to feed the FMA units, and one won Llama-160M's o on Zen 4
    (8 x 16 in a 48-wide panel)."""
    mus_n = tile_widths(isa, pack_n)
    full = (panel_gflops or {}).get(pack_n // isa.lanes, 0.0)
    if full > 0:
        mus_n = [mu for mu in mus_n if mu == pack_n
                 or panel_gflops.get(mu // isa.lanes, full) >= NARROW_KEEP * full]
    out = []
    for mu_n in mus_n[:widths]:
        vec_n = mu_n // isa.lanes
        tallest = tallest_rows(isa, vec_n)
        rows = sorted({r for r in range(1, min(max_rows, tallest) + 1)} | {tallest})
        out.extend(MicroKernel(r, mu_n) for r in rows if r >= 1)
    return out


def decode_batch_tile(isa: Isa, pack_n: int, rows: int) -> MicroKernel | None:
    """The widest tile of `rows` rows (a whole decode batch) whose width divides the panel,
    where the panel's own width holds fewer rows (None where it holds them, or nothing does).

    For formats whose tile converts each weight vector before its products (int4's nibble
    split: roofsurface.dequantization), the conversion runs once per row block, so a batch
    split into two blocks converts each weight twice. On the Sapphire Rapids VM (2 threads,
    int4-g32 with VNNI, weights rotated beyond the LLC) an 8 x 32 tile in the 64-wide panels
    ran M = 8 x1.04-1.06 faster than the 4 x 64 tile in two blocks on all four of
    Sheared-LLaMA's shapes, though it walks each panel twice along K."""
    if tallest_rows(isa, pack_n // isa.lanes) >= rows:
        return None
    return next((MicroKernel(rows, mu) for mu in tile_widths(isa, pack_n)
                 if tallest_rows(isa, mu // isa.lanes) >= rows), None)


def kernel_n(n: int, lanes: int) -> int:
    """The N a GEMM is tuned and run at: N rounded up to whole vectors. A vocabulary of
    32001 or 49153 runs on the kernel of the next multiple, its weights packed with zero
    columns and the extra outputs dropped, so no model dimension has to be changed."""
    return -(-n // lanes) * lanes


# panel probes this close count as a tie, which the wider panel wins: three probes of a
# Zen 3 spread by up to 3% per width (fixed slice grid, interleaved rounds)
PANEL_TIE = 0.05


def pack_width(n: int, isa: Isa, *, rows: int = 8, panel_gflops: dict[int, float] | None = None) -> int:
    """The packed weight panel width in floats (0 when no whole vector divides N).

    Without a measured machine model: the widest of 4, 3, 2 or 1 vectors that divides N.
    With one (`panel_gflops`: the machine model's probe of each width's tallest register
    tile, tuner/machine_model.py), the widest whose probe is within PANEL_TIE of the best
    probe among those that divide N: on a 16-register AVX2 core the 4-vector panel's tallest
    tile has 2 rows, and the probe says whether that feeds the FMA units as well as a
    narrower, taller tile. Either way, a panel of at least 3/4 of that width (that also
    divides N) whose register tile is as tall as `rows`, a whole decode batch, replaces it
    when it is not.

    Every M of an (N, K) shares one packing. With 32 AVX-512 registers a 4-vector panel's
    tallest tile has 6 rows, so M = 7 and 8 need a tail pass that re-reads each weight panel
    from L2 while the DRAM stream idles; a 3-vector panel (N = 768: 48 floats) holds 8 rows.
    Measured with the tuner's own timing in interleaved rounds, 3 against 4 vectors: o
    (768 x 768) streamed, M = 8: 149 against 139 GFLOPS (the 6-row tile and its tail), M = 1:
    17.4 / 17.2, M = 4: 69.2 / 68.5; qkv (2304 x 768) streamed, M = 8: 145 / 135; hot
    weights, qkv M = 32: 227.3 / 227.1, o M = 512: 229.0 / 227.3."""
    widths = [v for v in (4, 3, 2, 1) if n % (v * isa.lanes) == 0]
    if not widths:
        return 0
    probed = {v: g for v, g in (panel_gflops or {}).items() if v in widths and g > 0}
    if probed:
        best = max(probed.values())
        widths = [v for v in widths if v <= max(u for u, g in probed.items()
                                                if g >= (1 - PANEL_TIE) * best)]
    width = widths[0]
    if tallest_rows(isa, width) < rows:
        width = next((v for v in widths if tallest_rows(isa, v) >= rows and 4 * v >= 3 * widths[0]),
                     width)
    return width * isa.lanes


def polymerizations(threads: int, *, split_k: bool = True) -> list[Polymerization]:
    """Every (t_m, t_n, t_k) whose product is the thread count."""
    out = []
    for t_m in range(1, threads + 1):
        if threads % t_m:
            continue
        rest = threads // t_m
        for t_n in range(1, rest + 1):
            if rest % t_n:
                continue
            t_k = rest // t_n
            if t_k > 1 and not split_k:
                continue
            out.append(Polymerization(t_m, t_n, t_k))
    return out


def _ceil_div(x: int, unit: int) -> int:
    return -(-x // unit)


def _round_up(x: int, unit: int) -> int:
    return _ceil_div(x, unit) * unit


def slice_caps(m: int, n: int, k: int, mk: MicroKernel, pl: Polymerization) -> ComputeSlice:
    """Largest slice that still leaves every thread of `pl` some work along each dimension."""
    return ComputeSlice(
        b_m=max(mk.mu_m, _round_up(_ceil_div(m, pl.t_m), mk.mu_m)),
        b_n=max(mk.mu_n, _round_up(_ceil_div(n, pl.t_n), mk.mu_n)),
        b_k=max(K_UNIT, _round_up(_ceil_div(k, pl.t_k), K_UNIT)),
    )


def clamp(s: ComputeSlice, caps: ComputeSlice) -> ComputeSlice:
    return ComputeSlice(min(s.b_m, caps.b_m), min(s.b_n, caps.b_n), min(s.b_k, caps.b_k))


def cache_blocked_slice(mk: MicroKernel, m: int, n: int, k: int, pl: Polymerization, *,
                        l1_bytes: int, l2_bytes: int) -> ComputeSlice:
    """The slice this CPU's caches ask for at a compute-bound (prefill) M, for fp32 weights
    (4 bytes a value; the search asks it of fp32 only), sized as BLIS's analytical model
    sizes its blocks (Low et al., TOMS 2016) for the family's loop order: a tile's panel of weights (mu_n x b_k) takes half of L1, the row block of A that every
    tile of the slice re-reads is two tiles tall (L1 holds it beside the panel), and the
    slice's weights (b_n x b_k), which every row block re-reads, a quarter of one core's L2.
    Clamped to what leaves each thread of `pl` work.

    Fast start grows a slice from one tile only while each step gains 2%, and noisy timings
    stop it early: on Zen 3 (2 threads) a quick tune kept Llama-160M's lm_head (32000 x 768)
    at a 6 x 16 x 272 slice, one tile wide, 170 GFLOPS at M = 1024, where this slice,
    12 x 128 x 256 split along M, ran 184 (numpy 182) in the same rounds."""
    b_k = max(K_UNIT, l1_bytes // (2 * mk.mu_n * 4) // K_UNIT * K_UNIT)
    tiles = max(1, l2_bytes // (4 * mk.mu_n * b_k * 4))
    return clamp(ComputeSlice(2 * mk.mu_m, tiles * mk.mu_n, b_k), slice_caps(m, n, k, mk, pl))


def align(s: ComputeSlice, mk: MicroKernel) -> ComputeSlice:
    """A slice found with another micro-kernel, in whole tiles of `mk` (at least one each
    way): a 1-row slice would give a 2-row tile zero row blocks."""
    def whole(size: int, tile: int) -> int:
        return max(tile, round(size / tile) * tile)
    return ComputeSlice(whole(s.b_m, mk.mu_m), whole(s.b_n, mk.mu_n), s.b_k)


def useful(pl: Polymerization, m: int, n: int, k: int, mk: MicroKernel) -> bool:
    """A polymerization is worth trying only if each of its threads gets some work, and
    split-K only while its partial sums stay cheap: the t_k partial M x N results are
    written and read back (2 t_k M N floats) to save streaming time on the K x N weights,
    which pays only while that traffic is at most a quarter of the weights' (8 t_k M <= K).
    Past that, M and N have tiles for every thread anyway, and a lucky timing could pick
    a 0.5 GB workspace (Sheared-LLaMA's lm_head at M = 2048 did)."""
    blocks_m = max(1, m // mk.mu_m)
    if pl.t_k > 1 and 8 * pl.t_k * m > k:
        return False
    return pl.t_m <= blocks_m and pl.t_n <= n // mk.mu_n and pl.t_k <= _ceil_div(k, K_UNIT)


def weight_imbalance(s: KernelSchedule, n: int, k: int) -> float:
    """How much more of the weights the busiest thread streams than an even share (1.0 when
    even). Threads split N into slices of b_n and K into panels of b_k (see the template's
    thread loop), and the first thread of each dimension gets the most of both."""
    mk, sl, pl = s.micro_kernel, s.slice, s.polymerization
    tiles = n // mk.mu_n
    bnt = sl.b_n // mk.mu_n
    slices_per_thread = _ceil_div(_ceil_div(tiles, bnt), pl.t_n)
    panels_per_thread = _ceil_div(_ceil_div(k, sl.b_k), pl.t_k)
    cols = min(slices_per_thread * bnt, tiles) / tiles
    rows = min(panels_per_thread * sl.b_k, k) / k
    return cols * pl.t_n * rows * pl.t_k


def stream_pause_share(s: KernelSchedule, m: int) -> float:
    """The share of the tail thread's rows whose pass stalls its weight stream: the M mod
    mu_m tail rows behind one or more full row blocks. Up to M = 8 the kernel
    (dsl/kernels/gemm_family.sw) prefetches the stream's next rows while a second or later
    row block re-reads a tile from L2, but not while the tail does, so DRAM idles for that
    share of the thread's time; a tail with no block before it streams the tile itself."""
    _, own, tail = m_thread_blocks(s, m)
    mu_m = s.micro_kernel.mu_m
    return tail / (own * mu_m + tail) if own and tail else 0.0


def m_thread_blocks(s: KernelSchedule, m: int) -> tuple[int, int, int]:
    """How the family's thread loop splits M: the full blocks of mu_m rows each M-thread but
    the last takes (ceil(blocks / t_m)), the last one's full blocks, and the tail rows
    (M mod mu_m), which the last one owns besides."""
    mu_m, t_m = s.micro_kernel.mu_m, s.polymerization.t_m
    blocks, tail = divmod(m, mu_m)
    per_thread = _ceil_div(blocks, t_m)
    return per_thread, blocks - min((t_m - 1) * per_thread, blocks), tail
