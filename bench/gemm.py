"""`sandwichc bench gemm`: the cached sandwich GEMMs against the vendor peers, in one process,
one run, the same threads and the same cache state, plus the machine's measured limits."""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from sandwich.bench.baselines.measure import (
    measure_peer,
    measure_runner,
    random_gemm,
)
from sandwich.bench.baselines.vendor import make_peers
from sandwich.bench.machine import measure_machine
from sandwich.compiler.gemm_runner import aligned_empty
from sandwich.compiler.target import describe_machine
from sandwich.errors import ConfigError
from sandwich.models import load_model_config
from sandwich.payload import make_payload
from sandwich.tuner.machine_bench import peak_gflops, read_bandwidth_gbs, tile_gflops
from sandwich.tuner.quiet import other_cpu_load, warn_if_busy
from sandwich.tuner.streaming import rotation_copies
from sandwich.tuner.timing import gflops
from sandwich.tuner.tune import unique_shapes

ROTATE_MAX_M = 8
TIMING = {"warmup": 2, "repeat": 7, "min_repeat_s": 0.03}
# thread pools (TVM's, OpenBLAS's, OpenMP's) spin for a while after a call; a pause before
# each runner lets the previous library's threads sleep so they do not steal its cores
SETTLE_S = 0.2


def _settle() -> None:
    time.sleep(SETTLE_S)


@dataclass
class BenchResult:
    """Everything the JSON, Markdown and PNG outputs are made from."""

    command: str
    date: str
    machine: str
    threads: int
    peak_gflops: float
    read_gbs: float
    peers: list[str]
    skipped: list[str]
    rows: list[dict] = field(default_factory=list)
    rotated_rows: list[dict] = field(default_factory=list)
    passes: int = 1
    other_load: tuple[float, float] = (0.0, 0.0)  # other processes' CPU share, start and end
    tile_gflops: float = 0.0  # the register tile fed from L1 (bench/machine.py), same threads

    def to_json(self) -> dict:
        return {"command": self.command, "date": self.date, "machine": self.machine,
                "other_cpu_load_start_end": list(self.other_load),
                "threads": self.threads, "passes": self.passes, "peak_gflops": self.peak_gflops,
                "tile_gflops": self.tile_gflops,
                "read_gbs": self.read_gbs, "peers": self.peers, "skipped": self.skipped,
                "rows": self.rows, "rotated_rows": self.rotated_rows,
                "summary": summarize(self.rows, self.peers, self.peak_gflops, self.tile_gflops),
                "rotated_summary": summarize_rotated(self.rotated_rows, ["sandwich", *self.peers])}


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def ratio_text(x: float) -> str:
    """A summary's geomean as the reports print it: 0 stands for no rows (an --m list of
    prefill Ms has none at M <= 64)."""
    return f"{x:.2f}" if x > 0 else "none (no such rows)"


def summarize(rows: list[dict], peers: list[str], peak: float, tile: float = 0.0) -> dict:
    """Geomean speedup over the best peer per row; fraction of peak for large M, and of the
    L1-fed register tile's rate (`tile`, 0 when not measured)."""
    def speedups(pred):
        return [r["speedup_vs_best_peer"] for r in rows if pred(r) and r.get("speedup_vs_best_peer")]

    large = [r["sandwich_gflops"] / peak for r in rows if r["m"] >= 512 and peak > 0]
    of_tile = [r["sandwich_gflops"] / tile for r in rows if r["m"] >= 512 and tile > 0]
    # the peak is the FMA loop's best repeat; the same statistic of ours, beside the median's
    large_best = [r.get("sandwich_best_gflops", 0.0) / peak for r in rows if r["m"] >= 512 and peak > 0]
    return {
        "geomean_speedup_all": geomean(speedups(lambda r: True)),
        "geomean_speedup_m_le_64": geomean(speedups(lambda r: r["m"] <= 64)),
        "geomean_speedup_m_ge_512": geomean(speedups(lambda r: r["m"] >= 512)),
        "min_fraction_of_peak_m_ge_512": min(large) if large else 0.0,
        "geomean_fraction_of_peak_m_ge_512": geomean(large),
        "min_best_fraction_of_peak_m_ge_512": min(large_best) if large_best else 0.0,
        "geomean_best_fraction_of_peak_m_ge_512": geomean(large_best),
        "geomean_fraction_of_tile_m_ge_512": geomean(of_tile),
        "min_fraction_of_tile_m_ge_512": min(of_tile) if of_tile else 0.0,
    }


