"""The kernel cache: tuned GEMM kernels (records + verified `.so` files) behind a small API.

    from sandwich.runtime import KernelCache
    gemm = KernelCache(cache_dir).gemm(n=N, k=K, dtype="float32")
    wp = gemm.pack(w)      # w: (K, N) float32, packed once
    out = gemm(a, wp)      # a: (M, K) float32, any M >= 1 -> (M, N)
"""

from __future__ import annotations

import bisect
import hashlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from sandwich.compiler.amx import request_tiles
from sandwich.compiler.build import export_atomic, load_function
from sandwich.compiler.gemm_runner import (
    aligned_empty,
    check_activation,
    gemm_args,
    pack_weight,
    workspace_view,
    wrap,
)
from sandwich.compiler.target import CpuInfo, detect_cpu
from sandwich.errors import CacheError, ShapeError
from sandwich.tuner.tuning_db import KernelFile, StoredRecord, TuningDB
from sandwich.types import AMX_OPS, KernelSchedule
from sandwich.weight_formats import QuantizedWeight, pad_columns

DB_NAME = "tuning.sqlite"


def default_cache_dir(env: dict[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME/sandwichc, else ~/.cache/sandwichc (the CLI passes os.environ)."""
    env = env if env is not None else {}
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sandwichc"


def process_threads() -> int:
    """The thread count kernels run with in this process: TVM's pool size (TVM_NUM_THREADS,
    which the CLI sets from --threads), else every CPU the process may use."""
    return int(os.environ.get("TVM_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class PackedWeight:
    """Weights in the kernel layout, made once by `GemmKernel.pack`: fp32 as one array
    W[N / pack_n, K, pack_n], an int format as its values, scales (and minimums) in the same
    panel order (compiler/gemm_runner.py: pack_weight)."""

    data: tuple[np.ndarray, ...]
    n: int
    k: int
    dtype: str = "float32"  # the weight format packed (a GEMM dtype: weight_formats.gemm_dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed arrays: what one call streams of this weight."""
        return sum(x.nbytes for x in self.data)

    @cached_property
    def tvm_args(self) -> tuple:
        """The arrays as a kernel call's arguments (zero-copy TVM tensors), made on first use:
        `GemmKernel.bind_each` swaps them into a bound call."""
        return tuple(wrap(x) for x in self.data)


def cache_fingerprint(cpu: CpuInfo) -> str:
    """What records and kernel files are keyed by: the target fingerprint (TVM version,
    target, CPU flags), the GEMM family's source, so a new kernel version starts afresh, and
    the L2 size, which the family's kernels are built with (their row chunks) and whose
    schedules were timed on it: two CPUs of one target can differ in L2. The timing method
    (streaming.TIMING_VERSION) too: records timed another way were ranked on other terms."""
    from sandwich.compiler.gemm_dsl import family_source_sha256
    from sandwich.tuner.streaming import TIMING_VERSION

    key = (f"{cpu.fingerprint()}:{family_source_sha256()}:l2={cpu.l2_bytes}"
           f":timing={TIMING_VERSION}")
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class KernelCache:
    """A cache directory (0700) holding `tuning.sqlite` and `kernels/<fingerprint>/*.so`."""

    def __init__(self, cache_dir: str | Path, *, cpu: CpuInfo | None = None) -> None:
        self.dir = Path(cache_dir)
        if self.dir.exists() and not self.dir.is_dir():
            raise CacheError(f"cache directory {self.dir} is a file; pass another --cache-dir")
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)
        self.cpu = cpu or detect_cpu()
        self.fingerprint = cache_fingerprint(self.cpu)
        self.db = TuningDB(self.dir / DB_NAME)

    @property
    def ops_dir(self) -> Path:
        """The runtime's untuned kernels (norms, RoPE, attention), named by what they were
        built from (compiler/build.compile_source); not records, so `clean` leaves them."""
        return self.dir / "ops"

    # -- kernel files ------------------------------------------------------------------
    def kernel_path(self, n: int, k: int, schedule: KernelSchedule) -> Path:
        return self.dir / "kernels" / self.fingerprint / f"n{n}_k{k}_{schedule.family_key()}.so"

    def store_kernel(self, executable, *, n: int, k: int, dtype: str,
                     schedule: KernelSchedule) -> KernelFile:
        """Export a verified kernel family atomically and record its hash."""
        path = self.kernel_path(n, k, schedule)
        export_atomic(executable, path)
        kf = KernelFile(n, k, dtype, schedule.family(), str(path.relative_to(self.dir)),
                        sha256_file(path))
        self.db.put_kernel(self.fingerprint, kf)
        return kf

    def kernel_problem(self, kf: KernelFile | None) -> str:
        """Why a kernel file cannot be used ('' if it can)."""
        if kf is None:
            return "no kernel file recorded"
        path = self.dir / kf.path
        if not path.is_file():
            return f"{path} is missing"
        if sha256_file(path) != kf.sha256:
            return f"{path} does not match its recorded SHA-256 (truncated or altered)"
        return ""

    def load_kernel(self, n: int, k: int, dtype: str, schedule: KernelSchedule):
        """The kernel's function, after checking its hash; never loads an altered file."""
        kf = self.db.kernel(self.fingerprint, n, k, dtype, schedule)
        problem = self.kernel_problem(kf)
        if problem:
            raise CacheError(f"kernel for N={n} K={k} ({schedule.family_key()}): {problem}; "
                             f"run `sandwichc tune` again to rebuild it")
        assert kf is not None
        if schedule.op in AMX_OPS:  # its first tile instruction would kill a process without
            request_tiles()       # the tile state (compiler/amx.py)
        return load_function(self.dir / kf.path)

    # -- lookup ------------------------------------------------------------------------
    def kernel_n(self, n: int) -> int:
        """The N whose kernels serve a GEMM of N outputs (N padded to whole vectors)."""
        from sandwich.tuner.space import kernel_n

        return kernel_n(n, self.cpu.lanes_f32)

    def records(self, n: int, k: int, dtype: str = "float32",
                threads: int | None = None) -> list[StoredRecord]:
        """The usable records that serve (N, K) (those of the padded N when N is not whole
        vectors); a damaged record is left out, so its M range is tuned again."""
        from sandwich.tuner.record_check import record_problem

        recs = self.db.records(fingerprint=self.fingerprint, n=self.kernel_n(n), k=k, dtype=dtype,
                               threads=threads, bad=[])
        return [r for r in recs if record_problem(r, lanes=self.cpu.lanes_f32) is None]

    def bad_records(self) -> list[str]:
        """Every record of this target that `records` leaves out, and why."""
        from sandwich.tuner.record_check import describe, record_problem

        bad: list[str] = []
        layouts: dict[tuple, set[int]] = {}
        for r in self.db.records(fingerprint=self.fingerprint, bad=bad):
            why = record_problem(r, lanes=self.cpu.lanes_f32)
            rec = r.record
            if not why and self.db.kernel(self.fingerprint, rec.n, rec.k, rec.dtype,
                                          rec.schedule) is None:
                why = "no kernel file recorded for its family"
            if why:
                bad.append(f"{describe(r)}: {why}")
            else:
                layouts.setdefault((rec.n, rec.k, rec.dtype, r.threads), set()).add(rec.schedule.pack_n)
        bad += [f"records N={n} K={k} threads={t} disagree on the weight layout {sorted(packs)}"
                for (n, k, _, t), packs in layouts.items() if len(packs) > 1]
        return bad

    def gemm(self, *, n: int, k: int, dtype: str = "float32",
             threads: int | None = None) -> GemmKernel:
        """The tuned GEMM for (N, K) and `threads` threads (default: this process's thread
        count). Kernels tuned for another thread count are never used in their place: their
        slices and polymerization were chosen for that many threads."""
        threads = threads or process_threads()
        recs = self.records(n, k, dtype, threads)
        if not recs:
            others = sorted({r.threads for r in self.records(n, k, dtype)})
            have = (f"; it has them for {', '.join(map(str, others))} thread(s) only (tune with "
                    f"--threads {threads}, or run with --threads {others[-1]})" if others else
                    "; run `sandwichc tune` for a model with this shape first" +
                    (f" (with --weights {dtype})" if dtype != "float32" else ""))
            raise CacheError(f"no tuned kernels for GEMM N={n} K={k} {dtype} with {threads} "
                             f"thread(s) on this machine (target {self.fingerprint}) in "
                             f"{self.dir}{have}")
        return GemmKernel(self, n=self.kernel_n(n), k=k, dtype=dtype, records=recs, n_out=n)

    def verify(self) -> list[str]:
        """Every record is usable and every recorded kernel file exists and matches its hash;
        returns the problems."""
        problems = self.db.integrity_problems() + self.bad_records()
        for fp, kf in self.db.kernels(bad=problems):
            if fp != self.fingerprint:
                continue
            problem = self.kernel_problem(kf)
            if problem:
                problems.append(f"N={kf.n} K={kf.k} {kf.schedule.key()}: {problem}")
        return problems

    def stray_files(self, *, min_age_s: float = 0.0) -> list[Path]:
        """`.so` files no record names (a tuner killed between writing and recording one,
        or its `.tmp-*` file), at least `min_age_s` old: a running tuner's newest file is
        younger than that."""
        import time

        recorded = {(self.dir / kf.path).resolve() for _, kf in self.db.kernels(bad=[])}
        now, out = time.time(), []
        for p in sorted((self.dir / "kernels").rglob("*.so")):
            if p.resolve() not in recorded and now - p.stat().st_mtime >= min_age_s:
                out.append(p)
        return out

    def clean(self, *, min_age_s: float = 600.0) -> list[Path]:
        """Delete the stray files (see `stray_files`); returns them."""
        gone = self.stray_files(min_age_s=min_age_s)
        for p in gone:
            p.unlink(missing_ok=True)
        return gone

    def clear(self) -> None:
        """Delete records and kernels of every target; the directory stays."""
        self.db.close()
        for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
            (self.dir / name).unlink(missing_ok=True)
        shutil.rmtree(self.dir / "kernels", ignore_errors=True)
        shutil.rmtree(self.ops_dir, ignore_errors=True)
        self.db = TuningDB(self.dir / DB_NAME)


