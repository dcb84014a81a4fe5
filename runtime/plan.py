"""The plan of one model on one machine (Sandwich §3, Fig. 4): the prefill and the decode
service configuration chosen by measurement, every candidate's figures, and what it was made
from, so a plan made for another model, machine or kernel cache is caught and never used.

Plans live in the kernel cache (`<cache>/plans/<model>-<digest>.json`, or
`<model>-<format>-<digest>.json` for a weight format other than fp32: each format has its own
kernels and timings). A plan is found by
the model's shape digest (the weights' values do not change a kernel or a timing: a plan
tuned on an embedded config serves every checkpoint of that shape).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandwich.errors import CacheError
from sandwich.models import ModelConfig
from sandwich.payload import make_payload
from sandwich.topology.cpulist import format_cpulist
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.types import ServiceConfig
from sandwich.weight_formats import parse_weights

PLAN_VERSION = 1


@dataclass(frozen=True)
class Candidate:
    """One placement measured for both phases (a TP degree, its CPU sets, threads per process):
    the simulator's figures next to the medians measured on the real engine."""

    config: ServiceConfig  # phase field: the phase whose top-k brought it in
    ops: tuple[str, ...]  # TopoTree transforms behind it
    sim_ttft_ms: float
    sim_tpot_ms: float
    ttft_ms: float = float("nan")
    tpot_ms: float = float("nan")
    ttft_spread: float = float("nan")  # (max - min) / median over the rounds
    tpot_spread: float = float("nan")
    runnable: str = ""  # empty when measured; else why it was not
    ttft_all: tuple[float, ...] = ()  # every round's figure, in round order (a wide spread
    tpot_all: tuple[float, ...] = ()  # says which rounds: a slow first one, or one outlier)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = self.config.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Candidate:
        """Plans stored before the per-round figures load with none."""
        return cls(**{**d, "config": ServiceConfig.from_dict(d["config"]), "ops": tuple(d["ops"]),
                      "ttft_all": tuple(d.get("ttft_all", ())), "tpot_all": tuple(d.get("tpot_all", ()))})


@dataclass(frozen=True)
class Stamp:
    """What a plan was made from; any difference makes it stale."""

    model_digest: str  # the model's shapes
    machine: str  # CPU target fingerprint, topology hash, the CPUs this process may use
    kernels: str  # the tuning records of every GEMM the plan runs


@dataclass(frozen=True)
class Plan:
    model: str
    stamp: Stamp
    prefill: ServiceConfig
    decode: ServiceConfig
    candidates: tuple[Candidate, ...]
    measured: dict = field(default_factory=dict)  # the pair vs the best single, one run
    setup: dict = field(default_factory=dict)  # trace, rounds, search parameters
    created: str = ""
    version: int = PLAN_VERSION

    def to_json(self) -> str:
        d = {"version": self.version, "model": self.model, "created": self.created,
             "stamp": asdict(self.stamp), "prefill": self.prefill.to_dict(),
             "decode": self.decode.to_dict(), "measured": self.measured, "setup": self.setup,
             "candidates": [c.to_dict() for c in self.candidates]}
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        if d.get("version") != PLAN_VERSION:
            raise ValueError(f"plan version {d.get('version')}, this sandwichc reads {PLAN_VERSION}")
        return cls(model=d["model"], stamp=Stamp(**d["stamp"]),
                   prefill=ServiceConfig.from_dict(d["prefill"]),
                   decode=ServiceConfig.from_dict(d["decode"]),
                   candidates=tuple(Candidate.from_dict(c) for c in d["candidates"]),
                   measured=d.get("measured", {}), setup=d.get("setup", {}),
                   created=d.get("created", ""))


def placement(cfg: ServiceConfig) -> tuple[tuple[int, ...], ...]:
    """Where the processes run: the CPU set of each rank (the phase does not matter)."""
    return tuple(tuple(sorted(p.cpus)) for p in cfg.processes)


def describe(cfg: ServiceConfig) -> str:
    sets = placement(cfg)
    where = " | ".join(format_cpulist(s) for s in sets)
    return f"TP={len(sets)} x {len(sets[0])} thr (cpus {where})"


def format_plan(plan: Plan) -> str:
    """What `plan show` prints: the chosen pair, every candidate, the one-run comparison."""
    lines = [f"plan for {plan.model}, {plan_weights(plan)} weights (made {plan.created} on "
             f"{plan.setup.get('machine', '?')})",
             f"  prefill: {describe(plan.prefill)}", f"  decode:  {describe(plan.decode)}",
             f"candidates (measured: median of {plan.setup.get('rounds', '?')} rounds, "
             f"{plan.setup.get('prompt_len', '?')}-token prompt, {plan.setup.get('new_tokens', '?')} "
             f"new tokens; spread = (max - min) / median):",
             f"  {'placement':<34}{'from':>8}{'sim TTFT':>10}{'TTFT ms':>9}{'spread':>8}"
             f"{'sim TPOT':>10}{'TPOT ms':>9}{'spread':>8}  transforms"]
    for c in plan.candidates:
        if c.runnable:
            lines.append(f"  {describe(c.config):<34}{c.config.phase:>8}  not measured: {c.runnable}")
            continue
        lines.append(f"  {describe(c.config):<34}{c.config.phase:>8}{c.sim_ttft_ms:>10.2f}"
                     f"{c.ttft_ms:>9.2f}{c.ttft_spread:>8.1%}{c.sim_tpot_ms:>10.3f}{c.tpot_ms:>9.3f}"
                     f"{c.tpot_spread:>8.1%}  {' '.join(c.ops) or '-'}")
    m = plan.measured
    if placement(plan.prefill) == placement(plan.decode):
        lines.append("the best prefill and decode placements coincide: one configuration serves both")
    lines.append("the pair against each single placement used for both phases, one run:")
    for name, f in [("pair", m["pair"]), *m["singles"].items()]:
        lines.append(f"  {name:<34}TTFT {f['ttft_ms']:.2f} ms (spread {f['ttft_spread']:.1%})  "
                     f"TPOT {f['tpot_ms']:.3f} ms (spread {f['tpot_spread']:.1%})")
    lines.append(f"greedy tokens identical across every engine measured: {m.get('greedy_ids_agree')}")
    return "\n".join(lines)


