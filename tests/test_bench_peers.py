"""Vendor GEMM peers and the check/time helpers of the GEMM benchmark (issue 2, item 9)."""

import importlib.util
import sys

import numpy as np
import pytest

from sandwich.bench.baselines import Peer, measure
from sandwich.bench.baselines.vendor import make_peers
from sandwich.errors import BuildError, ConfigError, ShapeError
from sandwich.tuner.streaming import rotation_bytes, rotation_copies

SHAPES = [(1, 64, 96), (7, 48, 128), (33, 200, 72)]


def _peer(name):
    ps = make_peers([name], threads=2)
    if not ps.peers:
        pytest.skip(ps.messages[0])
    return ps.peers[0]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("name", ["numpy", "torch", "openvino"])
def test_peer_matches_numpy(name, m, n, k):
    if name != "numpy":
        pytest.importorskip(name)
    peer = _peer(name)
    a, w = measure.random_gemm(m, n, k, seed=m)
    h = peer.prepare(w)
    measure.check_gemm(peer.run(a, h), a, w, what=name)
    r = measure.measure_peer(peer, a, w, repeat=2, min_repeat_s=0.0)
    assert r.gflops > 0 and (r.m, r.n, r.k) == (m, n, k) and not r.rotated


@pytest.mark.parametrize("name", ["numpy", "torch", "openvino"])
def test_prepare_copies_the_weights(name):
    if name != "numpy":
        pytest.importorskip(name)
    peer = _peer(name)
    a, w = measure.random_gemm(2, 16, 8)
    h = peer.prepare(w)
    w[:] = 0.0  # the handle must not alias w: rotation relies on distinct copies
    assert np.abs(np.asarray(peer.run(a, h))).max() > 0


def test_missing_package_is_skipped_with_a_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    monkeypatch.setitem(sys.modules, "torch", None)
    ps = make_peers(["numpy", "torch", "openvino"], threads=1)
    assert ps.names == ("numpy",)
    assert [s.name for s in ps.skipped] == ["torch", "openvino"]
    assert "peer openvino skipped: openvino is not installed (pip install openvino)" in ps.messages
    assert any("pip install torch==2.13.0" in msg for msg in ps.messages)


def test_unknown_peer_and_bad_threads_are_config_errors():
    with pytest.raises(ConfigError, match="unknown GEMM peer 'mkl'"):
        make_peers(["mkl"], threads=1)
    with pytest.raises(ConfigError, match="threads"):
        make_peers(["numpy"], threads=0)


def test_wrong_activation_shape_is_a_shape_error():
    peer = _peer("numpy")
    h = peer.prepare(np.ones((8, 4), np.float32))
    with pytest.raises(ShapeError, match=r"\(M, 8\)"):
        peer.run(np.ones((2, 5), np.float32), h)


def test_check_gemm_rejects_a_wrong_result():
    a, w = measure.random_gemm(4, 32, 64)
    out = (a @ w).astype(np.float32)
    measure.check_gemm(out, a, w)
    out[1, 3] += 1e-2
    with pytest.raises(BuildError, match="relative error"):
        measure.check_gemm(out, a, w, what="fake")
    with pytest.raises(BuildError, match="shape"):
        measure.check_gemm(out[:, :5], a, w)


def test_check_gemm_rejects_bf16_like_rounding():
    a, w = measure.random_gemm(3, 64, 512)
    bf16 = lambda x: (x.view(np.uint32) & 0xFFFF0000).view(np.float32)  # noqa: E731
    with pytest.raises(BuildError):
        measure.check_gemm(bf16(a) @ bf16(w), a, w)


def test_time_rotated_visits_every_handle_in_turn():
    seen = []
    t = measure.time_rotated(lambda a, h: seen.append(h), None, ["w0", "w1", "w2"],
                             repeat=2, min_repeat_s=0.0)
    assert t.median_s > 0 and t.repeats == 2
    assert seen[:3] == ["w0", "w1", "w2"]  # warm-up covers all three
    # then the two repeats, on the next handles in turn: with min_repeat_s = 0 one call fills
    # a repeat, which the warm-up already showed, so no call is spent sizing them
    assert seen[3:] == ["w0", "w1"]
    with pytest.raises(ConfigError):
        measure.time_rotated(lambda a, h: None, None, [])


