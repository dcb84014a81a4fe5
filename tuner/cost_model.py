"""A learned cost model of GEMM schedules: a candidate's features, and an XGBoost model of its
speed trained on the tuner's measured trials (issue 29, item 2), saved beside the database."""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sandwich.errors import CacheError, ConfigError
from sandwich.tuner.space import stream_pause_share, weight_imbalance
from sandwich.tuner.trial_log import Sample, data_fingerprint, merge_repeats, read_trials
from sandwich.types import KernelSchedule

__all__ = ["FEATURES", "FEATURE_VERSION", "CostModel", "Sample", "constants_of", "features",
           "load_or_fit", "model_path", "read_trials", "spearman"]

FEATURE_VERSION = 1  # bump when a feature changes meaning: saved models of another version retrain
SKINNY_M = 8  # up to this M the search times weights streamed from DRAM (search.Settings.skinny_m)
F32 = 4  # bytes per element (the family is float32)
KINDS = ("regressor", "ranker")

# The feature vector, in this order. Trees split on thresholds, so a size appears once
# (its log2 would split the same way); the derived ones name what makes a GEMM fast.
FEATURES = (
    # the raw tunables
    "mu_m", "mu_n", "t_m", "t_n", "t_k", "pack_n", "b_m", "b_n", "b_k",
    # the problem
    "m", "n", "k", "threads", "log2_flops",
    "intensity",             # 2MNK / bytes of A, W and C: flops per byte of the whole GEMM
    "streamed",              # 1 when M <= SKINNY_M: the weights stream from DRAM
    # the register tile
    "tile_elems",            # mu_m * mu_n (accumulators x lanes)
    "loads_per_fma",         # (mu_m + mu_n) / (mu_m * mu_n): A broadcasts + W elements per FMA
    # the split over threads
    "row_blocks_per_thread",  # ceil(ceil(M / mu_m) / t_m)
    "col_tiles_per_thread",  # ceil(N / mu_n / t_n)
    "m_imbalance",           # rows of the busiest M-thread x t_m / M (1 = even; t_m > blocks idles)
    "weight_imbalance",      # space.weight_imbalance: the busiest thread's weights / an even share
    "tail_rows",             # M mod mu_m: rows run by the smaller power-of-two tiles
    "tail_share",            # tail rows / M
    "stream_pause_share",    # space.stream_pause_share: tail rows that stall the weight stream
    "splitk_traffic",        # 2 t_k M / K when t_k > 1: partial sums per weight read, else 0
    # the slice (b_m clamped to M)
    "slice_a_bytes", "slice_w_bytes", "slice_c_bytes",
    "k_panels",              # ceil(K / b_k): C is loaded and stored once per K panel
    "slice_intensity",       # flops per byte of one slice's A, W and C
    # the target's constants (NaN without a machine model; xgboost treats NaN as missing)
    "accumulators",          # mu_m * mu_n / lanes
    "acc_vs_peak",           # accumulators / the independent chains the FMA peak needs
    "registers_share",       # (accumulators + mu_n / lanes + 1) / registers (space.registers_used)
    "w_slice_vs_l1", "a_slice_vs_l1", "slice_vs_l2",
    "weights_vs_llc",        # K N 4 / LLC: the weights stay in cache between calls or not
    "roofline_gflops",       # min(peak, DRAM-bound) when streamed, else min(peak, L2-bound slice)
)

CONSTANTS = ("lanes", "registers", "peak_gflops", "accumulators", "l1d_bytes", "l2_bytes",
             "llc_bytes", "l1_read_gbs", "l2_read_gbs", "dram_read_gbs")


def constants_of(model: Any) -> dict[str, float]:
    """The target constants features use, from a `machine_model.MachineModel` or a plain dict
    (missing keys stay missing); {} for None."""
    if model is None:
        return {}
    get = model.get if isinstance(model, Mapping) else (lambda name: getattr(model, name, None))
    out = {}
    for name in CONSTANTS:
        v = get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out[name] = float(v)
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _ratio(num: float, constants: Mapping[str, float], name: str) -> float:
    den = constants.get(name)
    return num / den if den else math.nan


