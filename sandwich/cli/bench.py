"""`sandwichc bench gemm|serving|formats|...`: the work is in bench/ (gemm.py, serving.py,
formats.py, ...)."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from sandwich.cli.common import (
    add_cache_arg,
    add_kv_cache_dtype_arg,
    add_threads_arg,
    add_weights_arg,
    cache_dir_arg,
    command_line,
    int_list,
    read_text,
    threads_of,
)
from sandwich.errors import ConfigError

GEMM_RESULTS = "results/cpus/<mcpu>/gemm_vs_vendor"  # <mcpu>: LLVM's name of this CPU (`info`)


def gemm_results(mcpu: str) -> str:
    """Where `bench gemm` writes by default on a CPU of this LLVM name (no extension)."""
    return GEMM_RESULTS.replace("<mcpu>", mcpu)


def register(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks that write to results/")
    bsub = bench.add_subparsers(dest="bench_cmd", required=True)
    g = bsub.add_parser("gemm", help="cached sandwich GEMMs vs vendor peers, same process and threads")
    g.add_argument("--model", action="append", help="embedded name or config.json path (repeatable; "
                   "default llama-160m)")
    g.add_argument("--m", default="1,2,4,8,16,32,64,128,256,512,1024,2048",
                   help="comma-separated M values")
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--peers", default="numpy,torch,openvino")
    g.add_argument("--json", dest="json_out", default=None,
                   help=f"default {GEMM_RESULTS}.json: each CPU's figures kept side by side")
    g.add_argument("--md", default=None, help=f"default: beside --json, with its name; without "
                   f"--json {GEMM_RESULTS}.md")
    g.add_argument("--png", default=None, help=f"default: beside --json (or --md), with its "
                   f"name; without either {GEMM_RESULTS}.png")
    g.add_argument("--no-rotate", action="store_true", help="skip the M <= 8 rows with weights beyond the LLC")
    g.add_argument("--passes", type=int, default=2, help="timings of every runner, minutes apart; "
                   "each reports its best (this VM slows down for seconds at a time)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_threads_arg(g)
    add_cache_arg(g)
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
    add_weights_arg(s)
    add_kv_cache_dtype_arg(s)
    add_threads_arg(s)
    add_cache_arg(s)
    s.set_defaults(func=_run_serving)

    h = bsub.add_parser("http", help="`sandwichc serve` through the openai client vs the "
                        "in-process engine (TTFT, TPOT), and many concurrent clients")
    h.add_argument("--model", default="smollm2", help="a .gguf file, an installed model or an "
                   "HF directory with tokenizer.json")
    h.add_argument("--text", required=True, help="a UTF-8 text file the prompts are cut from")
    h.add_argument("--prompt-len", type=int, default=128)
    h.add_argument("--max-tokens", type=int, default=128)
    h.add_argument("--repeats", type=int, default=5)
    h.add_argument("--clients", type=int, default=16)
    h.add_argument("--max-batch", type=int, default=16)
    h.add_argument("--json", dest="json_out", default=None, help="default results/http_<model>.json")
    h.add_argument("--md", default=None, help="default results/http_<model>.md")
    add_threads_arg(h)
    add_cache_arg(h)
    h.set_defaults(func=_run_http)

    pr = bsub.add_parser("prefix", help="a chat's turns with and without prefix reuse: TTFT per "
                         "turn of two engines on the same model, the turns alternating")
    pr.add_argument("--turns", type=int, default=6, help="turns of the built-in conversation (1-6)")
    pr.add_argument("--max-new-tokens", type=int, default=64, help="longest reply of a turn")
    pr.add_argument("--rounds", type=int, default=3, help="conversations, each from the start")
    pr.add_argument("--choices", type=int, default=4, help="then this many sampled choices of "
                    "the last prompt at once (OpenAI's n; 1: none)")
    _chat_bench_args(pr, "prefix_reuse", "reset and with its context kept between turns")
    pr.set_defaults(func=_run_prefix)

    sp = bsub.add_parser("speculate", help="speculative decoding by prompt lookup against a "
                         "token-a-step decode: TPOT per task (replies that copy their context, "
                         "and one that does not), the drafts taken, the same ids")
    sp.add_argument("--draft", default="4,8", help="comma-separated draft lengths (--speculate's K)")
    sp.add_argument("--max-new-tokens", type=int, default=128)
    sp.add_argument("--rounds", type=int, default=3, help="off/on pairs per task and draft length")
    _chat_bench_args(sp, "speculation", "a token a step and with its prompt-lookup decoding")
    sp.set_defaults(func=_run_speculate)

    p = bsub.add_parser("plan", help="make each model's plan on this machine (topology search, "
                        "kernels per payload, every candidate measured, the pair against every "
                        "single configuration) and write results/sandwich_plan.{md,json}")
    p.add_argument("--model", action="append", help="embedded name, HF directory or GGUF "
                   "(repeatable; default llama-160m)")
    p.add_argument("--budget", choices=("tiny", "quick", "default", "full"), default="quick")
    p.add_argument("--seq-max", type=int, default=2048)
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--no-progress", action="store_true", help="no progress bars while tuning")
    p.add_argument("--no-fixtures", action="store_true",
                   help="leave out the simulated plans of the synthetic large machines")
    p.add_argument("--json", dest="json_out", default=None,
                   help="default results/sandwich_plan.json (sandwich_plan_<format>.json)")
    p.add_argument("--md", default=None, help="default results/sandwich_plan.md (or _<format>)")
    add_cache_arg(p)
    add_weights_arg(p)
    p.set_defaults(func=_run_plan)

    c = bsub.add_parser("corruption", help="single-byte corruptions of a tuned tiny-model "
                        "cache: how many are harmless, reported, or (failures) crash or compute "
                        "wrong results")
    c.add_argument("--count", type=int, default=1000)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    c.add_argument("--json", dest="json_out", default="results/corruption.json")
    c.add_argument("--md", default="results/corruption.md")
    c.set_defaults(func=_run_corruption)

    q = bsub.add_parser("gguf", help="a model as the F32 GGUF the serving benchmark gives "
                        "llama.cpp (a GGUF source's own tokenizer, else a placeholder vocabulary: "
                        "the benchmarks feed token ids), "
                        "optionally quantized by llama.cpp's own quantizer")
    q.add_argument("--model", required=True, help="an HF directory, a .gguf file or an embedded "
                   "config (random weights, as bench serving writes them)")
    q.add_argument("--out", required=True, help="the .gguf file to write")
    q.add_argument("--type", default="F32", help="F32, or a llama.cpp file type: Q8_0, Q4_0, "
                   "Q4_1, Q4_K_M, Q4_K_S, Q5_K_M, Q6_K... (needs llama-cpp-python)")
    q.add_argument("--pure", action="store_true", help="every tensor in the type's base type "
                   "(llama.cpp's --pure), not its mix (Q4_K_M keeps some in Q6_K)")
    q.add_argument("--work", default=None, help="where an embedded config's random weights are "
                   "written (default: the kernel cache's models/)")
    add_threads_arg(q)
    add_cache_arg(q)
    q.set_defaults(func=_run_gguf)

    r = bsub.add_parser("reference", help="a GGUF model against llama.cpp's and HF's tokenizers "
                        "and HF transformers' greedy tokens and logits on the same file")
    r.add_argument("--model", default="smollm2", help="a .gguf file or an installed model")
    r.add_argument("--new-tokens", type=int, default=64)
    r.add_argument("--text", action="append", help="a UTF-8 text file for the perplexity check, "
                   "repeatable (the files are joined; none: skipped)")
    r.add_argument("--ctx", type=int, default=512, help="perplexity window (tokens)")
    r.add_argument("--json", dest="json_out", default=None,
                   help="default results/reference_<model>.json")
    r.add_argument("--md", default=None, help="default results/reference_<model>.md")
    add_threads_arg(r)
    add_cache_arg(r)
    r.set_defaults(func=_run_reference)

    f = bsub.add_parser("formats", help="one model's tuned GEMMs in each weight format (fp32, "
                        "int8, int4...) side by side, same run and threads: decode rows in stored "
                        "GB/s against the streaming read, larger M in GFLOPS, each against fp32")
    f.add_argument("--model", action="append", help="embedded name, HF directory or GGUF "
                   "(repeatable; default llama-160m)")
    f.add_argument("--weights", default="int8-g32,int4-g32",
                   help="comma-separated formats to compare with fp32 (always included)")
    f.add_argument("--m", default="1,8,512", help="comma-separated M values")
    f.add_argument("--budget", choices=("tiny", "quick", "default", "full"), default="quick",
                   help="budget of the tuning the cache lacks")
    f.add_argument("--seq-max", type=int, default=2048, help="M range the kernels are tuned over")
    f.add_argument("--json", dest="json_out", default=None,
                   help="default results/cpus/<mcpu>/weight_formats.json")
    f.add_argument("--md", default=None, help="default results/cpus/<mcpu>/weight_formats.md")
    f.add_argument("--no-progress", action="store_true", help="no progress bar while tuning")
    f.add_argument("--passes", type=int, default=1, help="timings of every row, each against its "
                   "own moment's read; the row is the median pass, with the range")
    add_threads_arg(f)
    add_cache_arg(f)
    f.set_defaults(func=_run_formats)

    c = bsub.add_parser("caches", help="two kernel caches of this machine (two tunes) timed "
                        "against each other, row by row in interleaved rounds")
    c.add_argument("--a", required=True, metavar="DIR", help="the reference cache")
    c.add_argument("--b", required=True, metavar="DIR", help="the cache compared with it")
    c.add_argument("--model", action="append", help="embedded name or config.json path "
                   "(repeatable; default llama-160m)")
    c.add_argument("--m", default="1,2,4,8,16,32,64,128,256,512,1024,2048",
                   help="comma-separated M values")
    c.add_argument("--rounds", type=int, default=5, help="A B B A rounds per row")
    c.add_argument("--json", dest="json_out", default=None, help="also write the rows as JSON")
    c.add_argument("--md", default=None, help="also write a Markdown table")
    add_threads_arg(c)
    c.set_defaults(func=_run_caches)

    kab = bsub.add_parser("kernels", help="two versions of the GEMM family's source (the "
                          "shipped one and an edited copy; the AMX kernel's for amx_ schedules) "
                          "on the same schedules, timed against each other in interleaved rounds")
    kab.add_argument("--b", required=True, metavar="FILE", help="the .sw source compared")
    kab.add_argument("--a", default=None, metavar="FILE", help="the reference source "
                     "(default: the shipped dsl/kernels/gemm_family.sw, or gemm_amx_bf16.sw "
                     "for amx_ schedules)")
    _schedule_args(kab, m="8", m_help="comma-separated M values", rounds=8,
                   rounds_help="A B B A rounds per row")
    kab.set_defaults(func=_run_kernels)

    sab = bsub.add_parser("schedules", help="several schedules of one GEMM, in any weight "
                          "formats (fp32's tuned kernel, two bf16 tunes' picks...), timed against "
                          "the first in interleaved rounds")
    _schedule_args(sab, m="512,2048", m_help="comma-separated M values", rounds=5)
    sab.set_defaults(func=_run_schedules)

    st = bsub.add_parser("streaming", help="a decode GEMM against the streaming read and "
                         "against itself on cache-resident weights (its compute ceiling), "
                         "in interleaved rounds")
    st.add_argument("--src", default=None, metavar="FILE", help="the .sw source built "
                    "(default: the shipped dsl/kernels/gemm_family.sw)")
    _schedule_args(st, m="8", m_help="comma-separated M values, 1 to 8", rounds=8)
    st.set_defaults(func=_run_streaming)

    amx = bsub.add_parser("amx", help="the AMX GEMM (CPUs with AMX-BF16; bf16, int8 and int4 "
                          "weights) against the family's kernel of the same format on the same "
                          "weights, checked and timed in rounds")
    _schedule_args(amx, m="512,2048", m_help="comma-separated M values", rounds=5, many=False,
                   outputs=False)
    amx.add_argument("--peers", default="torch,openvino",
                     help="bf16 schedules: the vendors' bf16 GEMMs timed in the same rounds "
                     "(torch, openvino; 'none' for none)")
    amx.set_defaults(func=_run_amx)

    from sandwich.cli import bench_scheduling

    bench_scheduling.register(bsub)


def _schedule_args(p, *, m: str, m_help: str, rounds: int, rounds_help: str = "rounds per row",
                   many: bool = True, outputs: bool = True) -> None:
    """The arguments of the commands that time given schedules of the family at one N x K."""
    if many:
        p.add_argument("--schedule", action="append", required=True, metavar="KEY",
                       help="a schedule key, its dtype the weight format, e.g. "
                       "gemm_int8-g32_mk4x64_p1x2x1_n64_s8x64x256 (repeatable)")
    else:
        p.add_argument("--schedule", required=True, metavar="KEY", help="the family's bf16 "
                       "schedule, whose pack_n the AMX kernel shares, e.g. "
                       "gemm_bf16_mk6x64_p2x1x1_n64_s12x256x512")
    p.add_argument("--n", type=int, required=True, help="the GEMM's N")
    p.add_argument("--k", type=int, required=True, help="the GEMM's K")
    p.add_argument("--m", default=m, help=m_help)
    p.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    if outputs:
        p.add_argument("--json", dest="json_out", default=None, help="also write the rows as JSON")
        p.add_argument("--md", default=None, help="also write a Markdown table")
    add_threads_arg(p)


def report_paths(json_out: str | None, md: str | None, png: str | None,
                 default_base: str) -> tuple[str, str, str]:
    """The JSON, Markdown and PNG paths of a report: those given, the others beside the first
    given one with its stem (a run written to /tmp keeps its PNG there too, rather than
    overwriting the committed per-CPU one); `default_base` (no suffix) when none is given."""
    given = next((Path(p) for p in (json_out, md, png) if p), None)
    base = str(given.with_suffix("")) if given else default_base
    return json_out or f"{base}.json", md or f"{base}.md", png or f"{base}.png"


def _run(args) -> int:
    from tqdm import tqdm

    from sandwich.bench.gemm import ratio_text, run_bench
    from sandwich.bench.gemm_report import write_markdown, write_png
    from sandwich.tuner.kernel_cache import KernelCache

    ms = int_list(args.m, "--m")
    threads = threads_of(args)
    command = command_line()
    # delay: an input error (a shape never tuned, say) prints its one line and no bar
    with tqdm(total=0, unit="timing", dynamic_ncols=True, disable=args.no_progress,
              delay=1) as bar:
        res = run_bench(models=args.model or ["llama-160m"], ms=ms, tp=args.tp,
                        peer_names=[p for p in args.peers.split(",") if p], threads=threads,
                        cache=KernelCache(cache_dir_arg(args)), rotate=not args.no_rotate,
                        command=command, passes=args.passes, log=tqdm.write, progress=bar)
    res.machine += f", {platform.python_implementation()} {platform.python_version()}"
    if None in (args.json_out, args.md, args.png):
        from sandwich.compiler.target import detect_cpu

        args.json_out, args.md, args.png = report_paths(
            args.json_out, args.md, args.png, gemm_results(detect_cpu().mcpu))
    for path in (args.json_out, args.md, args.png):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(res.to_json(), indent=1))
    write_markdown(res, Path(args.md))
    write_png(res, Path(args.png))
    s = res.to_json()["summary"]
    large = (f"M>=512 at {100 * s['geomean_fraction_of_peak_m_ge_512']:.0f}% of peak (min "
             f"{100 * s['min_fraction_of_peak_m_ge_512']:.0f}%)"
             if s["geomean_fraction_of_peak_m_ge_512"] else "no M>=512 rows")
    print(f"geomean speedup over the best peer: all {ratio_text(s['geomean_speedup_all'])}, "
          f"M<=64 {ratio_text(s['geomean_speedup_m_le_64'])}; {large}")
    print(f"wrote {args.json_out}, {args.md}, {args.png}")
    return 0


def _run_caches(args) -> int:
    from sandwich.bench.cache_ab import run_ab, write_markdown

    ms = int_list(args.m, "--m")
    threads = threads_of(args)
    res = run_ab(a_dir=args.a, b_dir=args.b, models=args.model or ["llama-160m"], ms=ms,
                 threads=threads, rounds=args.rounds)
    print(f"geomean B / A: all {res.geomean():.3f}, M <= 8 {res.geomean(lambda r: r.m <= 8):.3f}, "
          f"M >= 512 {res.geomean(lambda r: r.m >= 512):.3f} ({len(res.rows)} rows, {threads} threads)")
    _write_rows(args, res, write_markdown)
    return 0


def _write_rows(args, res, write_markdown, **kw) -> None:
    """--json and --md of a command that times rows in rounds; the Markdown names the command."""
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res.to_json(), indent=1))
    if args.md:
        write_markdown(res, Path(args.md), command_line(), **kw)


def _run_kernels(args) -> int:
    from sandwich.bench.cache_ab import write_markdown
    from sandwich.bench.kernel_ab import run_kernel_ab

    threads = threads_of(args)
    res = run_kernel_ab(a_src=args.a, b_src=args.b, schedules=args.schedule, n=args.n, k=args.k,
                        ms=int_list(args.m, "--m"), threads=threads, rounds=args.rounds)
    print(f"geomean B / A: {res.geomean():.3f} ({len(res.rows)} rows, {threads} threads)")
    _write_rows(args, res, write_markdown,
                title="Two versions of the GEMM family's source, interleaved: B / A")
    return 0


def _run_schedules(args) -> int:
    from sandwich.bench.schedule_ab import run_schedule_ab, write_markdown

    threads = threads_of(args)
    res = run_schedule_ab(schedules=args.schedule, n=args.n, k=args.k, ms=int_list(args.m, "--m"),
                          threads=threads, rounds=args.rounds)
    _write_rows(args, res, write_markdown)
    return 0


def _run_streaming(args) -> int:
    from sandwich.bench.kernel_stream import run_kernel_stream, write_markdown

    threads = threads_of(args)
    res = run_kernel_stream(src=args.src, schedules=args.schedule, n=args.n, k=args.k,
                            ms=int_list(args.m, "--m"), threads=threads, rounds=args.rounds)
    _write_rows(args, res, write_markdown)
    return 0


def _run_amx(args) -> int:
    from sandwich.bench.amx import run_amx

    threads = threads_of(args)
    peers = () if args.peers in ("", "none") else tuple(p.strip() for p in args.peers.split(","))
    run_amx(schedule=args.schedule, n=args.n, k=args.k, ms=int_list(args.m, "--m"),
            threads=threads, rounds=args.rounds, peers=peers)
    return 0


def _run_formats(args) -> int:
    from sandwich.bench.formats import run_formats, write_report
    from sandwich.tuner.kernel_cache import KernelCache
    from sandwich.weight_formats import parse_format

    ms = int_list(args.m, "--m")
    formats = [parse_format(f).name for f in args.weights.split(",") if f.strip()]
    cache = KernelCache(cache_dir_arg(args))
    threads = threads_of(args)
    base = f"results/cpus/{cache.cpu.mcpu}/weight_formats"
    res = run_formats(models=args.model or ["llama-160m"], formats=formats, ms=ms, threads=threads,
                      cache=cache, budget=args.budget, seq_max=args.seq_max,
                      command=command_line(),
                      log=lambda msg: print(msg, flush=True), progress=not args.no_progress,
                      passes=args.passes)
    md, js = Path(args.md or f"{base}.md"), Path(args.json_out or f"{base}.json")
    write_report(res, md, js)
    print(f"wrote {js}, {md}")
    return 0


def _run_serving(args) -> int:
    from sandwich.bench.serving import run_serving_bench, write_report
    from sandwich.tuner.kernel_cache import KernelCache

    lens = int_list(args.prompt_lens, "--prompt-lens")
    if args.new_tokens < 1 or args.repeats < 1:
        raise ConfigError("--new-tokens and --repeats must be >= 1")
    cache = KernelCache(cache_dir_arg(args))
    threads = threads_of(args)
    work = Path(args.work) if args.work else cache.dir / "models"
    res = run_serving_bench(models=args.model or ["llama-160m"], prompt_lens=lens,
                            new_tokens=args.new_tokens, repeats=args.repeats, threads=threads,
                            cache=cache, work=work, peers=[p for p in args.peers.split(",") if p],
                            weights=args.weights, kv_dtype=args.kv_cache_dtype,
                            same_file=getattr(args, "weights_auto", False), command=command_line())
    write_report(res, Path(args.md), Path(args.json_out))
    print(f"wrote {args.json_out}, {args.md}")
    return 0


def _run_reference(args) -> int:
    from sandwich.bench.reference_check import run_reference_check, write_report
    from sandwich.tuner.kernel_cache import KernelCache

    if args.new_tokens < 1:
        raise ConfigError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    name = Path(args.model).stem.split(".")[0].lower()
    md = Path(args.md or f"results/reference_{name}.md")
    js = Path(args.json_out or f"results/reference_{name}.json")
    threads = threads_of(args)
    res = run_reference_check(model=args.model, cache=KernelCache(cache_dir_arg(args)),
                              threads=threads, new_tokens=args.new_tokens,
                              texts=[Path(t) for t in args.text or ()], ctx=args.ctx,
                              command=command_line())
    write_report(res, md, js)
    for name, t in res.tokenizer.items():
        print(f"tokenizer vs {name}: {t['equal']}/{t['strings']} strings equal")
    same = sum(g["identical"] for g in res.greedy)
    worst = max((g["prefill_logits_max_rel_error"] for g in res.greedy), default=0.0)
    print(f"greedy vs HF transformers: {same}/{len(res.greedy)} prompts identical; prefill "
          f"logits max rel. error {worst:.1e}")
    if res.perplexity:
        p = res.perplexity
        print(f"perplexity over {p['tokens']} tokens: ours {p['ours']:.4f}, HF {p['hf']:.4f} "
              f"({100 * p['rel_diff']:.4f}% apart)")
    print(f"wrote {md}, {js}")
    return 0


def _run_http(args) -> int:
    from sandwich.bench.http_serving import run_http_bench, write_report
    from sandwich.cli.engines import make_engine as _engine
    from sandwich.compiler.target import describe_machine
    from sandwich.runtime.http_server import served_name

    if min(args.prompt_len, args.max_tokens, args.repeats, args.clients, args.max_batch) < 1:
        raise ConfigError("--prompt-len, --max-tokens, --repeats, --clients and --max-batch must be >= 1")
    text = read_text(args.text)
    threads = threads_of(args)
    engine_args = _engine_args(args, threads)
    name = served_name(args.model)
    md = Path(args.md or f"results/http_{name}.md")
    js = Path(args.json_out or f"results/http_{name}.json")
    res = run_http_bench(
        model=args.model, text=text, prompt_len=args.prompt_len, max_tokens=args.max_tokens,
        repeats=args.repeats, clients=args.clients, max_batch=args.max_batch, threads=threads,
        cache_dir=cache_dir_arg(args), command=command_line(),
        machine=describe_machine() + f", {platform.python_implementation()} {platform.python_version()}",
        make_engine=lambda b, s: _engine(engine_args, max_batch=b, max_seq=s))
    write_report(res, md, js)
    e, h = res.engine, res.http
    print(f"TTFT {e.ttft_ms:.1f} -> {h.ttft_ms:.1f} ms, TPOT {e.tpot_ms:.2f} -> {h.tpot_ms:.2f} ms "
          f"(engine -> HTTP; paired ratios {res.paired[0]:.3f}, {res.paired[1]:.3f}); "
          f"{res.clients} clients {res.speedup:.2f}x one client's tokens/s")
    print(f"wrote {md}, {js}")
    return 0


def _engine_args(args, threads: int, **fixed):
    """A bench's arguments as `make_engine` reads them: one process, the DSL ops, kernels
    tuned at the quick budget on first use."""
    return argparse.Namespace(**vars(args) | dict(
        tp=1, ops="dsl", prefill_config=None, decode_config=None, no_warmup=False, no_tune=False,
        tune_budget="quick", threads=threads, **fixed))


def _chat_bench_args(p: argparse.ArgumentParser, stem: str, llama_cpp_how: str) -> None:
    """The arguments the chat benches (prefix, speculate) share: the model, llama.cpp beside
    it (`llama_cpp_how`: how it runs), where its GGUF and the results (results/cpus/<mcpu>/
    <stem>_<model>.*) go, threads and the kernel cache."""
    p.add_argument("--model", default="smollm2", help="a .gguf file, an installed model or an "
                   "HF directory with tokenizer.json and a chat template")
    p.add_argument("--llama-cpp", action="store_true", help="also each prompt on llama.cpp "
                   f"(llama-cpp-python, an F32 GGUF of the same weights), {llama_cpp_how}")
    p.add_argument("--work", default=None, help="where the F32 GGUF for llama.cpp is written "
                   "(default: the kernel cache's models/)")
    p.add_argument("--json", dest="json_out", default=None,
                   help=f"default results/cpus/<mcpu>/{stem}_<model>.json")
    p.add_argument("--md", default=None, help=f"default results/cpus/<mcpu>/{stem}_<model>.md")
    add_threads_arg(p)
    add_cache_arg(p)


def _chat_bench(args):
    """What the chat benches (prefix, speculate) start from: (threads, kernel cache,
    tokenizer, engine arguments (the sandwich schedule, no plan, fp32), max_seq)."""
    from sandwich.models import load_model_config
    from sandwich.runtime.tokenizer import load_tokenizer
    from sandwich.tuner.kernel_cache import KernelCache

    threads = threads_of(args)
    cache = KernelCache(cache_dir_arg(args))
    tok = load_tokenizer(args.model)
    engine_args = _engine_args(args, threads, schedule="sandwich", plan="off", weights="fp32")
    return threads, cache, tok, engine_args, min(2048, load_model_config(args.model).max_position_embeddings)


def _llama_cpp_f32(args, cache, threads: int) -> Path:
    """An F32 GGUF of the model's weights for a llama.cpp peer, written once under --work (by
    default the kernel cache's models/)."""
    from sandwich.bench.serving import model_dir_for
    from sandwich.bench.serving_peers import llama_cpp_gguf

    work = Path(args.work) if args.work else cache.dir / "models"
    return llama_cpp_gguf(model_dir_for(args.model, work), work, "fp32", threads=threads)


