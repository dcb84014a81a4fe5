"""The GEMM template compiled with TVM: every tail path, split-K and slices vs numpy."""

import itertools

import numpy as np
import pytest

from sandwich.compiler.build import build_gemm
from sandwich.compiler.gemm_runner import call_gemm, pack_weights
from sandwich.compiler.gemm_template import GemmProblem, gemm_tvmscript, tail_sizes
from sandwich.compiler.target import detect_cpu
from sandwich.errors import ConfigError, ShapeError
from sandwich.tuner.tvm_measure import TvmMeasure
from sandwich.types import GEMM_OP, ComputeSlice, KernelSchedule, MicroKernel, Polymerization

pytestmark = pytest.mark.tvm

CPU = detect_cpu()
LANES = CPU.lanes_f32


def _sched(mu_m, mu_n, b, pl, pack=64):
    return KernelSchedule(MicroKernel(mu_m, mu_n), ComputeSlice(*b), Polymerization(*pl), pack)


def test_tail_sizes_cover_every_remainder():
    for mu_m in range(1, 15):
        sizes = tail_sizes(mu_m)
        sums = {sum(s for s in sizes if r & s) for r in range(mu_m)}
        assert sums == set(range(mu_m))


def test_invalid_schedules_are_refused():
    p = GemmProblem(n=128, k=64, lanes=16)
    with pytest.raises(ConfigError, match="multiple of the micro-kernel"):
        gemm_tvmscript(_sched(3, 64, (4, 64, 16), (1, 1, 1)), p)
    with pytest.raises(ConfigError, match="vector width"):
        gemm_tvmscript(_sched(1, 24, (1, 24, 16), (1, 1, 1)), p)
    with pytest.raises(ConfigError, match="without K panels"):
        gemm_tvmscript(_sched(1, 64, (1, 64, 64), (1, 1, 2)), p)


