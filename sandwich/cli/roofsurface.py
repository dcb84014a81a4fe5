"""`sandwichc roofsurface`: DECA's Roof-Surface bounds of our GEMM kernels on this machine, per
weight format and M (the model is tuner/roofsurface.py), and their BORD as a PNG."""

from __future__ import annotations

from pathlib import Path

from sandwich.cli.common import add_threads_arg, int_list
from sandwich.errors import ConfigError

DEFAULT_FORMATS = ("fp32", "bf16", "int8-g32", "int4-g32", "int4-g32-asym")
COLORS = {"MEM": "#9fd89f", "VEC": "#f7c38a", "MTX": "#9cc3f0"}  # DECA Fig. 4/5: green, orange, blue


def register(sub) -> None:
    p = sub.add_parser("roofsurface", help="Roof-Surface bounds (DECA §4) of the GEMM kernels "
                       "per weight format and M, from this machine's measured bandwidth and FMA rate")
    p.add_argument("--format", action="append", dest="formats", metavar="FORMAT",
                   help=f"a weight format (repeatable; default {', '.join(DEFAULT_FORMATS)})")
    p.add_argument("--m", default="1,8,512", help="comma-separated M values (activation rows)")
    p.add_argument("--png", default=None, help="also draw each M's bounding-region diagram here")
    add_threads_arg(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from sandwich.compiler.target import detect_cpu
    from sandwich.tuner import roofsurface as rs
    from sandwich.weight_formats import parse_format

    ms = int_list(args.m, "--m")
    names = list(dict.fromkeys(parse_format(f).name for f in args.formats or DEFAULT_FORMATS))
    cpu = detect_cpu()
    sigs = {f: rs.kernel_signature(f, cpu.lanes_f32, bf16_dot=cpu.bf16_dot)
            for f in names}  # input errors before timing
    threads = args.threads or int(args.env.get("TVM_NUM_THREADS", "1"))
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
              f"{host.lanes} lanes) (vpdpbusd, or 2 pmaddwd + 2 paddd) (measured)")
    print(f"VOS {host.vos / 1e9:8.2f} G vector ops/s   ASSUMPTION: {rs.VOS_ASSUMPTION}")
    print("matrix op = one weight vector in M FMAs: MOS = FMA rate / M, 2 x lanes x M FLOPs "
          "(bf16 with vdpbf16ps: 2 x its rate / M; int formats on 8-bit activations: 4 x the "
          "dot8 rate / M, less the 2 + 32 / G scaling ops per row and block of 32)")
    print(f"{'format':<14} {'M':>5} {'AI_XM op/B':>10} {'AI_XV op/vop':>12} "
          f"{'MEM':>8} {'VEC':>8} {'MTX':>8} {'bound GFLOPS':>12}  resource")
    for name, sig in sigs.items():
        for m in ms:
            per_op = rs.gemm_flops_per_op(host.lanes, m)
            machine = host.machine(m, name)
            terms = {k: v * per_op / 1e9 for k, v in rs.rates(machine, sig).items()}
            b = rs.bound(machine, sig, per_op)
            print(f"{name:<14} {m:>5} {sig.ai_xm:>10.4f} {sig.ai_xv:>12.3f} "
                  + " ".join(f"{terms[k]:>8.1f}" for k in rs.RESOURCES)
                  + f" {b.flops / 1e9:>12.1f}  {b.resource}")
    if args.png:
        _write_bord(Path(args.png), host, sigs, ms, title=f"{cpu.mcpu}, {threads} threads")
        print(f"wrote {args.png}")
    return 0


def _write_bord(path: Path, host, sigs: dict, ms: list[int], *, title: str) -> None:
    """One bounding-region diagram per M (MOS, so the MTX corner, moves with M), log axes,
    the three regions shaded and each format a point; AI_XV = inf is drawn on the top edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.ticker import NullFormatter

    from sandwich.tuner import roofsurface as rs

    xs = [s.ai_xm for s in sigs.values()]
    finite = [s.ai_xv for s in sigs.values() if s.ai_xv != float("inf")]
    fig, axes = plt.subplots(1, len(ms), figsize=(5 * len(ms), 4.4), squeeze=False)
    for ax, m in zip(axes[0], ms, strict=True):
        machine = host.machine(m)
        lines = rs.bord_lines(machine)
        x0, x1 = min(xs + [lines.mtx_x]) / 4, max(xs + [lines.mtx_x]) * 4
        ys = finite + [lines.mtx_y, lines.mem_vec_slope * x0, lines.mem_vec_slope * x1]
        y0, y1 = min(ys) / 4, max(ys) * 4
        gx, gy = np.geomspace(x0, x1, 240), np.geomspace(y0, y1, 240)
        gxx, gyy = np.meshgrid(gx, gy)  # Eq. 1's three terms over the plane; argmin keeps
        terms = (machine.mbw * gxx, machine.vos * gyy, np.full_like(gxx, machine.mos))
        grid = np.argmin(np.stack(terms), axis=0)  # the first of equal terms, as rs.bound does
        ax.pcolormesh(gx, gy, grid, cmap=ListedColormap([COLORS[k] for k in rs.RESOURCES]),
                      vmin=-0.5, vmax=2.5, shading="auto")
        xm = min(lines.mtx_x, x1)
        ax.plot([x0, xm], [lines.mem_vec_slope * x0, lines.mem_vec_slope * xm], "k-", lw=1)
        ax.plot([lines.mtx_x, lines.mtx_x], [lines.mtx_y, y1], "k-", lw=1)
        ax.plot([lines.mtx_x, x1], [lines.mtx_y, lines.mtx_y], "k-", lw=1)
        for i, (name, sig) in enumerate(sigs.items()):
            top = sig.ai_xv == float("inf")
            y = y1 / 1.15 if top else sig.ai_xv
            ax.plot(sig.ai_xm, y, "^" if top else "o", color="k")
            below = top or i % 2  # neighbours' labels alternate above and below their points
            ax.annotate(name + (" (AI_XV inf)" if top else ""), (sig.ai_xm, y), fontsize=8,
                        xytext=(4, -11 if below else 4), textcoords="offset points")
        for k in rs.RESOURCES:
            ax.plot([], [], "s", color=COLORS[k], label=f"{k}-bound")
        ax.set(xscale="log", yscale="log", xlim=(x0, x1), ylim=(y0, y1), title=f"M = {m}",
               xlabel="AI_XM (weight vectors per byte)", ylabel="AI_XV (weight vectors per vector op)")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())  # log minor labels collide over narrow ranges
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Roof-Surface BORD of the GEMM kernels, {title} (VOS assumed = FMA rate)")
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=110)
    except OSError as e:
        raise ConfigError(f"cannot write --png {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