ROTATED_TARGET_PCT = 90.0  # of the streaming read, the bar for M <= 8 rows


def summarize_rotated(rotated_rows: list[dict], names: list[str],
                      target_pct: float = ROTATED_TARGET_PCT) -> dict:
    """Per runner: how many rotated rows reach `target_pct` of their moment's read, in all
    and per M, and the lowest share; and how many each pass reaches alone (a row's figure is
    its best pass, so these show how much the passes lean on each other)."""
    out = {}
    for name in names:
        pcts = [(r["m"], r[f"{name}_pct_read"]) for r in rotated_rows if f"{name}_pct_read" in r]
        per_m = {}
        for m, pct in pcts:
            hit, total = per_m.get(m, (0, 0))
            per_m[m] = (hit + (pct >= target_pct), total + 1)
        passes = [r.get(f"{name}_passes", []) for r in rotated_rows]
        each_pass = [sum(len(ps) > p and ps[p]["pct_read"] >= target_pct for ps in passes)
                     for p in range(max(map(len, passes), default=0))]
        out[name] = {"rows": len(pcts), "at_target": sum(pct >= target_pct for _, pct in pcts),
                     "at_target_each_pass": each_pass,
                     "min_pct_read": min((pct for _, pct in pcts), default=0.0),
                     "per_m": {str(m): list(v) for m, v in sorted(per_m.items())}}
    return {"target_pct_read": target_pct, "runners": out}


def _cases(models: list[str], ms: list[int], tp: int):
    """(model, op names, op, m) for every unique GEMM shape of the models at every M."""
    for model in models:
        payload = make_payload(load_model_config(model), tp=tp, seq_max=max(ms))
        for names, op in unique_shapes(payload):
            for m in ms:
                yield model, names, op, m


class _NoProgress:
    """Stands in for a tqdm bar when the caller shows no progress."""

    total = 0

    def set_description(self, desc: str, refresh: bool = True) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def refresh(self) -> None:
        pass


