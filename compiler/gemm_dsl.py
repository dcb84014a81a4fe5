"""The tuner's GEMM family built from the DSL (dsl/kernels/gemm_family.sw).

`build_gemm_dsl` is a drop-in for `compiler.build.build_gemm`: the same schedules are
valid, and the executable has the same calling convention,
`main(A[M, K], W[N/pack_n, K, pack_n], C[M, N], [WS[t_k*M, N]], bmb, bnt, bk)`.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from sandwich.compiler.amx import request_tiles
from sandwich.compiler.build import compile_source
from sandwich.compiler.gemm_formats import (
    ACT_BLOCK,
    amx8_format,
    amx_format,
    int_activations,
    op_takes,
    weight_args,
    weight_format,
)
from sandwich.compiler.gemm_template import GemmProblem, validate
from sandwich.compiler.lower_tir import to_tvmscript
from sandwich.compiler.lower_vector import sums_in_16_bits
from sandwich.compiler.target import CpuInfo
from sandwich.errors import ConfigError, DSLError, first_line
from sandwich.types import (
    AMX8_OP,
    AMX_OP,
    ComputeSlice,
    KernelSchedule,
    MicroKernel,
    Polymerization,
)
from sandwich.weight_formats import WeightFormat

KERNEL = "gemm_family"
# GEMMs on x86 AMX tiles, bf16 products (dsl/kernels/gemm_amx_bf16.sw): a schedule of op AMX_OP
# runs it on the family's packed weights (bf16, or int8 / int4 rounded to bf16 a block at a
# time), so one packing serves both kernels
AMX_KERNEL = "gemm_amx_bf16"
AMX_BLOCK = 32  # the C block its four accumulator tiles hold (rows and columns)
AMX_ROWS = 256  # the most rows of A a thread's pass over W takes (amx_schedules)
# Int weights on AMX tiles with byte products (dsl/kernels/gemm_amx_int8.sw), a schedule of op
# AMX8_OP: the family's packed weights and 8-bit activations, 16 rows a tile
AMX8_KERNEL = "gemm_amx_int8"
AMX8_ROWS = 16
AMX8_PREFETCH = 4  # blocks of 32 values along K ahead that its weights are prefetched
_KERNELS = {AMX_OP: AMX_KERNEL, AMX8_OP: AMX8_KERNEL}


@lru_cache(maxsize=1)
def _kernel():
    from sandwich.dsl.load import load_kernel

    return load_kernel(KERNEL)


def load_family(path: str | Path, name: str = KERNEL):
    """The kernel `name` (the family's, or AMX_KERNEL) of another source file (an edited copy
    of the shipped one, to time against it); ConfigError when the file does not parse or has
    no such kernel."""
    from sandwich.dsl.load import load_file

    try:
        module = load_file(path)
    except DSLError as e:
        raise ConfigError(f"{path}: {first_line(e)}") from None
    for kernel in module.kernels:
        if kernel.name == name:
            return kernel
    raise ConfigError(f"{path} has no kernel named {name}")


_LOWERING_PACKAGES = ("sandwich.compiler", "sandwich.dsl")


def _module_file(name: str) -> Path | None:
    """The file of a module of the compiler or the DSL, found from its package's folder."""
    import importlib

    for package in _LOWERING_PACKAGES:
        if name == package or name.startswith(package + "."):
            root = Path(importlib.import_module(package).__file__).parent
            parts = name.split(".")[2:]
            for candidate in (root.joinpath(*parts[:-1], f"{parts[-1]}.py") if parts else None,
                              root.joinpath(*parts, "__init__.py")):
                if candidate is not None and candidate.is_file():
                    return candidate
    return None


