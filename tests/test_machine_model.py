"""Issue 30, item 1: the machine model is measured, stored per target, and the weight layout
the tuner packs follows it (no vendor constant decides it)."""

import json
from dataclasses import replace

import pytest

from sandwich.tuner import machine_model as mm
from sandwich.tuner.space import Isa, pack_width

AVX2, AVX512 = Isa(8, 16), Isa(16, 32)


def _model(fingerprint="f" * 16, **over) -> mm.MachineModel:
    base = mm.MachineModel(fingerprint=fingerprint, lanes=8, registers=16,
                           chain_gflops=(11.5, 23.0, 34.0, 45.0, 56.0, 68.0, 80.0, 92.0, 85.0),
                           l1_read_gbs=157.0, l2_read_gbs=86.0, dram_read_gbs=14.3,
                           l1d_bytes=32 << 10, l2_bytes=512 << 10, llc_bytes=32 << 20,
                           l1d_ways=8, l2_ways=8, cache_line=64,
                           panel_gflops={4: 62.6, 3: 82.9, 2: 80.8, 1: 62.6}, date="2026-11-25")
    return replace(base, **over)


def test_derived_figures_come_from_the_chains():
    m = _model()
    assert m.peak_gflops == 92.0
    assert m.accumulators == 8  # the first chain count within 5% of the best rate
    assert m.fma_latency_ns == pytest.approx(16 / 11.5)  # one chain: 2 x 8 flops per latency
    assert replace(m, chain_gflops=(40.0, 80.0, 81.0)).accumulators == 2
    summary = m.summary()
    assert "8 (GFLOPS by chains" in summary["accumulators for peak"]
    assert "3 x 8: 82.9" in summary["panel probe (GFLOPS)"]
    assert summary["L1-fed tile (1 core)"] == "not measured"  # a model without the figure
    assert summary_of(replace(m, tile_gflops=78.2)).startswith("78.2 GFLOPS, 85% of the FMA peak")


def summary_of(m: mm.MachineModel) -> str:
    return m.summary()["L1-fed tile (1 core)"]


def test_the_panel_width_follows_the_probe():
    probe = {4: 62.6, 3: 82.9, 2: 80.8, 1: 62.6}  # measured on a Zen 3 (AVX2)
    assert pack_width(768, AVX2) == 32  # without a model: the widest that divides N
    assert pack_width(768, AVX2, panel_gflops=probe) == 24  # 3 vectors: best, and the widest tie
    assert pack_width(32000, AVX2, panel_gflops=probe) == 16  # 24 does not divide 32000
    assert pack_width(768, AVX2, panel_gflops={4: 80.0, 3: 79.0, 2: 81.0}) == 32  # all tie: widest
    assert pack_width(768, AVX2, panel_gflops={4: 76.0, 2: 81.0}) == 16
    # the decode-batch rule still applies on top: AVX-512's probe ties 4 and 3 vectors, and a
    # 3-vector panel holds an 8-row tile where the 4-vector one holds 6
    assert pack_width(768, AVX512, panel_gflops={4: 180.0, 3: 178.0, 2: 150.0}) == 48
    assert pack_width(2048, AVX512, panel_gflops={4: 180.0, 3: 190.0, 2: 150.0}) == 64
    assert pack_width(768, AVX512, rows=6, panel_gflops={4: 150.0, 2: 180.0}) == 32


def test_the_model_round_trips_and_a_bad_file_is_measured_again(tmp_path):
    m = _model()
    path = mm.save_model(tmp_path, m)
    assert path == mm.model_path(tmp_path, m.fingerprint)
    assert mm.load_model(tmp_path, m.fingerprint) == m
    assert mm.load_model(tmp_path, "0" * 16) is None  # another target: not this file
    for text in ("{not json", json.dumps({"fingerprint": m.fingerprint}),
                 json.dumps(m.to_json() | {"chain_gflops": [0.0]}),
                 json.dumps(m.to_json() | {"version": mm.MODEL_VERSION + 1})):
        path.write_text(text)
        assert mm.load_model(tmp_path, m.fingerprint) is None, text
    path.write_text(json.dumps(m.to_json() | {"fingerprint": "0" * 16}))
    assert mm.load_model(tmp_path, m.fingerprint) is None  # a file copied from another CPU


def test_fma_chains_show_the_latency_and_the_peak():
    from sandwich.tuner.machine_bench import fma_chain_gflops, max_chains

    one = max(fma_chain_gflops(1, iters=100_000) for _ in range(3))
    many = max(fma_chain_gflops(max_chains(16), iters=100_000) for _ in range(3))
    # every FMA unit we know has a latency of several cycles and more than one in flight
    assert many > 2.0 * one > 0
    with pytest.raises(Exception, match="chains must be"):
        fma_chain_gflops(0)


def test_the_l1_fed_tile_runs_near_but_not_above_the_fma_peak():
    """The register tile on L1-resident data (mb_tile): 12 or 24 independent accumulators, so
    well above one FMA chain, and loads besides its FMAs, so not above the FMA loop's peak
    (a flop count off by a factor would be; the margin is for a moment of another process)."""
    from sandwich.tuner.machine_bench import fma_chain_gflops, peak_gflops, tile_gflops

    one_chain = max(fma_chain_gflops(1, iters=100_000) for _ in range(3))
    tile, peak = tile_gflops(1, iters=5_000, repeat=3), peak_gflops(1, iters=300_000, repeat=3)
    assert 2 * one_chain < tile < 1.3 * peak
    with pytest.raises(Exception, match="threads must be"):
        tile_gflops(0)


@pytest.mark.tvm
def test_the_tuner_packs_weights_as_the_stored_model_says(tmp_path):
    """A stored model whose probe favours 2-vector panels makes the quick budget pack 2
    vectors where the register-file rule packs 4; the tiny budget (no model) keeps 4."""
    from sandwich.compiler.target import detect_cpu
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.kernel_cache import KernelCache
    from sandwich.tuner.tune import weight_pack

    cache = KernelCache(tmp_path / "c")
    cpu = cache.cpu
    lanes = cpu.lanes_f32
    n = 8 * lanes  # 4 and 2 vectors divide it, 3 does not
    model = _model(fingerprint=cache.fingerprint, lanes=lanes, registers=cpu.vector_registers,
                   panel_gflops={4: 50.0, 2: 80.0, 1: 40.0})
    mm.save_model(cache.dir, model)
    assert weight_pack(cache, n, get_budget("quick")) == 2 * lanes
    assert weight_pack(cache, n, get_budget("tiny")) == pack_width(
        n, Isa(lanes, cpu.vector_registers)) == 4 * lanes
    assert detect_cpu().lanes_f32 == lanes


@pytest.mark.tvm
def test_the_panel_probe_times_every_width_that_holds_enough_accumulators():
    from sandwich.compiler.target import detect_cpu

    cpu = detect_cpu()
    lanes = cpu.lanes_f32
    probe = mm.probe_panels(cpu, 8, shape=(16, 24 * lanes, 64), rounds=2, keep=1)
    # 1..4 vectors all divide 24 vectors; each width's tallest tile holds >= 8 accumulators
    # on 16 and on 32 registers except 4 vectors on 16 (2 rows: 8) - which still does
    assert set(probe) == {1, 2, 3, 4} and min(probe.values()) > 0
    assert mm.probe_panels(cpu, 10_000, shape=(16, 24 * lanes, 64)) == {}