def run_bench(*, models: list[str], ms: list[int], tp: int, peer_names: list[str], threads: int,
              cache, rotate: bool, command: str, passes: int = 2, log=print,
              progress=None) -> BenchResult:
    """Time every unique GEMM shape of the models at every M, ours and the peers'.

    Each pass times ours on every row, then each peer on every row; a runner's figure is
    its best pass (a pass's figure is a median). This VM's cores and DRAM bandwidth slow
    down for seconds at a time, and a second timing minutes apart, for every runner alike,
    keeps one such moment from deciding a row. Ours come first in the first pass, before
    any peer library starts: OpenVINO's and OpenMP's idle worker threads keep spinning
    after their calls and steal the cores a short TVM kernel needs; in later passes a
    pause before each of ours lets them sleep. Same process, threads, inputs, cache state.

    `progress` (a tqdm bar, say) counts one step per timing of one runner on one row, and
    says which; its total is set here."""
    if passes < 1:
        raise ConfigError(f"--passes must be >= 1, got {passes}")
    bar = _NoProgress() if progress is None else progress  # a tqdm bar of total 0 is falsy
    rows = [{"model": model, "op": "+".join(names), "m": m, "n": op.n, "k": op.k,
             "_op": op} for model, names, op, m in _cases(models, ms, tp)]
    rotated = {i: {k: r[k] for k in ("model", "op", "m", "n", "k")} for i, r in enumerate(rows)
               if rotate and r["m"] <= ROTATE_MAX_M}
    for op in {row["_op"] for row in rows}:  # a shape never tuned fails now, not minutes in
        cache.gemm(n=op.n, k=op.k, dtype=op.dtype, threads=threads)
    load0 = warn_if_busy("the benchmark", log)  # samples the load for a while: after the checks
    per_runner = len(rows) + len(rotated)
    bar.total = 1 + passes * per_runner * (1 + len(peer_names))
    bar.set_description("machine peak and read bandwidth")
    limits = measure_machine(threads)
    bar.update(1)
    log(f"machine limits with {threads} threads: peak {limits.peak_gflops:.1f} GFLOPS, "
        f"streaming read {limits.read_gbs:.1f} GB/s")
    peers = None
    for p in range(passes):
        step = _stepper(bar, f"pass {p + 1}/{passes}")
        for i, row in enumerate(rows):
            if peers is not None:
                _settle()
            _time_ours(row, rotated.get(i), cache, threads, limits, step)
        if peers is None:
            bar.set_description(f"loading {', '.join(peer_names)}")
            peers = make_peers(peer_names, threads=threads)
            for msg in peers.messages:
                log(msg)
            bar.total = 1 + passes * per_runner * (1 + len(peers.peers))
            bar.refresh()
        for i, row in enumerate(rows):
            _time_peers(row, rotated.get(i), peers.peers, limits, step)
    assert peers is not None
    # the peak again after the timings: a slow moment of this VM at the start once read 108
    # GFLOPS for a 2-core peak of 160-180, and every row's % of peak came out above 100
    peak_end, tile_end = peak_gflops(threads), tile_gflops(threads)
    log(f"machine peak measured again after the timings: {peak_end:.1f} GFLOPS (the larger of "
        f"the two, {max(peak_end, limits.peak_gflops):.1f}, is the peak of this run); the "
        f"L1-fed tile {max(tile_end, limits.tile_gflops):.1f}")
    limits = replace(limits, peak_gflops=max(peak_end, limits.peak_gflops),
                     tile_gflops=max(tile_end, limits.tile_gflops))
    res = BenchResult(command, datetime.date.today().isoformat(), describe_machine(), threads,
                      limits.peak_gflops, limits.read_gbs, list(peers.names), list(peers.messages),
                      passes=passes, tile_gflops=limits.tile_gflops)
    for i, row in enumerate(rows):
        del row["_op"]
        for name in ["sandwich", *peers.names]:
            row[f"{name}_gflops"] = max(row[f"{name}_gflops_passes"])
            row[f"{name}_best_gflops"] = max(row[f"{name}_best_gflops_passes"])
        best = max((row[f"{p}_gflops"] for p in peers.names), default=0.0)
        row["best_peer_gflops"] = best
        row["speedup_vs_best_peer"] = row["sandwich_gflops"] / best if best else None
        res.rows.append(row)
        log(_row_line(row, peers.names))
        if i in rotated:
            res.rotated_rows.append(_best_rotated_pass(rotated[i], ["sandwich", *peers.names]))
            log(_rotated_line(res.rotated_rows[-1], peers.names))
    res.other_load = (load0, other_cpu_load())
    return res


def _inputs(row: dict) -> tuple[np.ndarray, np.ndarray]:
    return aligned_problem(row["m"], row["n"], row["k"])


