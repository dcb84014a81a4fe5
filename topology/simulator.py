"""Roofline-style latency simulator: TTFT and TPOT of a ServiceConfig on a token trace."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx
import numpy as np

from sandwich.models import ModelConfig
from sandwich.payload import make_payload
from sandwich.topology.trace import Trace
from sandwich.types import ServiceConfig

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
SHARED_KINDS = ("package", "numa", "l3", "cluster", "group")


@dataclass(frozen=True)
class SimParams:
    """Machine parameters; `calibrate` measures the per-core ones on the host."""

    core_gflops: float = 40.0  # sustained GEMM GFLOP/s of one physical core
    smt_gain: float = 0.15  # extra compute from a core's second hardware thread
    core_bw_gbs: float = 12.0  # streaming bandwidth one core can pull alone
    numa_bw_gbs: float = 80.0  # capacity of one NUMA node's memory controllers
    l3_bw_gbs: float = 200.0  # capacity of one L3 domain's ring/mesh slice
    cluster_bw_gbs: float = 60.0  # capacity of one core cluster's shared port (L3 tag)
    gamma_numa: float = 0.004  # contention: aggregate bandwidth / (1 + gamma * (k - 1))
    gamma_l3: float = 0.01
    gamma_cluster: float = 0.03
    # A `group` node (a latent level found by the group transform, e.g. an L3-tag cluster the OS
    # hides) is a shared resource of its own; with both values 0 it costs nothing, as before.
    group_bw_gbs: float = 0.0  # capacity of one latent group's shared port; 0 = no limit of its own
    gamma_group: float = 0.0
    group_cores: int = 0  # cores per latent group these values describe (Kunpeng-920: 4); 0 = any size
    remote_bw_factor: float = 0.6  # bandwidth of remote NUMA accesses relative to local
    sync_us: float = 2.0  # fork-join barrier per op, times (1 + log2 threads)
    allreduce_us: float = 8.0  # latency of one all-reduce step within a NUMA node
    allreduce_gbs: float = 10.0  # shared-memory all-reduce bandwidth within a NUMA node
    cross_numa_factor: float = 2.0  # all-reduce slowdown once ranks span NUMA nodes
    batch: int = 1  # decode batch size
    calibrated: str = ""  # where the per-core values came from, empty for defaults

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SimParams:
        return cls(**json.loads(text))

    @property
    def latent(self) -> bool:
        """Whether group nodes cost anything: only then does the search look for latent levels."""
        return self.gamma_group > 0 or self.group_bw_gbs > 0

    def capacity(self, kind: str) -> tuple[float, float]:
        """(capacity GB/s, gamma) of a shared node kind; packages add no limit of their own."""
        return {
            "numa": (self.numa_bw_gbs, self.gamma_numa),
            "l3": (self.l3_bw_gbs, self.gamma_l3),
            "cluster": (self.cluster_bw_gbs, self.gamma_cluster),
            "group": (self.group_bw_gbs or math.inf, self.gamma_group),
        }.get(kind, (math.inf, 0.0))


@dataclass(frozen=True)
class HardwareMap:
    """For each cpu: its core and the shared nodes above it (innermost first), group nodes included."""

    core_of: dict[int, str]
    shared_of: dict[int, tuple[tuple[str, str], ...]]
    numa_of: dict[int, str]

    @classmethod
    def from_tree(cls, tree: nx.DiGraph) -> HardwareMap:
        core_of, shared_of, numa_of = {}, {}, {}
        for node, data in tree.nodes(data=True):
            if data["kind"] != "pu":
                continue
            cpu, chain, up = data["cpu"], [], node
            core_of[cpu] = f"pu{cpu}"
            while tree.in_degree(up):
                up = next(iter(tree.predecessors(up)))
                kind = tree.nodes[up]["kind"]
                if kind == "core":
                    core_of[cpu] = up
                elif kind in SHARED_KINDS:
                    chain.append((kind, up))
                if kind == "numa":
                    numa_of[cpu] = up
            shared_of[cpu] = tuple(chain)
        return cls(core_of, shared_of, numa_of)

    def with_groups(self, groups: list[frozenset[int]]) -> HardwareMap:
        """This map plus one shared `group` node per cpu set: latent levels taken from other trees."""
        extra: dict[int, list[tuple[str, str]]] = {}
        for i, cpus in enumerate(groups):
            for c in cpus:
                extra.setdefault(c, []).append(("group", f"latent{i}"))
        shared = {c: (*extra.get(c, ()), *chain) for c, chain in self.shared_of.items()}
        return HardwareMap(self.core_of, shared, self.numa_of)


_MAPS: dict[str, HardwareMap] = {}


def hardware_map(tree: nx.DiGraph) -> HardwareMap:
    """HardwareMap.from_tree, cached by the tree's Merkle hash (equal hashes, equal structure)."""
    key = tree.graph["hash"]
    if key not in _MAPS:
        if len(_MAPS) >= 256:
            _MAPS.pop(next(iter(_MAPS)))
        _MAPS[key] = HardwareMap.from_tree(tree)
    return _MAPS[key]


