"""`sandwichc serve`: the OpenAI-compatible HTTP server on the continuous-batching engine."""

from __future__ import annotations

import argparse
import os
import sys

from sandwich.cli.common import port_number
from sandwich.errors import ConfigError

DEFAULT_MAX_SEQ = 2048  # KV positions per sequence when the model's context is longer


def register(sub) -> None:
    from sandwich.cli.serve import _serving_args

    s = sub.add_parser("serve", help="serve the model over the OpenAI HTTP API "
                       "(/v1/completions, /v1/chat/completions, /v1/models, /health)")
    _serving_args(s, sampling=False)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=port_number, default=8000, help="TCP port (0 picks a free one)")
    s.add_argument("--max-batch", type=int, default=16,
                   help="sequences decoded together; more requests wait in the queue")
    s.add_argument("--served-model-name",
                   help="the model id clients send and /v1/models lists (default: the --model name)")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="larger request bodies get a 400")
    s.add_argument("--api-key", default=os.environ.get("SANDWICHC_API_KEY"),
                   help="the /v1/ routes need 'Authorization: Bearer KEY' (default: the "
                   "SANDWICHC_API_KEY environment variable; none: open)")
    s.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (info logs every request)")
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from sandwich.cli.engines import make_engine as _engine
    from sandwich.models import load_model_config
    from sandwich.runtime.engine_loop import EngineLoop
    from sandwich.runtime.http_server import (
        OpenAIServer,
        ServerSettings,
        bind,
        make_uvicorn,
        served_name,
    )
    from sandwich.runtime.tokenizer import load_tokenizer

    if args.max_body_bytes < 1024:
        raise ConfigError(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    tok = load_tokenizer(args.model)  # before the slow part: no tokenizer, no text server
    sock = bind(args.host, args.port)
    max_seq = args.max_seq or min(DEFAULT_MAX_SEQ, load_model_config(args.model).max_position_embeddings)
    engine = _engine(args, max_batch=args.max_batch, max_seq=max_seq)
    name = args.served_model_name or served_name(args.model)
    server = OpenAIServer(EngineLoop(engine).start(), tok,
                          ServerSettings(name, args.max_body_bytes, args.api_key or None))
    host, port = sock.getsockname()[:2]
    print(f"sandwichc: serving {name!r} on http://{host}:{port}/v1 (max_batch {args.max_batch}, "
          f"max_seq {max_seq}); Ctrl-C stops", file=sys.stderr, flush=True)
    try:  # uvicorn shuts down gracefully on Ctrl-C or SIGTERM, then re-raises the signal
        make_uvicorn(server.app(), log_level=args.log_level).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        server.loop.stop()
    print("sandwichc: server stopped", file=sys.stderr)
    return 0