def _run_gguf(args) -> int:
    from sandwich.bench.gguf_export import write_gguf
    from sandwich.bench.serving import model_dir_for
    from sandwich.bench.serving_peers import llama_cpp_ftype, quantize_gguf

    out = Path(args.out)
    if out.suffix != ".gguf":
        raise ConfigError(f"--out {out}: a GGUF file's name ends in .gguf")
    work = Path(args.work) if args.work else cache_dir_arg(args) / "models"
    if args.type.upper() == "F32":
        write_gguf(model_dir_for(args.model, work), out)
    else:
        llama_cpp_ftype(args.type)  # no llama-cpp-python, or no such type: before any write
        f32 = out.with_name(out.stem + ".f32.gguf")
        try:
            write_gguf(model_dir_for(args.model, work), f32)
            quantize_gguf(f32, out, args.type, threads=threads_of(args), pure=args.pure)
        finally:
            f32.unlink(missing_ok=True)
    print(f"wrote {out} ({args.type.upper()}{', pure' if args.pure else ''})")
    return 0


def _run_prefix(args) -> int:
    from sandwich.bench.prefix_reuse import check_turns, run_prefix_bench, write_report
    from sandwich.cli.engines import make_engine
    from sandwich.compiler.target import describe_machine
    from sandwich.runtime.http_server import served_name

    if min(args.max_new_tokens, args.rounds, args.choices) < 1:
        raise ConfigError("--max-new-tokens, --rounds and --choices must be >= 1")
    check_turns(args.turns)  # before anything loads
    threads, cache, tok, engine_args, max_seq = _chat_bench(args)
    peers = None
    if args.llama_cpp:
        from sandwich.bench.prefix_reuse import LlamaCppTurns

        gguf = _llama_cpp_f32(args, cache, threads)
        peers = tuple(LlamaCppTurns(gguf, threads=threads, n_ctx=max_seq, keep=k) for k in (False, True))
    reuse, whole = (make_engine(engine_args, max_batch=args.choices, max_seq=max_seq)
                    for _ in range(2))
    whole.ex.set_prefix_cache(False)
    name = served_name(args.model)
    base = f"results/cpus/{cache.cpu.mcpu}/prefix_reuse_{name}"
    try:
        res = run_prefix_bench(reuse=reuse, whole=whole, tok=tok, turns=args.turns,
                               max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                               choices=args.choices, peers=peers,
                               command=command_line(),
                               machine=describe_machine(), model=args.model, threads=threads)
    finally:
        for peer in peers or ():
            peer.close()
    md, js = Path(args.md or f"{base}.md"), Path(args.json_out or f"{base}.json")
    write_report(res, md, js)
    print(f"wrote {md}, {js}")
    return 0


