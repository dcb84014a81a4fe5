"""`sandwichc init-model`: write a random-weight HF-format Llama checkpoint."""

from __future__ import annotations

import argparse

from sandwich.tuner.models import DEFAULT_MODEL


def register(sub) -> None:
    p = sub.add_parser("init-model", help="write a random-weight HF-format Llama checkpoint "
                       "(config.json + model.safetensors) for the loader, tests and benchmarks")
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