def aligned_problem(m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded A and W of one GEMM row, A in a 64-byte aligned buffer (as the executor's
    activations are) for every runner alike."""
    a, w = random_gemm(m, n, k, seed=m)
    aligned = aligned_empty(a.shape)
    aligned[...] = a
    return aligned, w


def _stepper(bar, stage: str):
    """step(runner, row, rotated)(): names the timing about to run on the bar; the returned
    done() counts it."""
    def step(name: str, row: dict, rotated: bool = False):
        what = "rotated" if rotated else "hot"
        bar.set_description(f"{stage} {name} {row['op']} M={row['m']} {what}", refresh=False)
        return lambda: bar.update(1)
    return step


def _time_ours(row: dict, rot: dict | None, cache, threads: int, limits, step) -> None:
    """One pass of ours on one row (and its rotated-weights variant)."""
    op = row["_op"]
    done = step("sandwich", row)
    gemm = cache.gemm(n=op.n, k=op.k, dtype=op.dtype, threads=threads)
    a, w = _inputs(row)
    out = aligned_empty((row["m"], op.n))  # as the executor's buffers are
    _keep_pass(row, measure_runner("sandwich", bound_runner(gemm, out), a, w, [gemm.pack(w)], **TIMING))
    row["sandwich_schedule"] = gemm.schedule_for(row["m"]).key()
    done()
    if rot is None:
        return
    done = step("sandwich", row, rotated=True)
    copies = rotation_copies(w.nbytes, limits.llc_bytes)
    handles = [gemm.pack(w) for _ in range(copies)]
    rot["copies"] = copies
    _add_rotated_pass(rot, "sandwich", limits,
                      lambda: measure_runner("sandwich", bound_runner(gemm, out), a, w, handles, **TIMING))
    done()


def _keep_pass(row: dict, t) -> None:
    """A pass's figures of one runner on a row: GFLOPS by its median repeat, and by its best
    (the statistic the FMA peak is measured by)."""
    row.setdefault(f"{t.name}_gflops_passes", []).append(t.gflops)
    best = gflops(2.0 * t.m * t.n * t.k, t.timing.min_s)
    row.setdefault(f"{t.name}_best_gflops_passes", []).append(best)


def _time_peers(row: dict, rot: dict | None, peers, limits, step) -> None:
    """One pass of every peer on one row (and its rotated-weights variant)."""
    a, w = _inputs(row)
    for peer in peers:
        done = step(peer.name, row)
        _settle()
        _keep_pass(row, measure_peer(peer, a, w, **TIMING))
        done()
    if rot is None:
        return
    for peer in peers:
        done = step(peer.name, row, rotated=True)
        _settle()
        _add_rotated_pass(rot, peer.name, limits,
                          lambda peer=peer: measure_peer(peer, a, w, copies=rot["copies"], **TIMING))
        done()


def moment_read(limits) -> float:
    """The streaming-read GB/s of this moment (a few repeats, the benchmark's buffer)."""
    return read_bandwidth_gbs(limits.threads, size_bytes=limits.read_buffer_bytes, repeat=3)


def _add_rotated_pass(rot: dict, name: str, limits, measure) -> None:
    """Run one rotated timing (`measure()`) between two streaming reads and keep it against
    their mean: this VM's DRAM bandwidth drifts by tens of percent within seconds, so each
    percentage is taken against the bandwidth of its own moment, bracketed on both sides
    (the same for every runner)."""
    before = moment_read(limits)
    t = measure()
    after = moment_read(limits)
    local = (before + after) / 2
    rot.setdefault(f"{name}_passes", []).append(
        {"gbs": t.weight_gbs, "read_gbs": local, "read_before_after_gbs": [before, after],
         "pct_read": t.pct_of_read(local)})


def _best_rotated_pass(rot: dict, names: list[str]) -> dict:
    """Each runner's pass with the highest share of its own moment's read bandwidth."""
    for name in names:
        best = max(rot[f"{name}_passes"], key=lambda x: x["pct_read"])
        rot.update({f"{name}_gbs": best["gbs"], f"{name}_read_gbs": best["read_gbs"],
                    f"{name}_pct_read": best["pct_read"]})
    return rot


def bound_runner(gemm, out: np.ndarray):
    """Our GEMM as a peer-style runner writing into a preallocated output, called the way the
    executor calls it: bound once to its buffers (GemmKernel.bind), then run."""
    bound: dict[tuple[int, int], object] = {}

    def run(a: np.ndarray, handle) -> np.ndarray:
        call = bound.get((id(a), id(handle)))
        if call is None:  # the runner's caller keeps a and every handle alive while timing
            call = bound[(id(a), id(handle))] = gemm.bind(a, handle, out)
        return call()

    return run


def _rotated_line(rot: dict, peers) -> str:
    cols = " ".join(f"{p} {rot[f'{p}_pct_read']:5.0f}%" for p in peers)
    return (f"{rot['op']:<16} M={rot['m']:<5} {rot['n']}x{rot['k']}: rotated, % of the read: "
            f"sandwich {rot['sandwich_pct_read']:5.0f}% | {cols}")


def _row_line(row: dict, peers) -> str:
    cols = " ".join(f"{p} {row[f'{p}_gflops']:7.1f}" for p in peers)
    sp = row["speedup_vs_best_peer"]
    return (f"{row['op']:<16} M={row['m']:<5} {row['n']}x{row['k']}: sandwich "
            f"{row['sandwich_gflops']:7.1f} | {cols} | x{sp:.2f}" if sp else "")
