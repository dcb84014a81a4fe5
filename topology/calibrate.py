"""Calibrate the simulator's per-core parameters on this machine: 1 vs 2 pinned workers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import networkx as nx

from sandwich.errors import TopologyError
from sandwich.topology.simulator import SimParams, hardware_map

# Each worker pins itself, waits for a common start time, runs one kernel for `duration`
# seconds and prints its rate. Single-threaded BLAS so one worker = one core.
_WORKER = r"""
import os, sys, time
import numpy as np
cpu, start, duration, kind, size = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
os.sched_setaffinity(0, {cpu})
if kind == "gemm":
    a = np.ones((size, size), np.float32); b = np.ones((size, size), np.float32); c = np.empty_like(a)
    work, step = 2.0 * size ** 3, lambda: np.matmul(a, b, out=c)
else:
    a = np.ones(size, np.float32); b = np.ones(size, np.float32); c = np.empty_like(a)
    work, step = 12.0 * size, lambda: np.add(a, b, out=c)
step()
while time.time() < start:
    time.sleep(0.0005)
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < duration:
    step(); n += 1
print(n * work / (time.perf_counter() - t0))
"""


@dataclass(frozen=True)
class Calibration:
    """Measured rates (GFLOP/s, GB/s) with one worker alone and with two at once, per worker."""

    cpus: tuple[int, ...]
    gflops_1: float
    gflops_2: float
    gbs_1: float
    gbs_2: float
    gemm_size: int
    stream_floats: int
    duration_s: float
    date: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def apply(self, params: SimParams, *, tree: nx.DiGraph | None = None, latent_cores: int = 0) -> SimParams:
        """Per-core GFLOP/s and GB/s from the 1-worker runs; the bandwidth lost when two cores
        stream at once (b2 = b1 / (1 + gamma)) is the contention of the innermost domain they share.

        In `tree` that domain may be a cluster (gamma_cluster) or a group node (gamma_group, and
        group_cores = its cores); anything wider (L3, NUMA node, package), or no tree, sets
        gamma_l3 and gamma_numa as before. `latent_cores=n` says the two cpus share an n-core group the OS does not show (an
        L3-tag cluster), so the loss is that group's gamma_group. Two workers cannot show where a
        shared port saturates: group_bw_gbs is left as given.
        """
        gamma = round(max(0.0, self.gbs_1 / max(self.gbs_2, 1e-9) - 1), 4)
        kind, cores = ("group", latent_cores) if latent_cores else self._shared_domain(tree)
        fields: dict[str, float | int] = {"gamma_l3": gamma, "gamma_numa": gamma}
        if kind == "cluster":
            fields = {"gamma_cluster": gamma}
        elif kind == "group":
            fields = {"gamma_group": gamma, "group_cores": cores}
        return dataclasses.replace(
            params,
            core_gflops=round(self.gflops_1, 2),
            core_bw_gbs=round(self.gbs_1, 2),
            calibrated=f"cpus {','.join(map(str, self.cpus))} on {self.date}, loss as {' '.join(sorted(fields))}",
            **fields,
        )

    def _shared_domain(self, tree: nx.DiGraph | None) -> tuple[str, int]:
        """(kind, cores) of the innermost shared node above both calibration cpus; ("", 0) without a tree."""
        if tree is None:
            return "", 0
        hw = hardware_map(tree)
        a, b = self.cpus[:2]
        if a not in hw.shared_of or b not in hw.shared_of:
            raise TopologyError(f"calibration cpus {a},{b} are not both in the tree; calibrate on cpus of this machine")
        above_b = {node for _, node in hw.shared_of[b]}
        for kind, node in hw.shared_of[a]:
            if node in above_b:
                return kind, len({hw.core_of[c] for c, chain in hw.shared_of.items() if (kind, node) in chain})
        return "", 0


def _run(cpus: list[int], kind: str, size: int, duration: float, delay: float = 0.5) -> list[float]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.time() + delay  # leaves time for the workers to import numpy
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(c), str(start), str(duration), kind, str(size)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for c in cpus
    ]
    rates = []
    for p in procs:
        out, err = p.communicate(timeout=60 + duration)
        if p.returncode:
            raise TopologyError(f"calibration worker failed on cpu list {cpus}: {err.strip().splitlines()[-1:]}")
        rates.append(float(out.strip()))
    return rates


def calibrate(*, cpus: tuple[int, int] | None = None, duration_s: float = 0.3, gemm_size: int = 256,
              stream_floats: int = 1 << 24) -> Calibration:
    """GEMM GFLOP/s and streaming GB/s of one pinned worker, then of two at once (per worker)."""
    allowed = sorted(os.sched_getaffinity(0))
    if cpus is None:
        if len(allowed) < 2:
            raise TopologyError(f"calibration needs 2 cpus, this process may run on {allowed}; free a second cpu")
        cpus = (allowed[0], allowed[1])
    bad = [c for c in cpus if c not in allowed]
    if bad:
        raise TopologyError(f"calibration cpus {bad} are not available to this process (allowed {allowed})")
    g1 = _run([cpus[0]], "gemm", gemm_size, duration_s)[0]
    g2 = _run(list(cpus), "gemm", gemm_size, duration_s)
    b1 = _run([cpus[0]], "stream", stream_floats, duration_s)[0]
    b2 = _run(list(cpus), "stream", stream_floats, duration_s)
    return Calibration(
        cpus=tuple(cpus),
        gflops_1=g1 / 1e9,
        gflops_2=sum(g2) / len(g2) / 1e9,
        gbs_1=b1 / 1e9,
        gbs_2=sum(b2) / len(b2) / 1e9,
        gemm_size=gemm_size,
        stream_floats=stream_floats,
        duration_s=duration_s,
        date=time.strftime("%Y-%m-%d"),
    )
