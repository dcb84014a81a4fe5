"""`topo search` on each of hwloc's Linux test snapshots: one row per snapshot, as Markdown + JSON (issue 27)."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sandwich.errors import ConfigError, SandwichError
from sandwich.models import ModelConfig
from sandwich.topology.load import load_tree
from sandwich.topology.pipeline import Ranked, search_service_configs
from sandwich.topology.simulator import SimParams
from sandwich.topology.snapshot import SUFFIX, extract_snapshot, snapshot_names
from sandwich.topology.trace import Trace
from sandwich.topology.tree import asymmetry, depth_levels, summary
from sandwich.types import JsonMixin

# the snapshots kept with the tests (tests/data/hwloc/README.md); found beside an editable install
HWLOC_DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "hwloc"
# issue 4: "search over a 192-core 8-NUMA topology finishes in < 60 s on this machine"
TIME_LIMIT_S = 60.0


@dataclass(frozen=True)
class SnapshotRow(JsonMixin):
    """One snapshot through `topo search`: its shape, the search's counts, its top-1 configs.

    `trimmed` is empty for a symmetric tree, else the asymmetry `topo show` names (the search
    then ran on the largest symmetric sub-tree, as `--trim-asymmetric` does); `error` is empty
    unless the search cannot apply, and then says why.
    """

    name: str
    arch: str
    pus: int = 0
    cores: int = 0
    packages: int = 0
    numa: int = 0
    levels: str = ""
    searched_pus: int = 0
    trimmed: str = ""
    group_variants: int = 0
    trees_explored: int = 0
    duplicates: int = 0
    configs_simulated: int = 0
    prefill: str = ""
    ttft_ms: float = 0.0
    decode: str = ""
    tpot_ms: float = 0.0
    decode_cpus: tuple[int, ...] = ()
    seconds: float = 0.0
    error: str = ""

    @property
    def over_limit(self) -> bool:
        return self.seconds >= TIME_LIMIT_S


def notation(r: Ranked) -> str:
    """A ranked config as `topo search` prints it: TP, threads per process, NUMA nodes, transforms."""
    c = r.config
    return (f"TP={c.tp} threads/proc={c.threads_per_process} NUMA={[p.numa_node for p in c.processes]} "
            f"{' '.join(r.ops) or '(fundamental)'}")


def snapshot_arch(root: Path, name: str) -> str:
    """The architecture from the snapshot's proc/cpuinfo (which field names it differs per
    architecture); hwloc's file name when there is no cpuinfo (the synthetic `fake` ones).

    Every line counts, not only the first processor's: 32-bit ARM kernels write the CPU
    fields once, after the per-processor blocks.
    """
    info = root / "proc" / "cpuinfo"
    first: dict[str, str] = {}
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            first.setdefault(key.strip(), value.strip())
    if "CPU implementer" in first:
        return "aarch64" if first.get("CPU architecture") == "8" else "arm"
    if first.get("vendor_id") in ("GenuineIntel", "AuthenticAMD"):
        return "x86_64"
    if first.get("vendor_id", "").startswith("IBM/S390"):
        return "s390x"
    if "vendor" in first and "family" in first:  # ia64's cpuinfo says vendor/family, not vendor_id
        return "ia64"
    if first.get("cpu", "").startswith(("POWER", "Cell")):
        return "ppc64"
    for word in ("ia64", "fake"):
        if word in name:
            return f"{word} (no proc/cpuinfo)"
    return "unknown"


def search_root(root: Path, *, name: str, model: ModelConfig, trace: Trace, params: SimParams) -> SnapshotRow:
    """`topo search --sysfs-root root` (with `--trim-asymmetric` when the tree is asymmetric)."""
    arch = snapshot_arch(root, name)
    try:
        full = load_tree(sysfs_root=root)
    except SandwichError as e:
        return SnapshotRow(name=name, arch=arch, error=str(e))
    s = summary(full)
    count = {lv["kind"]: lv["count"] for lv in s["levels"]}
    why = asymmetry(full)
    row = SnapshotRow(name=name, arch=arch, pus=s["pus"], cores=s["cores"], packages=count.get("package", 0),
                      numa=count.get("numa", 0), trimmed=why or "")
    try:
        tree = load_tree(sysfs_root=root, trim_asymmetric=True) if why else full
        row = replace(row, searched_pus=summary(tree)["pus"],
                      levels=" > ".join(f"{tree.nodes[lv[0]]['kind']} {len(lv)}" for lv in depth_levels(tree)[1:]))
        res = search_service_configs(tree=tree, model=model, trace=trace, params=params, top_k=1)
    except SandwichError as e:
        return replace(row, error=str(e))
    st = res.stats
    row = replace(row, group_variants=st.group_variants, trees_explored=st.remove_explored,
                  duplicates=st.remove_duplicates, configs_simulated=st.configs_simulated, seconds=st.seconds)
    if not res.prefill or not res.decode:
        return replace(row, error=f"no configuration of {model.name} fits this tree: the TP limits rejected "
                       f"{st.configs_tp_rejected} of the {st.configs_seen} configs seen")
    p, d = res.prefill[0], res.decode[0]
    return replace(row, prefill=notation(p), ttft_ms=p.result.ttft_s * 1e3, decode=notation(d),
                   tpot_ms=d.result.tpot_s * 1e3, decode_cpus=tuple(c for proc in d.config.processes for c in proc.cpus))


def select_snapshots(data: Path, only: Sequence[str] = ()) -> list[str]:
    """The snapshot names in `data`, or those of `only` (each must be one of them)."""
    names = snapshot_names(data)
    if not names:
        raise ConfigError(f"{data}: no hwloc snapshots (*{SUFFIX}) here; point --data at tests/data/hwloc")
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ConfigError(f"--only {', '.join(unknown)}: not a snapshot in {data}; there are {', '.join(names)}")
    return [n for n in names if n in set(only)] if only else names


def run_snapshots(
    *,
    names: Sequence[str],
    data: Path,
    model: ModelConfig,
    trace: Trace,
    params: SimParams,
    progress: Callable[[str], None] | None = None,
) -> list[SnapshotRow]:
    """Unpack each snapshot to a temporary directory and search it; `progress(name)` after each."""
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="sandwichc-hwloc-") as tmp:
            try:
                root = extract_snapshot(Path(data) / f"{name}{SUFFIX}", Path(tmp))
            except SandwichError as e:
                rows.append(SnapshotRow(name=name, arch="unknown", error=str(e)))
            else:
                rows.append(search_root(root, name=name, model=model, trace=trace, params=params))
        if progress is not None:
            progress(name)
    return rows


def write_report(rows: Sequence[SnapshotRow], *, md: Path, json_path: Path, command: str, machine: str,
                 model: str, trace: Trace) -> None:
    """results/topology_hwloc.md (a table, then notes on trimmed and failed rows) and its JSON."""
    date = time.strftime("%Y-%m-%d %H:%M")
    for path in (md, json_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(md).write_text("\n".join(_markdown(rows, command=command, machine=machine, model=model, trace=trace,
                                            date=date)) + "\n")
    payload = {"command": command, "machine": machine, "model": model, "trace": trace.source, "date": date,
               "time_limit_s": TIME_LIMIT_S, "rows": [r.to_dict() for r in rows]}
    Path(json_path).write_text(json.dumps(payload, indent=1) + "\n")


def summary_line(rows: Sequence[SnapshotRow]) -> str:
    """How many ran, were trimmed or failed, the slowest search, and which broke the time limit."""
    ran = [r for r in rows if not r.error]
    slow = max(ran, key=lambda r: r.seconds, default=None)
    over = [r.name for r in ran if r.over_limit]
    return (f"{len(rows)} snapshots: {len(ran)} searched ({sum(1 for r in ran if r.trimmed)} on the largest "
            f"symmetric sub-tree), {len(rows) - len(ran)} not searchable"
            + (f"; slowest search {slow.seconds:.2f} s ({slow.name})" if slow else "")
            + f"; time limit {TIME_LIMIT_S:.0f} s (issue 4's, for the 192-core fixture): "
            + (f"**over it: {', '.join(over)}**" if over else "every search under it"))


def _markdown(rows: Sequence[SnapshotRow], *, command: str, machine: str, model: str, trace: Trace,
              date: str) -> list[str]:
    lines = [
        "# `topo search` on hwloc's Linux test snapshots (issue 27)",
        "",
        f"Command: `{command}`",
        "",
        f"- machine: {machine}; date: {date}; the search runs in one thread; latencies are simulated "
        "(default simulator parameters, not calibrated: these are not the snapshots' machines)",
        f"- model: {model}; trace: {trace.source}, {len(trace.requests)} requests; each row is what "
        f"`sandwichc topo search --sysfs-root <unpacked snapshot> --model {model}` finds with that trace "
        "(plus `--trim-asymmetric` where the tree is asymmetric, see the notes)",
        f"- {summary_line(rows)}",
        "- trees explored: distinct remove trees after Merkle-hash dedup, summed over the group "
        "variants (the dedup set is shared across them); top-1 prefill by simulated TTFT, decode by TPOT",
        "",
        "| snapshot | arch | PUs / cores / packages / NUMA | levels searched | group variants | trees explored "
        "(dups) | configs simulated | top prefill (TTFT ms) | top decode (TPOT ms) | search s |",
        "|---|---|---|---|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        shape = f"{r.pus} / {r.cores} / {r.packages} / {r.numa}" if r.pus else "-"
        if r.error:
            lines.append(f"| {r.name} | {r.arch} | {shape} | {r.levels or '-'} | - | - | - | not searchable, "
                         f"see notes | - | - |")
            continue
        seconds = f"**{r.seconds:.2f} (over)**" if r.over_limit else f"{r.seconds:.2f}"
        trim = f" (trimmed to {r.searched_pus} PUs)" if r.trimmed else ""
        lines.append(f"| {r.name} | {r.arch} | {shape} | {r.levels}{trim} | {r.group_variants} | "
                     f"{r.trees_explored} ({r.duplicates}) | {r.configs_simulated} | {r.prefill}, {r.ttft_ms:.1f} | "
                     f"{r.decode}, {r.tpot_ms:.2f} | {seconds} |")
    trimmed = [r for r in rows if r.trimmed and not r.error]
    failed = [r for r in rows if r.error]
    if trimmed:
        lines += ["", "## Asymmetric trees: searched on the largest symmetric sub-tree", ""]
        lines += [f"- {r.name}: {r.searched_pus} of {r.pus} PUs searched; {r.trimmed}" for r in trimmed]
    if failed:
        lines += ["", "## Not searchable", ""]
        lines += [f"- {r.name}: {r.error}" for r in failed]
    return lines
