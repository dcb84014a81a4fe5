"""The cost model inside the sandwich search (issue 29, item 2): before a round's candidates are
measured, the model ranks them, and only its top share (plus a random exploration share of the
rest) is timed. The model learns from the target's earlier trial logs and from every trial of
this tune, so a new shape of a known machine starts from what the other shapes taught it."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandwich.errors import CacheError, ConfigError
from sandwich.tuner.cost_model import CostModel, constants_of, model_path, spearman
from sandwich.tuner.trial_log import Sample, merge_repeats, read_trials
from sandwich.types import KernelSchedule


@dataclass(frozen=True)
class GuideSettings:
    """How much the model decides. `measure_share` 1 measures every candidate (no model)."""

    measure_share: float = 1.0  # of each round (the incumbent and its alternatives), the top share is measured
    explore: float = 0.1  # each candidate the model would skip is measured anyway with this chance
    min_samples: int = 150  # fewer measured candidates than this: the model is not trusted yet
    retrain_every: int = 100  # new measured candidates between retrainings
    trees: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.measure_share <= 1:
            raise ConfigError(f"--measure-share must be in (0, 1], got {self.measure_share}")
        if not 0 <= self.explore <= 1:
            raise ConfigError(f"--explore must be in [0, 1], got {self.explore}")

    @property
    def active(self) -> bool:
        return self.measure_share < 1


@dataclass
class GuideStats:
    """What the model did during a tune, for `tune --stats`."""

    trainings: int = 0
    train_seconds: float = 0.0
    predict_seconds: float = 0.0
    ranked: int = 0  # candidates the model scored
    rho_by_shape: dict[str, float] = field(default_factory=dict)  # Spearman on each shape's last M


class ModelGuide:
    """Chooses which of a round's candidates to measure, from a cost model of one target and
    weight format; learns from what the search measures. Until `min_samples` candidates are
    known it chooses all of them, as an unguided search would."""

    def __init__(self, settings: GuideSettings, *, prior: Sequence[Sample] = (),
                 constants: Any = None, path: Path | None = None) -> None:
        self.settings = settings
        self.constants = constants
        self.path = path
        self.samples: list[Sample] = list(prior)
        self.stats = GuideStats()
        self.model: CostModel | None = None
        self._trained_count = 0
        self._rng = random.Random(settings.seed)
        self._load_saved()
        self._maybe_train()

    def _load_saved(self) -> None:
        """The saved model, when it was trained on exactly the prior samples: no retraining."""
        if self.path is None or not self.samples:
            return
        try:
            model = CostModel.load(self.path)
        except CacheError:
            return
        if not model.stale(self.samples) and model.constants == constants_of(self.constants):
            self.model, self._trained_count = model, len(self.samples)

    def _maybe_train(self) -> None:
        known = len(self.samples)
        if known < self.settings.min_samples:
            return
        if self.model is not None and known - self._trained_count < self.settings.retrain_every:
            return
        t0 = time.perf_counter()
        self.model = CostModel(constants=self.constants, trees=self.settings.trees,
                               seed=self.settings.seed).fit(self.samples)
        self.stats.train_seconds += time.perf_counter() - t0
        self.stats.trainings += 1
        self._trained_count = known

    def choose(self, schedules: Sequence[KernelSchedule], m: int, n: int, k: int,
               keep: int = 1) -> list[bool]:
        """Which candidates to measure: the model's top `measure_share` of the round (at least
        `keep`), and each other one with the `explore` chance."""
        count = len(schedules)
        if self.model is None or not self.settings.active or count <= keep:
            return [True] * count
        t0 = time.perf_counter()
        scores = self.model.predict([Sample(s, m, n, k) for s in schedules])
        self.stats.predict_seconds += time.perf_counter() - t0
        self.stats.ranked += count
        top = max(keep, math.ceil(self.settings.measure_share * count - 1e-9))
        order = sorted(range(count), key=lambda i: -scores[i])
        chosen = [False] * count
        for rank, i in enumerate(order):
            chosen[i] = rank < top or self._rng.random() < self.settings.explore
        return chosen

    def observe(self, samples: Sequence[Sample], shape: str) -> None:
        """Learn from one M's measured candidates; scores the current model on them first
        (the rank correlation `--stats` shows for the shape's last M)."""
        fresh = [s for s in merge_repeats(samples) if s.gflops > 0]
        if self.model is not None and len(fresh) >= 3:
            rho = spearman(self.model.predict(fresh), [s.gflops for s in fresh])
            if not math.isnan(rho):
                self.stats.rho_by_shape[shape] = rho
        self.samples.extend(samples)
        self._maybe_train()

    def save(self) -> None:
        """Keep the model beside the database, so the next tune starts from it."""
        if self.path is not None and self.model is not None:
            self.model.save(self.path)


class Guides:
    """The guides of one tune, one per weight format, each made on first use from every trial
    the target's logs hold for that format; none when every candidate is measured anyway."""

    def __init__(self, settings: GuideSettings, *, cache_dir: Path, fingerprint: str,
                 constants: Any = None) -> None:
        self.settings, self.cache_dir, self.fingerprint = settings, Path(cache_dir), fingerprint
        self.constants = constants
        self.made: dict[str, ModelGuide] = {}

    def __call__(self, dtype: str) -> ModelGuide | None:
        if not self.settings.active:
            return None
        if self.constants is None:  # the machine model the tune stored, where there is one
            from sandwich.tuner.machine_model import load_model

            self.constants = load_model(self.cache_dir, self.fingerprint)
        if dtype not in self.made:
            prior = [s for s in read_trials(self.cache_dir / "logs" / self.fingerprint).samples
                     if s.schedule.dtype == dtype]
            self.made[dtype] = ModelGuide(self.settings, prior=prior, constants=self.constants,
                                          path=model_path(self.cache_dir, self.fingerprint, dtype))
        return self.made[dtype]

    def save(self) -> None:
        for guide in self.made.values():
            guide.save()

    def trainings(self) -> int:
        return sum(g.stats.trainings for g in self.made.values())
