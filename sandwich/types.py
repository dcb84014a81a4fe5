"""Plain frozen dataclasses passed between the compiler, tuner, topology and runtime."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


class JsonMixin:
    """to_json/from_json for frozen dataclasses whose fields are plain data or other such dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in d:
                continue
            v = d[f.name]
            sub = _NESTED.get((cls.__name__, f.name))
            if sub is not None and v is not None:
                v = tuple(sub.from_dict(x) for x in v) if isinstance(v, list) else sub.from_dict(v)
            elif isinstance(v, list):
                v = tuple(v)
            kwargs[f.name] = v
        return cls(**kwargs)

    @classmethod
    def from_json(cls, s: str):
        return cls.from_dict(json.loads(s))


@dataclass(frozen=True)
class GemmShape(JsonMixin):
    """C[m, n] = A[m, k] @ W[k, n]; n and k are fixed by the model, m is the token count."""

    m: int
    n: int
    k: int
    dtype: str = "float32"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class GemmOp(JsonMixin):
    """One GEMM of a model layer (or lm_head) with its fixed N and K; M varies per request."""

    name: str
    n: int
    k: int
    dtype: str = "float32"
    count: int = 1  # how many times it runs per forward pass (layers)
    m_max: int | None = None  # the largest M the runtime runs it at, if that is below seq_max


@dataclass(frozen=True)
class MicroKernel(JsonMixin):
    """Register tile: mu_m rows of A times mu_n columns of W held in vector registers."""

    mu_m: int
    mu_n: int


@dataclass(frozen=True)
class ComputeSlice(JsonMixin):
    """Cache block one thread works on at a time: b_m rows, b_n columns, b_k depth."""

    b_m: int
    b_n: int
    b_k: int


@dataclass(frozen=True)
class Polymerization(JsonMixin):
    """How slices are spread over threads: t_m x t_n x t_k threads (t_k > 1 is split-K)."""

    t_m: int = 1
    t_n: int = 1
    t_k: int = 1

    @property
    def threads(self) -> int:
        return self.t_m * self.t_n * self.t_k


GEMM_OP = "gemm"
AMX_OP = "amx"
AMX8_OP = "amx8"  # int weights on AMX tiles, byte products (tdpbsud): dsl/kernels/gemm_amx_int8.sw
AMX_OPS = (AMX_OP, AMX8_OP)  # the kernels whose blocks are built in: no slice at call time


@dataclass(frozen=True)
class KernelSchedule(JsonMixin):
    """Everything the compiler needs to build one GEMM kernel (valid for any M)."""

    micro_kernel: MicroKernel
    slice: ComputeSlice
    polymerization: Polymerization
    pack_n: int  # packed weight layout W[N/pack_n, K, pack_n]
    op: str = GEMM_OP  # the DSL family; AMX_OP / AMX8_OP: bf16 / byte products on tiles (gemm_dsl)
    dtype: str = "float32"

    def key(self) -> str:
        """Names the whole schedule."""
        s = self.slice
        return f"{self._base_key()}_s{s.b_m}x{s.b_n}x{s.b_k}"

    def _base_key(self) -> str:
        mk, p = self.micro_kernel, self.polymerization
        return f"{self.op}_{self.dtype}_mk{mk.mu_m}x{mk.mu_n}_p{p.t_m}x{p.t_n}x{p.t_k}_n{self.pack_n}"

    def family_key(self) -> str:
        """Names the compiled kernel: the family's slice is a call-time argument, so every
        slice of one micro-kernel + polymerization + layout shares one `.so`; the AMX
        kernels' blocks are built in, so their slice names their own."""
        return self.key() if self.op in AMX_OPS else self._base_key()

    def family(self) -> KernelSchedule:
        """This schedule with a canonical slice: the key under which its kernel is built
        (an AMX schedule as it is: its slice is built in)."""
        if self.op in AMX_OPS:
            return self
        mk = self.micro_kernel
        return KernelSchedule(mk, ComputeSlice(mk.mu_m, mk.mu_n, 16), self.polymerization,
                              self.pack_n, self.op, self.dtype)


@dataclass(frozen=True)
class TuneRecord(JsonMixin):
    """The best schedule found for one op over an M range, with how it was found."""

    target_fingerprint: str
    op: str
    n: int
    k: int
    dtype: str
    m_lo: int
    m_hi: int
    schedule: KernelSchedule
    gflops: float
    trials: int
    seconds: float


@dataclass(frozen=True)
class ProcessPlan(JsonMixin):
    """One process of a service configuration: the CPUs it is pinned to and its NUMA node."""

    cpus: tuple[int, ...]
    numa_node: int = 0


@dataclass(frozen=True)
class ServiceConfig(JsonMixin):
    """How one phase (prefill or decode) is served: processes (= TP degree) and their threads."""

    phase: str
    processes: tuple[ProcessPlan, ...] = field(default_factory=tuple)
    threads_per_process: int = 1

    @property
    def tp(self) -> int:
        return len(self.processes)


_NESTED: dict[tuple[str, str], Any] = {
    ("KernelSchedule", "micro_kernel"): MicroKernel,
    ("KernelSchedule", "slice"): ComputeSlice,
    ("KernelSchedule", "polymerization"): Polymerization,
    ("TuneRecord", "schedule"): KernelSchedule,
    ("ServiceConfig", "processes"): ProcessPlan,
}