def features(schedule: KernelSchedule, m: int, n: int, k: int,
             constants: Mapping[str, float] | None = None) -> np.ndarray:
    """The FEATURES of `schedule` run at M x N x K, as float64 in FEATURES order."""
    c = constants or {}
    mk, sl, pl = schedule.micro_kernel, schedule.slice, schedule.polymerization
    mu_m, mu_n = mk.mu_m, mk.mu_n
    threads = pl.threads
    flops = 2.0 * m * n * k
    blocks = _cdiv(m, mu_m)
    per_thread = _cdiv(blocks, pl.t_m)
    busiest_rows = min(per_thread * mu_m, m)
    b_m = min(sl.b_m, m)
    a_bytes, w_bytes, c_bytes = b_m * sl.b_k * F32, sl.b_k * sl.b_n * F32, b_m * sl.b_n * F32
    slice_bytes = a_bytes + w_bytes + c_bytes
    streamed = m <= SKINNY_M
    try:
        imbalance = weight_imbalance(schedule, n, k)
    except ZeroDivisionError:  # a slice narrower than its tile: nothing to say
        imbalance = math.nan
    lanes = c.get("lanes")
    acc = mu_m * mu_n / lanes if lanes else math.nan
    vec_n = mu_n / lanes if lanes else math.nan
    peak = c.get("peak_gflops", math.nan) * threads
    slice_intensity = 2.0 * b_m * sl.b_n * sl.b_k / slice_bytes
    if streamed:
        bound = flops / (F32 * n * k) * c.get("dram_read_gbs", math.nan) * threads
    else:
        bound = slice_intensity * c.get("l2_read_gbs", math.nan) * threads
    row = {
        "mu_m": mu_m, "mu_n": mu_n, "t_m": pl.t_m, "t_n": pl.t_n, "t_k": pl.t_k,
        "pack_n": schedule.pack_n, "b_m": sl.b_m, "b_n": sl.b_n, "b_k": sl.b_k,
        "m": m, "n": n, "k": k, "threads": threads, "log2_flops": math.log2(flops),
        "intensity": flops / (F32 * (m * k + k * n + m * n)),
        "streamed": float(streamed),
        "tile_elems": mu_m * mu_n,
        "loads_per_fma": (mu_m + mu_n) / (mu_m * mu_n),
        "row_blocks_per_thread": per_thread,
        "col_tiles_per_thread": _cdiv(_cdiv(n, mu_n), pl.t_n),
        "m_imbalance": busiest_rows * pl.t_m / m,
        "weight_imbalance": imbalance,
        "tail_rows": m % mu_m,
        "tail_share": (m % mu_m) / m,
        "stream_pause_share": stream_pause_share(schedule, m),
        "splitk_traffic": 2.0 * pl.t_k * m / k if pl.t_k > 1 else 0.0,
        "slice_a_bytes": a_bytes, "slice_w_bytes": w_bytes, "slice_c_bytes": c_bytes,
        "k_panels": _cdiv(k, sl.b_k),
        "slice_intensity": slice_intensity,
        "accumulators": acc,
        "acc_vs_peak": _ratio(acc, c, "accumulators"),
        "registers_share": _ratio(acc + vec_n + 1, c, "registers"),
        "w_slice_vs_l1": _ratio(w_bytes, c, "l1d_bytes"),
        "a_slice_vs_l1": _ratio(a_bytes, c, "l1d_bytes"),
        "slice_vs_l2": _ratio(slice_bytes, c, "l2_bytes"),
        "weights_vs_llc": _ratio(F32 * n * k, c, "llc_bytes"),
        "roofline_gflops": math.nan if math.isnan(peak) or math.isnan(bound) else min(peak, bound),
    }
    return np.array([row[name] for name in FEATURES], dtype=np.float64)


