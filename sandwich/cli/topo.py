"""`sandwichc topo show|search|calibrate|fixture|hwloc-report`: the main CLI calls `register(subparsers)`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path

from sandwich.errors import ConfigError, TopologyError
from sandwich.models import DEFAULT_MODEL, load_model_config
from sandwich.topology.calibrate import Calibration, calibrate
from sandwich.topology.fixtures import (
    KUNPENG_NO_CLUSTER,
    MACHINES,
    write_hwloc_xml,
    write_lscpu,
    write_sysfs,
)
from sandwich.topology.load import load_tree, machine_slug
from sandwich.topology.pipeline import search_service_configs
from sandwich.topology.render import render_png, render_text
from sandwich.topology.report import write_report
from sandwich.topology.simulator import SimParams
from sandwich.topology.trace import load_trace
from sandwich.topology.tree import asymmetry, summary


def register(subparsers) -> None:
    """Add `topo` with its `show`, `search`, `fixture`, `calibrate` and `hwloc-report` sub-commands."""
    topo = subparsers.add_parser("topo", help="CPU topology: TopoTree, group/remove search, service configs")
    sub = topo.add_subparsers(dest="topo_cmd", required=True)

    show = sub.add_parser("show", help="print the TopoTree of this machine or of a snapshot")
    _sources(show)
    show.add_argument("--json", action="store_true", help="print {pus, cores, levels} as JSON")
    show.add_argument("--full", action="store_true", help="expand every node, not only the first of each kind")
    show.set_defaults(func=cmd_show)

    search = sub.add_parser("search", help="rank service configurations for prefill and decode")
    _sources(search)
    search.add_argument("--model", default=DEFAULT_MODEL, help="embedded model name or path to config.json")
    search.add_argument("--trace", default="synthetic", help="'synthetic' or a JSON/JSONL/CSV of prompt,output")
    search.add_argument("--top-k", type=int, default=10)
    search.add_argument("--max-group-levels", type=int, default=1, help="latent levels group may insert")
    search.add_argument("--patience", type=int, default=8, help="early stopping per (TP, NUMA) group; 0 = off")
    search.add_argument("--no-prune", action="store_true", help="expand every remove tree (slow)")
    search.add_argument("--batch", type=int, default=1, help="decode batch size in the simulator")
    search.add_argument("--calibrate", action="store_true", help="measure per-core rates on this host first")
    search.add_argument("--calibration", type=Path, help="a JSON written by `topo calibrate --out`")
    search.add_argument("--out-dir", type=Path, default=Path("results"))
    search.add_argument("--no-png", action="store_true")
    search.set_defaults(func=cmd_search)

    fx = sub.add_parser("fixture", help="write a synthetic machine as a sysfs snapshot (+ hwloc XML, lscpu)")
    fx.add_argument("machine", choices=sorted([*MACHINES, "kunpeng-4s-nocluster"]))
    fx.add_argument("dir", type=Path)
    fx.set_defaults(func=cmd_fixture)

    cal = sub.add_parser("calibrate", help="time 1 vs 2 pinned workers and print the simulator parameters")
    cal.add_argument("--duration", type=float, default=0.3, help="seconds per measurement")
    cal.add_argument("--out", type=Path, help="write the calibration JSON here")
    cal.set_defaults(func=cmd_calibrate)

    hw = sub.add_parser("hwloc-report", help="`topo search` on each of hwloc's Linux test snapshots, "
                        "one row each (results/topology_hwloc.md)")
    hw.add_argument("--model", default="llama-3-8b", help="embedded model name or path to config.json")
    hw.add_argument("--trace", default="synthetic", help="'synthetic' or a JSON/JSONL/CSV of prompt,output")
    hw.add_argument("--data", type=Path, default=None, help="the snapshots (default: tests/data/hwloc)")
    hw.add_argument("--only", action="append", default=[], metavar="NAME", help="this snapshot only (repeatable)")
    hw.add_argument("--md", type=Path, default=Path("results/topology_hwloc.md"))
    hw.add_argument("--json", type=Path, default=Path("results/topology_hwloc.json"))
    hw.set_defaults(func=cmd_hwloc_report)


def _sources(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sysfs-root", type=Path, help="a snapshot directory laid out like / (default: live /)")
    g.add_argument("--hwloc-xml", type=Path, help="output of `lstopo --of xml`")
    g.add_argument("--lscpu", type=Path, help="output of `lscpu -p`")
    g.add_argument("--fixture", choices=sorted([*MACHINES, "kunpeng-4s-nocluster"]),
                   help="one of the project's synthetic machines (as `topo fixture` writes it)")
    p.add_argument("--trim-asymmetric", action="store_true", help="use the largest symmetric sub-tree")


def _tree(args):
    if getattr(args, "fixture", None):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="sandwichc-fixture-") as tmp:
            write_sysfs(_fixture_spec(args.fixture), Path(tmp))
            return load_tree(sysfs_root=tmp, trim_asymmetric=args.trim_asymmetric)
    return load_tree(sysfs_root=args.sysfs_root, hwloc_xml=args.hwloc_xml, lscpu=args.lscpu,
                     trim_asymmetric=args.trim_asymmetric)


def _fixture_spec(name: str):
    return KUNPENG_NO_CLUSTER if name == "kunpeng-4s-nocluster" else MACHINES[name]


def cmd_show(args) -> int:
    tree = _tree(args)
    print(json.dumps(summary(tree)) if args.json else render_text(tree, full=args.full))
    why = asymmetry(tree)
    if why:
        print(f"note: asymmetric machine: {why}; `topo search` needs --trim-asymmetric", file=sys.stderr)
    return 0


def cmd_search(args) -> int:
    if args.top_k < 1 or args.max_group_levels < 0 or args.batch < 1 or args.patience < 0:
        raise ConfigError("--top-k and --batch must be >= 1, --max-group-levels and --patience >= 0")
    tree = _tree(args)
    model = load_model_config(args.model)
    trace = load_trace(args.trace)
    params = dataclasses.replace(SimParams(), batch=args.batch)
    cal = None
    if args.calibration is not None:
        try:
            cal = Calibration(**{k: tuple(v) if k == "cpus" else v for k, v in json.loads(args.calibration.read_text()).items()})
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(f"--calibration {args.calibration}: cannot read ({e}); write it with `topo calibrate --out`") from None
    elif args.calibrate:
        cal = calibrate()
    if cal is not None:
        params = cal.apply(params)
    result = search_service_configs(tree=tree, model=model, trace=trace, params=params, top_k=args.top_k,
                                    max_new_levels=args.max_group_levels, patience=args.patience, prune=not args.no_prune)
    slug = machine_slug(tree)
    png = None if args.no_png else render_png(tree, args.out_dir / f"topology_{slug}.png")
    md = write_report(out_dir=args.out_dir, slug=slug, command=_command(args), tree=tree, model_name=model.name,
                      trace=trace, params=params, result=result, calibration=cal, png=png)
    for phase, rows, metric in (("prefill", result.prefill, "ttft_s"), ("decode", result.decode, "tpot_s")):
        print(f"{phase} top-{len(rows)} (by simulated {metric[:4].upper()}):")
        for i, r in enumerate(rows, 1):
            c = r.config
            print(f"  {i:2d}. TP={c.tp:<3d} threads/proc={c.threads_per_process:<4d} NUMA={[p.numa_node for p in c.processes]} "
                  f"TTFT={r.result.ttft_s * 1e3:.2f} ms TPOT={r.result.tpot_s * 1e3:.3f} ms  {' '.join(r.ops)}")
    st = result.stats
    print(f"searched {st.group_variants} group variants, {st.remove_explored} remove trees, "
          f"{st.configs_simulated} configs simulated in {st.seconds:.2f} s; wrote {md}")
    return 0


def cmd_fixture(args) -> int:
    spec = _fixture_spec(args.machine)
    write_sysfs(spec, args.dir)
    write_hwloc_xml(spec, args.dir / "lstopo.xml")
    write_lscpu(spec, args.dir / "lscpu.txt")
    print(f"wrote {args.dir} (sysfs snapshot), {args.dir / 'lstopo.xml'}, {args.dir / 'lscpu.txt'}")
    return 0


def cmd_calibrate(args) -> int:
    if args.duration <= 0:
        raise ConfigError("--duration must be > 0 seconds")
    cal = calibrate(duration_s=args.duration)
    print(cal.to_json())
    print(cal.apply(SimParams()).to_json())
    if args.out is not None:
        try:
            args.out.write_text(cal.to_json())
        except OSError as e:
            raise TopologyError(f"--out {args.out}: cannot write ({e.strerror})") from None
    return 0


def cmd_hwloc_report(args) -> int:
    from tqdm import tqdm

    from sandwich.bench.topology_hwloc import (
        HWLOC_DATA,
        run_snapshots,
        select_snapshots,
        summary_line,
        write_report,
    )
    from sandwich.compiler.target import detect_cpu

    data = args.data if args.data is not None else HWLOC_DATA
    names = select_snapshots(data, args.only)
    model = load_model_config(args.model)
    trace = load_trace(args.trace)
    cpu = detect_cpu()
    machine = (f"{cpu.model} (mcpu {cpu.mcpu}, {cpu.cores} cores, as `sandwichc info` reports), "
               f"load average {os.getloadavg()[0]:.1f} at the start")
    with tqdm(total=len(names), unit="snapshot", disable=None, file=sys.stderr) as bar:
        def step(name: str) -> None:
            bar.set_postfix_str(name)
            bar.update(1)

        rows = run_snapshots(names=names, data=data, model=model, trace=trace, params=SimParams(), progress=step)
    words = ["sandwichc", "topo", "hwloc-report", "--model", args.model, "--trace", args.trace]
    if args.data is not None:
        words += ["--data", str(args.data)]
    for name in args.only:
        words += ["--only", name]
    words += ["--md", str(args.md), "--json", str(args.json)]
    write_report(rows, md=args.md, json_path=args.json, command=shlex.join(words), machine=machine,
                 model=args.model, trace=trace)
    print(summary_line(rows).replace("**", ""))
    print(f"wrote {args.md}, {args.json}")
    return 0


def _command(args) -> str:
    words = ["sandwichc", "topo", "search"]
    for flag in ("sysfs_root", "hwloc_xml", "lscpu", "fixture", "model", "trace", "top_k", "max_group_levels", "patience",
                 "batch", "calibration", "out_dir"):
        v = getattr(args, flag)
        if v is not None:
            words += [f"--{flag.replace('_', '-')}", str(v)]
    for flag in ("trim_asymmetric", "calibrate", "no_prune", "no_png"):
        if getattr(args, flag):
            words.append(f"--{flag.replace('_', '-')}")
    return shlex.join(words)