_REPLAY_BYTES = 1 << 20  # activation + output bytes of a call GemmKernel may replay
_REPLAY_ENTRIES = 64


class GemmKernel:
    """C = A @ W for one (N, K): picks the schedule tuned for the M range of each call.

    `n` is the kernels' N; `n_out` (<= n) the caller's: when they differ the weights get zero
    columns and each call writes a scratch of n columns, then copies the first n_out out."""

    def __init__(self, cache: KernelCache, *, n: int, k: int, dtype: str,
                 records: list[StoredRecord], n_out: int | None = None) -> None:
        self.cache, self.n, self.k, self.dtype = cache, n, k, dtype
        self.n_out = n if n_out is None else n_out
        self.threads = records[0].threads if records else 0  # what its records were tuned for
        recs = sorted(records, key=lambda r: r.record.m_lo)
        self.m_los = [r.record.m_lo for r in recs]
        self.schedules = [r.record.schedule for r in recs]
        packs = {s.pack_n for s in self.schedules}
        if len(packs) != 1:
            raise CacheError(f"GEMM N={n} K={k}: records disagree on the weight layout {sorted(packs)}; "
                             f"run `sandwichc cache clear` and tune again")
        self.pack_n = packs.pop()
        self._funcs: dict[KernelSchedule, object] = {}
        self._ws = np.empty(0, dtype=np.float32)
        # (a, weights, out) buffers seen before -> (kernel, wrapped arguments): an executor
        # calls with the same permanent buffers every step, and wrapping them again costs
        # as much as an M=1 kernel. Entries keep their arrays alive, so an address is never
        # reused by another array while cached; only small calls (where the wrapping shows)
        # are kept, and few of them, so at most _REPLAY_ENTRIES * _REPLAY_BYTES stay alive.
        self._calls: dict[tuple, tuple] = {}

    def schedule_for(self, m: int) -> KernelSchedule:
        """The record with the largest m_lo <= M (the first one below every m_lo)."""
        i = max(0, bisect.bisect_right(self.m_los, m) - 1)
        return self.schedules[i]

    def _func(self, schedule: KernelSchedule):
        fam = schedule.family()
        if fam not in self._funcs:
            self._funcs[fam] = self.cache.load_kernel(self.n, self.k, self.dtype, fam)
        return self._funcs[fam]

    def pack(self, w: np.ndarray | QuantizedWeight) -> PackedWeight:
        """Pack W (K, N) once into the layout every schedule of this GEMM reads: float
        weights (quantized here when the GEMM's dtype is an int format) or a QuantizedWeight
        of that format (a GGUF's blocks, as stored)."""
        shape = w.shape if isinstance(w, QuantizedWeight) else np.shape(w)
        if tuple(shape) != (self.k, self.n_out):
            raise ShapeError(f"weights must have shape ({self.k}, {self.n_out}), got {tuple(shape)}")
        if self.n_out != self.n:
            w = (pad_columns(w, self.n) if isinstance(w, QuantizedWeight)
                 else np.pad(np.asarray(w), ((0, 0), (0, self.n - self.n_out))))
        return PackedWeight(pack_weight(w, self.pack_n, self.dtype), self.n_out, self.k, self.dtype)

    def __call__(self, a: np.ndarray, wp: PackedWeight, out: np.ndarray | None = None) -> np.ndarray:
        key = None
        if out is not None and isinstance(a, np.ndarray) and isinstance(wp, PackedWeight):
            key = (a.ctypes.data, a.shape, a.strides, a.dtype, wp.data[0].ctypes.data, wp.n, wp.k,
                   out.ctypes.data, out.shape, out.strides, out.dtype)
            hit = self._calls.get(key)
            if hit is not None:
                return hit[0]()
        given = a
        a, out, run = self._prepare(a, wp, out)
        # replayable when no copy was made, and small enough to hold on to
        if key is not None and a is given and a.nbytes + out.nbytes <= _REPLAY_BYTES:
            if len(self._calls) >= _REPLAY_ENTRIES:
                self._calls.clear()
            self._calls[key] = (run, a, wp.data, out)
        return run()

    def bind(self, a: np.ndarray, wp: PackedWeight, out: np.ndarray) -> Callable[[], np.ndarray]:
        """C = A @ W into `out` as a call without arguments, checked and wrapped once.

        For callers whose buffers are permanent (the executor's decode steps): each call then
        costs the kernel alone, where finding a cached call by its buffers' addresses costs
        ~5 us, a third of an M=1 kernel. The call reads whatever `a` holds when it runs."""
        given = a
        if out is None:
            raise ShapeError("GemmKernel.bind needs out=, the buffer every call writes")
        a, out, run = self._prepare(a, wp, out)
        if a is not given:
            raise ShapeError("GemmKernel.bind needs a C-contiguous float32 activation (a copy "
                             "made now would not see later writes)")
        return run

    def bind_each(self, a: np.ndarray, weights: Sequence[PackedWeight],
                  out: np.ndarray) -> Callable[[int], np.ndarray]:
        """C = A @ weights[i] into `out`, i named by each call: `bind` for a site whose weight
        changes from call to call among weights this GEMM packed (an MoE layer's experts, a
        decode step's choice), so one bound call serves every expert at the cost of the
        kernel alone (each weight's TVM arguments are made once, `PackedWeight.tvm_args`)."""
        if not weights:
            raise ShapeError("GemmKernel.bind_each needs at least one packed weight")
        for wp in weights[1:]:
            self._check_packed(wp)
        run = self._bind_weights(a, out, weights[0], "bind_each")

        def each(i: int, keep=weights) -> np.ndarray:
            return run(weights[i])
        return each

    def bind_any(self, a: np.ndarray, out: np.ndarray, like: PackedWeight
                 ) -> Callable[[PackedWeight], np.ndarray]:
        """C = A @ W into `out`, W named by each call: any weight this GEMM packed (checked
        then), bound with `like`. For a site whose row count and buffers repeat while its
        weight changes across layers and experts (an MoE prefill's expert of c tokens)."""
        run = self._bind_weights(a, out, like, "bind_any")

        def any_weight(wp: PackedWeight) -> np.ndarray:
            self._check_packed(wp)
            return run(wp)
        return any_weight

    def _bind_weights(self, a, out, like: PackedWeight, what: str) -> Callable[[PackedWeight], np.ndarray]:
        """The call of bind_each and bind_any: its weight's TVM arguments swapped in (made
        once per weight, `PackedWeight.tvm_args`), the rest bound once."""
        given = a
        a, out, args, finish = self._operands(a, like, out)
        if a is not given:
            raise ShapeError(f"GemmKernel.{what} needs a C-contiguous float32 activation")
        n_w = len(like.data)

        def run(wp: PackedWeight, keep=a) -> np.ndarray:  # keep: the buffers outlive the call
            args[1: 1 + n_w] = wp.tvm_args
            return finish(args)
        return run

    def _check_packed(self, wp) -> None:
        if not isinstance(wp, PackedWeight) or (wp.n, wp.k, wp.dtype) != (self.n_out, self.k, self.dtype):
            raise ShapeError(f"weights were not packed by this GEMM (N={self.n_out}, K={self.k}, "
                             f"{self.dtype}); use gemm.pack(w)")

    def _prepare(self, a, wp, out):
        """Check one call's operands; returns (A as the kernel reads it, out, the call). The
        call holds its buffers (and, for a padded N, its own scratch of N columns)."""
        a, out, args, finish = self._operands(a, wp, out)

        def run(keep=(a, wp.data)) -> np.ndarray:  # keep: the buffers outlive the call
            return finish(args)
        return a, out, run

    def _operands(self, a, wp, out):
        """(A as the kernel reads it, out, the kernel's arguments with `wp`'s, finish(args):
        runs the kernel on them and returns out)."""
        self._check_packed(wp)
        a = check_activation(a, self.k)
        m = a.shape[0]
        if out is None:
            out = aligned_empty((m, self.n_out))
        elif out.shape != (m, self.n_out) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ShapeError(f"out must be a C-contiguous float32 array of shape ({m}, {self.n_out})")
        elif not out.flags.writeable:
            raise ShapeError("out is read-only; give a writable array (or none)")
        elif np.shares_memory(a, out) or any(np.shares_memory(x, out) for x in wp.data):
            raise ShapeError("out overlaps the activation or the weights; the kernel would read "
                             "what it has already written (give a separate out)")
        schedule = self.schedule_for(m)
        t_k = schedule.polymerization.t_k
        ws = None
        if t_k > 1:
            if self._ws.size < t_k * m * self.n:
                self._ws = aligned_empty((t_k * m * self.n,))
            ws = workspace_view(self._ws, t_k, m, self.n)
        func = self._func(schedule)
        # padded N: the kernel writes a scratch of N columns, the caller gets the first n_out
        full = out if self.n == self.n_out else aligned_empty((m, self.n))
        args = gemm_args(a, wp.data, full, schedule, ws)

        def finish(args: list, keep=(ws, full)) -> np.ndarray:
            func(*args)
            if full is not out:
                np.copyto(out, full[:, :self.n_out])
            return out
        return a, out, args, finish
