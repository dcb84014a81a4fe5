"""`sandwichc bench gemm`: registered by tuner/cli.py; the work is in tuner/bench_gemm.py."""

from __future__ import annotations


def register(sub, *, cache_arg, threads_arg) -> None:
    bench = sub.add_parser("bench", help="benchmarks that write to results/")
    bsub = bench.add_subparsers(dest="bench_cmd", required=True)
    g = bsub.add_parser("gemm", help="cached sandwich GEMMs vs vendor peers, same process and threads")
    g.add_argument("--model", action="append", help="embedded name or config.json path (repeatable; "
                   "default llama-160m)")
    g.add_argument("--m", default="1,2,4,8,16,32,64,128,256,512,1024,2048",
                   help="comma-separated M values")
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--peers", default="numpy,torch,openvino")
    g.add_argument("--json", dest="json_out", default="results/gemm_vs_vendor.json")
    g.add_argument("--md", default="results/gemm_vs_vendor.md")
    g.add_argument("--png", default="results/gemm_vs_vendor.png")
    g.add_argument("--no-rotate", action="store_true", help="skip the M <= 8 rows with weights beyond the LLC")
    threads_arg(g)
    cache_arg(g)
    g.set_defaults(func=_run)


def _run(args) -> int:
    from sandwich.tuner.bench_gemm import cmd_bench_gemm

    return cmd_bench_gemm(args)
