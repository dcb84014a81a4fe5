"""Issue 29, item 2: the learned cost model ranks held-out candidates, survives a round trip
to disk, detects a damaged or foreign file, and reads the tuner's trial logs."""

import hashlib
import json
import math

import numpy as np
import pytest
from schedule_fakes import CONSTANTS, MS, SHAPES, speed, synthetic

from sandwich.errors import CacheError
from sandwich.tuner import cost_model as cm
from sandwich.tuner.cost_model_eval import evaluate_target, noise_ceiling, score_groups, table
from sandwich.tuner.trial_log import merge_repeats, parse_schedule_key, read_trials
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization


def split(samples, seed=1):
    train_ms = set(np.random.default_rng(seed).permutation(MS)[: len(MS) // 2].tolist())
    return ([s for s in samples if s.m in train_ms], [s for s in samples if s.m not in train_ms])


@pytest.fixture(scope="module")
def data():
    return synthetic()


@pytest.fixture(scope="module")
def fitted(data):
    return cm.CostModel(constants=CONSTANTS, trees=150).fit(data)


def test_schedule_keys_parse_back():
    s = KernelSchedule(MicroKernel(2, 32), ComputeSlice(4, 32, 256), Polymerization(1, 2, 1), 32)
    assert s.key() == "gemm_float32_mk2x32_p1x2x1_n32_s4x32x256"
    assert parse_schedule_key(s.key()) == s
    for bad in ("", "gemm_float32_mk2x32_p1x2_n32_s4x32x256", "gemm_float32_mk0x32_p1x2x1_n32_s4x32x256",
                "gemm_float32_mk2x32_p1x2x1_n32_s4x32x256_extra"):
        with pytest.raises(ValueError):
            parse_schedule_key(bad)


def test_every_weight_formats_trials_are_read(tmp_path):
    """Schedule keys and log names carry the format's name, dashes and all (int8-g32,
    int4-g32-asym): their logs were skipped, so each tune's per-format guide started with no
    prior for every format but fp32, bf16 and int8."""
    from sandwich.tuner.guide import Guides, GuideSettings

    folder = tmp_path / "logs" / "fp"
    folder.mkdir(parents=True)
    for fmt in ("int8-g32", "int4-g32-asym", "bf16"):
        s = KernelSchedule(MicroKernel(4, 64), ComputeSlice(8, 64, 256), Polymerization(1, 2, 1), 64,
                           dtype=fmt)
        assert parse_schedule_key(s.key()) == s
        lines = [json.dumps({"m": m, "schedule": s.key(), "gflops": 100.0 + m}) for m in (1, 8)]
        (folder / f"n2048_k2048_{fmt}_t2.jsonl").write_text("\n".join(lines))
    trials = read_trials(tmp_path / "logs")
    assert (trials.files, trials.skipped) == (3, 0)
    assert sorted(x.schedule.dtype for x in trials.samples) == [
        "bf16", "bf16", "int4-g32-asym", "int4-g32-asym", "int8-g32", "int8-g32"]
    guides = Guides(GuideSettings(measure_share=0.5), cache_dir=tmp_path, fingerprint="fp",
                    constants=CONSTANTS)
    assert [x.m for x in guides("int4-g32-asym").samples] == [1, 8]


def test_features_have_a_fixed_order_and_constants_are_optional():
    s = parse_schedule_key("gemm_float32_mk2x32_p1x2x1_n32_s4x64x256")
    bare, full = cm.features(s, 5, 768, 768), cm.features(s, 5, 768, 768, CONSTANTS)
    assert bare.shape == full.shape == (len(cm.FEATURES),)
    f = dict(zip(cm.FEATURES, full, strict=True))
    assert (f["mu_m"], f["b_n"], f["m"], f["threads"], f["tail_rows"], f["streamed"]) == (2, 64, 5, 2, 1, 1)
    assert f["accumulators"] == 8 and f["acc_vs_peak"] == 1.0
    assert f["registers_share"] == (8 + 4 + 1) / 16  # space.registers_used
    assert f["slice_w_bytes"] == 256 * 64 * 4 and f["m_imbalance"] == 1.0
    constant_side = {i for i, name in enumerate(cm.FEATURES)
                     if name in ("accumulators", "acc_vs_peak", "registers_share", "w_slice_vs_l1",
                                 "a_slice_vs_l1", "slice_vs_l2", "weights_vs_llc", "roofline_gflops")}
    assert all(math.isnan(bare[i]) == (i in constant_side) for i in range(len(bare)))
    assert np.isfinite(full).all()
    # a MachineModel-like object gives the same constants as the dict
    assert cm.constants_of(type("M", (), CONSTANTS)()) == cm.constants_of(CONSTANTS)


def test_spearman_matches_hand_ranks():
    assert cm.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert cm.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert cm.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)  # tie averaged
    assert math.isnan(cm.spearman([1, 1, 1], [1, 2, 3]))


@pytest.mark.parametrize("kind", cm.KINDS)
def test_held_out_m_values_are_ranked(data, kind):
    train, test = split(data)
    model = cm.CostModel(kind=kind, constants=CONSTANTS, trees=150).fit(train)
    figures = score_groups(model.predict(test), test)
    assert figures["within"] >= 0.8, figures
    assert figures["top1"] >= 0.9, figures
    if kind == "regressor":
        assert figures["pooled"] >= 0.9, figures
    group = [s for s in test if s.group == test[0].group]
    ranked = model.rank([s.schedule for s in group], m=group[0].m, n=group[0].n, k=group[0].k)
    assert sorted(map(KernelSchedule.key, ranked)) == sorted(s.schedule.key() for s in group)
    assert speed(ranked[0], group[0].m, group[0].n, group[0].k) >= 0.9 * max(
        speed(s.schedule, s.m, s.n, s.k) for s in group)


def test_save_load_round_trip(tmp_path, data, fitted):
    path = cm.model_path(tmp_path, "f" * 16)
    fitted.save(path)
    loaded = cm.CostModel.load(path)
    assert np.array_equal(loaded.predict(data), fitted.predict(data))
    assert (loaded.kind, loaded.constants, loaded.samples) == ("regressor", cm.constants_of(CONSTANTS),
                                                               len(merge_repeats(data)))
    assert not loaded.stale(list(reversed(data)))  # order does not matter
    assert loaded.stale(data[:-1])


def _rewrite_meta(path, **over):
    meta_file = cm.meta_path(path)
    meta_file.write_text(json.dumps(json.loads(meta_file.read_text()) | over))


def test_damaged_or_foreign_files_are_detected_and_retrained(tmp_path, data, fitted):
    path = tmp_path / "cm.json"
    with pytest.raises(CacheError, match="no cost model"):
        cm.CostModel.load(path)
    fitted.save(path)
    path.write_bytes(path.read_bytes()[:-40])  # a torn model file
    with pytest.raises(CacheError, match="checksum"):
        cm.CostModel.load(path)
    fitted.save(path)
    cm.meta_path(path).write_text("{not json")
    with pytest.raises(CacheError, match="damaged"):
        cm.CostModel.load(path)
    fitted.save(path)
    _rewrite_meta(path, feature_version=cm.FEATURE_VERSION + 1)
    with pytest.raises(CacheError, match="feature version"):
        cm.CostModel.load(path)
    fitted.save(path)
    garbage = b"\x00not an xgboost model"
    path.write_bytes(garbage)
    _rewrite_meta(path, model_sha256=hashlib.sha256(garbage).hexdigest())
    with pytest.raises(CacheError, match="xgboost cannot read"):
        cm.CostModel.load(path)
    # treated as absent: trained again, saved, and then served as it is
    small = data[:200]
    model = cm.load_or_fit(path, small, constants=CONSTANTS)
    assert not model.stale(small)
    again = cm.CostModel.load(path)
    assert again.trained_on == model.trained_on
    assert cm.load_or_fit(path, small, constants=CONSTANTS).trained_on == model.trained_on
    assert cm.load_or_fit(path, data[:210], constants=CONSTANTS).samples == len(merge_repeats(data[:210]))


def test_malformed_log_lines_are_skipped_and_counted(tmp_path):
    folder = tmp_path / "logs" / "abc"
    folder.mkdir(parents=True)
    good = {"m": 4, "phase": "finetune", "schedule": "gemm_float32_mk2x32_p1x2x1_n32_s4x32x256",
            "gflops": 30.5}
    lines = [json.dumps(good), json.dumps(good | {"gflops": 31.5, "phase": "confirm"}), "",
             "{not json", json.dumps({"m": 4, "gflops": 1.0}),  # no schedule
             json.dumps(good | {"schedule": "gemm_float32_mk2x32"}),  # not a key
             json.dumps(good | {"schedule": "gemm_float32_mk2x32_p1x1x1_n32_s4x32x256"}),  # 1 thread
             json.dumps(good | {"m": 0}), json.dumps(good | {"gflops": "fast"}), "[1, 2]",
             json.dumps(good | {"m": 8})[:30]]  # a tune killed mid-line
    (folder / "n768_k768_float32_t2.jsonl").write_text("\n".join(lines))
    (folder / "notes.jsonl").write_text("ignored: not a log name\n")
    trials = read_trials(tmp_path / "logs")
    assert (len(trials.samples), trials.skipped, trials.files) == (2, 8, 1)
    s = trials.samples[0]
    assert (s.m, s.n, s.k, s.threads, s.gflops, s.source) == (4, 768, 768, 2, 30.5, "n768_k768_float32_t2")
    assert [x.gflops for x in merge_repeats(trials.samples)] == [31.0]  # repeats: their median
    assert read_trials(tmp_path / "missing").samples == ()


def test_held_out_evaluation_reports_both_modes(data):
    scores = evaluate_target("f" * 16, data, CONSTANTS, kinds=("regressor",), repeats=1,
                             trees=60)
    assert {(s.source, s.mode) for s in scores} == {(f"n{n}_k{k}_float32_t2", mode)
                                                    for n, k in SHAPES for mode in ("half", "others")}
    assert all(s.test_ms == len(MS) - len(MS) // 2 for s in scores)
    assert min(s.within for s in scores if s.mode == "half") >= 0.7
    assert "| **mean** |" in table(scores)


def test_the_noise_ceiling_follows_the_repeats_spread(data):
    """Repeats that agree leave a perfect model at rho 1; repeats 20% apart pull it down, and
    a log with no repeats gives no ceiling."""
    from dataclasses import replace

    none, no_pairs = noise_ceiling(data)
    assert no_pairs == 0 and math.isnan(none)
    same = data + [replace(s, phase="confirm") for s in data]
    rho, pairs = noise_ceiling(same)
    assert rho == pytest.approx(1.0) and pairs == len(merge_repeats(data))
    apart = data + [replace(s, gflops=s.gflops * (1.2 if i % 2 else 1 / 1.2)) for i, s in enumerate(data)]
    rough, _ = noise_ceiling(apart)
    assert 0.3 < rough < 0.99
    assert noise_ceiling(same, m_max=8)[1] < pairs