def feature_matrix(samples: Sequence[Sample], constants: Mapping[str, float] | None = None) -> np.ndarray:
    if not samples:
        return np.zeros((0, len(FEATURES)))
    return np.stack([features(s.schedule, s.m, s.n, s.k, constants) for s in samples])


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1, ties sharing their average rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (ties averaged); NaN when either side is constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


MIN_GFLOPS = 1e-3  # a failed candidate (0 GFLOPS) is trained as this, the slowest of all


class CostModel:
    """XGBoost over FEATURES, trained on one target's measured samples. `kind` "regressor"
    fits log GFLOPS; "ranker" fits pairwise order within each (N, K, dtype, threads, M)
    group, labelled by each candidate's share of its group's best. Either way a higher
    score is a faster candidate, and scores compare only within one group."""

    def __init__(self, *, kind: str = "regressor", constants: Any = None, trees: int = 400,
                 depth: int = 4, learning_rate: float = 0.05, seed: int = 0):
        if kind not in KINDS:
            raise ConfigError(f"cost model kind {kind!r}: choose one of {', '.join(KINDS)}")
        self.kind = kind
        self.constants = constants_of(constants)
        self.params = {"trees": trees, "depth": depth, "learning_rate": learning_rate, "seed": seed}
        self.trained_on = ""  # data_fingerprint of the training samples
        self.samples = 0
        self._booster: Any = None

    def fit(self, samples: Iterable[Sample]) -> CostModel:
        """Train on `samples` (repeats of a candidate merged to their median); returns self."""
        import xgboost as xgb

        rows = sorted(merge_repeats(s for s in samples), key=lambda s: (s.group, s.schedule.key()))
        if not rows:
            raise ConfigError("cost model: no measured trials to train on")
        x = feature_matrix(rows, self.constants)
        gflops = np.maximum(np.array([s.gflops for s in rows]), MIN_GFLOPS)
        p = self.params
        # shallow, subsampled trees: on the real logs (tuner/cost_model_eval.py) they ranked
        # held-out M values better than depth 6 without subsampling (within-M rho 0.55 / 0.52)
        params = {"max_depth": p["depth"], "eta": p["learning_rate"], "seed": p["seed"],
                  "subsample": 0.8, "colsample_bytree": 0.8, "min_child_weight": 3,
                  "nthread": 1, "tree_method": "hist"}
        if self.kind == "regressor":
            data = xgb.DMatrix(x, label=np.log(gflops))
            params["objective"] = "reg:squarederror"
        else:
            keys = [s.group for s in rows]
            qid = np.cumsum([0] + [a != b for a, b in zip(keys, keys[1:], strict=False)])
            best = np.zeros(qid[-1] + 1)
            np.maximum.at(best, qid, gflops)
            data = xgb.DMatrix(x, label=gflops / best[qid], qid=qid)
            params |= {"objective": "rank:pairwise", "lambdarank_pair_method": "mean",
                       "lambdarank_num_pair_per_sample": 8}
        self._booster = xgb.train(params, data, num_boost_round=p["trees"])
        self.trained_on, self.samples = data_fingerprint(rows), len(rows)
        return self

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        """A score per sample (regressor: predicted log GFLOPS); higher is faster."""
        if self._booster is None:
            raise ValueError("cost model: predict before fit or load")
        if not samples:
            return np.zeros(0)
        return np.asarray(self._booster.inplace_predict(feature_matrix(samples, self.constants)),
                          dtype=np.float64)

    def rank(self, schedules: Sequence[KernelSchedule], *, m: int, n: int, k: int) -> list[KernelSchedule]:
        """`schedules` at M x N x K, the predicted fastest first (ties keep their order)."""
        scores = self.predict([Sample(s, m, n, k) for s in schedules])
        return [schedules[i] for i in np.argsort(-scores, kind="stable")]

    def stale(self, samples: Iterable[Sample]) -> bool:
        """Whether `samples` differ from what the model was trained on (a new trial counts)."""
        return data_fingerprint(merge_repeats(samples)) != self.trained_on

    def _meta(self, model_sha: str) -> dict[str, Any]:
        return {"feature_version": FEATURE_VERSION, "features": list(FEATURES), "kind": self.kind,
                "constants": self.constants, "params": self.params, "trained_on": self.trained_on,
                "samples": self.samples, "model_sha256": model_sha}

    def save(self, path: str | Path) -> None:
        """The booster as xgboost JSON at `path`, and beside it `<stem>.meta.json` (feature
        version, kind, constants, training-set fingerprint, the model file's SHA-256), each
        written atomically; the sidecar goes last, so a half-written pair fails its checksum."""
        if self._booster is None:
            raise ValueError("cost model: save before fit")
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json")  # the suffix picks JSON
            os.close(fd)
            self._booster.save_model(tmp)
            sha = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
            os.replace(tmp, path)
            _write_atomic(meta_path(path), json.dumps(self._meta(sha), indent=1, sort_keys=True))
        except OSError as e:
            raise CacheError(f"cannot write the cost model {path}: {e.strerror or e}") from e

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """The model saved at `path`; CacheError when it is missing, damaged, or of another
        feature version (the caller retrains: nothing else depends on it)."""
        import xgboost as xgb

        path, meta_file = Path(path), meta_path(Path(path))
        if not path.is_file() or not meta_file.is_file():
            raise CacheError(f"no cost model at {path}")
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            data = path.read_bytes()
            version, names, sha = meta["feature_version"], meta["features"], meta["model_sha256"]
            model = cls(kind=meta["kind"], constants=meta["constants"], **meta["params"])
            trained_on, samples = str(meta["trained_on"]), int(meta["samples"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, ConfigError) as e:
            raise CacheError(f"cost model {meta_file} is damaged ({type(e).__name__}); "
                             f"delete it to retrain") from e
        if version != FEATURE_VERSION or names != list(FEATURES):
            raise CacheError(f"cost model {path} has feature version {version}, this sandwichc "
                             f"uses {FEATURE_VERSION}; it is retrained")
        if hashlib.sha256(data).hexdigest() != sha:
            raise CacheError(f"cost model {path} does not match its checksum (damaged or "
                             f"half-written); delete it to retrain")
        booster = xgb.Booster()
        try:
            booster.load_model(bytearray(data))
        except xgb.core.XGBoostError as e:
            raise CacheError(f"cost model {path} is damaged: xgboost cannot read it") from e
        if booster.num_features() != len(FEATURES):
            raise CacheError(f"cost model {path} has {booster.num_features()} features, "
                             f"not {len(FEATURES)}; it is retrained")
        booster.set_param({"nthread": 1})
        model._booster, model.trained_on, model.samples = booster, trained_on, samples
        return model


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def meta_path(path: Path) -> Path:
    return path.with_name(path.stem + ".meta.json")


def model_path(cache_dir: str | Path, fingerprint: str, dtype: str = "float32") -> Path:
    """Where a target's cost model of one weight format lives: beside the tuning database,
    like the machine model (the features count fp32 bytes, so formats do not share one)."""
    suffix = "" if dtype == "float32" else f"_{dtype}"
    return Path(cache_dir) / "cost_model" / f"{fingerprint}{suffix}.json"


def load_or_fit(path: str | Path, samples: Sequence[Sample], *, kind: str = "regressor",
                constants: Any = None) -> CostModel:
    """The model at `path` if it was trained on exactly `samples` with this kind and these
    constants; otherwise (missing, damaged, foreign version, stale) one trained now and saved."""
    try:
        model = CostModel.load(path)
    except CacheError:
        model = None
    if model is None or model.kind != kind or model.constants != constants_of(constants) \
            or model.stale(samples):
        model = CostModel(kind=kind, constants=constants).fit(samples)
        model.save(path)
    return model
