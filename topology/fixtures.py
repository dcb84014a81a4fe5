"""Synthetic machines written as sysfs snapshots, hwloc XML and `lscpu -p`, for tests and demos."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from sandwich.topology.cpulist import format_cpulist, format_hwloc_cpuset


@dataclass(frozen=True)
class MachineSpec:
    """A regular machine: packages > NUMA nodes > L3 domains > clusters > cores > SMT threads.

    Cores are numbered package-major; SMT sibling s of core g is cpu g + s * cores (Linux x86).
    `cluster` says what cluster_cpus holds: "cluster" (real clusters), "core" (x86 kernels
    that repeat the core), or "none" (no cluster_cpus file at all).
    """

    name: str
    packages: int
    numa_per_package: int
    l3_per_numa: int
    clusters_per_l3: int
    cores_per_cluster: int
    smt: int = 1
    cluster: str = "core"
    l2_bytes: int = 1 << 20
    l3_bytes: int = 32 << 20
    offline: tuple[int, ...] = ()
    memory_only_numa: int = 0

    @property
    def cores(self) -> int:
        return self.packages * self.numa_per_package * self.l3_per_numa * self.clusters_per_l3 * self.cores_per_cluster

    def cpus_of_core(self, g: int) -> list[int]:
        return [g + s * self.cores for s in range(self.smt)]

    def index(self, g: int) -> dict[str, int]:
        """Which package, NUMA node, L3 and cluster core g belongs to."""
        per = [self.cores_per_cluster, self.clusters_per_l3, self.l3_per_numa, self.numa_per_package]
        cluster = g // per[0]
        l3 = cluster // per[1]
        numa = l3 // per[2]
        return {"cluster": cluster, "l3": l3, "numa": numa, "package": numa // per[3]}

    def members(self, kind: str, i: int) -> list[int]:
        """Online cpus of the i-th `kind` unit."""
        cores = [g for g in range(self.cores) if self.index(g)[kind] == i]
        return sorted(c for g in cores for c in self.cpus_of_core(g) if c not in self.offline)


XEON_2S = MachineSpec("Intel(R) Xeon(R) Gold 6248R-like", 2, 1, 1, 1, 24, smt=2, l3_bytes=36 << 20)
EPYC_2X64 = MachineSpec("AMD EPYC 7742-like", 2, 1, 16, 1, 4, smt=2, l2_bytes=512 << 10, l3_bytes=16 << 20)
KUNPENG_4S = MachineSpec("HiSilicon Kunpeng-920-like", 4, 2, 1, 6, 4, cluster="cluster", l2_bytes=512 << 10)
DESKTOP_8C = MachineSpec("desktop 8-core", 1, 1, 1, 1, 8, smt=2, l2_bytes=1 << 20, l3_bytes=32 << 20)
KUNPENG_NO_CLUSTER = replace(KUNPENG_4S, cluster="none")
# 2 sockets x 2 dies (NUMA nodes) x 8 four-core L3-tag clusters, with cluster_cpus hidden as on
# older kernels: only group(n=4, t=1) finds the clusters (the latent case of the paper's Fig. 5).
KUNPENG_2X64 = MachineSpec("HiSilicon Kunpeng-920-like 2x64", 2, 2, 1, 8, 4, cluster="none", l2_bytes=512 << 10)
MACHINES = {"xeon-2s": XEON_2S, "epyc-2x64": EPYC_2X64, "kunpeng-4s": KUNPENG_4S, "desktop-8c": DESKTOP_8C,
            "kunpeng-2x64": KUNPENG_2X64}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_sysfs(spec: MachineSpec, root: str | Path) -> Path:
    """Write `root/sys/devices/system/{cpu,node}/...` and `root/proc/cpuinfo` for `spec`."""
    root = Path(root)
    cpu_dir = root / "sys/devices/system/cpu"
    all_cpus = list(range(spec.cores * spec.smt))
    online = [c for c in all_cpus if c not in spec.offline]
    for name, cpus in (("online", online), ("present", all_cpus), ("possible", all_cpus)):
        _write(cpu_dir / name, format_cpulist(cpus))
    _write(cpu_dir / "offline", format_cpulist(spec.offline))
    for c in all_cpus:
        d = cpu_dir / f"cpu{c}"
        _write(d / "online", "0" if c in spec.offline else "1")
        if c in spec.offline:
            continue  # the kernel removes topology/ and cache/ of offline cpus
        g = c % spec.cores
        idx = spec.index(g)
        core = [x for x in spec.cpus_of_core(g) if x not in spec.offline]
        t = d / "topology"
        _write(t / "physical_package_id", str(idx["package"]))
        _write(t / "core_id", str(g))
        _write(t / "core_cpus_list", format_cpulist(core))
        _write(t / "thread_siblings_list", format_cpulist(core))
        _write(t / "package_cpus_list", format_cpulist(spec.members("package", idx["package"])))
        if spec.cluster != "none":
            cl = spec.members("cluster", idx["cluster"]) if spec.cluster == "cluster" else core
            _write(t / "cluster_cpus_list", format_cpulist(cl))
            _write(t / "cluster_id", str(idx["cluster"]))
        caches = [(1, "Data", 32 << 10, core), (1, "Instruction", 32 << 10, core), (2, "Unified", spec.l2_bytes, core),
                  (3, "Unified", spec.l3_bytes, spec.members("l3", idx["l3"]))]
        for i, (level, typ, size, shared) in enumerate(caches):
            ci = d / "cache" / f"index{i}"
            _write(ci / "level", str(level))
            _write(ci / "type", typ)
            _write(ci / "size", f"{size >> 10}K")
            _write(ci / "shared_cpu_list", format_cpulist(shared))
    node_dir = root / "sys/devices/system/node"
    n_numa = spec.packages * spec.numa_per_package
    for n in range(n_numa + spec.memory_only_numa):
        cpus = spec.members("numa", n) if n < n_numa else []
        _write(node_dir / f"node{n}" / "cpulist", format_cpulist(cpus))
    _write(node_dir / "online", format_cpulist(range(n_numa + spec.memory_only_numa)))
    _write(root / "proc/cpuinfo", "\n".join(f"processor\t: {c}\nmodel name\t: {spec.name}\n" for c in online))
    return root


def write_lscpu(spec: MachineSpec, path: str | Path) -> Path:
    """`lscpu -p` output: online cpus only, L2 id = core id, L3 id = L3 domain."""
    path = Path(path)
    lines = ["# The following is the parsable format.", "# CPU,Core,Socket,Node,,L1d,L1i,L2,L3"]
    for c in range(spec.cores * spec.smt):
        if c in spec.offline:
            continue
        g = c % spec.cores
        idx = spec.index(g)
        lines.append(f"{c},{g},{idx['package']},{idx['numa']},,{g},{g},{g},{idx['l3']}")
    _write(path, "\n".join(lines))
    return path


def write_hwloc_xml(spec: MachineSpec, path: str | Path) -> Path:
    """hwloc v2 XML: NUMANode as a memory child of its Package (or of a Group per NUMA node)."""
    path = Path(path)
    out = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">', '<topology version="2.0">']
    all_cpus = range(spec.cores * spec.smt)
    online = [c for c in all_cpus if c not in spec.offline]

    def obj(depth: int, typ: str, cpus, extra: str = "", close: bool = False) -> None:
        pad = "  " * depth
        out.append(f'{pad}<object type="{typ}" cpuset="{format_hwloc_cpuset(cpus)}"{extra}{"/" if close else ""}>')

    def end(depth: int) -> None:
        out.append("  " * depth + "</object>")

    obj(1, "Machine", online, f' complete_cpuset="{format_hwloc_cpuset(all_cpus)}" os_index="0"')
    out.append(f'    <info name="CPUModel" value="{spec.name}"/>')
    per_l3 = spec.clusters_per_l3 * spec.cores_per_cluster
    for p in range(spec.packages):
        obj(2, "Package", spec.members("package", p), f' os_index="{p}"')
        for n in range(p * spec.numa_per_package, (p + 1) * spec.numa_per_package):
            d = 3 if spec.numa_per_package == 1 else 4
            if d == 4:
                obj(3, "Group", spec.members("numa", n))
            obj(d, "NUMANode", spec.members("numa", n), f' os_index="{n}" local_memory="68719476736"', close=True)
            for l3 in range(n * spec.l3_per_numa, (n + 1) * spec.l3_per_numa):
                obj(d, "L3Cache", spec.members("l3", l3), f' cache_size="{spec.l3_bytes}" depth="3" cache_type="0"')
                for cl in range(l3 * spec.clusters_per_l3, (l3 + 1) * spec.clusters_per_l3):
                    dd = d + 1
                    if spec.cluster == "cluster":
                        obj(dd, "Group", spec.members("cluster", cl), ' subtype="Cluster"')
                        dd += 1
                    for g in range(cl * spec.cores_per_cluster, (cl + 1) * spec.cores_per_cluster):
                        cpus = [c for c in spec.cpus_of_core(g) if c not in spec.offline]
                        if not cpus:
                            continue
                        obj(dd, "L2Cache", cpus, f' cache_size="{spec.l2_bytes}" depth="2" cache_type="0"')
                        obj(dd + 1, "Core", cpus, f' os_index="{g % per_l3}"')
                        for c in cpus:
                            obj(dd + 2, "PU", [c], f' os_index="{c}"', close=True)
                        end(dd + 1)
                        end(dd)
                    if spec.cluster == "cluster":
                        end(d + 1)
                end(d)
            if d == 4:
                end(3)
        end(2)
    for n in range(spec.memory_only_numa):
        obj(2, "NUMANode", [], f' os_index="{spec.packages * spec.numa_per_package + n}"', close=True)
    end(1)
    out.append("</topology>")
    _write(path, "\n".join(out))
    return path


def expected_levels(spec: MachineSpec) -> list[tuple[str, int]]:
    """The (kind, count) levels a parser should report for `spec` with no offline cpus."""
    numa = spec.packages * spec.numa_per_package
    levels = [("package", spec.packages), ("numa", numa), ("l3", numa * spec.l3_per_numa)]
    if spec.cluster == "cluster":
        levels.append(("cluster", numa * spec.l3_per_numa * spec.clusters_per_l3))
    levels += [("l2", spec.cores), ("core", spec.cores), ("pu", spec.cores * spec.smt)]
    return levels


def total_pus(spec: MachineSpec) -> int:
    return math.prod([spec.cores, spec.smt]) - len(spec.offline)


def raw_from_spec(spec: MachineSpec):
    """The RawTopology a parser would return for `spec`, without writing files (fast, for tests)."""
    from sandwich.topology.raw import make_raw

    cpus = frozenset(c for c in range(spec.cores * spec.smt) if c not in spec.offline)
    keys: dict[str, dict[int, object]] = {"package": {}, "l3": {}, "l2": {}, "core": {}}
    if spec.cluster == "cluster":
        keys["cluster"] = {}
    numa_of = {}
    for c in cpus:
        g = c % spec.cores
        idx = spec.index(g)
        keys["package"][c], keys["l3"][c], numa_of[c] = idx["package"], idx["l3"], idx["numa"]
        keys["l2"][c] = keys["core"][c] = g
        if "cluster" in keys:
            keys["cluster"][c] = idx["cluster"]
    return make_raw(source=f"spec {spec.name}", name=spec.name, cpus=cpus, keys=keys, numa_of=numa_of,
                    cache_bytes={"l2": spec.l2_bytes, "l3": spec.l3_bytes})
