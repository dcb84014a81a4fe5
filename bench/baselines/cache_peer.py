"""Another kernel cache's tuned GEMMs as a `bench gemm` peer (`--peers cache:DIR`): two tunes
of one machine (say, with and without the cost model) timed in the same run, same threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sandwich.bench.baselines import Peer
from sandwich.compiler.gemm_runner import aligned_empty
from sandwich.errors import ConfigError

PREFIX = "cache:"


class CachePeer(Peer):
    """The GEMMs tuned into the cache at `path`, packed and run as our own are."""

    def __init__(self, path: str, threads: int) -> None:
        from sandwich.tuner.kernel_cache import KernelCache

        if not Path(path).is_dir():
            raise ConfigError(f"peer {PREFIX}{path}: no kernel cache directory at {path}")
        self.name = f"{PREFIX}{path}"
        self.threads = threads
        self._cache = KernelCache(Path(path))
        self._bound: dict[tuple[int, int], object] = {}

    def prepare(self, w: np.ndarray) -> object:
        k, n = w.shape
        gemm = self._cache.gemm(n=n, k=k, threads=self.threads)
        return gemm, gemm.pack(np.asarray(w, dtype=np.float32))

    def run(self, a: np.ndarray, handle: object) -> np.ndarray:
        """Bound once to its buffers, then called, as `bench gemm` runs our own GEMMs (the
        timing loop keeps `a` and every handle alive, so their ids name them)."""
        gemm, packed = handle  # type: ignore[misc]
        call = self._bound.get((id(a), id(packed)))
        if call is None:
            out = aligned_empty((a.shape[0], gemm.n_out))
            call = self._bound[(id(a), id(packed))] = gemm.bind(np.ascontiguousarray(a), packed, out)
        return call()