def model_digest(cfg: ModelConfig) -> str:
    """The shapes that decide kernels and timings (not the name, not the weights)."""
    d = asdict(cfg)
    d.pop("name", None)
    d.pop("model_type", None)  # tensor names, not shapes
    if not cfg.is_moe:  # a dense model's digest stays what it was before MoE fields existed
        d.pop("num_local_experts", None)
        d.pop("num_experts_per_tok", None)
    for key, default in (("norm_topk_prob", True), ("shared_expert_intermediate_size", 0)):
        if d[key] == default:  # nor does a Mixtral's, before Qwen's MoE fields
            d.pop(key)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def machine_stamp(cache: KernelCache, topology_hash: str) -> str:
    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    return f"{cache.fingerprint}/{topology_hash}/cpus {cpus}"


def plan_threads(cfg: ModelConfig, configs: list[ServiceConfig]) -> list[tuple[int, int]]:
    """The distinct payloads (TP degree, threads per process) of some configurations."""
    return sorted({(c.tp, c.threads_per_process) for c in configs})


def kernels_stamp(cache: KernelCache, cfg: ModelConfig, payloads: list[tuple[int, int]],
                  weights: str = "fp32") -> str:
    """A digest of the records every payload's GEMMs would load in the format `weights`:
    re-tuning, clearing or damaging one changes it."""
    h = hashlib.sha256()
    for tp, threads in payloads:
        for op in make_payload(cfg, tp=tp, seq_max=1, weights=weights).ops:
            recs = cache.records(op.n, op.k, op.dtype, threads)
            h.update(f"{tp}/{threads}/{op.n}/{op.k}:".encode())
            for r in sorted(recs, key=lambda r: (r.record.m_lo, r.record.m_hi)):
                h.update(r.record.to_json().encode())
    return h.hexdigest()[:16]


def current_stamp(cache: KernelCache, cfg: ModelConfig, topology_hash: str,
                  configs: list[ServiceConfig], weights: str = "fp32") -> Stamp:
    return Stamp(model_digest=model_digest(cfg), machine=machine_stamp(cache, topology_hash),
                 kernels=kernels_stamp(cache, cfg, plan_threads(cfg, configs), weights))


def plan_dir(cache: KernelCache) -> Path:
    return Path(cache.dir) / "plans"


def _slug(cfg: ModelConfig, weights: str = "fp32") -> str:
    """The model's name, and the weight format's unless fp32 (plans from before formats
    existed keep their names)."""
    name = re.sub(r"[^a-z0-9]+", "-", cfg.name.lower()).strip("-")[-40:] or "model"
    fmt = parse_weights(weights).slug
    return name if fmt == "fp32" else f"{name}-{fmt}"


def plan_name(cfg: ModelConfig, weights: str = "fp32") -> str:
    """A file-name-safe name: the model's name (and weight format) plus its shape digest."""
    return f"{_slug(cfg, weights)}-{model_digest(cfg)[:8]}"


def plan_weights(plan: Plan) -> str:
    """The weight format a plan was measured with (plans from before formats: fp32)."""
    return plan.setup.get("weights", "fp32")


def save_plan(cache: KernelCache, cfg: ModelConfig, plan: Plan) -> Path:
    """Write atomically (a reader never sees half a plan)."""
    d = plan_dir(cache)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{plan_name(cfg, plan_weights(plan))}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(plan.to_json())
    os.replace(tmp, path)
    return path


def find_plan(cache: KernelCache, cfg: ModelConfig, weights: str = "fp32") -> tuple[Plan | None, Path]:
    """The stored plan for this model's shapes and weight format, else one stored under the
    same name for other shapes (stale: the model changed), else None; a damaged plan file is a
    CacheError."""
    path = plan_dir(cache) / f"{plan_name(cfg, weights)}.json"
    if not path.is_file():
        same_name = sorted(plan_dir(cache).glob(f"{_slug(cfg, weights)}-????????.json"))
        if not same_name:
            return None, path
        path = same_name[0]
    try:
        return Plan.from_json(path.read_text(encoding="utf-8")), path
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CacheError(f"{path}: not a readable plan ({type(e).__name__}: {e}); "
                         f"`sandwichc tune --model ...` writes a new one") from None


def staleness(plan: Plan, cache: KernelCache, cfg: ModelConfig, topology_hash: str) -> str | None:
    """Why the plan may not be used here, or None when it is current."""
    now = current_stamp(cache, cfg, topology_hash, [plan.prefill, plan.decode], plan_weights(plan))
    if now.model_digest != plan.stamp.model_digest:
        return "the model's shapes changed"
    if now.machine != plan.stamp.machine:
        return f"the machine changed (planned on {plan.stamp.machine}, now {now.machine})"
    if now.kernels != plan.stamp.kernels:
        return "the kernel cache changed (a GEMM was re-tuned, cleared or damaged)"
    return None


def stamp_time() -> str:
    return time.strftime("%Y-%m-%d %H:%M")
