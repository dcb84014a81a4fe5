"""`sandwichc init-model | generate | tokenize | perplexity`: checkpoints and the serving engine."""

from __future__ import annotations

import argparse
import sys

from sandwich.cli.common import read_text
from sandwich.cli.engines import ensure_tuned, schedule_arg
from sandwich.cli.engines import make_engine as _engine
from sandwich.errors import ConfigError
from sandwich.models import DEFAULT_MODEL


def register(sub) -> None:
    p = sub.add_parser("init-model", help="write a random-weight HF-format Llama-family (MoE "
                       "included) checkpoint (config.json + model.safetensors) for the loader, "
                       "tests and benchmarks")
    p.add_argument("--config", default=DEFAULT_MODEL,
                   help="embedded model name or path to an HF config.json (or its directory)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--layers", type=int, default=None,
                   help="override num_hidden_layers (same layer shapes, fewer layers)")
    p.add_argument("--shards", type=int, default=1,
                   help="split the weights over this many files plus model.safetensors.index.json")
    p.add_argument("--bf16", action="store_true", help="store the weights as BF16 (single file)")
    p.set_defaults(func=cmd_init_model)
    register_serving(sub)


def cmd_init_model(args: argparse.Namespace) -> int:
    from sandwich.errors import ConfigError
    from sandwich.runtime.checkpoint import write_checkpoint

    if args.shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {args.shards}")
    if args.bf16 and args.shards > 1:
        raise ConfigError("--bf16 writes one file; drop --shards or --bf16")
    out = write_checkpoint(args.config, args.out, seed=args.seed, layers=args.layers,
                           shards=args.shards, bf16=args.bf16)
    print(f"wrote {out}/config.json and the weights (seed {args.seed})")
    return 0


# -- generate / serve-bench (issue 6) -------------------------------------------------------
def _id_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids like 1,2,3, "
                                         f"got {text!r}") from None


def _serving_args(p: argparse.ArgumentParser, *, sampling: bool = True) -> None:
    p.add_argument("--model", required=True, help="HF model directory (config.json + safetensors), "
                   "a .gguf file, or an installed model (smollm2)")
    _model_run_args(p)
    p.add_argument("--max-seq", type=int, help="KV-cache positions per sequence")
    if sampling:  # a server takes these per request
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (argmax)")
    p.add_argument("--prefill-config", help="ServiceConfig JSON (or `topo search` JSON) for prefill")
    p.add_argument("--decode-config", help="ServiceConfig JSON (or `topo search` JSON) for decode")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel processes (tune with `sandwichc tune --tp N` first); "
                   "ranks are pinned to the --decode-config's CPU sets, else an even split")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up request (first kernel calls load lazily)")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt whole: by default a prompt that starts with what a "
                   "finished sequence's slot holds (a chat's earlier turns, a shared system "
                   "prompt) takes that slot and prefills only the rest")
    p.add_argument("--speculate", type=int, default=0, metavar="K",
                   help="speculative decoding by prompt lookup: guess up to K next tokens from "
                   "what followed the reply's last tokens earlier in the prompt or reply, and "
                   "check them in the decode step; the tokens are the same, more of them per "
                   "weight read where the reply copies its context (default 0: off)")
    p.add_argument("--speculate-ngram", type=int, default=3, metavar="N",
                   help="with --speculate: the longest suffix looked up (default 3)")
    p.add_argument("--plan", choices=("auto", "off"), default="auto",
                   help="auto: run the plan `sandwichc tune` stored for this model (prefill and "
                   "decode each on its configuration and kernels; a stale plan is re-planned); "
                   "off, or any of --prefill-config/--decode-config/--tp/--threads: as given")
    p.add_argument("--schedule", type=schedule_arg, default="sandwich",
                   help="sandwich: each new prompt prefilled whole, then every sequence decodes "
                   "(default); chunked:C: a C-token prompt chunk beside the decodes each "
                   "iteration; layered[:G]: the prompt through one of G layer groups per "
                   "iteration (default G = ceil(prompt / 512)); splitwise:P,D: prefill on a "
                   "P-core prompt pool process while D cores decode")
    _tune_args(p)


