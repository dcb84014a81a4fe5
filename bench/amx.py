"""`sandwichc bench amx`: the AMX GEMM (dsl/kernels/gemm_amx_bf16.sw) on a CPU with AMX-BF16,
checked against numpy and timed beside the family's kernel of the same weight format
(vdpbf16ps for bf16, vpdpbusd for int8 / int4) on the same packed weights and M, in
interleaved rounds (bench/cache_ab.py's): every AMX schedule a tune measures (the row split
with cache-sized blocks, the panel split), so the tuner's choice at each M can be read off a
table.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np

from sandwich.bench.baselines.measure import check_gemm
from sandwich.bench.baselines.vendor import check_bf16_peers, make_bf16_peers
from sandwich.bench.cache_ab import AbRow, gemm_timer, interleaved_rounds, row_line
from sandwich.bench.kernel_ab import build_side, check_source_args, problem
from sandwich.compiler.gemm_dsl import amx8_schedules, amx_schedules, build_gemm_dsl
from sandwich.compiler.gemm_formats import amx_format
from sandwich.compiler.gemm_runner import aligned_empty, gemm_args
from sandwich.compiler.target import detect_cpu
from sandwich.errors import ConfigError
from sandwich.tuner.tvm_measure import kernel_rows, kernel_weights
from sandwich.types import AMX_OP
from sandwich.weight_formats import round_bf16

# a bf16 peer rounds its product to bf16 (torch) or sums in its own order: its error against
# numpy on the same bf16 operands stays within this share of |A| @ |W|
BF16_RTOL = 1e-2


def run_amx(*, schedule: str, n: int, k: int, ms: list[int], threads: int, rounds: int = 5,
            peers: tuple[str, ...] = (), log: Callable[[str], None] = print) -> list[AbRow]:
    """Each AMX schedule the tuner would measure at the schedule's pack_n (B; see
    gemm_dsl.amx_schedules, and for int weights on a CPU with AMX-INT8 amx8_schedules) against
    the family's `schedule` (A, a key such as gemm_bf16_mk6x64_p2x1x1_n64_s12x256x512 or
    gemm_int8-g32_mk4x64_p2x1x1_n64_s8x64x256), each checked against numpy on what it
    multiplies (bf16 products: the bf16-rounded operands; byte products: the family's 8-bit
    activations and the int weights' values), then all timed in the same interleaved rounds
    at every M: a row per AMX schedule and M, its ratio AMX / family. Each AMX kernel is built
    and called as the tuner and the kernel cache build and call it (gemm_dsl.build_gemm_dsl,
    gemm_args).

    `peers` (bf16 schedules): the vendors' bf16 GEMMs (vendor.make_bf16_peers: torch's oneDNN,
    OpenVINO with bf16 precision) on the same bf16 weights and A, checked against numpy and
    timed in the same rounds: a row each, peer / family, and a line per M of the best AMX
    schedule over the best peer."""
    [s] = check_source_args([schedule], n, k, rounds, threads, ())
    if not amx_format(s.dtype, k):
        raise ConfigError(f"--schedule: the AMX kernel multiplies bf16, int8 and int4 weights in "
                          f"groups of 32 values; {s.key()} is {s.dtype}")
    cpu = detect_cpu()
    if not cpu.amx:
        raise ConfigError(f"this CPU ({cpu.model}, {cpu.mcpu}) has no AMX-BF16: nothing to time")
    amxs = amx_schedules(n=n, k=k, pack_n=s.pack_n, threads=threads, cpu=cpu, dtype=s.dtype)
    amxs += amx8_schedules(n=n, k=k, pack_n=s.pack_n, threads=threads, cpu=cpu, dtype=s.dtype)
    if not amxs:
        raise ConfigError(f"the AMX kernel needs pack_n a multiple of 32 dividing N, K a "
                          f"multiple of 32 and threads in its domain; got pack_n {s.pack_n}, "
                          f"N {n}, K {k}, {threads} threads")
    bf16_peers = _bf16_peers(peers, s.dtype, threads, log)
    family = build_side("family", None, s, n, k, threads, cpu)
    kernels = [build_gemm_dsl(a, n=n, k=k, cpu=cpu, threads=threads)["main"] for a in amxs]
    rng = np.random.default_rng(0)
    w, ref, rows_of = problem(s, n, k, rng)  # the weights, their values, A as the family rounds it
    # what each AMX kernel multiplies, once: bf16 products int values times scales rounded to
    # bf16, byte products the values themselves
    op_ref = {op: kernel_weights(ref, s.dtype, op) for op in {AMX_OP, *(a.op for a in amxs)}}
    amx_ref = op_ref[AMX_OP]
    packed = family.prepare(w)  # the family's packing is the one the AMX kernel reads
    vendors = [(p, p.prepare(amx_ref)) for p in bf16_peers]  # the same bf16 values
    rows = []
    for m in ms:
        a = aligned_empty((m, k))
        a[...] = rng.standard_normal((m, k), dtype=np.float32)
        c = aligned_empty((m, n))
        want = round_bf16(a)
        check_gemm(family.run(a, packed), rows_of(a) if rows_of else a, ref,
                   what=f"the {s.dtype} family")
        timers = [gemm_timer(family.run, a, [packed], n, k)]
        for sched, kernel in zip(amxs, kernels, strict=True):
            args = gemm_args(a, packed, c, sched)  # wrapped once, as the cache binds a call

            def run_once(_a=None, _w=None, kernel=kernel, args=args) -> None:
                kernel(*args)

            run_once()
            rows_of_op = kernel_rows(s.dtype, k, sched.op)
            check_gemm(c, rows_of_op(a) if rows_of_op else a, op_ref[sched.op],
                       what=f"the AMX kernel ({sched.key()})")
            timers.append(gemm_timer(run_once, a, [packed], n, k))
        for peer, handle in vendors:
            check_gemm(peer.run(a, handle), want, amx_ref, rtol=BF16_RTOL, what=peer.name)
            timers.append(gemm_timer(peer.run, a, [handle], n, k))
        fam, *others = interleaved_rounds(timers, rounds)
        names = [f"AMX {sched.key()}" for sched in amxs] + [peer.name for peer, _ in vendors]
        for name, figures in zip(names, others, strict=True):
            row = AbRow(f"{name} / family", n, k, m, rotated=False)
            row.a_gflops, row.b_gflops = list(fam), figures
            rows.append(row)
            log(row_line(row))
        if vendors:
            amx_best = max(statistics.median(f) for f in others[:len(amxs)])
            peer_best = max(statistics.median(f) for f in others[len(amxs):])
            log(f"M={m}: the best AMX schedule {amx_best:.1f} GFLOPS, the best bf16 peer "
                f"{peer_best:.1f}: x{amx_best / peer_best:.2f}")
    return rows


def _bf16_peers(names: tuple[str, ...], dtype: str, threads: int, log) -> list:
    """The bf16 peers for a bf16 schedule; none for int weights (the peers' int paths
    quantize by their own rules), with a line saying so."""
    if not check_bf16_peers(names):
        return []
    if dtype != "bf16":
        log(f"--peers: the peers run bf16 GEMMs; left out for {dtype} weights")
        return []
    built = make_bf16_peers(names, threads=threads)
    for msg in built.messages:
        log(msg)
    return list(built.peers)