def _run_speculate(args) -> int:
    from sandwich.bench.speculation import run_speculation_bench, write_report
    from sandwich.cli.engines import make_engine
    from sandwich.compiler.target import describe_machine
    from sandwich.runtime.http_server import served_name

    drafts = int_list(args.draft, "--draft")
    if min(args.max_new_tokens, args.rounds) < 1:
        raise ConfigError("--max-new-tokens and --rounds must be >= 1")
    threads, cache, tok, engine_args, max_seq = _chat_bench(args)
    peers = None
    if args.llama_cpp:
        from sandwich.bench.speculation import LlamaCppLookup

        gguf = _llama_cpp_f32(args, cache, threads)
        peers = {k: LlamaCppLookup(gguf, threads=threads, n_ctx=max_seq, draft=k) for k in (0, *drafts)}
    engine = make_engine(engine_args, max_batch=1, max_seq=max_seq)
    try:
        res = run_speculation_bench(engine, tok, drafts=drafts, max_new_tokens=args.max_new_tokens,
                                    rounds=args.rounds, machine=describe_machine(), model=args.model,
                                    command=command_line(),
                                    threads=threads, peers=peers)
    finally:
        for peer in (peers or {}).values():
            peer.close()
    base = f"results/cpus/{cache.cpu.mcpu}/speculation_{served_name(args.model)}"
    md, js = Path(args.md or f"{base}.md"), Path(args.json_out or f"{base}.json")
    write_report(res, md, js)
    print(md.read_text())
    return 0