@dataclass(frozen=True)
class SimResult:
    """Mean time to first token and mean time per output token over the trace, in seconds."""

    ttft_s: float
    tpot_s: float


def process_rates(config: ServiceConfig, hw: HardwareMap, p: SimParams) -> tuple[float, float, int]:
    """(FLOP/s, bytes/s, threads) of the slowest process, with every process running at once
    (ranks of one TP step wait for the slowest)."""
    cpu_of_core: dict[str, int] = {}
    for proc in config.processes:
        for c in proc.cpus:
            cpu_of_core.setdefault(hw.core_of[c], c)
    load: dict[str, int] = {}
    kind_of: dict[str, str] = {}
    for cpu in cpu_of_core.values():
        for kind, node in hw.shared_of[cpu]:
            load[node] = load.get(node, 0) + 1
            kind_of[node] = kind
    per_node = {}
    for node, k in load.items():
        cap, gamma = p.capacity(kind_of[node])
        per_node[node] = min(k * p.core_bw_gbs, cap) / (1 + gamma * (k - 1)) / k
    flops_min, bw_min, threads = math.inf, math.inf, 1
    for proc in config.processes:
        cores = {hw.core_of[c]: c for c in proc.cpus}
        flops = p.core_gflops * 1e9 * (len(cores) + p.smt_gain * (len(proc.cpus) - len(cores)))
        bw = sum(min([p.core_bw_gbs] + [per_node[n] for _, n in hw.shared_of[c]]) for c in cores.values())
        spans = len({hw.numa_of.get(c) for c in proc.cpus})
        bw *= 1 / spans + (spans - 1) / spans * p.remote_bw_factor
        flops_min, bw_min, threads = min(flops_min, flops), min(bw_min, bw * 1e9), max(threads, len(proc.cpus))
    return flops_min, bw_min, threads


@lru_cache(maxsize=64)
def _ops(model: ModelConfig, tp: int):
    return make_payload(model, tp=tp).ops


def step_time(m: np.ndarray, ctx: np.ndarray, *, model: ModelConfig, tp: int, rates: tuple, p: SimParams,
              numa_span: int) -> np.ndarray:
    """Seconds for one forward pass of m tokens attending to ctx earlier tokens (arrays)."""
    flops_s, bytes_s, threads = rates
    sync = p.sync_us * 1e-6 * (1 + math.log2(threads))
    total = np.zeros_like(m, dtype=float)
    for op in _ops(model, tp):
        eb = _BYTES.get(op.dtype, 4)
        fl = 2.0 * m * op.n * op.k * op.count
        by = (op.n * op.k * eb + 4.0 * m * (op.n + op.k)) * op.count
        total += np.maximum(fl / flops_s, by / bytes_s) + op.count * sync
    layers, hd = model.num_hidden_layers, model.head_dim
    heads, kv = model.num_attention_heads // tp, model.num_key_value_heads // tp
    att_fl = 4.0 * m * ctx * heads * hd * layers
    att_by = 2.0 * ctx * kv * hd * 4 * layers * np.where(m > p.batch, 1, m)  # decode reads each row's KV
    total += np.maximum(att_fl / flops_s, att_by / bytes_s) + layers * sync
    if tp > 1:
        x = p.cross_numa_factor if numa_span > 1 else 1.0
        ar_bytes = 4.0 * m * model.hidden_size * 2 * (tp - 1) / tp
        total += 2 * layers * (math.ceil(math.log2(tp)) * p.allreduce_us * 1e-6 * x + ar_bytes / (p.allreduce_gbs * 1e9 / x))
    return total


def simulate(config: ServiceConfig, *, hw: HardwareMap, model: ModelConfig, trace: Trace, params: SimParams,
             decode_samples: int = 8) -> SimResult:
    """TTFT: prefill of each prompt (causal attention over half the prompt on average);
    TPOT: decode steps of batch `params.batch`, sampled along each request's output."""
    rates = process_rates(config, hw, params)
    span = len({hw.numa_of.get(c) for proc in config.processes for c in proc.cpus})
    kw = dict(model=model, tp=config.tp, rates=rates, p=params, numa_span=span)
    prompts = np.array([r[0] for r in trace.requests], dtype=float)
    ttft = step_time(prompts, prompts / 2, **kw).mean()
    ctx = np.concatenate([
        r[0] + np.linspace(0, r[1] - 1, min(r[1], decode_samples)) for r in trace.requests
    ])
    weights = np.concatenate([np.full(min(r[1], decode_samples), 1.0 / min(r[1], decode_samples)) for r in trace.requests])
    tpot = float((step_time(np.full_like(ctx, params.batch), ctx, **kw) * weights).sum() / len(trace.requests))
    return SimResult(ttft_s=float(ttft), tpot_s=tpot)
