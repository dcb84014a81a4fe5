"""Tuning into a kernel cache, the public GEMM API, corruption and resume."""

import dataclasses
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import numpy as np
import pytest

from sandwich.errors import CacheError, ShapeError
from sandwich.runtime import KernelCache
from sandwich.tuner.budget import get_budget
from sandwich.tuner.tune import tune_op, verify_numerics
from sandwich.types import GemmOp

pytestmark = pytest.mark.tvm

N, K, SEQ = 128, 64, 24


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    d = tmp_path_factory.mktemp("cache")
    cache = KernelCache(d)
    rep = tune_op(names=["t"], op=GemmOp("t", N, K), seq_max=SEQ, threads=2,
                  budget=get_budget("tiny"), cache=cache)
    return d, rep


def test_tune_fills_cache_and_second_run_is_cached(tuned):
    d, rep = tuned
    assert rep.searched == len(get_budget("tiny").m_samples(SEQ)) and rep.trials > 0
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    again = tune_op(names=["t"], op=GemmOp("t", N, K), seq_max=SEQ, threads=2,
                    budget=get_budget("tiny"), cache=KernelCache(d))
    assert again.searched == 0 and again.cached == rep.searched and again.trials == 0
    assert KernelCache(d).verify() == []


def test_public_gemm_api_any_m(tuned):
    d, _ = tuned
    gemm = KernelCache(d).gemm(n=N, k=K, dtype="float32")
    rng = np.random.default_rng(1)
    w = rng.standard_normal((K, N), dtype=np.float32)
    wp = gemm.pack(w)
    for m in (1, 2, 3, 7, 11, 13, 23, 24, 40):  # primes, and beyond seq_max
        a = rng.standard_normal((m, K), dtype=np.float32)
        np.testing.assert_allclose(gemm(a, wp), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    assert verify_numerics(KernelCache(d), n=N, k=K, ms=[1, 5, 17]) == []
    with pytest.raises(ShapeError, match=r"shape \(M, 64\)"):
        gemm(np.zeros((3, K + 1), np.float32), wp)
    with pytest.raises(ShapeError, match="float32"):
        gemm(np.zeros((3, K), np.float64), wp)
    with pytest.raises(ShapeError, match="packed"):
        gemm(np.zeros((3, K), np.float32), w)
    with pytest.raises(CacheError, match="run `sandwichc tune`"):
        KernelCache(d).gemm(n=N * 2, k=K)


def test_a_changed_gemm_family_source_starts_a_new_cache_key(tuned, monkeypatch):
    d, _ = tuned
    assert KernelCache(d).gemm(n=N, k=K).schedules
    monkeypatch.setattr("sandwich.compiler.gemm_dsl.family_source_sha256", lambda: "0" * 64)
    with pytest.raises(CacheError, match="no tuned kernels .* run `sandwichc tune`"):
        KernelCache(d).gemm(n=N, k=K)


def test_the_cache_key_covers_the_lowering_code_and_nothing_else(tmp_path, monkeypatch):
    import shutil

    import sandwich.compiler
    from sandwich.compiler import gemm_dsl

    copy = tmp_path / "compiler"
    shutil.copytree(Path(sandwich.compiler.__file__).parent, copy)
    monkeypatch.setattr(sandwich.compiler, "__file__", str(copy / "__init__.py"))
    gemm_dsl.family_source_sha256.cache_clear()
    try:
        before = gemm_dsl.family_source_sha256()
        (copy / "bench_of_something.py").write_text("import sandwich.compiler.lower_tir\n")
        gemm_dsl.family_source_sha256.cache_clear()
        assert gemm_dsl.family_source_sha256() == before  # the build never imports it
        with open(copy / "lower_tir.py", "a") as f:
            f.write("# a change in the lowering\n")
        gemm_dsl.family_source_sha256.cache_clear()
        assert gemm_dsl.family_source_sha256() != before
    finally:  # later tests must hash the real code, not this copy's
        gemm_dsl.family_source_sha256.cache_clear()


def test_repeated_calls_on_the_same_buffers_are_replayed_and_stay_correct(tuned):
    from sandwich.tuner import kernel_cache as kc

    gemm = KernelCache(tuned[0]).gemm(n=N, k=K, dtype="float32")
    rng = np.random.default_rng(2)
    w = rng.standard_normal((K, N), dtype=np.float32)
    wp = gemm.pack(w)
    a, out = np.empty((3, K), np.float32), np.empty((3, N), np.float32)
    for _ in range(3):  # new contents in the same buffers: the replayed call reads them
        a[...] = rng.standard_normal(a.shape, dtype=np.float32)
        assert gemm(a, wp, out=out) is out
        np.testing.assert_allclose(out, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    assert len(gemm._calls) == 1
    with pytest.raises(ShapeError):  # a different shape is not a replay: it is checked
        gemm(np.zeros((3, K + 1), np.float32), wp, out=out)
    rows = kc._REPLAY_BYTES // (4 * (K + N)) + 1  # too big to hold on to
    big_a, big_out = np.ones((rows, K), np.float32), np.empty((rows, N), np.float32)
    gemm(big_a, wp, out=big_out)
    assert len(gemm._calls) == 1
    gemm(a[:, :], wp, out=out)  # a new view of the same buffer replays
    assert len(gemm._calls) == 1


def test_altered_kernel_is_detected_never_loaded_and_rebuilt(tuned, tmp_path):
    d, _ = tuned
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(d, copy)
    cache = KernelCache(copy)
    so = next((copy / "kernels").rglob("*.so"))
    so.write_bytes(so.read_bytes()[:100])  # truncated
    assert any("SHA-256" in p for p in cache.verify())
    gemm = cache.gemm(n=N, k=K)
    wp = gemm.pack(np.ones((K, N), np.float32))
    broken = [m for m in range(1, SEQ + 1)
              if gemm.schedule_for(m).family_key() in so.name]
    with pytest.raises(CacheError, match="truncated or altered"):
        gemm(np.ones((broken[0], K), np.float32), wp)
    rep = tune_op(names=["t"], op=GemmOp("t", N, K), seq_max=SEQ, threads=2,
                  budget=get_budget("tiny"), cache=cache)
    assert rep.rebuilt >= 1 and rep.searched == 0
    assert cache.verify() == []


def test_corrupt_database_is_a_clear_error(tmp_path):
    (tmp_path / "tuning.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CacheError, match="unreadable|corrupt|not a database"):
        KernelCache(tmp_path)
    assert (tmp_path / "tuning.sqlite").read_bytes().startswith(b"this is not")  # kept


def test_records_are_committed_as_they_are_found(tuned):
    d, _ = tuned
    rows = sqlite3.connect(d / "tuning.sqlite").execute("SELECT m_lo, m_hi FROM records "
                                                        "ORDER BY m_lo").fetchall()
    samples = get_budget("tiny").m_samples(SEQ)
    assert [r[0] for r in rows] == samples
    assert rows[-1][1] == SEQ and all(hi + 1 == nxt for (_, hi), (nxt, _) in zip(rows, rows[1:], strict=False))


def test_records_of_another_weight_layout_are_retuned_not_mixed(tuned, tmp_path):
    """Every M of an (N, K) shares one packing: records stored for another layout (an older
    sandwichc chose other panel widths) are dropped and searched again, never resumed."""
    d = tmp_path / "cache"
    shutil.copytree(tuned[0], d)
    cache = KernelCache(d)
    records = cache.records(N, K, threads=2)
    real = records[0].record.schedule.pack_n  # the ISA's panel width (64 on AVX-512, 32 on AVX2)
    for r in records[1:]:  # the first M range keeps the real layout
        stale = dataclasses.replace(r.record.schedule, pack_n=2 * real)  # valid, but not real
        cache.db.put_record(dataclasses.replace(r.record, schedule=stale), threads=2)
    with pytest.raises(CacheError, match="weight layout"):  # a mix is refused at load ...
        KernelCache(d).gemm(n=N, k=K)
    rep = tune_op(names=["t"], op=GemmOp("t", N, K), seq_max=SEQ, threads=2,
                  budget=get_budget("tiny"), cache=KernelCache(d))
    assert rep.cached == 0 and rep.searched == len(get_budget("tiny").m_samples(SEQ))
    packs = {r.record.schedule.pack_n for r in KernelCache(d).records(N, K, threads=2)}
    assert packs == {real}
    assert verify_numerics(KernelCache(d), n=N, k=K, ms=[1, 7, 19]) == []  # ... and re-tuned


def test_bound_call_reads_new_contents_and_refuses_what_it_cannot_bind(tuned):
    gemm = KernelCache(tuned[0]).gemm(n=N, k=K, dtype="float32")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, N), dtype=np.float32)
    wp = gemm.pack(w)
    a, out = np.empty((5, K), np.float32), np.full((5, N), np.nan, np.float32)
    call = gemm.bind(a, wp, out)
    for _ in range(3):  # the bound call reads the buffers as they are when it runs
        a[...] = rng.standard_normal(a.shape, dtype=np.float32)
        assert call() is out
        np.testing.assert_allclose(out, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError, match="C-contiguous"):  # a copy would never see new writes
        gemm.bind(np.zeros((K, 5), np.float32).T, wp, out)
    with pytest.raises(ShapeError, match="out="):
        gemm.bind(a, wp, None)
    with pytest.raises(ShapeError, match=r"shape \(5, 128\)"):
        gemm.bind(a, wp, np.empty((4, N), np.float32))


def _replayed_and_bound(gemm, wp, w: np.ndarray, m: int, rng):
    """Twice: new activations through a call with `out` (the second time a replay) and
    through a bound call, each checked against numpy; returns the buffers."""
    a, out = np.empty((m, w.shape[0]), np.float32), np.empty((m, w.shape[1]), np.float32)
    call = gemm.bind(a, wp, out)
    for _ in range(2):
        a[...] = rng.standard_normal(a.shape, dtype=np.float32)
        assert gemm(a, wp, out=out) is out
        np.testing.assert_allclose(out, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
        out[...] = 0
        assert call() is out
        np.testing.assert_allclose(out, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    return a, out


def test_an_n_that_is_not_whole_vectors_runs_on_the_padded_kernel(tuned):
    """Issue 23: N = 125 finds the kernels tuned for N = 128, packs zero columns and returns
    125 columns, through a plain call, a replayed call and a bound call."""
    cache = KernelCache(tuned[0])
    n = N - 3
    assert cache.kernel_n(n) == N and cache.records(n, K) == cache.records(N, K)
    gemm = cache.gemm(n=n, k=K)
    assert (gemm.n, gemm.n_out) == (N, n)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, n), dtype=np.float32)
    wp = gemm.pack(w)
    with pytest.raises(ShapeError, match=rf"\({K}, {n}\)"):
        gemm.pack(rng.standard_normal((K, N), dtype=np.float32))
    for m in (1, 5, 30):
        a = rng.standard_normal((m, K), dtype=np.float32)
        np.testing.assert_allclose(gemm(a, wp), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    a, out = _replayed_and_bound(gemm, wp, w, 4, rng)
    with pytest.raises(ShapeError, match=f"shape \\(4, {n}\\)"):
        gemm(a, wp, out=np.empty((4, N), np.float32))


def test_split_k_records_run_with_their_workspace_at_any_m(tuned, tmp_path):
    """The tiny budget tunes no split-K: records of a split-K schedule (what larger budgets
    find) run through the public call, a replay and a bound call, with the workspace the
    dispatcher sizes for each M."""
    from sandwich.compiler.gemm_dsl import build_gemm_dsl
    from sandwich.types import ComputeSlice, Polymerization

    d = tmp_path / "cache"
    shutil.copytree(tuned[0], d)
    cache = KernelCache(d)
    for r in cache.records(N, K, threads=2):
        s = r.record.schedule
        split = dataclasses.replace(s, polymerization=Polymerization(1, 1, 2),
                                    slice=ComputeSlice(s.slice.b_m, s.slice.b_n, 16))
        cache.db.put_record(dataclasses.replace(r.record, schedule=split), threads=2)
        if cache.db.kernel(cache.fingerprint, N, K, "float32", split.family()) is None:
            ex = build_gemm_dsl(split, n=N, k=K, cpu=cache.cpu, threads=2)
            cache.store_kernel(ex, n=N, k=K, dtype="float32", schedule=split)
    gemm = KernelCache(d).gemm(n=N, k=K)
    assert all(gemm.schedule_for(m).polymerization.t_k == 2 for m in (1, 9, SEQ))
    rng = np.random.default_rng(5)
    w = rng.standard_normal((K, N), dtype=np.float32)
    wp = gemm.pack(w)
    for m in (1, 9, SEQ, 3 * SEQ, 2):  # the workspace grows, then serves a smaller M
        a = rng.standard_normal((m, K), dtype=np.float32)
        np.testing.assert_allclose(gemm(a, wp), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    _replayed_and_bound(gemm, wp, w, 6, rng)


def _damage(db: Path, m_lo: int, edit, *, legacy: bool) -> None:
    """Rewrite the stored schedule JSON of one record (as a flipped bit in the file would);
    `legacy` also drops its checksum, as in a cache written before records carried one."""
    con = sqlite3.connect(db)
    (text,) = con.execute("SELECT schedule FROM records WHERE m_lo = ?", (m_lo,)).fetchone()
    con.execute("UPDATE records SET schedule = ? WHERE m_lo = ?", (edit(text), m_lo))
    if legacy:
        con.execute("UPDATE records SET digest = NULL WHERE m_lo = ?", (m_lo,))
    con.commit()
    con.close()


NEGATIVE_B_M = lambda t: t.replace('"b_m": ', '"b_m": -', 1).replace("--", "-")  # noqa: E731


@pytest.mark.parametrize("edit, legacy, says", [
    (NEGATIVE_B_M, False, "checksum"),
    (NEGATIVE_B_M, True, "positive|multiple"),
    (lambda t: t.replace('"b_k": ', '"b_k": -', 1).replace("--", "-"), True, "positive"),
    (lambda t: t.replace('"b_m": ', '"b_m": 0*', 1), True, "malformed"),
    (lambda t: t[: len(t) // 2], True, "malformed"),
])
def test_a_damaged_record_is_reported_skipped_and_retuned_never_run(tuned, tmp_path, edit,
                                                                    legacy, says):
    """Issue 24, item 1: `"b_m": 0` passed every check and the first GEMM call died with
    SIGFPE; `b_k = -16` gave a relative error of 2e35. Now the record fails its checksum (or,
    in a cache from before checksums, the schedule checks), is reported by verify, left out
    at load (the M range below serves), and tuned again by the next tune."""
    import json
    import re

    d = tmp_path / "cache"
    shutil.copytree(tuned[0], d)
    victim = get_budget("tiny").m_samples(SEQ)[1]
    _damage(d / "tuning.sqlite", victim, edit, legacy=legacy)
    cache = KernelCache(d)
    problems = cache.verify()
    assert len(problems) == 1 and f"M>={victim}" in problems[0] and re.search(says, problems[0])
    assert all(r.record.m_lo != victim for r in cache.records(N, K))
    gemm = cache.gemm(n=N, k=K)
    w = np.random.default_rng(4).standard_normal((K, N), dtype=np.float32)
    a = np.random.default_rng(5).standard_normal((victim, K), dtype=np.float32)
    np.testing.assert_allclose(gemm(a, gemm.pack(w)), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    rep = tune_op(names=["t"], op=GemmOp("t", N, K), seq_max=SEQ, threads=2,
                  budget=get_budget("tiny"), cache=cache)
    assert rep.searched == 1 and cache.verify() == []
    assert json.loads(sqlite3.connect(d / "tuning.sqlite").execute(
        "SELECT schedule FROM records WHERE m_lo = ?", (victim,)).fetchone()[0])


def test_a_zero_slice_never_reaches_a_kernel():
    from sandwich.compiler.gemm_runner import gemm_args
    from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

    s = KernelSchedule(MicroKernel(4, 16), ComputeSlice(0, 16, 16), Polymerization(), pack_n=16)
    z = np.zeros((4, 16), np.float32)
    with pytest.raises(ShapeError, match="must be positive"):
        gemm_args(z, z, z, s)


def test_overlapping_or_read_only_buffers_are_refused_or_copied(tuned):
    """Issue 24, item 2: out overlapping a returned garbage (relative error 1e15); read-only
    inputs raised a bare BufferError."""
    gemm = KernelCache(tuned[0]).gemm(n=N, k=K)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((K, N), dtype=np.float32)
    wp = gemm.pack(w)
    buf = np.zeros((4, N + K), np.float32)
    a = np.ascontiguousarray(buf[:, :K])
    with pytest.raises(ShapeError, match="overlaps"):
        gemm(buf.reshape(-1)[: 4 * K].reshape(4, K), wp, out=buf.reshape(-1)[: 4 * N].reshape(4, N))
    frozen = np.zeros((4, N), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ShapeError, match="read-only"):
        gemm(a, wp, out=frozen)
    a = rng.standard_normal((4, K), dtype=np.float32)
    ro = np.frombuffer(a.tobytes(), np.float32).reshape(4, K)  # read-only
    np.testing.assert_allclose(gemm(ro, wp), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


def test_stray_files_are_listed_and_cleaned_and_records_leave_the_wal(tuned, tmp_path):
    """Issue 24, item 5: a SIGKILL could leave a 0-byte `.tmp-*.so` forever, an exported but
    unrecorded `.so`, and every committed record only in the WAL."""
    d = tmp_path / "cache"
    shutil.copytree(tuned[0], d)
    cache = KernelCache(d)
    so = next((d / "kernels").rglob("n*.so"))
    orphan, tmp = so.with_name("n1_k1_orphan.so"), so.with_name(".tmp-abc123.so")
    orphan.write_bytes(so.read_bytes())
    tmp.write_bytes(b"")
    assert cache.stray_files() == sorted([orphan, tmp])
    assert cache.clean(min_age_s=3600) == []  # young files may belong to a running tuner
    assert cache.clean(min_age_s=0) == sorted([orphan, tmp]) and not orphan.exists()
    assert cache.verify() == [] and so.exists()
    rep = tune_op(names=["t"], op=GemmOp("t", N, K), seq_max=SEQ, threads=2,
                  budget=get_budget("tiny"), cache=cache)
    assert rep.cached > 0
    wal = d / "tuning.sqlite-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed after the shape


def test_a_malformed_kernel_row_is_reported_not_fatal(tuned, tmp_path):
    """Issue 24, item 3: a corrupted kernels row raised JSONDecodeError in `verify`."""
    d = tmp_path / "cache"
    shutil.copytree(tuned[0], d)
    con = sqlite3.connect(d / "tuning.sqlite")
    con.execute("UPDATE kernels SET schedule = substr(schedule, 1, 10) WHERE rowid = "
                "(SELECT min(rowid) FROM kernels)")
    con.commit()
    con.close()
    problems = KernelCache(d).verify()
    assert len(problems) == 1 and "malformed schedule" in problems[0]


def test_single_byte_corruptions_never_crash_or_compute_wrong(tuned, tmp_path):
    """Issue 24: a bounded run of `sandwichc bench corruption` (the full one is 1,000): each
    corruption of the SQLite file or a `.so` is harmless or reported by verify."""
    from sandwich.bench import corruption as cb

    base = tmp_path / "base"
    shutil.copytree(tuned[0], base)
    KernelCache(base).db.checkpoint()
    results = cb.run_corruptions(base, tmp_path / "work", cb.plan(base, 60, seed=1), [(N, K)])
    outcomes = {r["outcome"] for r in results}
    assert len(results) == 60 and outcomes <= {"harmless", "reported"}, \
        [r for r in results if r["outcome"] not in ("harmless", "reported")]


def test_undecodable_schema_text_is_a_cache_error(tuned, tmp_path):
    """Issue 24, item 3: two of forty corrupted SQLite files raised UnicodeDecodeError at
    `PRAGMA journal_mode` (SQLite's own message quoted the damaged schema text)."""
    d = tmp_path / "cache"
    shutil.copytree(tuned[0], d)
    KernelCache(d).db.checkpoint()
    db = d / "tuning.sqlite"
    data = bytearray(db.read_bytes())
    at = data.index(b"CREATE TABLE records")
    data[at + 7] = 0xA3  # "CREATE \xa3ABLE": not UTF-8, not SQL
    db.write_bytes(bytes(data))
    with pytest.raises(CacheError, match="unreadable"):
        KernelCache(d)


def test_a_cache_from_before_record_checksums_is_upgraded_in_place(tuned, tmp_path):
    """Its records (no digest column) stay usable; new ones carry a checksum."""
    d = tmp_path / "cache"
    shutil.copytree(tuned[0], d)
    con = sqlite3.connect(d / "tuning.sqlite")
    con.execute("ALTER TABLE records DROP COLUMN digest")
    con.commit()
    con.close()
    cache = KernelCache(d)
    assert cache.verify() == [] and len(cache.records(N, K)) == len(get_budget("tiny").m_samples(SEQ))
    rec = cache.records(N, K)[0]
    cache.db.put_record(rec.record, threads=rec.threads)
    digests = sqlite3.connect(d / "tuning.sqlite").execute(
        "SELECT count(digest) FROM records").fetchone()
    assert digests == (1,)
