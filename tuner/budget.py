"""Tuning budgets: presets of the search settings and of which M values get searched."""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.errors import ConfigError
from sandwich.tuner.search import SearchSettings


@dataclass(frozen=True)
class Budget:
    """How hard `sandwichc tune` searches."""

    name: str
    settings: SearchSettings
    mk_widths: int  # how many micro-kernel widths (1 = only the widest)
    dense_until: int  # every M up to here is searched, then `per_octave` points per doubling
    per_octave: int
    machine_model: bool = True  # measure the machine model (once per CPU) and pack by it
    sparse_from: int | None = None  # from this M on, one point per doubling
    # the cost model's share of each search round unless `--measure-share` says otherwise
    # (1: every candidate measured). The default budget's 0.25 measured 3.12x fewer candidates
    # of Sheared-LLaMA-1.3B from an empty cache, in 323 s instead of 574 s, for kernels at
    # 1.018 of the unguided tune's (Zen 3; results/cpus/znver3/tune_wall_sheared-llama-1.3b.md)
    measure_share: float = 1.0
    repeat: int = 5  # timed repeats of each candidate, the best counts,
    min_repeat_ms: int = 10  # each at least this long (calls of a small GEMM run back to back)


    def m_samples(self, seq_max: int) -> list[int]:
        """Increasing M values to search; each covers M up to the next one.

        Past `sparse_from` a GEMM is compute-bound and its best schedules run within noise of
        each other from one half-octave to the next (Sheared-LLaMA-1.3B on Zen 3: every winner
        from M = 256 to 2048 at 156-187 GFLOPS), while one timing costs most there (lm_head
        at M = 1448: 45 s of search): one point per doubling is enough."""
        if seq_max <= 0:
            raise ConfigError(f"--seq-max must be >= 1, got {seq_max}")
        ms = set(range(1, min(self.dense_until, seq_max) + 1))
        m = self.dense_until
        while m < seq_max:
            per = 1 if self.sparse_from is not None and m >= self.sparse_from else self.per_octave
            for i in range(1, per + 1):
                ms.add(min(seq_max, round(m * 2 ** (i / per))))
            m *= 2
        return sorted(x for x in ms if x <= seq_max)

    def share(self, asked: float | None) -> float:
        """The cost model's share of each round: what `--measure-share` asked, else the budget's."""
        return self.measure_share if asked is None else asked


# prefill Ms, compute-bound: from here the search also times the slice the caches ask for
# (SearchSettings.blocked_from); tiny (tests) leaves it out
BLOCKED_FROM = 128

BUDGETS = {
    # tiny (tests, a smoke run) leaves split-K out: it built and checked a second kernel per
    # shape for a scheme that at M <= 2 wins by noise (tests/test_gemm_dsl.py checks it); its
    # 3 repeats of 3 ms time a candidate in about a third of the others' 5 x 10 ms
    "tiny": Budget("tiny", SearchSettings(sigma=2, mk_keep=1, finetune_steps=1, reuse_patience=1,
                                          split_k=False),
                   mk_widths=1, dense_until=2, per_octave=1, machine_model=False, repeat=3,
                   min_repeat_ms=3),
    "quick": Budget("quick", SearchSettings(sigma=4, mk_keep=1, finetune_steps=1, reuse_patience=2,
                                                 max_seconds_per_m=6.0, skinny_rounds=3,
                                                 blocked_from=BLOCKED_FROM),
                    mk_widths=1, dense_until=4, per_octave=1),
    "default": Budget("default", SearchSettings(sigma=16, mk_keep=2, finetune_steps=2, reuse_patience=2,
                                                     max_seconds_per_m=12.0, min_trials_per_m=10,
                                                     skinny_rounds=5, refine_from=256,
                                                     blocked_from=BLOCKED_FROM),
                      mk_widths=2, dense_until=4, per_octave=2, sparse_from=256, measure_share=0.25),
    "full": Budget("full", SearchSettings(sigma=16, mk_keep=4, finetune_steps=6, reuse_patience=3,
                                               skinny_rounds=9, blocked_from=BLOCKED_FROM),
                   mk_widths=3, dense_until=16, per_octave=4),
}


def get_budget(name: str) -> Budget:
    try:
        return BUDGETS[name]
    except KeyError:
        raise ConfigError(f"unknown budget '{name}' (choose from {', '.join(BUDGETS)})") from None
