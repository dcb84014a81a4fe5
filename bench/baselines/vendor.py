"""The vendor GEMM peers (numpy/OpenBLAS, torch/oneDNN, OpenVINO) and the `make_peers` factory."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from sandwich.bench.baselines import Peer, PeerSet, SkippedPeer
from sandwich.bench.baselines.cache_peer import PREFIX as CACHE_PREFIX
from sandwich.bench.baselines.cache_peer import CachePeer
from sandwich.errors import ConfigError, ShapeError

DEFAULT_PEERS = ("numpy", "torch", "openvino")


def _own_copy(w: np.ndarray) -> np.ndarray:
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        raise ShapeError(f"weights must be a 2-D numpy array (K, N), got {getattr(w, 'shape', type(w))}")
    return np.array(w, dtype=np.float32, order="C", copy=True)


def _check_a(a: np.ndarray, k: int) -> None:
    if a.ndim != 2 or a.shape[1] != k or a.dtype != np.float32:
        raise ShapeError(f"activations must be float32 (M, {k}), got {a.dtype} {a.shape}")


class NumpyPeer(Peer):
    """numpy matmul on its bundled OpenBLAS, threads limited with threadpoolctl."""

    name = "numpy"

    def __init__(self, threads: int) -> None:
        from threadpoolctl import threadpool_limits

        self.threads = threads
        # Kept on the peer: the limit stays set for the process, like torch.set_num_threads.
        self._limits = threadpool_limits(limits=threads, user_api="blas")

    def prepare(self, w: np.ndarray) -> np.ndarray:
        return _own_copy(w)

    def run(self, a: np.ndarray, handle: object) -> np.ndarray:
        assert isinstance(handle, np.ndarray)
        _check_a(a, handle.shape[0])
        return a @ handle


class TorchPeer(Peer):
    """torch.mm (oneDNN/MKL on x86 CPU wheels) on zero-copy views of the numpy arrays; with
    `bf16`, on bf16 weights and A rounded to bf16 per call, the product (bf16, as torch
    returns it) widened back to f32: oneDNN's AMX or avx512_bf16 path."""

    name = "torch"

    def __init__(self, threads: int, *, bf16: bool = False) -> None:
        import torch

        self.threads = threads
        self._torch = torch
        self._dtype = torch.bfloat16 if bf16 else None
        self.name = "torch-bf16" if bf16 else "torch"
        torch.set_num_threads(threads)

    def prepare(self, w: np.ndarray) -> object:
        t = self._torch.from_numpy(_own_copy(w))
        return t.to(self._dtype) if self._dtype else t

    def run(self, a: np.ndarray, handle: object) -> np.ndarray:
        _check_a(a, handle.shape[0])  # type: ignore[attr-defined]
        x = self._torch.from_numpy(a)
        if self._dtype is None:
            return self._torch.mm(x, handle).numpy()
        return self._torch.mm(x.to(self._dtype), handle).float().numpy()


@dataclass
class _OpenVinoWeights:
    """Weights as (N, K) plus one compiled model per static M, built on first use.

    With `copies` > 1 the model holds that many distinct weight matrices (copy i is scaled by
    1 + i * 2^-20 so no pass can merge equal constants), one MatMul each on the same input:
    one call streams every copy, and only copy 0's product is returned."""

    wt: np.ndarray
    copies: int = 1
    compiled: dict[int, object] = field(default_factory=dict)