TINY_MODEL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
              "vocab_size": 256, "max_position_embeddings": 64}


def _run_plan(args) -> int:
    from sandwich.bench.plan_report import write_report
    from sandwich.compiler.target import describe_machine
    from sandwich.runtime.planner import PlanSettings, make_plan
    from sandwich.tuner.kernel_cache import KernelCache
    from sandwich.weight_formats import parse_weights

    if args.top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {args.top_k}")
    cache = KernelCache(cache_dir_arg(args))
    settings = PlanSettings(top_k=args.top_k, seq_max=args.seq_max, budget=args.budget,
                            prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                            rounds=args.rounds, weights=args.weights)
    slug = parse_weights(args.weights).slug
    stem = "results/sandwich_plan" + ("" if slug == "fp32" else f"_{slug}")
    args.md, args.json_out = args.md or f"{stem}.md", args.json_out or f"{stem}.json"
    plans = [make_plan(m, cache, settings, progress=not args.no_progress)
             for m in args.model or ["llama-160m"]]
    fixtures = ""
    if not args.no_fixtures:
        from sandwich.bench.plan_fixtures import fixture_plans_markdown

        fixtures = fixture_plans_markdown()
    write_report(plans, command=command_line(),
                 machine=describe_machine() + f", Python {platform.python_version()}", md=Path(args.md),
                 json_out=Path(args.json_out), fixtures_md=fixtures)
    print(f"wrote {args.md} and {args.json_out}")
    return 0


