"""`sandwichc bench reference`: a real model against the independent references on the same
file: our tokenizer against llama.cpp's and HF's on 200 varied strings, and our greedy
tokens and prefill logits against HF transformers loading the same GGUF in fp32."""

from __future__ import annotations

import datetime
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sandwich.bench.serving_peers import hf_model
from sandwich.compiler.target import describe_machine
from sandwich.errors import ConfigError

FRAGMENTS = {
    "code": ["def f(x):\n    return x ** 2", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
             '{"key": [1, 2.5, null], "ok": true}', "if [ -f ~/.bashrc ]; then . ~/.bashrc; fi",
             "SELECT id, name FROM users WHERE age >= 21;", "x->y = &z; // pointer",
             "<div class=\"a\">&nbsp;</div>", "lambda s: s.strip().split(',')",
             "fn main() { println!(\"{}\", 1_000); }", "@decorator\nclass A(B):\n\tpass"],
    "unicode": ["héllo wörld", "naïve façade coöperate", "日本語のテキスト", "中文分词测试",
                "한국어 문장", "Привет, мир!", "مرحبا بالعالم", "שלום עולם", "🙂👍🏽🚀",
                "e\u0301 combining", "Ωμέγα αλφα", "ß ẞ ﬁ ligature", "\u200bzero\u200bwidth"],
    "space": ["  two  spaces  ", "\t\ttabs\t", "\n\n\n", "\r\n\r\n", "   ", " \n \t ",
              "trailing   ", "   leading", "a\u00a0b"],
    "digits": ["2024", "3.14159", "1,234,567", "10_000_000", "+1 (555) 010-9999",
               "0x1F 0b1010 1e-9", "12:34:56", "99.9%", "007", "1st 2nd 3rd 4th"],
    "prose": ["The quick brown fox jumps over the lazy dog.", "don't won't I'm we'll they've",
              "Hello, World!", "U.S.A. vs. e.g. i.e.", "CamelCaseWords and snake_case_words",
              "https://example.com/a?b=c&d=e#frag", "user@example.org", "C++ and C# and F#",
              "ALL CAPS SENTENCE", "--flag=value -x"],
}


def varied_strings(count: int = 200, seed: int = 0) -> list[str]:
    """Strings mixing code, Unicode, whitespace runs, digits and prose, joined by random
    whitespace; every fragment appears alone at least once."""
    rng = random.Random(seed)
    pool = [f for group in FRAGMENTS.values() for f in group]
    out = list(pool)
    joins = ["", " ", "  ", "\n", "\t", " \n"]
    while len(out) < count:
        parts = rng.sample(pool, rng.randint(2, 4))
        out.append("".join(p + rng.choice(joins) for p in parts))
    return out[:count]


@dataclass
class ReferenceReport:
    command: str
    model: str
    machine: str
    threads: int
    date: str
    tokenizer: dict = field(default_factory=dict)
    greedy: list = field(default_factory=list)
    perplexity: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def _tokenizer_check(model_path: Path, ours, strings: list[str], report: ReferenceReport) -> None:
    refs = {}
    try:
        import llama_cpp

        ll = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
        refs["llama.cpp"] = lambda s: ll.tokenize(s.encode(), add_bos=False, special=True)
    except ImportError:
        report.notes.append("llama-cpp-python is not installed: no llama.cpp tokenizer check")
    try:
        import transformers

        hf = transformers.AutoTokenizer.from_pretrained(str(model_path.parent),
                                                        gguf_file=model_path.name)
        refs["hf"] = lambda s: hf.encode(s, add_special_tokens=False)
    except ImportError:
        report.notes.append("transformers is not installed: no HF tokenizer check")
    for name, ref in refs.items():
        diff = [s for s in strings if ours.encode(s) != list(ref(s))]
        report.tokenizer[name] = {"strings": len(strings), "equal": len(strings) - len(diff),
                                  "first_differences": diff[:5]}


def _greedy_check(model, tokenizer, hf, prompts: list[str], new_tokens: int, threads: int,
                  report: ReferenceReport) -> None:
    """Plain greedy loops on both sides (argmax of each step's logits, no logits processors)."""
    import torch

    from sandwich.runtime.executor import Executor

    longest = max(len(tokenizer.encode(p)) for p in prompts) + new_tokens
    ex = Executor(model, max_batch=1, max_seq=longest, max_tokens=longest, ops="dsl",
                  threads=threads)
    for text in prompts:
        ids = tokenizer.encode(text)
        slot, logits = ex.start(ids)
        with torch.no_grad():
            r = hf(torch.tensor([ids]), use_cache=True)
        ref = r.logits[0, -1].numpy()
        err = float(np.abs(logits - ref).max() / np.abs(ref).max())
        ours, theirs = [int(logits.argmax())], [int(ref.argmax())]
        past = r.past_key_values
        for _ in range(new_tokens - 1):
            ours.append(int(ex.decode([slot], [ours[-1]])[0].argmax()))
            with torch.no_grad():
                r = hf(torch.tensor([[theirs[-1]]]), past_key_values=past, use_cache=True)
            past = r.past_key_values
            theirs.append(int(r.logits[0, -1].argmax()))
        ex.release(slot)
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
        report.greedy.append({"prompt": text, "prompt_tokens": len(ids), "identical": first is None,
                              "first_difference": first, "prefill_logits_max_rel_error": err,
                              "text": tokenizer.decode(ours)})


