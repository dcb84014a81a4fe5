"""Vendor GEMM peers the benchmark compares against: the interface and its result types."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


class Peer(ABC):
    """One vendor GEMM: weights (K, N) are prepared once, then run for any activation (M, K).

    A peer is built for a fixed thread count, which it sets in its library on construction
    (process-wide, as each library's own knob is), so every peer runs with the same threads.
    """

    name: str = ""
    threads: int = 1

    @abstractmethod
    def prepare(self, w: np.ndarray) -> object:
        """Copy (and pack, where the library can) weights w (K, N) float32; return a handle.

        The handle never aliases `w`, so preparing one matrix n times gives n distinct copies
        (the rotated-weights mode relies on it).
        """

    @abstractmethod
    def run(self, a: np.ndarray, handle: object) -> np.ndarray:
        """a (M, K) float32 times the prepared weights -> (M, N) float32.

        The result may be a view of a buffer the peer reuses on its next call with the same
        M (OpenVINO does so), as an application using that library would see it.
        """

    def prepare_rotated(self, w: np.ndarray, copies: int) -> tuple[list[object], int]:
        """Handles for the rotated-weights mode, and how many GEMMs one run() call does.

        By default `copies` separate handles, one GEMM per call. A library that cannot hold
        many prepared weights at once (OpenVINO starts a thread pool per compiled model)
        overrides this with one handle that runs every copy per call.
        """
        return [self.prepare(w) for _ in range(copies)], 1


@dataclass(frozen=True)
class SkippedPeer:
    """A requested peer that could not be built here, and why (shown in the benchmark output)."""

    name: str
    message: str


@dataclass(frozen=True)
class PeerSet:
    """The peers that were built, and the ones that were skipped with a message."""

    peers: tuple[Peer, ...]
    skipped: tuple[SkippedPeer, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.peers)

    @property
    def messages(self) -> tuple[str, ...]:
        return tuple(s.message for s in self.skipped)
