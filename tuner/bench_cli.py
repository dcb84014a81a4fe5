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
    g.add_argument("--passes", type=int, default=2, help="timings of every runner, minutes apart; "
                   "each reports its best (this VM slows down for seconds at a time)")
    threads_arg(g)
    cache_arg(g)
    g.set_defaults(func=_run)

    s = bsub.add_parser("serving", help="TTFT/TPOT of sandwichc vs HF transformers, llama.cpp and "
                        "OpenVINO on the same weights, same threads, one run")
    s.add_argument("--model", action="append",
                   help="HF model directory, or an embedded name (a random-weight checkpoint is "
                   "written once under --work); repeatable; default llama-160m")
    s.add_argument("--prompt-lens", default="128,512", help="comma-separated prompt lengths")
    s.add_argument("--new-tokens", type=int, default=32)
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--peers", default="sandwichc,hf-transformers,llama.cpp,openvino")
    s.add_argument("--work", default=None, help="where checkpoints and GGUF files are kept "
                   "(default: <cache dir>/models)")
    s.add_argument("--json", dest="json_out", default="results/serving.json")
    s.add_argument("--md", default="results/serving.md")
    threads_arg(s)
    cache_arg(s)
    s.set_defaults(func=_run_serving)


def _run(args) -> int:
    from sandwich.tuner.bench_gemm import cmd_bench_gemm

    return cmd_bench_gemm(args)


def _run_serving(args) -> int:
    import shlex
    import sys
    from pathlib import Path

    from sandwich.cli import cache_dir_arg
    from sandwich.errors import ConfigError
    from sandwich.runtime.bench_serving import run_serving_bench, write_report
    from sandwich.runtime.kernel_cache import KernelCache

    try:
        lens = sorted({int(x) for x in args.prompt_lens.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"--prompt-lens must be comma-separated integers, got {args.prompt_lens!r}") from None
    if not lens or lens[0] < 1 or args.new_tokens < 1 or args.repeats < 1:
        raise ConfigError("--prompt-lens, --new-tokens and --repeats must be >= 1")
    cache = KernelCache(cache_dir_arg(args))
    threads = args.threads or int(args.env.get("TVM_NUM_THREADS", "1"))
    work = Path(args.work) if args.work else cache.dir / "models"
    res = run_serving_bench(models=args.model or ["llama-160m"], prompt_lens=lens,
                            new_tokens=args.new_tokens, repeats=args.repeats, threads=threads,
                            cache=cache, work=work, peers=[p for p in args.peers.split(",") if p],
                            command="sandwichc " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    write_report(res, Path(args.md), Path(args.json_out))
    print(f"wrote {args.json_out}, {args.md}")
    return 0