def _perplexity_check(model, hf, tokenizer, texts: list[Path], ctx: int, threads: int,
                      report: ReferenceReport, log) -> None:
    """Our perplexity and HF's on the same token ids and the same windows."""
    import torch

    from sandwich.runtime.executor import Executor
    from sandwich.runtime.perplexity import perplexity

    try:
        text = "".join(t.read_text(encoding="utf-8") for t in texts)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the --text files as UTF-8 ({e})") from None
    ids = tokenizer.encode(text)
    ex = Executor(model, max_batch=1, max_seq=ctx, max_tokens=ctx, ops="dsl", threads=threads)

    def hf_score(window) -> np.ndarray:
        with torch.no_grad():
            logits = hf(torch.tensor([list(window)])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)[:-1]
        return logp[torch.arange(len(window) - 1), torch.tensor(list(window[1:]))].numpy()

    log(f"perplexity over {len(ids)} tokens, windows of {ctx}: ours, then HF")
    t0 = time.perf_counter()
    ours = perplexity(ids, ctx, ex.score)
    t1 = time.perf_counter()
    ref = perplexity(ids, ctx, hf_score)
    t2 = time.perf_counter()
    report.perplexity = {"text": " + ".join(map(str, texts)), "ctx": ctx, "tokens": ours.tokens,
                         "windows": ours.windows, "ours": ours.perplexity, "hf": ref.perplexity,
                         "rel_diff": abs(ours.perplexity - ref.perplexity) / ref.perplexity,
                         "ours_s": t1 - t0, "hf_s": t2 - t1}


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,",
           "List three colors:"]
CHAT = "What is the boiling point of water?"


def run_reference_check(*, model: str, cache, threads: int, command: str,
                        new_tokens: int = 64, texts: list[Path] | None = None, ctx: int = 512,
                        log=print) -> ReferenceReport:
    from sandwich.gguf_config import gguf_path, is_gguf
    from sandwich.runtime.loader import load_model
    from sandwich.runtime.tokenizer import load_tokenizer

    if not is_gguf(model):
        raise ConfigError(f"{model}: the reference check runs on a GGUF file or an installed model")
    path = gguf_path(model)
    report = ReferenceReport(command, str(path), describe_machine(), threads,
                             datetime.date.today().isoformat())
    tok = load_tokenizer(model)
    log("tokenizer: 200 strings against llama.cpp and HF")
    _tokenizer_check(path, tok, varied_strings(), report)
    try:
        import torch
        import transformers  # noqa: F401  (hf_model needs it: checked here)
    except ImportError:
        report.notes.append("transformers is not installed: no logits or greedy check")
        return report
    torch.set_num_threads(threads)
    log("loading the model (ours, then HF transformers in fp32)")
    ours = load_model(model, cache)
    t0 = time.perf_counter()
    hf = hf_model(path)
    log(f"HF loaded in {time.perf_counter() - t0:.0f} s; greedy {new_tokens} tokens x 5 prompts")
    prompts = PROMPTS + ([tok.render_chat([{"role": "user", "content": CHAT}])]
                         if tok.chat_template else [])
    _greedy_check(ours, tok, hf, prompts, new_tokens, threads, report)
    if not texts:
        report.notes.append("no --text given: no perplexity check")
    else:
        _perplexity_check(ours, hf, tok, texts, ctx, threads, report, log)
    return report


def write_report(r: ReferenceReport, md: Path, js: Path) -> None:
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(asdict(r), indent=1, ensure_ascii=False))
    lines = [f"# {Path(r.model).name} against llama.cpp and HF transformers", "",
             f"Regenerate: `{r.command}`", "",
             f"- machine: {r.machine}; threads: {r.threads}; date: {r.date}",
             f"- model file: `{r.model}` (weights dequantized to fp32 by both sides)", "",
             "## Tokenizer (200 strings: code, Unicode, whitespace runs, digits, prose)", "",
             "| reference | equal |", "|---|---|"]
    lines += [f"| {k} | {v['equal']} / {v['strings']} |" for k, v in r.tokenizer.items()]
    lines += ["", "## Greedy generation against HF transformers (plain argmax loops, fp32)", "",
              "| prompt | tokens | identical | prefill logits max rel. error |", "|---|---|---|---|"]
    for g in r.greedy:
        prompt = g["prompt"].replace("\n", "\\n").replace("|", "\\|")
        lines.append(f"| `{prompt[:60]}` | {g['prompt_tokens']} | "
                     f"{'yes' if g['identical'] else 'no, from ' + str(g['first_difference'])} | "
                     f"{g['prefill_logits_max_rel_error']:.1e} |")
    if r.perplexity:
        p = r.perplexity
        lines += ["", f"## Perplexity ({p['tokens']} tokens scored in {p['windows']} "
                  f"non-overlapping windows of {p['ctx']}, `{p['text']}`)", "",
                  "| ours | HF transformers | relative difference |", "|---|---|---|",
                  f"| {p['ours']:.4f} | {p['hf']:.4f} | {100 * p['rel_diff']:.4f}% |"]
    lines += [""] + [f"- {n}" for n in r.notes]
    md.write_text("\n".join(lines) + "\n")
