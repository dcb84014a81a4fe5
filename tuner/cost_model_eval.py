"""The cost model held out on a cache's trial logs: how well it ranks the candidates of an M it
has not seen. Run by hand: python -m sandwich.tuner.cost_model_eval <logs dir> [out.md]."""

from __future__ import annotations

import json
import math
import statistics
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.tuner.cost_model import CostModel, constants_of, spearman
from sandwich.tuner.trial_log import Sample, merge_repeats, read_trials

MODES = ("half", "others")
FIGURES = ("within", "pooled", "top1", "top_quarter", "clear_pairs")
# two timings of one candidate differ by about 4% (median CV of the logs' repeats), so a
# pair of candidates further apart than this is one the timings themselves order
CLEAR = 0.10  # train on the other logs + half this log's M values / other shapes only


@dataclass(frozen=True)
class Score:
    """One log's held-out figures for one model kind and training mode (means over splits)."""

    fingerprint: str
    source: str
    kind: str
    mode: str
    train: int  # training samples (repeats merged), first split
    test_ms: int  # held-out M values per split
    within: float  # mean over held-out M of the Spearman of prediction and GFLOPS among its candidates
    pooled: float  # Spearman over every held-out sample of the log at once (M spreads it)
    top1: float  # the model's first pick's GFLOPS / the best measured, mean over held-out M
    top_quarter: float  # share of held-out M whose best candidate is in the model's top quarter
    clear_pairs: float  # share of candidate pairs of one M, apart by over CLEAR, ordered right


