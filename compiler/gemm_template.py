"""The fp32 GEMM template: a kernel family (micro-kernel x polymerization) -> TVMScript.

C[M, N] = A[M, K] @ W with W packed once as Wp[N / pack_n, K, pack_n]. M is symbolic, and
the computation slice (b_m, b_n, b_k) is passed at call time, so one compiled kernel serves
every M and every slice of its family: the search times slices without recompiling.
Rows come in blocks of mu_m (the register tile); the M % mu_m tail rows are done inside the
same slice loop with power-of-two micro-kernels, while the weight tile is still hot, so no
activation is padded or copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.errors import ConfigError
from sandwich.types import KernelSchedule

# TVM keeps CPU allocations on the stack (so LLVM can promote them to registers) only for
# "global" scope buffers below 1024 bytes; one accumulator row per buffer stays under it.
_MAX_STACK_BYTES = 1024
# independent FMA chains needed to hide FMA latency (latency 4 x 2 pipes)
_MIN_CHAINS = 8


@dataclass(frozen=True)
class GemmProblem:
    """The fixed part of a GEMM: N and K, and the vector width of the target."""

    n: int
    k: int
    lanes: int


def validate(s: KernelSchedule, p: GemmProblem) -> None:
    """Reject schedules the template cannot express, with the reason."""
    mk, sl, pl = s.micro_kernel, s.slice, s.polymerization
    problems = []
    if mk.mu_n % p.lanes:
        problems.append(f"mu_n={mk.mu_n} is not a multiple of the vector width {p.lanes}")
    if s.pack_n % mk.mu_n or p.n % s.pack_n:
        problems.append(f"pack_n={s.pack_n} must be a multiple of mu_n={mk.mu_n} and divide N={p.n}")
    if mk.mu_n * 4 >= _MAX_STACK_BYTES:
        problems.append(f"mu_n={mk.mu_n} is too wide for a register-resident accumulator row")
    if sl.b_m % mk.mu_m or sl.b_n % mk.mu_n:
        problems.append(f"slice {sl.b_m}x{sl.b_n} is not a multiple of the micro-kernel {mk.mu_m}x{mk.mu_n}")
    if sl.b_k <= 0 or sl.b_m <= 0 or sl.b_n <= 0 or min(pl.t_m, pl.t_n, pl.t_k) <= 0 or mk.mu_m <= 0:
        problems.append("sizes and thread counts must be positive")
    elif pl.t_k > 1:
        panels = -(-p.k // sl.b_k)
        if (pl.t_k - 1) * -(-panels // pl.t_k) >= panels:
            problems.append(f"t_k={pl.t_k} leaves a split-K group without K panels (b_k={sl.b_k})")
    if problems:
        raise ConfigError(f"invalid GEMM schedule {s.key()}: " + "; ".join(problems))


def slice_args(s: KernelSchedule) -> tuple[int, int, int]:
    """The runtime arguments that pick the slice: blocks of mu_m rows, tiles of mu_n, b_k."""
    return (s.slice.b_m // s.micro_kernel.mu_m, s.slice.b_n // s.micro_kernel.mu_n, s.slice.b_k)


def _ceil(a: str, b: int | str) -> str:
    return f"((({a}) + ({b}) - 1) // ({b}))" if b != 1 else f"({a})"


class _Emitter:
    """Collects indented TVMScript lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def loop(self, depth: int, var: str, start: str, stop: str) -> None:
        """`for var in range(start, stop)`, emitted zero-based: TVM 0.27 lowers a loop whose
        start depends on an enclosing loop with a non-zero start wrongly (the inner start
        sees the outer variable before it is shifted), so every loop here starts at 0."""
        self(depth, f"for {var}_ in range(({stop}) - ({start})):")
        self(depth + 1, f"{var} = ({start}) + {var}_")


