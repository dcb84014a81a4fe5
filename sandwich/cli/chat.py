"""`sandwichc chat`: an interactive terminal chat, as `llama-cli` and `ollama run` offer."""

from __future__ import annotations

import argparse
import sys

from sandwich.errors import ConfigError

HELP = "/reset clears the conversation, /help shows this, Ctrl-D (or /exit) leaves"


def register(sub) -> None:
    from sandwich.cli.serve import _serving_args, sampling_args

    c = sub.add_parser("chat", help="chat with the model in the terminal (its chat template, "
                       "streamed replies; " + HELP + ")")
    _serving_args(c)
    c.add_argument("--system", help="a system message that opens the conversation")
    c.add_argument("--max-new-tokens", type=int, default=None,
                   help="longest reply (default: 512, or half the context when that is shorter)")
    sampling_args(c)
    c.set_defaults(func=cmd_chat)


DEFAULT_REPLY = 512  # tokens a reply may take, unless the context is shorter than twice that


def cmd_chat(args: argparse.Namespace) -> int:
    from sandwich.cli.engines import make_engine as _engine
    from sandwich.cli.serve import sampling_of
    from sandwich.models import load_model_config
    from sandwich.runtime.chat_session import ChatSession
    from sandwich.runtime.engine import Request, RequestError
    from sandwich.runtime.tokenizer import load_tokenizer

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    tok = load_tokenizer(args.model)
    max_seq = args.max_seq or min(2048, load_model_config(args.model).max_position_embeddings)
    if args.max_new_tokens is None:  # a 256-token model refused every message with 512
        args.max_new_tokens = max(1, min(DEFAULT_REPLY, max_seq // 2))
    session = ChatSession(tok, max_seq, args.max_new_tokens, args.system)
    session.prompt("hi")  # the template renders before the slow part, or fails here
    session.reset()
    engine = _engine(args, max_batch=1, max_seq=max_seq)
    interactive = sys.stdin.isatty()
    if interactive:
        import readline  # noqa: F401  (line editing and history for input())
        print(f"sandwichc chat: {args.model} ({HELP})", file=sys.stderr)
    seed = args.seed
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:  # Ctrl-C drops the line being typed, as a shell does
            print()
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text in ("/reset", "/help"):
            if text == "/reset":
                session.reset()
            print("(conversation cleared)" if text == "/reset" else HELP, file=sys.stderr)
            continue
        try:
            ids = session.prompt(text)
        except ConfigError as e:
            print(f"sandwichc: {e}", file=sys.stderr)
            continue
        step = tok.stream()
        parts: list[str] = []

        def show(_, token, _lp, step=step, parts=parts):
            parts.append(step(token))
            print(parts[-1], end="", flush=True)

        engine.on_token = show
        (res,) = engine.run([Request(prompt=tuple(ids), max_new_tokens=args.max_new_tokens,
                                     stop=tuple(sorted(tok.stop_ids)),
                                     **(sampling_of(args) | {"seed": seed}))])
        seed += 1  # a new draw per reply when sampling
        if res.error:
            raise RequestError(res.error)
        print(flush=True)
        session.reply("".join(parts))
    return 0