def score_groups(predicted: np.ndarray, samples: Sequence[Sample]) -> dict[str, float]:
    """The Score figures of one model's predictions on `samples` (any number of M values)."""
    by_m: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_m.setdefault(s.m, []).append(i)
    gflops = np.array([s.gflops for s in samples])
    within, top1, hits, right, pairs = [], [], [], 0, 0
    for idx in by_m.values():
        g, p = gflops[idx], predicted[idx]
        if len(idx) < 3 or g.max() <= 0:
            continue
        rho = spearman(p, g)
        if not math.isnan(rho):
            within.append(rho)
        order = np.argsort(-p, kind="stable")
        top1.append(g[order[0]] / g.max())
        hits.append(int(np.argmax(g)) in set(order[:math.ceil(len(idx) / 4)].tolist()))
        apart = g[:, None] > (1 + CLEAR) * g[None, :]  # i clearly faster than j
        pairs += int(apart.sum())
        right += int((apart & (p[:, None] > p[None, :])).sum())
    return {"within": _mean(within), "pooled": spearman(predicted, gflops),
            "top1": _mean(top1), "top_quarter": _mean(hits),
            "clear_pairs": right / pairs if pairs else math.nan}


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _split(ms: list[int], source: str, rep: int, seed: int) -> set[int]:
    """A random half of a log's M values (the training half), fixed by the seed."""
    rng = np.random.default_rng([seed, rep, zlib.crc32(source.encode())])
    return {int(m) for m in rng.permutation(ms)[: len(ms) // 2]}


def evaluate_target(fingerprint: str, samples: Sequence[Sample], constants=None, *,
                    kinds: Sequence[str] = ("regressor", "ranker"), repeats: int = 3,
                    seed: int = 0, **model_kw) -> list[Score]:
    """Every log of one target held out in turn: "half" trains on the target's other logs
    plus a random half of this log's M values and tests on the other half; "others" trains
    on the logs of other (N, K) only (a new shape), tested on the same held-out halves.
    `model_kw` goes to each CostModel (trees, depth, learning_rate)."""
    rows = merge_repeats(samples)
    by_source: dict[str, list[Sample]] = {}
    for s in rows:
        by_source.setdefault(s.source, []).append(s)
    out = []
    for source, own in sorted(by_source.items()):
        ms = sorted({s.m for s in own})
        others = [s for s in rows if s.source != source]
        shape = (own[0].n, own[0].k)
        new_shape = [s for s in others if (s.n, s.k) != shape]
        splits = [_split(ms, source, rep, seed) for rep in range(repeats)]
        tests = [[s for s in own if s.m not in train_ms] for train_ms in splits]
        for kind in kinds:
            runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
            sizes = {}
            if new_shape:
                cold = CostModel(kind=kind, constants=constants, seed=seed, **model_kw).fit(new_shape)
                sizes["others"] = cold.samples
                runs["others"] = [score_groups(cold.predict(t), t) for t in tests]
            for train_ms, test in zip(splits, tests, strict=True):
                model = CostModel(kind=kind, constants=constants, seed=seed, **model_kw)
                model.fit(others + [s for s in own if s.m in train_ms])
                sizes.setdefault("half", model.samples)
                runs["half"].append(score_groups(model.predict(test), test))
            for mode in MODES:
                if runs[mode]:
                    figures = {f: _mean([r[f] for r in runs[mode] if not math.isnan(r[f])])
                               for f in FIGURES}
                    out.append(Score(fingerprint, source, kind, mode, sizes[mode],
                                     len(ms) - len(splits[0]), **figures))
    return out


def noise_ceiling(samples: Sequence[Sample], *, m_max: int | None = None, m_min: int = 1,
                  draws: int = 5, seed: int = 0) -> tuple[float, int]:
    """The within-M Spearman a perfect model would reach against one timing of each candidate,
    and the repeated pairs it is estimated from: each simulated timing multiplies the measured
    GFLOPS by a repeat-noise factor drawn from the logs' own repeats (the log ratio of a
    candidate's first two timings at one M, over sqrt 2). Optimistic: the measured values it
    starts from already carry that noise, which spreads them."""
    runs: dict[tuple, list[float]] = {}
    for s in samples:
        if m_min <= s.m <= (m_max or s.m) and s.gflops > 0:
            runs.setdefault((s.source, s.m, s.schedule.key()), []).append(s.gflops)
    logs = np.array([math.log(v[1] / v[0]) for v in runs.values() if len(v) >= 2])
    if not len(logs):
        return math.nan, 0
    groups: dict[tuple, list[float]] = {}
    for (source, m, _), v in runs.items():
        groups.setdefault((source, m), []).append(statistics.median(v))
    rng = np.random.default_rng(seed)
    rhos = [spearman(g, np.asarray(g) * np.exp(rng.choice(logs, len(g)) / math.sqrt(2)))
            for g in groups.values() if len(g) >= 3 for _ in range(draws)]
    return _mean([r for r in rhos if not math.isnan(r)]), len(logs)


def machine_constants(logs_root: Path, fingerprint: str) -> dict[str, float]:
    """The target constants of the machine model stored beside the logs ({} when none)."""
    from sandwich.tuner.machine_model import MachineModel

    path = logs_root.parent / "machine" / f"{fingerprint}.json"
    try:
        return constants_of(MachineModel.from_json(json.loads(path.read_text())))
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def evaluate(logs_root: Path, **kw) -> tuple[list[Score], dict[str, int]]:
    """evaluate_target for each fingerprint folder under `logs_root`; also the lines skipped."""
    scores, skipped = [], {}
    for folder in sorted(p for p in Path(logs_root).iterdir() if p.is_dir()):
        trials = read_trials(folder)
        skipped[folder.name] = trials.skipped
        if trials.samples:
            scores += evaluate_target(folder.name, trials.samples,
                                      machine_constants(Path(logs_root), folder.name), **kw)
    return scores, skipped


def table(scores: Sequence[Score]) -> str:
    """A markdown table per model kind: each log with both training modes, then the means."""
    def fmt(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.2f}"

    lines = []
    for kind in dict.fromkeys(s.kind for s in scores):
        head = ["within-M rho", "pooled rho", "top-1", "best in top 1/4", "clear pairs"]
        lines += [f"### {kind}", "",
                  "| target | log (N, K, threads) | held-out M | train | "
                  + " | ".join(f"{h} (+half)" for h in head) + " | "
                  + " | ".join(f"{h} (other shapes)" for h in head) + " |",
                  "|---" * (4 + 2 * len(head)) + "|"]
        mine = [s for s in scores if s.kind == kind]
        keys = list(dict.fromkeys((s.fingerprint, s.source) for s in mine))
        cols = FIGURES
        for fp, source in keys:
            half = next((s for s in mine if (s.fingerprint, s.source, s.mode) == (fp, source, "half")), None)
            cold = next((s for s in mine if (s.fingerprint, s.source, s.mode) == (fp, source, "others")), None)
            first = half or cold
            cells = [fp, source, str(first.test_ms), str(half.train if half else "-")]
            cells += [fmt(getattr(half, c)) if half else "-" for c in cols]
            cells += [fmt(getattr(cold, c)) if cold else "-" for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
        means = ["**mean**", f"{len(keys)} logs", "", ""]
        for mode in MODES:
            sel = [s for s in mine if s.mode == mode]
            means += [fmt(_mean([getattr(s, c) for s in sel if not math.isnan(getattr(s, c))]))
                      for c in cols]
        lines += ["| " + " | ".join(means) + " |", ""]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    scores, skipped = evaluate(Path(argv[0]))
    text = table(scores) + f"\nmalformed log lines skipped: {skipped}\n"
    for folder in sorted(p for p in Path(argv[0]).iterdir() if p.is_dir()):
        samples = read_trials(folder).samples
        for name, lo, hi in (("M <= 8", 1, 8), ("M > 8", 9, None)):
            rho, pairs = noise_ceiling(samples, m_min=lo, m_max=hi)
            text += (f"noise ceiling of within-M rho, {folder.name}, {name}: {rho:.2f} "
                     f"(from {pairs} repeated timings)\n")
    print(text)
    if len(argv) > 1:
        Path(argv[1]).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