@pytest.mark.parametrize("mu_m, mu_n, slice_, pl", [
    (6, 4 * LANES, (12, 8 * LANES, 48), (1, 2, 1)),
    (5, 2 * LANES, (10, 2 * LANES, 64), (2, 1, 1)),
    (3, 4 * LANES, (6, 4 * LANES, 32), (1, 1, 2)),
    (1, 4 * LANES, (1, 4 * LANES, 80), (1, 2, 1)),
])
def test_kernel_matches_numpy(mu_m, mu_n, slice_, pl):
    n, k = 8 * LANES, 96  # K not a multiple of b_k: partial panels too
    s = _sched(mu_m, mu_n, slice_, pl, pack=4 * LANES)
    func = build_gemm(s, n=n, k=k, cpu=CPU, threads=2)["main"]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n), dtype=np.float32)
    wp = pack_weights(w, 4 * LANES)
    for m in (1, 2, 3, 5, 7, 13, 31, 64, 97):
        a = rng.standard_normal((m, k), dtype=np.float32)
        out = np.full((m, n), np.nan, dtype=np.float32)
        ws = np.empty((pl[2] * m, n), np.float32) if pl[2] > 1 else None
        call_gemm(func, a, wp, out, s, ws)
        np.testing.assert_allclose(out, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


def test_one_family_serves_every_slice():
    meas = TvmMeasure(CPU, 2, 4 * LANES, 64, 4 * LANES, seq_max=32)
    for b in ((2, 4 * LANES, 16), (8, 4 * LANES, 64), (4, 4 * LANES, 32)):
        assert meas(_sched(2, 4 * LANES, b, (1, 1, 1), pack=4 * LANES), 17).ok
    assert len(meas.kernels) == 1 and len(meas.verified) == 3


def test_a_slice_the_kernel_cannot_run_is_a_failed_candidate_not_an_error():
    """A slice of fewer rows than the tile has zero row blocks (the kernel divides by them):
    the measure reports it failed, and the search goes on."""
    meas = TvmMeasure(CPU, 2, 4 * LANES, 64, 4 * LANES, seq_max=32)
    assert meas(_sched(2, 4 * LANES, (2, 4 * LANES, 16), (1, 1, 1), pack=4 * LANES), 17).ok
    bad = _sched(2, 4 * LANES, (1, 4 * LANES, 16), (1, 1, 1), pack=4 * LANES)  # family built
    for _ in range(2):  # the second time from what the first one learned
        res = meas(bad, 17)
        assert not res.ok and "every size must be positive" in res.error


def test_checks_reuse_reference_rows_and_catch_a_wrong_kernel():
    from sandwich.compiler.gemm_formats import quantized_activations
    from sandwich.tuner.reference import ReferenceRows, reference_matmul

    meas = TvmMeasure(CPU, 2, 4 * LANES, 64, 4 * LANES, seq_max=40)
    assert meas(_sched(2, 4 * LANES, (4, 4 * LANES, 32), (1, 1, 1), pack=4 * LANES), 17).ok
    family = meas._references[GEMM_OP]  # the family's reference (the AMX kernel has its own)
    done = family.done  # the rows the checks needed, each computed once
    assert 1 <= done <= 40
    assert np.allclose(meas.reference(GEMM_OP, done), reference_matmul(meas.a[:done], meas.w),
                       rtol=1e-12)
    # rows added later extend the same reference; a row transform (the kernel's 16-bit
    # activation rounding) applies row by row
    rows = ReferenceRows(meas.a, meas.w, quantized_activations)
    rows(3)
    assert np.allclose(rows(40), reference_matmul(quantized_activations(meas.a), meas.w), rtol=1e-12)
    # a kernel that disagrees with the reference is refused, never timed
    family._out[:done] += 1.0
    res = meas(_sched(2, 4 * LANES, (8, 4 * LANES, 64), (1, 1, 1), pack=4 * LANES), 17)
    assert not res.ok and "is wrong at M=" in res.error


def test_skinny_m_is_timed_on_weights_streamed_past_the_llc():
    meas = TvmMeasure(CPU, 2, 4 * LANES, 64, 4 * LANES, seq_max=32, llc_bytes=1 << 20)
    assert meas(_sched(1, 4 * LANES, (1, 4 * LANES, 64), (1, 1, 1), pack=4 * LANES), 1).ok
    copies = [c for (c,) in meas.streamed_weights()]  # fp32: one array per copy
    (wp,) = meas.wp
    assert len(copies) * wp.nbytes >= 8 << 20  # 8x the (given) LLC
    assert all(c.ctypes.data % 64 == 0 and np.array_equal(c, wp) for c in copies)
    # separate allocations, as a model's weights are: none starts where another ends, so
    # the hardware prefetcher cannot run on from one call's weights into the next call's
    spans = sorted((c.ctypes.data, c.ctypes.data + c.nbytes) for c in copies)
    assert all(end != start for (_, end), (start, _) in itertools.pairwise(spans))


def test_large_weights_are_timed_from_dram_at_every_m():
    """Past decode's M, weights of 1/8 of the LLC and more are timed rotated (in a model the
    other layers' weights evict them between calls); smaller ones stay cache-resident."""
    from sandwich.tuner.streaming import from_dram

    assert from_dram(1, 1 << 10, 32 << 20) and from_dram(8, 1 << 10, 32 << 20)
    assert not from_dram(9, 1 << 10, 32 << 20) and not from_dram(512, (4 << 20) - 1, 32 << 20)
    assert from_dram(512, 4 << 20, 32 << 20)
    sched = _sched(1, 4 * LANES, (4, 4 * LANES, 64), (1, 1, 1), pack=4 * LANES)
    for llc, rotated in ((1 << 20, False), (4 * LANES * 64 * 4 * 8, True)):  # 8x the weights
        meas = TvmMeasure(CPU, 2, 4 * LANES, 64, 4 * LANES, seq_max=32, llc_bytes=llc)
        assert meas(sched, 32).ok
        assert bool(meas._streamed) == rotated  # the copies exist only once a timing rotated


def test_wrong_weight_shape():
    with pytest.raises(ShapeError):
        pack_weights(np.zeros((4, 30), np.float32), 16)


def test_a_process_compiles_each_source_and_target_once(monkeypatch, tmp_path):
    """The second build of the same source for the same target is the first's module (no
    TVM call), written to a build directory the first call had not named; another thread
    count is another target, and a failed build is not kept."""
    import tvm

    from sandwich.compiler import build
    from sandwich.errors import BuildError

    calls = []
    real = tvm.compile
    monkeypatch.setattr(tvm, "compile", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    src = gemm_tvmscript(_sched(1, LANES, (1, LANES, 16), (1, 1, 1), pack=LANES),
                         GemmProblem(n=LANES, k=32, lanes=LANES)) + f"\n# test {id(calls)}\n"
    first = build.compile_source(src, CPU, 1)
    assert build.compile_source(src, CPU, 1) is first and len(calls) == 1
    assert build.compile_source(src, CPU, 1, tmp_path) is first and len(calls) == 1
    assert len(list(tmp_path.glob("*.so"))) == 1
    assert build.compile_source(src, CPU, 2) is not first and len(calls) == 2
    bad = src.replace("T.prim_func", "T.prim_func_misspelled")
    for _ in range(2):
        with pytest.raises(BuildError, match="TVM failed to compile"):
            build.compile_source(bad, CPU, 1)
    a = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((32, LANES)).astype(np.float32)
    s = _sched(1, LANES, (1, LANES, 16), (1, 1, 1), pack=LANES)
    out = call_gemm(build.executable_function(first), a, pack_weights(w, s.pack_n),
                    np.zeros((3, LANES), np.float32), s)
    np.testing.assert_allclose(out, a @ w, rtol=1e-4, atol=1e-4)


def test_a_stored_build_loads_in_a_new_process_and_a_damaged_one_is_rebuilt(tmp_path, monkeypatch):
    """compile_source with a directory keeps the module as <dir>/<key>.so: with this process's memory of it
    gone and TVM's compiler refusing, the file still gives a working kernel; a damaged
    file is built again and replaced."""
    import tvm

    from sandwich.compiler import build

    monkeypatch.delenv("SANDWICHC_BUILD_CACHE", raising=False)  # this directory only
    s = _sched(1, LANES, (1, LANES, 16), (1, 1, 1), pack=LANES)
    src = gemm_tvmscript(s, GemmProblem(n=LANES, k=32, lanes=LANES)) + f"\n# stored {tmp_path}\n"
    build.compile_source(src, CPU, 1, tmp_path)
    (path,) = tmp_path.glob("*.so")
    a = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((32, LANES)).astype(np.float32)

    def run(mod):
        out = np.zeros((3, LANES), np.float32)
        return call_gemm(mod["main"], a, pack_weights(w, s.pack_n), out, s)

    real = tvm.compile
    monkeypatch.setattr(build, "_BUILT", type(build._BUILT)())
    monkeypatch.setattr(tvm, "compile", lambda *a, **kw: pytest.fail("compiled again"))
    loaded = build.compile_source(src, CPU, 1, tmp_path)
    np.testing.assert_allclose(run(loaded), a @ w, rtol=1e-4, atol=1e-4)
    build.export_atomic(loaded, tmp_path / "kernels" / "again.so")  # as the tuner stores a winner
    np.testing.assert_allclose(run(build.load_module(tmp_path / "kernels" / "again.so")), a @ w,
                               rtol=1e-4, atol=1e-4)
    # damaged as a new file (this process maps the old one: writing over it would fault)
    (tmp_path / "damaged").write_bytes(b"not a shared object")
    (tmp_path / "damaged").replace(path)
    monkeypatch.setattr(build, "_BUILT", type(build._BUILT)())
    monkeypatch.setattr(tvm, "compile", real)
    np.testing.assert_allclose(run(build.compile_source(src, CPU, 1, tmp_path)), a @ w, rtol=1e-4, atol=1e-4)
    assert build.load_module(path)["main"] is not None  # replaced by a whole file


def test_a_kernel_caches_directory_takes_a_build_from_the_shared_build_cache(tmp_path, monkeypatch):
    """With $SANDWICHC_BUILD_CACHE set, a build directory that lacks a kernel (a fresh kernel
    cache's ops/) gets it from there, copied, without compiling; one it has is not replaced."""
    import tvm

    from sandwich.compiler import build

    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir()
    own.mkdir()
    monkeypatch.setenv("SANDWICHC_BUILD_CACHE", str(shared))
    s = _sched(1, LANES, (1, LANES, 16), (1, 1, 1), pack=LANES)
    src = gemm_tvmscript(s, GemmProblem(n=LANES, k=32, lanes=LANES)) + f"\n# shared {tmp_path}\n"
    build.compile_source(src, CPU, 1)
    (kept,) = shared.glob("*.so")
    monkeypatch.setattr(build, "_BUILT", type(build._BUILT)())
    monkeypatch.setattr(tvm, "compile", lambda *a, **kw: pytest.fail("compiled again"))
    mod = build.compile_source(src, CPU, 1, own)
    assert [p.name for p in own.glob("*.so")] == [kept.name]
    assert (own / kept.name).read_bytes() == kept.read_bytes()
    a = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((32, LANES)).astype(np.float32)
    out = call_gemm(mod["main"], a, pack_weights(w, s.pack_n), np.zeros((3, LANES), np.float32), s)
    np.testing.assert_allclose(out, a @ w, rtol=1e-4, atol=1e-4)
    mtime = (own / kept.name).stat().st_mtime_ns
    monkeypatch.setattr(build, "_BUILT", type(build._BUILT)())
    build.compile_source(src, CPU, 1, own)
    assert (own / kept.name).stat().st_mtime_ns == mtime


def test_rotated_args_are_each_copys_gemm_args():
    """A decode timing's calls (rotated_args over copies wrapped once) hold what gemm_args
    gives each copy: A, that copy's arrays in order, C, the workspace and the slice."""
    from sandwich.compiler.gemm_runner import gemm_args, rotated_args, wrap

    rng = np.random.default_rng(0)
    s = _sched(1, LANES, (1, LANES, 16), (1, 1, 2), pack=LANES)
    a, out = rng.random((3, 32), np.float32), np.zeros((3, LANES), np.float32)
    ws = np.zeros((2 * 3, LANES), np.float32)
    copies = [tuple(rng.random((1, 32, LANES), np.float32) for _ in range(2)) for _ in range(3)]
    calls = rotated_args(gemm_args(a, copies[0], out, s, ws), [tuple(map(wrap, c)) for c in copies])

    def ptrs(args):
        return [np.from_dlpack(x).ctypes.data if hasattr(x, "__dlpack__") else x for x in args]

    assert [ptrs(c) for c in calls] == [ptrs(gemm_args(a, c, out, s, ws)) for c in copies]
