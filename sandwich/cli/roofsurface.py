"""`sandwichc roofsurface`: DECA's Roof-Surface bounds of our GEMM kernels on this machine, per
weight format and M (the model is tuner/roofsurface.py), and their BORD as a PNG."""

from __future__ import annotations

from pathlib import Path

from sandwich.cli.common import add_threads_arg, int_list, threads_of
from sandwich.errors import ConfigError

DEFAULT_FORMATS = ("fp32", "bf16", "int8-g32", "int4-g32", "int4-g32-asym", "int4-k", "int5-k", "int6-k")
COLORS = {"MEM": "#9fd89f", "VEC": "#f7c38a", "MTX": "#9cc3f0"}  # DECA Fig. 4/5: green, orange, blue


def register(sub) -> None:
    p = sub.add_parser("roofsurface", help="Roof-Surface bounds (DECA §4) of the GEMM kernels "
                       "per weight format and M, from this machine's measured bandwidth, product "
                       "and dequantization rates")
    p.add_argument("--format", action="append", dest="formats", metavar="FORMAT",
                   help=f"a weight format (repeatable; default {', '.join(DEFAULT_FORMATS)})")
    p.add_argument("--m", default="1,8,512", help="comma-separated M values (activation rows)")
    p.add_argument("--png", default=None,
                   help="also draw the bounding-region diagram of each format and M here")
    add_threads_arg(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from sandwich.compiler.gemm_formats import amx_format
    from sandwich.compiler.target import detect_cpu
    from sandwich.tuner import roofsurface as rs
    from sandwich.weight_formats import parse_format

    ms = int_list(args.m, "--m")
    names = list(dict.fromkeys(parse_format(f).name for f in args.formats or DEFAULT_FORMATS))
    cpu = detect_cpu()
    sigs = {f: rs.kernel_signature(f, cpu.lanes_f32, bf16_dot=cpu.bf16_dot)
            for f in names}  # input errors before timing
    threads = threads_of(args)
    host = rs.calibrate(threads, lanes=cpu.lanes_f32)
    print(f"{cpu.model} ({cpu.mcpu}, {cpu.isa}, {host.lanes} f32 lanes), {threads} threads")
    print(f"MBW {host.mbw / 1e9:8.1f} GB/s           streaming read (measured)")
    print(f"FMA {host.fma_vector_ops / 1e9:8.2f} G vector ops/s   peak FMA GFLOPS / (2 x {host.lanes} "
          f"lanes) (measured)")
    if host.bf16_dot_ops:
        print(f"BF16 {host.bf16_dot_ops / 1e9:7.2f} G vdpbf16ps/s      peak bf16 GFLOPS / (4 x "
              f"{host.lanes} lanes) (measured)")
    if host.int8_dot_ops:
        print(f"INT8 {host.int8_dot_ops / 1e9:7.2f} G dot8/s           peak int8 G ops/s / (8 x "
              f"{host.lanes} lanes) (vpdpbusd, or 2 pmaddwd + 2 paddd), in the tile's blocks of 8 and "
              f"their scaling (measured)")
    if host.narrow_dot_ops:
        print(f"INT<8 {host.narrow_dot_ops / 1e9:6.2f} G dot8/s           the same on weight bytes below "
              f"128 (4- to 6-bit; vpdpbusd, or int4's pmaddubsw + paddw in 16 bits) (measured)")
    if host.amx_flops:
        print(f"AMX {host.amx_flops / 1e9:8.1f} GFLOPS            AMX's bf16 tile product (tdpbf16ps) on "
              f"operands held in tiles (measured): the MTX of the AMX kernel's rows ('amx'); on "
              f"int weights its VEC is their rounding to bf16 ({', '.join(f'{b}-bit {n:g}' for b, n in rs.AMX_ROUND_OPS.items())} "
              f"ops a weight vector, at the FMA rate) once per {rs.AMX_ROWS} rows")
    print("VOS      G vector ops/s of each dequantization sequence alone, on registers "
          "(measured): " + ", ".join(f"{kind} {rate / 1e9:.2f}" for kind, rate in host.vos.items()))
    print("matrix op = one weight vector in M FMAs: MOS = FMA rate / M, 2 x lanes x M FLOPs "
          "(bf16 with vdpbf16ps: 2 x its rate / M; int formats on 8-bit activations: 4 x the "
          "dot8 rate in blocks / M, that block's scaling measured for groups of 32 and scaled by "
          "8 + 2 + 32 / G ops for others)")
    print("a format's VOS: its sequence at that rate, its group epilogue (scaling FMAs) at the "
          "FMA rate")
    print("bound = min(MEM, 1 / (1 / VEC + 1 / MTX)): the dequantization and the products take "
          "the same vector ports (the AMX kernel rounds int weights before its tiles run), so "
          "their times add; DECA's Eq. 1 takes min(MEM, VEC, MTX) for a separate matrix unit")
    print(f"{'format':<14} {'M':>5} {'AI_XM op/B':>10} {'AI_XV op/vop':>12} {'VOS G/s':>8} "
          f"{'MEM':>8} {'VEC':>8} {'MTX':>8} {'bound GFLOPS':>12}  resource")
    rows = []  # (format, its signature at M, on AMX tiles)
    for name, sig in sigs.items():
        rows.append((name, lambda m, sig=sig: sig, False))
        if host.amx_flops and name == "bf16":
            rows.append((name, lambda m, sig=sig: sig, True))
        elif host.amx_flops and amx_format(name, rs.SIGNATURE_K):
            rows.append((name, lambda m, name=name: rs.amx_signature(name, host.lanes, m=m), True))
    for name, sig_at, amx in rows:
        for m in ms:
            sig = sig_at(m)
            per_op = rs.gemm_flops_per_op(host.lanes, m)
            machine = host.machine(m, name, amx=amx)
            terms = {k: v * per_op / 1e9 for k, v in rs.rates(machine, sig).items()}
            b = rs.bound(machine, sig, per_op)
            label = f"{name} amx" if amx else name
            print(f"{label:<14} {m:>5} {sig.ai_xm:>10.4f} {sig.ai_xv:>12.3f} "
                  f"{machine.vos / 1e9:>8.2f} "
                  + " ".join(f"{terms[k]:>8.1f}" for k in rs.RESOURCES)
                  + f" {b.flops / 1e9:>12.1f}  {b.resource}")
    if args.png:
        _write_bord(Path(args.png), host, sigs, ms, title=f"{cpu.mcpu}, {threads} threads")
        print(f"wrote {args.png}")
    return 0


def _regions(machine, x, y):
    """The index in RESOURCES of the term that bounds each point (AI_XM x, AI_XV y) of a grid:
    rs.region at every point, so the diagram shades what the bound decides (on a shared
    machine, where the VEC and MTX times add, a curved MEM border)."""
    import numpy as np

    from sandwich.tuner import roofsurface as rs

    def at(ai_xm: float, ai_xv: float) -> int:
        return rs.RESOURCES.index(rs.region(machine, rs.Signature(ai_xm, ai_xv)))
    return np.vectorize(at, otypes=[int])(x, y)


def _write_bord(path: Path, host, sigs: dict, ms: list[int], *, title: str) -> None:
    """One bounding-region diagram per format (a row) and M (a column): each format has its
    own MOS (its product's rate) and VOS (its dequantization's), so its own BORD; log axes,
    the three regions shaded and their borders drawn, the format a point; AI_XV = inf is
    drawn on the top edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.ticker import NullFormatter

    from sandwich.tuner import roofsurface as rs

    fig, axes = plt.subplots(len(sigs), len(ms), figsize=(4.6 * len(ms), 3.8 * len(sigs)),
                             squeeze=False)
    for row, (name, sig) in zip(axes, sigs.items(), strict=True):
        for ax, m in zip(row, ms, strict=True):
            machine = host.machine(m, name)
            lines = rs.bord_lines(machine)
            x0, x1 = min(sig.ai_xm, lines.mtx_x) / 4, max(sig.ai_xm, lines.mtx_x) * 4
            finite = [sig.ai_xv] if sig.ai_xv != float("inf") else []
            ys = finite + [lines.mtx_y, lines.mem_vec_slope * x0, lines.mem_vec_slope * x1]
            y0, y1 = min(ys) / 4, max(ys) * 4
            gx, gy = np.geomspace(x0, x1, 240), np.geomspace(y0, y1, 240)
            gxx, gyy = np.meshgrid(gx, gy)
            grid = _regions(machine, gxx, gyy)
            ax.pcolormesh(gx, gy, grid, cmap=ListedColormap([COLORS[k] for k in rs.RESOURCES]),
                          vmin=-0.5, vmax=2.5, shading="auto")
            ax.contour(gx, gy, grid, levels=[0.5, 1.5], colors="k", linewidths=1)
            top = sig.ai_xv == float("inf")
            y = y1 / 1.15 if top else sig.ai_xv
            ax.plot(sig.ai_xm, y, "^" if top else "o", color="k")
            ax.annotate(name + (" (AI_XV inf)" if top else ""), (sig.ai_xm, y), fontsize=8,
                        xytext=(4, -11 if top else 4), textcoords="offset points")
            for k in rs.RESOURCES:
                ax.plot([], [], "s", color=COLORS[k], label=f"{k}-bound")
            ax.set(xscale="log", yscale="log", xlim=(x0, x1), ylim=(y0, y1),
                   title=f"{name}, M = {m}", xlabel="AI_XM (weight vectors per byte)",
                   ylabel="AI_XV (weight vectors per vector op)")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(NullFormatter())  # minor labels collide on narrow ranges
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Roof-Surface BORD of the GEMM kernels, {title} (measured MBW, MOS, VOS)")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # room for the title
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=100)
    except OSError as e:
        raise ConfigError(f"cannot write --png {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