def _micro_kernel(e: _Emitter, d: int, rows: int, row0: str, s: KernelSchedule, out: str,
                  lanes: int, first: str, out_off: str) -> None:
    """Emit one register tile: rows x mu_n accumulators over k in [k0, k1).

    Rows are A's; `out_off` shifts them in the output (the split-K group's workspace rows).
    Skinny tiles keep `split` accumulator sets over interleaved k so that enough FMA chains
    run at once; they are summed before the store."""
    mu_n = s.micro_kernel.mu_n
    per_pack = s.pack_n // mu_n
    wt, wj = f"jt // {per_pack}", f"(jt % {per_pack}) * {mu_n}"
    col = f"jt * {mu_n}"
    split = max(1, min(4, _MIN_CHAINS // (rows * (mu_n // lanes))))
    accs = [[f"acc{i}_{u}" for u in range(split)] for i in range(rows)]
    for row in accs:
        for acc in row:
            e(d, f'{acc} = T.alloc_buffer(({mu_n},), "float32", scope="global")')
    e(d, f"if {first}:")
    for row in accs:
        for acc in row:
            e(d + 1, f"for j in T.vectorized({mu_n}):")
            e(d + 2, f"{acc}[j] = T.float32(0)")
    e(d, "else:")
    for i, row in enumerate(accs):
        for u, acc in enumerate(row):
            e(d + 1, f"for j in T.vectorized({mu_n}):")
            init = f"{out}[{out_off}{row0} + {i}, {col} + j]" if u == 0 else "T.float32(0)"
            e(d + 2, f"{acc}[j] = {init}")

    def fma(depth: int, k: str, u: int) -> None:
        for i, row in enumerate(accs):
            e(depth, f"for j in T.vectorized({mu_n}):")
            e(depth + 1, f"{row[u]}[j] = {row[u]}[j] + A[{row0} + {i}, {k}] * W[{wt}, {k}, {wj} + j]")

    if split == 1:
        e.loop(d, "k", "k0", "k1")
        fma(d + 1, "k", 0)
    else:
        e(d, f"for kq in range((k1 - k0) // {split}):")
        for u in range(split):
            fma(d + 1, f"k0 + kq * {split} + {u}", u)
        e.loop(d, "k", f"k0 + (k1 - k0) // {split} * {split}", "k1")
        fma(d + 1, "k", 0)
    for i, row in enumerate(accs):
        e(d, f"for j in T.vectorized({mu_n}):")
        total = " + ".join(f"{acc}[j]" for acc in row)
        e(d + 1, f"{out}[{out_off}{row0} + {i}, {col} + j] = {total}")


def tail_sizes(mu_m: int) -> list[int]:
    """Power-of-two row counts whose sums cover every tail 1..mu_m-1."""
    sizes, p = [], 1
    while p < mu_m:
        sizes.append(p)
        p *= 2
    return sizes[::-1]


def gemm_tvmscript(s: KernelSchedule, p: GemmProblem) -> str:
    """TVMScript of `main(A[M, K], W[N/pack_n, K, pack_n], C[M, N], bmb, bnt, bk)` for the
    family of schedule s (its slice is only validated; `slice_args(s)` gives the last three).

    Split-K families (t_k > 1) take a workspace WS[t_k * M, N] after C."""
    validate(s, p)
    mk, pl = s.micro_kernel, s.polymerization
    mu_m, mu_n, n, k = mk.mu_m, mk.mu_n, p.n, p.k
    tiles_n = n // mu_n
    split_k = pl.t_k > 1
    out = "WS" if split_k else "C"
    e = _Emitter()
    e(0, "@T.prim_func")
    ws_arg = ", ws: T.handle" if split_k else ""
    e(0, f"def main(a: T.handle, w: T.handle, c: T.handle{ws_arg}, bmb: T.int32, bnt: T.int32, bk: T.int32):")
    e(1, 'T.func_attr({"global_symbol": "main", "tir.noalias": True})')
    e(1, "M = T.int32()")
    e(1, f'A = T.match_buffer(a, (M, {k}), "float32", align=4)')
    e(1, f'W = T.match_buffer(w, ({n // s.pack_n}, {k}, {s.pack_n}), "float32", align=4)')
    e(1, f'C = T.match_buffer(c, (M, {n}), "float32", align=4)')
    if split_k:
        # the caller passes the workspace: TVM frees an in-kernel one between parallel loops
        e(1, f'WS = T.match_buffer(ws, ({pl.t_k} * M, {n}), "float32", align=4)')
    e(1, f"n_slices = {_ceil(str(tiles_n), 'bnt')}")
    e(1, f"slices_per_thread = {_ceil('n_slices', pl.t_n)}")
    e(1, f"k_panels = {_ceil(str(k), 'bk')}")
    e(1, f"panels_per_thread = {_ceil('k_panels', pl.t_k)}")
    e(1, f"for tid in T.parallel({pl.threads}):")
    d = 2
    # thread coordinates: tk outermost, then tm, then tn
    e(d, f"tk = tid // {pl.t_m * pl.t_n}")
    e(d, f"tm = (tid // {pl.t_n}) % {pl.t_m}")
    e(d, f"tn = tid % {pl.t_n}")
    e(d, f"mo = M // {mu_m}")
    e(d, f"mb_per = {_ceil('mo', pl.t_m)}")
    e(d, "mb0 = T.min(tm * mb_per, mo)")
    e(d, "mb1 = T.min(mb0 + mb_per, mo)")
    e(d, "kp0 = tk * panels_per_thread")
    row_off = "tk * M + " if split_k else ""
    e.loop(d, "sn", "tn * slices_per_thread", "T.min((tn + 1) * slices_per_thread, n_slices)")
    d += 1
    e.loop(d, "kp", "kp0", "T.min(kp0 + panels_per_thread, k_panels)")
    d += 1
    e(d, "k0 = kp * bk")
    e(d, f"k1 = T.min(kp * bk + bk, {k})")
    first = "kp == kp0"
    e(d, f"for sm in range({_ceil('mb1 - mb0', 'bmb')}):")
    jt_range = ("sn * bnt", f"T.min(sn * bnt + bnt, {tiles_n})")
    e.loop(d + 1, "jt", *jt_range)
    e.loop(d + 2, "ib", "mb0 + sm * bmb", "T.min(mb0 + sm * bmb + bmb, mb1)")
    _micro_kernel(e, d + 3, mu_m, f"ib * {mu_m}", s, out, p.lanes, first, row_off)
    if mu_m > 1:
        # tail rows M % mu_m: owned by the last M-thread, done while this weight panel is hot
        e(d, f"if tm == {pl.t_m - 1}:")
        e(d + 1, f"r = M - mo * {mu_m}")
        e.loop(d + 1, "jt", *jt_range)
        for size in tail_sizes(mu_m):
            row0 = f"mo * {mu_m} + (r // {2 * size}) * {2 * size}"
            e(d + 2, f"if (r // {size}) % 2 == 1:")
            _micro_kernel(e, d + 3, size, row0, s, out, p.lanes, first, row_off)
    if split_k:
        # split-K reduction: sum the t_k partial products into C, rows spread over threads
        rows_per = _ceil("M", pl.threads)
        e(1, f"for rt in T.parallel({pl.threads}):")
        e.loop(2, "i", f"rt * {rows_per}", f"T.min((rt + 1) * {rows_per}, M)")
        e(3, f"for jt in range({tiles_n}):")
        e(4, f"for j in T.vectorized({mu_n}):")
        terms = " + ".join(f"WS[{t} * M + i, jt * {mu_n} + j]" for t in range(pl.t_k))
        e(5, f"C[i, jt * {mu_n} + j] = {terms}")
    return "\n".join(e.lines) + "\n"