class OpenVinoPeer(Peer):
    """OpenVINO MatMul with the weights as a Constant, compiled per static M.

    The constant lets the CPU plugin pack the weights ahead (a FullyConnected node), as our
    kernels do; the weights are stored (N, K) with transpose_b so no Transpose node is left in
    the graph; f32 precision is forced, since the plugin defaults to bf16 on CPUs with bf16,
    unless `bf16` asks for that (f32 in and out, the weights and the MatMul in bf16).
    """

    name = "openvino"

    def __init__(self, threads: int, *, bf16: bool = False) -> None:
        import openvino as ov
        import openvino.opset13 as ops

        self.threads = threads
        self._ov, self._ops = ov, ops
        self._core = ov.Core()
        self.name = "openvino-bf16" if bf16 else "openvino"
        self._config = {"INFERENCE_NUM_THREADS": threads,
                        "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                        "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}

    def prepare(self, w: np.ndarray) -> _OpenVinoWeights:
        return _OpenVinoWeights(wt=np.ascontiguousarray(_own_copy(w).T))

    def prepare_rotated(self, w: np.ndarray, copies: int) -> tuple[list[object], int]:
        """One compiled model per handle would start `copies` thread pools that fight over the
        cores (that measured 0.1 GB/s); one model holding every copy reads the same bytes."""
        return [_OpenVinoWeights(wt=np.ascontiguousarray(_own_copy(w).T), copies=copies)], copies

    def _compile(self, h: _OpenVinoWeights, m: int) -> object:
        n, k = h.wt.shape
        x = self._ops.parameter([m, k], self._ov.Type.f32)
        ys = [self._ops.matmul(x, self._ops.constant(h.wt * np.float32(1 + i * 2.0 ** -20)
                                                     if i else h.wt), False, True)
              for i in range(h.copies)]
        model = self._ov.Model(ys, [x], f"gemm_{m}x{n}x{k}_x{h.copies}")
        h.compiled[m] = self._core.compile_model(model, "CPU", self._config)
        return h.compiled[m]

    def run(self, a: np.ndarray, handle: object) -> np.ndarray:
        assert isinstance(handle, _OpenVinoWeights)
        _check_a(a, handle.wt.shape[1])
        cm = handle.compiled.get(a.shape[0])
        if cm is None:
            cm = self._compile(handle, a.shape[0])
        return cm({0: a}, share_inputs=True, share_outputs=True)[0]  # type: ignore[operator]


_FACTORIES: dict[str, tuple[Callable[..., Peer], str]] = {
    "numpy": (NumpyPeer, "pip install threadpoolctl"),
    "torch": (TorchPeer, "pip install torch==2.13.0"),
    "openvino": (OpenVinoPeer, "pip install openvino"),
}


BF16_PEERS = ("torch", "openvino")  # the peers with a bf16 GEMM (their `bf16` argument)


def check_bf16_peers(names: Iterable[str]) -> list[str]:
    """The names, or a ConfigError for the first that is no bf16 peer."""
    names = list(names)
    for name in names:
        if name not in BF16_PEERS:
            raise ConfigError(f"unknown bf16 GEMM peer {name!r}; choose from {', '.join(BF16_PEERS)}")
    return names


def make_bf16_peers(names: Iterable[str], *, threads: int) -> PeerSet:
    """The named peers in bf16 (torch, openvino), for the bf16 GEMMs their results are checked
    against; a peer whose package is missing is skipped with a message."""
    built = [_build(name, threads, bf16=True) for name in check_bf16_peers(names)]
    return _peer_set(built)


def make_peers(names: Iterable[str] = DEFAULT_PEERS, *, threads: int) -> PeerSet:
    """Build the named peers for `threads` threads; a peer whose package is missing is skipped."""
    if not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    built: list[Peer | SkippedPeer] = []
    for name in names:
        if name.startswith(CACHE_PREFIX):
            built.append(CachePeer(name[len(CACHE_PREFIX):], threads))
            continue
        if name not in _FACTORIES:
            raise ConfigError(f"unknown GEMM peer {name!r}; choose from {', '.join(_FACTORIES)}, "
                              f"or {CACHE_PREFIX}DIR (another kernel cache's tuned GEMMs)")
        built.append(_build(name, threads))
    return _peer_set(built)


def _build(name: str, threads: int, **kw) -> Peer | SkippedPeer:
    """Peer `name` of _FACTORIES, or a SkippedPeer saying what to install where its package
    is missing."""
    factory, install = _FACTORIES[name]
    try:
        return factory(threads, **kw)
    except ImportError as e:
        missing = e.name or str(e)
        return SkippedPeer(name, f"peer {name} skipped: {missing} is not installed ({install})")


def _peer_set(built: list[Peer | SkippedPeer]) -> PeerSet:
    return PeerSet(peers=tuple(p for p in built if isinstance(p, Peer)),
                   skipped=tuple(p for p in built if isinstance(p, SkippedPeer)))
