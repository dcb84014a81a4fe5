"""`sandwichc bench-attention`: the DSL attention kernels against the machine's streaming
bandwidth (decode) and torch SDPA (causal prefill), written to results/attention.md."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.compiler.tensors import tensor_over
from sandwich.errors import ConfigError

COMMAND = "sandwichc bench-attention --threads {threads} -o {out}"
ROUNDS = 3  # decode and the bandwidth probe alternate, so a busy neighbour hits both


@dataclass(frozen=True)
class DecodeCase:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    max_batch: int
    max_seq: int
    lens: tuple[int, ...]


@dataclass(frozen=True)
class PrefillShape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int


# KV caches of 256 MiB (8x the 32 MiB L3): reads come from DRAM
DECODE = (
    DecodeCase("GQA 32/8 heads, d=128, full batch", 32, 8, 128, 8, 4096, (4096,) * 8),
    DecodeCase("same cache, ragged batch", 32, 8, 128, 8, 4096,
               (4096, 3500, 2900, 2048, 1500, 1000, 600, 37)),
)
PREFILL = (PrefillShape("Llama-3.2-1B (GQA 32/8, d=64)", 32, 8, 64),
           PrefillShape("Sheared-LLaMA-1.3B (MHA 16, d=128)", 16, 16, 128))
SEQS = (512, 1024, 2048)
DECODE_CANDIDATES = tuple(dict(b_kv=b, n_split=s, n_d=n) for b in (8, 16, 32)
                          for s in (2, 4) for n in (32, 64))
PREFILL_CANDIDATES = (dict(b_q=32, b_kv=64, mu_k=4, mu_q=4, n_d=32),
                      dict(b_q=32, b_kv=128, mu_k=8, mu_q=4, n_d=64),
                      dict(b_q=64, b_kv=64, mu_k=2, mu_q=4, n_d=32),
                      dict(b_q=16, b_kv=64, mu_k=8, mu_q=8, n_d=32))


def _aligned(shape, rng, dtype=np.float32) -> np.ndarray:
    """A 64-byte aligned array (TVM wants it for zero-copy), filled with random values."""
    n = int(np.prod(shape))
    raw = np.empty(n + 16, dtype)
    off = (-raw.ctypes.data % 64) // raw.itemsize
    flat = raw[off:off + n]
    rng.random(out=flat, dtype=dtype)
    flat -= 0.5
    return flat.reshape(shape)


class _Bench:
    def __init__(self, threads: int) -> None:
        from sandwich.compiler.target import detect_cpu
        from sandwich.dsl.load import load_kernel
        from sandwich.tuner.timing import time_callable

        self.threads, self.time = threads, time_callable
        self.cpu = detect_cpu()
        self.kernels = {n: load_kernel(n) for n in ("decode_attention", "flash_prefill")}
        self.rng = np.random.default_rng(0)

    def build(self, name: str, tunables: dict, fixed: dict):
        from sandwich.compiler.lower_build import build_kernel

        ex = build_kernel(self.kernels[name], tunables=tunables, fixed=fixed, cpu=self.cpu,
                          threads=self.threads)
        return ex["main"]

    def t(self, a: np.ndarray):
        """Zero-copy for the big aligned arrays (numpy's huge pages stay), a copy otherwise."""
        return tensor_over(a)

    def seconds(self, fn, repeat=5) -> float:
        return self.time(fn, warmup=1, repeat=repeat, min_repeat_s=0.05).median_s


def _decode_call(b: _Bench, f, case: DecodeCase, tun: dict, arrays):
    q, kc, vc, slots, lens, out = arrays
    work = b.t(_aligned((tun["n_split"], len(case.lens), case.heads, case.head_dim + 16), b.rng))
    B, H, KVH, D = len(case.lens), case.heads, case.kv_heads, case.head_dim
    scale = 1.0 / np.sqrt(D)
    return lambda: f(B, H, KVH, D, case.max_seq, case.max_batch, scale, q, kc, vc, slots, lens,
                     out, work)


def _decode_case(b: _Bench, case: DecodeCase, kc, vc, best: dict | None) -> dict:
    from sandwich.tuner.machine_bench import read_bandwidth_gbs

    fixed = dict(H=case.heads, KVH=case.kv_heads, D=case.head_dim)
    B = len(case.lens)
    arrays = (b.t(_aligned((B, case.heads, case.head_dim), b.rng)), b.t(kc), b.t(vc),
              b.t(np.arange(B, dtype=np.int32)), b.t(np.array(case.lens, np.int32)),
              b.t(_aligned((B, case.heads, case.head_dim), b.rng)))
    if best is None:  # a small search over the tunables
        timed = []
        for tun in DECODE_CANDIDATES:
            call = _decode_call(b, b.build("decode_attention", tun, fixed), case, tun, arrays)
            timed.append((b.seconds(call, repeat=3), tun))
        best = min(timed, key=lambda x: x[0])[1]
    call = _decode_call(b, b.build("decode_attention", best, fixed), case, best, arrays)
    nbytes = 2 * sum(case.lens) * case.kv_heads * case.head_dim * 4
    gbs, bws = [], []
    for _ in range(ROUNDS):
        bws.append(read_bandwidth_gbs(b.threads, repeat=3))
        gbs.append(nbytes / b.seconds(call) / 1e9)
    ratios = [g / w for g, w in zip(gbs, bws, strict=True)]
    return dict(case=case, tunables=best, kv_mib=nbytes / 2**20, gbs=statistics.median(gbs),
                bw=statistics.median(bws), pct=100 * statistics.median(ratios))


def bench_decode(b: _Bench) -> list[dict]:
    c = DECODE[0]
    kv_shape = (c.max_seq, c.max_batch, c.kv_heads, c.head_dim)
    kc, vc = _aligned(kv_shape, b.rng), _aligned(kv_shape, b.rng)
    rows: list[dict] = []
    for case in DECODE:
        rows.append(_decode_case(b, case, kc, vc, rows[0]["tunables"] if rows else None))
        print(f"decode {case.name}: {rows[-1]['gbs']:.1f} GB/s, {rows[-1]['pct']:.0f}% of "
              f"stream ({rows[-1]['bw']:.1f} GB/s)", flush=True)
    return rows


def _prefill_case(b: _Bench, shape: PrefillShape, S: int) -> dict:
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    H, KVH, D = shape.heads, shape.kv_heads, shape.head_dim
    fixed, scale = dict(H=H, KVH=KVH, D=D), float(1.0 / np.sqrt(D))
    q, k, v = (_aligned((S, n, D), b.rng) for n in (H, KVH, KVH))
    o = _aligned((S, H, D), b.rng)
    args = [b.t(x) for x in (q, k, v, o)]
    timed = []  # a small search over the tunables
    for tun in PREFILL_CANDIDATES:
        f = b.build("flash_prefill", tun, fixed)
        timed.append((b.seconds(lambda f=f: f(S, S, H, KVH, D, scale, *args), 3), tun, f))
    _, tun, f = min(timed, key=lambda x: x[0])
    ours = b.seconds(lambda: f(S, S, H, KVH, D, scale, *args))
    tq, tk, tv = (torch.from_numpy(x).permute(1, 0, 2).contiguous()[None] for x in (q, k, v))
    rk, rv = (x.repeat_interleave(H // KVH, 1).contiguous() for x in (tk, tv))
    gqa = b.seconds(lambda: sdpa(tq, tk, tv, is_causal=True, scale=scale, enable_gqa=True))
    rep = b.seconds(lambda: sdpa(tq, rk, rv, is_causal=True, scale=scale))
    ref = sdpa(tq, rk, rv, is_causal=True, scale=scale)[0].permute(1, 0, 2).numpy()
    flops = 4.0 * S * (S + 1) / 2 * D * H
    return dict(shape=shape, S=S, tunables=tun, ours=ours, gqa=gqa, rep=rep,
                gflops=flops / ours / 1e9, err=float(np.abs(o - ref).max()))


def bench_prefill(b: _Bench) -> list[dict]:
    rows = []
    for shape in PREFILL:
        for S in SEQS:  # the tunables are picked per shape and length
            rows.append(_prefill_case(b, shape, S))
            r = rows[-1]
            print(f"prefill {shape.name} S={S}: {r['ours'] * 1e3:.1f} ms vs torch "
                  f"{min(r['gqa'], r['rep']) * 1e3:.1f} ms", flush=True)
    return rows


def _report(threads: int, out: str, cpu, decode: list[dict], prefill: list[dict], load) -> str:
    import torch

    from sandwich.compiler.tensors import tvm_version

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Attention kernels of the DSL (issue 3)", "",
        f"Regenerate: `{COMMAND.format(threads=threads, out=out)}` (the same as "
        "`python -m sandwich.bench.attention`, about a minute)", "",
        f"- machine: {cpu.model} ({cpu.mcpu}, {cpu.isa}, {cpu.cores} cores, "
        f"L3 {cpu.l3_bytes >> 20} MiB), {platform.system()} {platform.machine()}",
        f"- threads: {threads} (TVM_NUM_THREADS and torch.set_num_threads)",
        f"- date: {now}; TVM {tvm_version()}, torch {torch.__version__}",
        f"- load average at start / end: {load[0]:.2f} / {load[1]:.2f} (other jobs share "
        "this 2-core machine, so figures are noisy)", "",
        "## Decode attention (fp32), KV cache [max_seq, max_batch, KVH, D] far larger than the LLC",
        "", "GB/s counts the K and V rows read (sum of lengths x KVH x D x 4 B x 2). Streaming "
        "bandwidth is `sandwich.tuner.machine_bench.read_bandwidth_gbs(threads)`, measured "
        f"alternately with the kernel ({ROUNDS} rounds, medians; % is the median of the "
        f"per-round ratios); tunables: the fastest of {len(DECODE_CANDIDATES)} candidates on "
        "the full batch.", "",
        "| case | lens | KV read | tunables | GB/s | stream GB/s | % of stream |",
        "|---|---|---|---|---|---|---|"]
    for r in decode:
        c = r["case"]
        lens = f"{len(c.lens)} x {c.lens[0]}" if len(set(c.lens)) == 1 else "/".join(map(str, c.lens))
        lines.append(f"| {c.name} | {lens} | {r['kv_mib']:.0f} MiB | {r['tunables']} | "
                     f"{r['gbs']:.1f} | {r['bw']:.1f} | {r['pct']:.0f}% |")
    lines += ["", "## Causal prefill attention (fp32), one sequence", "",
              "Peers in the same process and threads: torch SDPA with `enable_gqa=True`, and "
              "torch SDPA on K/V repeated per query head (what HF transformers does). Times are "
              "medians; the DSL tunables are the fastest of "
              f"{len(PREFILL_CANDIDATES)} candidates at each length; max |diff| is against the "
              "torch output.", "",
              "| shape | S | tunables | DSL ms | GFLOPS | SDPA gqa ms | SDPA repeated ms | "
              "speed-up vs best torch | max abs diff |", "|---|---|---|---|---|---|---|---|---|"]
    for r in prefill:
        best = min(r["gqa"], r["rep"])
        lines.append(f"| {r['shape'].name} | {r['S']} | {r['tunables']} | {r['ours'] * 1e3:.1f} | "
                     f"{r['gflops']:.0f} | {r['gqa'] * 1e3:.1f} | {r['rep'] * 1e3:.1f} | "
                     f"{best / r['ours']:.2f}x | {r['err']:.1e} |")
    return "\n".join(lines) + "\n"


def run(threads: int, out_md: str | Path) -> None:
    """Run both benchmarks with `threads` threads and write the Markdown report."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    os.environ["TVM_NUM_THREADS"] = str(threads)  # read when TVM's thread pool starts
    import torch

    torch.set_num_threads(threads)
    load0 = os.getloadavg()[0]
    b = _Bench(threads)
    decode = bench_decode(b)
    prefill = bench_prefill(b)
    text = _report(threads, str(out_md), b.cpu, decode, prefill, (load0, os.getloadavg()[0]))
    path = Path(out_md)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    run(2, "results/attention.md")