def test_rotation_copies_exceed_the_llc():
    assert rotation_copies(16 << 20, 32 << 20) == 16
    assert rotation_copies(1 << 30, 32 << 20) == 2
    assert rotation_copies(16 << 20, 32 << 20) * (16 << 20) >= 8 * (32 << 20)
    # 8x an LLC up to 128 MiB; twice a larger one, at least 1 GiB (a VM's 480 MiB LLC)
    assert rotation_bytes(128 << 20) == 1 << 30 and rotation_bytes(64 << 20) == 512 << 20
    assert rotation_bytes(480 << 20) == 1 << 30 and rotation_bytes(1 << 30) == 2 << 30
    assert rotation_copies(16 << 20, 480 << 20) == 64


def test_rotated_peer_reports_weight_bandwidth():
    peer = _peer("numpy")
    a, w = measure.random_gemm(1, 64, 64)
    r = measure.measure_peer(peer, a, w, copies=3, repeat=2, min_repeat_s=0.0)
    assert r.rotated and r.weight_gbs > 0
    assert r.weight_gbs == pytest.approx(w.nbytes / r.timing.median_s / 1e9)


class _WrongPeer(Peer):
    """A peer that drops the last row of K: it must be caught before any timing."""

    name = "wrong"

    def __init__(self):
        self.calls = 0

    def prepare(self, w):
        return w.copy()

    def run(self, a, handle):
        self.calls += 1
        return a[:, :-1] @ handle[:-1]


def test_a_wrong_peer_is_rejected_before_timing():
    peer = _WrongPeer()
    a, w = measure.random_gemm(5, 32, 64)
    with pytest.raises(BuildError, match="wrong is wrong at 5x32x64"):
        measure.measure_peer(peer, a, w)
    assert peer.calls == 1


def test_gemm_timing_json_and_percentage():
    peer = _peer("numpy")
    a, w = measure.random_gemm(1, 32, 32)
    r = measure.measure_peer(peer, a, w, copies=2, repeat=2, min_repeat_s=0.0)
    assert r.to_json()["timing"]["repeats"] == 2
    assert r.pct_of_read(r.weight_gbs * 2) == pytest.approx(50.0)


class _BatchedPeer(Peer):
    """Runs every weight copy in one call, as the OpenVINO peer does when rotated."""

    name = "batched"

    def __init__(self):
        self.handles = []

    def prepare(self, w):
        return w.copy()

    def prepare_rotated(self, w, copies):
        self.handles = [[w.copy() for _ in range(copies)]]
        return self.handles, copies

    def run(self, a, handle):
        if isinstance(handle, list):
            outs = [a @ h for h in handle]
            return outs[0]
        return a @ handle


def test_a_batched_rotation_reports_rates_per_gemm():
    peer = _BatchedPeer()
    a, w = measure.random_gemm(2, 64, 64)
    r = measure.measure_peer(peer, a, w, copies=4, repeat=2, min_repeat_s=0.0)
    assert r.rotated and len(peer.handles[0]) == 4
    assert r.weight_gbs == pytest.approx(4 * w.nbytes / r.timing.median_s / 1e9)
    assert r.gflops == pytest.approx(4 * 2 * 2 * 64 * 64 / r.timing.median_s / 1e9)


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino not installed")
def test_openvino_rotation_is_one_model_with_every_copy():
    peer = make_peers(["openvino"], threads=1).peers[0]
    a, w = measure.random_gemm(3, 32, 48)
    handles, per_call = peer.prepare_rotated(w, 5)
    assert len(handles) == 1 and per_call == 5
    np.testing.assert_allclose(peer.run(a, handles[0]), a @ w, rtol=1e-4)
    assert len(handles[0].compiled[3].outputs) == 5
