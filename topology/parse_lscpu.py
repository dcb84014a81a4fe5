"""Read the CPU topology from `lscpu -p` (or `lscpu -p=CPU,CORE,CLUSTER,SOCKET,NODE,CACHE -a`)."""

from __future__ import annotations

from pathlib import Path

from sandwich.errors import TopologyError
from sandwich.topology.raw import RawTopology, make_raw

# lscpu column name -> our level kind ("Node" is handled as NUMA below)
_COLUMNS = {"core": "core", "socket": "package", "cluster": "cluster", "l2": "l2", "l3": "l3"}


def parse_lscpu(path: str | Path) -> RawTopology:
    """Columns are taken from the `# CPU,Core,...` header, so any column order parses."""
    path = Path(path)
    source = f"lscpu file {path}"
    if not path.is_file():
        raise TopologyError(f"{source}: file not found; write one with `lscpu -p > FILE`")
    header: list[str] | None = None
    rows: list[list[str]] = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            fields = [f.strip().lower() for f in line[1:].split(",")]
            if fields and fields[0] == "cpu":
                header = fields
        elif line.strip():
            rows.append([f.strip() for f in line.split(",")])
    if header is None:
        raise TopologyError(f"{source}: no '# CPU,Core,Socket,...' header; write it with `lscpu -p`")
    if not rows:
        raise TopologyError(f"{source}: no cpu rows; the cpu list is empty")
    cpus: set[int] = set()
    offline: set[int] = set()
    keys: dict[str, dict[int, object]] = {}
    numa_of: dict[int, int] = {}
    for lineno, row in enumerate(rows, 1):
        if len(row) != len(header):
            raise TopologyError(f"{source}: row {lineno} has {len(row)} fields, header has {len(header)}")
        values = dict(zip(header, row, strict=True))
        cpu = _int(values["cpu"], source, lineno, "CPU")
        if values.get("online", "y").lower() in ("n", "no") or values.get("core", "") in ("", "-"):
            offline.add(cpu)
            continue
        if cpu in cpus:
            raise TopologyError(f"{source}: cpu {cpu} appears twice (row {lineno}); inconsistent ids")
        cpus.add(cpu)
        for column, kind in _COLUMNS.items():
            if values.get(column, "") not in ("", "-"):
                # ids of different sockets may repeat (core 0 on each socket), so key by socket too
                sock = values.get("socket", "") if kind in ("core", "cluster", "l2") else ""
                keys.setdefault(kind, {})[cpu] = (sock, _int(values[column], source, lineno, column))
        if values.get("node", "") not in ("", "-"):
            numa_of[cpu] = _int(values["node"], source, lineno, "Node")
    return make_raw(
        source=source,
        name="unknown cpu (lscpu -p)",
        cpus=frozenset(cpus),
        keys=keys,
        numa_of=numa_of or None,
        offline=frozenset(offline),
    )


def _int(text: str, source: str, lineno: int, column: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"{source}: row {lineno}: {column} {text!r} is not an integer") from None