def sampling_args(p: argparse.ArgumentParser) -> None:
    """The cuts and logit adjustments of one command-line request (runtime/sampling.py)."""
    p.add_argument("--top-k", type=int, default=0, help="keep the K likeliest tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="keep the likeliest tokens holding "
                   "this share of the probability (1: all)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="divide the positive "
                   "logits (multiply the negative) of every token already in the prompt or the "
                   "reply by this (1: none; 1.1-1.3 curbs the loops of small models)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract this from the logit of every token the reply holds (OpenAI's)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="subtract this times "
                   "its count from the logit of every token the reply holds (OpenAI's)")


def sampling_of(args: argparse.Namespace) -> dict:
    """Request keyword arguments from `sampling_args` and the --temperature / --seed flags."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, repetition_penalty=args.repetition_penalty,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty)


def _model_run_args(p: argparse.ArgumentParser) -> None:
    """Where the kernels come from and how they run: every command that runs a model."""
    from sandwich.cli.common import (
        add_cache_arg,
        add_kv_cache_dtype_arg,
        add_threads_arg,
        add_weights_arg,
    )

    add_cache_arg(p)
    add_threads_arg(p)
    add_weights_arg(p)
    add_kv_cache_dtype_arg(p)
    p.add_argument("--ops", choices=("dsl", "numpy"), default="dsl",
                   help="non-GEMM ops: compiled DSL kernels, or the numpy fallback")


def _tune_args(p: argparse.ArgumentParser) -> None:
    from sandwich.tuner.budget import BUDGETS

    p.add_argument("--no-tune", action="store_true",
                   help="fail on GEMMs missing from the kernel cache instead of tuning them first")
    p.add_argument("--tune-budget", choices=list(BUDGETS), default="quick",
                   help="budget of the tuning on first use (default quick: a few minutes)")


def register_serving(sub) -> None:
    g = sub.add_parser("generate", help="generate text (or token ids) for one prompt, streamed")
    _serving_args(g)
    prompt = g.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (the model's tokenizer encodes it)")
    prompt.add_argument("--prompt-ids", type=_id_list, help="comma-separated token ids")
    g.add_argument("--chat", action="store_true",
                   help="send --prompt as a user message through the model's chat template")
    g.add_argument("--max-new-tokens", type=int, default=128)
    sampling_args(g)
    g.add_argument("--stop-ids", type=_id_list, default=(), help="comma-separated stop token ids")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE|JSON",
                       help="the reply is JSON that fits this schema (a file, or the schema itself)")
    shape.add_argument("--regex", help="the whole reply matches this regular expression")
    shape.add_argument("--choice", action="append", metavar="TEXT",
                       help="the reply is one of these texts (repeat the flag for each)")
    shape.add_argument("--grammar", metavar="FILE",
                       help="the reply is what this Lark grammar's start rule derives (llguidance's dialect)")
    g.add_argument("--json", action="store_true",
                   help='print {"ids": [...], "text": ..., "ttft_ms": ..., "tpot_ms": ...}')
    g.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help='with --json, also each token\'s log-probability (the model\'s own, before '
                   'temperature and cuts) and the K likeliest tokens: "logprobs": [{"id", "logprob", '
                   '"top": [[id, logprob], ...]}, ...]')
    g.set_defaults(func=cmd_generate)

    x = sub.add_parser("perplexity", help="token-level perplexity of a text file over "
                       "non-overlapping windows (the windows of HF's perplexity guide)")
    x.add_argument("--model", required=True, help="HF model directory, a .gguf file, or an "
                   "installed model (smollm2)")
    x.add_argument("--text", required=True, help="a UTF-8 text file")
    x.add_argument("--ctx", type=int, default=512, help="tokens per window")
    x.add_argument("--json", action="store_true",
                   help='print {"perplexity": ..., "tokens": ..., "windows": ...}')
    x.add_argument("--compare-llama-cpp", action="store_true",
                   help="also score the same tokens and windows with llama.cpp (llama-cpp-python) "
                   "on the same weights: an F32 GGUF of them, quantized by llama.cpp's own "
                   "quantizer to the --weights format's type (Q8_0, Q4_0, Q4_1)")
    _model_run_args(x)
    _tune_args(x)
    x.add_argument("--no-progress", action="store_true")
    x.set_defaults(func=cmd_perplexity)

    t = sub.add_parser("tokenize", help="print the token ids of a text (as llama-tokenize does)")
    t.add_argument("--model", required=True, help="HF model directory, a .gguf file, or an "
                   "installed model (smollm2)")
    t.add_argument("--text", required=True)
    t.add_argument("--json", action="store_true", help='print {"ids": [...], "count": n}')
    t.set_defaults(func=cmd_tokenize)


def _prompt(args):
    """(prompt ids, tokenizer or None, stop ids): text goes through the model's tokenizer
    (and chat template), whose end-of-sequence and end-of-turn tokens stop generation."""
    if args.prompt is None:
        if args.chat:
            raise ConfigError("--chat needs --prompt (text), not --prompt-ids")
        return tuple(args.prompt_ids), None, tuple(args.stop_ids)
    from sandwich.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model)
    text = tok.render_chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    ids = tuple(tok.encode(text))
    if not ids:
        raise ConfigError("--prompt encodes to no tokens; give some text")
    return ids, tok, tuple(args.stop_ids) + tuple(sorted(tok.stop_ids))


def _structure(args, tok):
    """The Structure the reply must parse as (runtime/structured.py), or None; checked before
    anything slow."""
    import json

    from sandwich.runtime.structured import Structure

    if args.json_schema is None and args.regex is None and args.choice is None and args.grammar is None:
        return None
    if tok is None:
        raise ConfigError("a structured reply needs --prompt (text), not --prompt-ids")
    if args.json_schema is not None:
        text = args.json_schema
        if not text.lstrip().startswith("{"):
            text = read_text(text, "--json-schema")
        try:
            structure, flag = Structure.json_schema(json.loads(text)), "--json-schema"
        except ValueError as e:
            raise ConfigError(f"--json-schema is not JSON: {e}") from None
    elif args.regex is not None:
        structure, flag = Structure("regex", args.regex), "--regex"
    elif args.choice is not None:
        structure, flag = Structure.choice(args.choice), "--choice"
    else:
        structure, flag = Structure("grammar", read_text(args.grammar, "--grammar")), "--grammar"
    why = structure.problem()
    if why:
        raise ConfigError(f"{flag}: {why}")
    return structure


def cmd_generate(args: argparse.Namespace) -> int:
    import json

    from sandwich.runtime.engine import Request, RequestError

    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.logprobs is not None and not args.json:
        raise ConfigError("--logprobs shows in the JSON output: add --json")
    ids, tok, stop = _prompt(args)
    structure = _structure(args, tok)
    need = len(ids) + args.max_new_tokens - 1
    engine = _engine(args, max_batch=1, max_seq=args.max_seq or max(need, 1))
    if structure is not None:
        from sandwich.runtime.structured import Grammars

        engine.grammars = Grammars.of(tok, engine.vocab_size)
    if tok is not None and not args.json:  # stream the text as it is sampled
        step = tok.stream()
        engine.on_token = lambda _, token, _lp: print(step(token), end="", flush=True)
    req = Request(prompt=ids, max_new_tokens=args.max_new_tokens, stop=stop,
                  logprobs=args.logprobs, structure=structure, **sampling_of(args))
    (res,) = engine.run([req])
    if res.error:
        raise RequestError(res.error)
    if args.json:
        out = {"ids": list(res.ids), "ttft_ms": res.ttft_ms, "tpot_ms": res.tpot_ms}
        if tok is not None:
            out["text"] = tok.decode(res.ids)
        if args.logprobs is not None:
            out["logprobs"] = [{"id": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                               for lp in res.logprobs]
        print(json.dumps(out))
    else:
        print(" ".join(map(str, res.ids)) if tok is None else "")
        print(f"{len(res.ids)} tokens ({res.finish}); TTFT {res.ttft_ms:.2f} ms, "
              f"TPOT {res.tpot_ms:.2f} ms", file=sys.stderr)
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    import json

    from sandwich.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model)
    ids = tok.encode(args.text)
    if args.json:
        print(json.dumps({"ids": ids, "count": len(ids)}))
        return 0
    for i in ids:
        print(f"{i:>8} -> {tok.decode([i], skip_special=False)!r}")
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    import json
    import os

    from tqdm import tqdm

    from sandwich.cli.common import cache_dir_arg
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model
    from sandwich.runtime.perplexity import perplexity, windows
    from sandwich.runtime.tokenizer import load_tokenizer
    from sandwich.tuner.kernel_cache import KernelCache

    text = read_text(args.text)
    ids = load_tokenizer(args.model).encode(text)
    spans = windows(len(ids), args.ctx)
    cache = KernelCache(cache_dir_arg(args))
    threads = args.threads or len(os.sched_getaffinity(0))
    # llama.cpp's file first: a format it lacks, or no llama-cpp-python, fails before our run
    peer_gguf = _llama_cpp_file(args, cache, threads) if args.compare_llama_cpp else None
    ensure_tuned(args, cache, threads)
    model = load_model(args.model, cache, threads=threads, weights=args.weights)
    if args.ctx > model.config.max_position_embeddings:
        raise ConfigError(f"--ctx {args.ctx} is beyond the model's context of "
                          f"{model.config.max_position_embeddings} tokens")
    ex = Executor(model, max_batch=1, max_seq=args.ctx, max_tokens=args.ctx, ops=args.ops,
                  threads=threads, kv_dtype=args.kv_cache_dtype)
    with tqdm(total=len(spans), unit="window", desc="perplexity", disable=args.no_progress,
              file=sys.stderr) as bar:
        res = perplexity(ids, args.ctx, ex.score, on_window=bar.update)
    peer = None
    if peer_gguf is not None:
        peer = _llama_cpp_perplexity(peer_gguf, ids, len(spans), args, threads)
    if args.json:
        print(json.dumps({"perplexity": res.perplexity, "tokens": res.tokens,
                          "windows": res.windows}
                         | ({"llama_cpp": peer.perplexity} if peer else {})))
    else:
        print(f"perplexity {res.perplexity:.4f} over {res.tokens} tokens "
              f"({res.windows} windows of up to {args.ctx})")
        if peer:
            how = ("the same file" if getattr(args, "weights_auto", False)
                   else f"{args.weights} weights as llama.cpp quantizes them")
            print(f"llama.cpp  {peer.perplexity:.4f} on the same tokens and windows ({how})")
    return 0


def _llama_cpp_file(args, cache, threads: int):
    """The GGUF llama.cpp scores: a GGUF model's own file where `--weights auto` runs it in
    its own format, else the same weights quantized by llama.cpp to --weights' types."""
    from pathlib import Path

    from sandwich.bench.serving_peers import llama_cpp_gguf, llama_cpp_module
    from sandwich.gguf_config import gguf_path, is_gguf

    model = gguf_path(args.model) if is_gguf(args.model) else Path(args.model)
    if getattr(args, "weights_auto", False):
        llama_cpp_module()  # llama-cpp-python missing: one line before our run
        return model
    return llama_cpp_gguf(model, cache.dir / "models", args.weights, threads=threads)


def _llama_cpp_perplexity(gguf, ids, n_windows: int, args, threads: int):
    """llama.cpp's perplexity on the same ids and windows (bench/serving_peers.py)."""
    from tqdm import tqdm

    from sandwich.bench.serving_peers import LlamaCppScorer
    from sandwich.runtime.perplexity import perplexity

    scorer = LlamaCppScorer(gguf, threads=threads, ctx=args.ctx)
    try:
        with tqdm(total=n_windows, unit="window", desc="llama.cpp", disable=args.no_progress,
                  file=sys.stderr) as bar:
            return perplexity(ids, args.ctx, scorer.score, on_window=bar.update)
    finally:
        scorer.close()