def _run_corruption(args) -> int:
    import tempfile
    import time

    from tqdm import tqdm

    from sandwich.bench import corruption as cb
    from sandwich.compiler.target import describe_machine
    from sandwich.models import load_model_config
    from sandwich.payload import make_payload
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.kernel_cache import KernelCache
    from sandwich.tuner.shared_tuning import tune_shapes
    from sandwich.tuner.tune import unique_shapes

    root = Path(args.work or tempfile.mkdtemp(prefix="sandwichc-corrupt-"))
    root.mkdir(parents=True, exist_ok=True)
    base = root / "base"
    cfg_path = root / "config.json"
    cfg_path.write_text(json.dumps(TINY_MODEL))
    cache = KernelCache(base)
    shapes = unique_shapes(make_payload(load_model_config(cfg_path), tp=1, seq_max=32))
    tune_shapes(shapes, seq_max=32, threads=2, budget=get_budget("tiny"), cache=cache)
    cache.db.checkpoint()
    cache.db.close()
    dims = sorted({(op.n, op.k) for _, op in shapes})
    plan = cb.plan(base, args.count, seed=args.seed)
    report = cb.CorruptionReport(describe_machine(), command_line(),
                                 args.count, files={str(p.relative_to(base)): p.stat().st_size
                                                    for p in sorted(base.rglob("*")) if p.is_file()})
    t0 = time.perf_counter()
    with tqdm(total=len(plan), unit="corruption", desc="corrupt and check") as bar:
        results = cb.run_corruptions(base, root / "work", plan, dims,
                                     on_result=lambda r: bar.update())
    report.seconds = time.perf_counter() - t0
    cb.summarize(results, report)
    cb.write_report(report, Path(args.md), Path(args.json_out))
    print(", ".join(f"{o} {report.outcomes.get(o, 0)}" for o in cb.OUTCOMES))
    print(f"wrote {args.md}, {args.json_out}")
    return 1 if report.failures else 0