def _imported_names(module: str, path: Path) -> set[str]:
    """Absolute names of every module `path` imports (top level or inside functions);
    `from X import y` names both X and X.y, since y may be a submodule."""
    import ast

    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def lowering_files() -> list[Path]:
    """The family's source, the DSL grammars, and every compiler or DSL module that
    building the family imports (followed through their own imports). A module the build
    never reaches (a command line, a benchmark) is not part of the kernel's key."""
    import sandwich.dsl
    from sandwich.dsl.load import builtin_kernels

    seen: dict[str, Path] = {}
    todo = [__name__]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        todo += [n for n in _imported_names(name, path)
                 if n not in seen and n.startswith(_LOWERING_PACKAGES)]
    grammars = sorted(Path(sandwich.dsl.__file__).parent.rglob("*.lark"))
    kernels = builtin_kernels()
    return [kernels[KERNEL], kernels[AMX_KERNEL], *grammars, *(seen[n] for n in sorted(seen))]


@lru_cache(maxsize=1)
def family_source_sha256() -> str:
    """Hash of everything that turns a schedule into a `.so` (`lowering_files`). The kernel
    cache keys on it, so kernels built by an older version of the algorithm or of the
    lowering are not reused."""
    digest = hashlib.sha256()
    for f in lowering_files():
        digest.update(f"{f.parent.name}/{f.name}\0".encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def family_tunables(schedule: KernelSchedule, k: int, *, h16: bool = False) -> dict[str, int]:
    """The kernel's tunables for a schedule's family (its slice is a runtime argument)."""
    mk, pl = schedule.micro_kernel, schedule.polymerization
    return {"mu_m": mk.mu_m, "mu_n": mk.mu_n, "pack_n": schedule.pack_n,
            "t_m": pl.t_m, "t_n": pl.t_n, "t_k": pl.t_k,
            **format_tunables(weight_format(schedule.dtype), k, h16=h16)}


def format_tunables(fmt: WeightFormat, k: int, *, h16: bool = False) -> dict[str, int]:
    """The tunables that follow from the weight format (and K, for act); `h16`: the target
    sums int4's and int5's products in 16 bits (x86 without VNNI: pmaddubsw + paddw)."""
    return {"bits": fmt.bits, "asym": int(not fmt.symmetric),
            "s32": int(fmt.scale_dtype == "float32"), "act": int(int_activations(fmt, k)),
            "sup": int(bool(fmt.super_group) and not fmt.symmetric), "h16": int(h16)}


def gemm_dsl_tvmscript(schedule: KernelSchedule, *, n: int, k: int, lanes: int, l2_bytes: int,
                       isa: str | None = None, bf16_dot: bool = False,
                       int8_dot: bool = False, kernel=None) -> str:
    """TVMScript of the family; refuses the schedules the hand template refuses. `l2_bytes`:
    one core's L2, which sizes the chunks of rows a thread runs one after another; `bf16_dot`:
    the target has avx512_bf16, so bf16 weights take vdpbf16ps (else f32 FMAs on them);
    `int8_dot`: it has AVX512-VNNI, so the int formats' dot8 is vpdpbusd (else pmaddwd, and
    int4 and int5 sum their products in 16 bits);
    `kernel`: another version of the family (load_family), else the shipped one."""
    validate(schedule, GemmProblem(n=n, k=k, lanes=lanes))
    split_k = schedule.polymerization.t_k > 1
    args = ("A", *weight_args(schedule.dtype, k), "C") + (("WS",) if split_k else ()) + ("bmb", "bnt", "bk")
    fmt = weight_format(schedule.dtype)
    try:
        # align=4: activations are numpy views (not 64-byte aligned), as in the hand
        # template; "inline" scalars: no let variables, which TVM 0.27 puts in heap
        # workspace and reloads after every store (the hand template pays for that)
        h16 = sums_in_16_bits(isa, int8_dot)
        return to_tvmscript(kernel or _kernel(), tunables=family_tunables(schedule, k, h16=h16), vlen=lanes,
                            fixed={"N": n, "K": k, "G": fmt.group_size(k), "L2": l2_bytes}, args=args, align=4,
                            scalars="inline", fold=True, isa=isa, bf16_dot=bf16_dot,
                            int8_dot=int8_dot)
    except DSLError as e:  # e.g. a tile outside the kernel's tunable domains
        raise ConfigError(f"GEMM schedule {schedule.key()} is outside {KERNEL}.sw: {e}") from e


def amx_schedules(*, n: int, k: int, pack_n: int, threads: int, cpu: CpuInfo,
                  dtype: str = "bf16") -> list[KernelSchedule]:
    """The schedules that may run a GEMM of (N, K) with `dtype` weights, packed pack_n wide, on
    AMX tiles, for the tuner to measure at each M; none where the kernel cannot run it: no
    AMX-BF16 on `cpu`, a format it does not take (amx_format), a panel or K that its 32 x 32
    blocks do not divide, or `threads` outside its domains. Int weights are rounded to bf16 a
    block (b_n x b_k) at a time into a buffer that takes the block's place in L2. The tile
    (mk32x32) names the C block; the slice carries the kernel's built-in blocks (b_m rows a
    pass, b_n columns, b_k depth); the polymerization its threads.
    - the rows split over the threads, W in blocks of b_n columns that take a quarter of L2
      and K in blocks of b_k whose 32 rows of A take a third of L1: 768 x 768 at M = 512
      1.43x the panel split below, 2304 x 768 1.23x, lm_head 1.21x (SPR, 2 threads);
    - the panels split, one a block, K whole (the first kernel's order): as fast or faster
      at K = 3072 and at M = 64 on a wide N (there the row split streams all of W to each
      thread).
    Both take a thread's rows b_m at a time, their A within 3/8 of L2 and at most AMX_ROWS:
    at M >= 1024 the row split ran 1.45x (lm_head), 1.6x (768 x 3072) with them, the same
    at M = 512; 512 rows of K = 768 were slower than 256 (W's blocks pass once a chunk).
    - the row split in the largest blocks, where they differ from the first's: a long K
      shrinks the first's blocks (Sheared's down, 2048 x 5504: b_m 64, b_n 64), which ran
      1193 GFLOPS at M = 512 where 256 rows and 320 columns ran 1905 and 1024 columns 1750
      (SPR VM, 2 threads; torch's bf16 1367 and OpenVINO's 1224 in the same rounds)."""
    if not cpu.amx or pack_n % AMX_BLOCK or n % pack_n or k % AMX_BLOCK or not amx_format(dtype, k):
        return []
    doms = _amx_domains(cpu.lanes_f32)
    if threads not in doms["t_m"]:
        return []
    fits_l2 = [v for v in doms["b_n"] if v % pack_n == 0 and v * k * 2 <= cpu.l2_bytes // 4]
    fits_l1 = [v for v in doms["b_k"] if AMX_BLOCK * v * 2 <= cpu.l1d_bytes // 3]
    rows_l2 = [v for v in doms["b_m"] if v <= AMX_ROWS and v * k * 2 <= 3 * cpu.l2_bytes // 8]
    whole_k = min((v for v in doms["b_k"] if v >= k), default=max(doms["b_k"]))
    b_m = max(rows_l2, default=AMX_BLOCK)

    def schedule(split: Polymerization, b_n: int, b_k: int) -> KernelSchedule:
        return KernelSchedule(MicroKernel(AMX_BLOCK, AMX_BLOCK), ComputeSlice(b_m, b_n, b_k),
                              split, pack_n, AMX_OP, dtype)
    b_k = max(fits_l1, default=AMX_BLOCK)
    out = [schedule(Polymerization(threads, 1, 1), max(fits_l2, default=pack_n), b_k),
           schedule(Polymerization(1, threads, 1), pack_n, whole_k)]
    # the row split in the largest blocks: AMX_ROWS rows a pass and W's blocks of b_k rows (not
    # of all K) in a quarter of L2, A's rows re-read from the LLC for each block of panels
    block_l2 = [v for v in doms["b_n"] if v % pack_n == 0 and v * b_k * 2 <= cpu.l2_bytes // 4]
    most_rows = max((v for v in doms["b_m"] if v <= AMX_ROWS), default=AMX_BLOCK)
    large = KernelSchedule(MicroKernel(AMX_BLOCK, AMX_BLOCK),
                           ComputeSlice(most_rows, max(block_l2, default=pack_n), b_k),
                           Polymerization(threads, 1, 1), pack_n, AMX_OP, dtype)

    def blocks(s: KernelSchedule) -> tuple[int, int, int, Polymerization]:  # as they run
        return s.slice.b_m, min(s.slice.b_n, n), min(s.slice.b_k, k), s.polymerization
    return out if any(blocks(large) == blocks(s) for s in out) else [*out, large]


def amx8_schedules(*, n: int, k: int, pack_n: int, threads: int, cpu: CpuInfo,
                   dtype: str) -> list[KernelSchedule]:
    """The schedule that may run a GEMM of (N, K) with int8 / int4 weights (amx8_format) on AMX
    tiles with byte products, for the tuner to measure at each M; none where it cannot: no
    AMX-INT8 on `cpu`, another format, a panel other than 32 or 64 columns, or `threads`
    outside its domains. The panels split over the threads; each takes blocks of b_n columns
    whose weights fit a quarter of L2, where every 16 rows after the first re-read them (the
    slice's b_m is the tile's 16 rows, b_k its 32 values of K)."""
    if not cpu.amx_int8 or pack_n not in (32, 64) or n % pack_n or not amx8_format(dtype, k):
        return []
    doms = _amx_domains(cpu.lanes_f32, AMX8_KERNEL)
    if threads not in doms["t_n"]:
        return []
    bits = weight_format(dtype).bits
    fits_l2 = [v for v in doms["b_n"]
               if v % pack_n == 0 and v <= n and v * k * bits // 8 <= cpu.l2_bytes // 4]
    return [KernelSchedule(MicroKernel(AMX8_ROWS, pack_n),
                           ComputeSlice(AMX8_ROWS, max(fits_l2, default=pack_n), ACT_BLOCK),
                           Polymerization(1, threads, 1), pack_n, AMX8_OP, dtype)]


@lru_cache(maxsize=None)
def _amx_domains(lanes: int, name: str = AMX_KERNEL) -> dict[str, tuple[int, ...]]:
    from sandwich.dsl.load import load_kernel
    from sandwich.dsl.space import domains

    return domains(load_kernel(name), vlen=lanes)


def amx_panel(*, n: int, k: int, pack_n: int, cpu: CpuInfo, dtype: str = "bf16") -> int:
    """The panel width a GEMM's weights are packed in where the AMX kernel can run it:
    `pack_n` when its 32-column blocks divide it, else 64 or 32 columns, the widest that
    divides N. On a Sapphire Rapids VM the probe ranked 48-wide panels best, which left the
    AMX kernel (5-8x the vdpbf16ps family there) out of every GEMM but lm_head; the decode
    Ms then run the family on 64-wide panels instead. `pack_n` where AMX cannot run."""
    if not cpu.amx or k % AMX_BLOCK or pack_n % AMX_BLOCK == 0 or not amx_format(dtype, k):
        return pack_n
    return next((w for w in (2 * AMX_BLOCK, AMX_BLOCK) if n % w == 0 and w % cpu.lanes_f32 == 0),
                pack_n)


def amx_tunables(schedule: KernelSchedule) -> dict[str, int]:
    """An AMX kernel's tunable values for an AMX_OP or AMX8_OP schedule (amx_schedules,
    amx8_schedules)."""
    p, b = schedule.polymerization, schedule.slice
    fmt = weight_format(schedule.dtype)
    weights = {"bits": fmt.bits, "asym": int(not fmt.symmetric),
               "s32": int(fmt.scale_dtype == "float32")}
    if schedule.op == AMX8_OP:
        return {"pack_n": schedule.pack_n, "t_n": p.t_n, "b_n": b.b_n, "pf": AMX8_PREFETCH,
                **weights}
    return {"pack_n": schedule.pack_n, "t_m": p.t_m, "t_n": p.t_n, "b_m": b.b_m, "b_n": b.b_n,
            "b_k": b.b_k, **weights}


def kernel_name(op: str) -> str:
    """The kernel an op's schedules build: the family's, or one of the AMX kernels."""
    return _KERNELS.get(op, KERNEL)


def amx_tvmscript(schedule: KernelSchedule, *, n: int, k: int, lanes: int,
                  isa: str | None = None, bf16_dot: bool = False, kernel=None) -> str:
    """TVMScript of an AMX kernel for an AMX_OP or AMX8_OP schedule, called as the family is
    without its slice: main(A[M, K], <weight arrays>, C[M, N]), M from A; the weight arrays as
    the family takes them (gemm_formats.weight_args: WB for bf16, Q8Q or Q4Q and the scales).
    `isa` and `bf16_dot` (CpuInfo's): with avx512_bf16, A and int weights are rounded to bf16
    by vcvtne2ps2bf16. `kernel`: another version of it (load_family), else the shipped one."""
    from sandwich.dsl.load import load_kernel

    if schedule.op not in _KERNELS or not op_takes(schedule.op, schedule.dtype, k):
        raise ConfigError(f"schedule {schedule.key()} is not an AMX schedule of a format its "
                          f"kernel takes (bf16 on bf16 products; int8 and int4 in groups of 32 "
                          f"values on both)")
    fmt = weight_format(schedule.dtype)
    name = _KERNELS[schedule.op]
    try:
        return to_tvmscript(kernel or load_kernel(name), tunables=amx_tunables(schedule),
                            vlen=lanes, fixed={"N": n, "K": k, "G": fmt.group_size(k)},
                            args=("A", *weight_args(schedule.dtype, k), "C"), align=4,
                            scalars="inline", fold=True, amx=True, isa=isa, bf16_dot=bf16_dot,
                            amx_int8=schedule.op == AMX8_OP)
    except DSLError as e:
        raise ConfigError(f"GEMM schedule {schedule.key()} is outside {name}.sw: {e}") from e


def build_gemm_dsl(schedule: KernelSchedule, *, n: int, k: int, cpu: CpuInfo, threads: int,
                   kernel=None):
    """Compile the DSL GEMM for the family of one schedule (any M, any slice); `kernel`: as
    in gemm_dsl_tvmscript. An AMX_OP schedule builds the AMX kernel instead (only for a CPU
    with AMX-BF16), an AMX8_OP one the byte-product kernel (AMX-INT8); `kernel` then a version
    of that one; and this process asks Linux for the tile state it runs with."""
    if schedule.op in _KERNELS:
        if not (cpu.amx_int8 if schedule.op == AMX8_OP else cpu.amx):
            need = "AMX-INT8" if schedule.op == AMX8_OP else "AMX-BF16"
            raise ConfigError(f"schedule {schedule.key()} needs {need}, which {cpu.mcpu} lacks")
        src = amx_tvmscript(schedule, n=n, k=k, lanes=cpu.lanes_f32, isa=cpu.isa,
                            bf16_dot=cpu.bf16_dot, kernel=kernel)
        request_tiles()
    else:
        src = gemm_dsl_tvmscript(schedule, n=n, k=k, lanes=cpu.lanes_f32, l2_bytes=cpu.l2_bytes,
                                 isa=cpu.isa, bf16_dot=cpu.bf16_dot, int8_dot=cpu.int8_dot,
                                 kernel=kernel)
    return compile_source(src, cpu, threads)
