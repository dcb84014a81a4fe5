"""Synthetic traces: Poisson or Gamma arrivals, and prompt/output lengths drawn from
log-normal fits of the papers' published statistics, scaled to fit a small machine."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.traces import TraceEntry, clip


@dataclass(frozen=True)
class Arrivals:
    """The inter-arrival process: 'poisson' (exponential gaps, CV 1) or 'gamma' gaps with
    coefficient of variation `cv` (> 1 is burstier than Poisson; 002 §6 tries 1.83)."""

    kind: str = "poisson"
    cv: float = 1.0

    @classmethod
    def parse(cls, text: str) -> Arrivals:
        """'poisson' or 'gamma:CV'."""
        kind, _, cv = text.partition(":")
        if kind == "poisson" and not cv:
            return cls()
        if kind == "gamma":
            try:
                v = float(cv)
            except ValueError:
                v = float("nan")
            if v > 0 and math.isfinite(v):
                return cls("gamma", v)
        raise ConfigError(f"--arrivals must be 'poisson' or 'gamma:CV' with CV > 0, got {text!r}")

    def gap(self, rng: np.random.Generator, rate: float) -> float:
        """One inter-arrival time (s) of mean 1/rate."""
        if self.kind == "poisson":
            return float(rng.exponential(1.0 / rate))
        shape = 1.0 / self.cv**2  # gamma: CV = 1/sqrt(shape), mean = shape * scale
        return float(rng.gamma(shape, 1.0 / (rate * shape)))

    def times(self, rng: np.random.Generator, rate: float, *, duration_s: float | None = None,
              n: int | None = None) -> list[float]:
        """Arrival times from 0: the first after one gap, until duration_s or n arrivals."""
        if not rate > 0:
            raise ConfigError(f"the arrival rate must be > 0, got {rate}")
        out, t = [], self.gap(rng, rate)
        while (duration_s is None or t < duration_s) and (n is None or len(out) < n):
            out.append(t)
            t += self.gap(rng, rate)
        return out


@dataclass(frozen=True)
class LengthProfile:
    """Log-normal prompt and output lengths: median and sigma of log(length)."""

    name: str
    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float

    @classmethod
    def from_moments(cls, name: str, prompt: tuple[float, float],
                     output: tuple[float, float]) -> LengthProfile:
        """Fit log-normals to published (mean, std) pairs."""
        def fit(mean: float, std: float) -> tuple[float, float]:
            s2 = math.log1p((std / mean) ** 2)
            return mean * math.exp(-s2 / 2), math.sqrt(s2)  # median = exp(mu)

        return cls(name, *fit(*prompt), *fit(*output))

    def draw(self, rng: np.random.Generator, n: int, length_scale: float = 1.0
             ) -> tuple[np.ndarray, np.ndarray]:
        """n (prompt, output) lengths, times length_scale, rounded, at least 1."""
        def one(median: float, sigma: float) -> np.ndarray:
            x = rng.lognormal(math.log(median * length_scale), sigma, n)
            return np.maximum(1, np.rint(x)).astype(np.int64)

        return one(self.prompt_median, self.prompt_sigma), one(self.output_median, self.output_sigma)


# Splitwise (paper 004) §III-B, Fig. 3, on the Azure LLM inference traces of 2023-11-11:
# coding: median 1500 prompt / 13 generated tokens; conversation: median 1020 / 129. The
# paper gives medians and CDF plots, not spreads: the sigmas are ours (coding prompts narrower,
# "the conversation service has a wider range of input prompt tokens"), P90/P50 = e^(1.28 sigma).
# Layered prefill (paper 002) Table 4 gives means and stds, fitted by moments: ShareGPT 2340
# (std 2088) in / 438 (265) out; arXiv summarization 9194 (5754) / 231 (104).
PROFILES: dict[str, LengthProfile] = {
    "coding": LengthProfile("coding", 1500, 0.7, 13, 1.0),
    "conversation": LengthProfile("conversation", 1020, 0.9, 129, 1.0),
    "sharegpt": LengthProfile.from_moments("sharegpt", (2340, 2088), (438, 265)),
    "arxiv": LengthProfile.from_moments("arxiv", (9194, 5754), (231, 104)),
}


def profile_trace(profile: str | LengthProfile, *, rate: float, duration_s: float, seed: int,
                  max_seq: int, arrivals: Arrivals = Arrivals(), length_scale: float = 1.0
                  ) -> tuple[list[TraceEntry], int]:
    """Arrivals at `rate` req/s over [0, duration_s) with the profile's lengths times
    length_scale, clipped to max_seq; returns the entries and how many were clipped."""
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ConfigError(f"unknown synthetic profile {profile!r}; choose one of "
                              f"{', '.join(PROFILES)}")
        profile = PROFILES[profile]
    if not duration_s > 0 or not length_scale > 0 or max_seq < 1:
        raise ConfigError(f"--duration and --length-scale must be > 0 and max_seq >= 1, got "
                          f"{duration_s}, {length_scale} and {max_seq}")
    rng = np.random.default_rng(seed)
    times = arrivals.times(rng, rate, duration_s=duration_s)
    prompts, outputs = profile.draw(rng, len(times), length_scale)
    entries = [TraceEntry(t, int(n), int(m)) for t, n, m in zip(times, prompts, outputs, strict=True)]
    return clip(entries, max_seq)
