"""Running `sandwichc` as a user does, for the command-line tests: a subprocess, and its
one-line errors."""

import os
import subprocess
import sys

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
        "vocab_size": 256, "max_position_embeddings": 64}


def run(*args, cache=None, timeout=300, cwd=None):
    cmd = [sys.executable, "-m", "sandwich.cli", *args]
    if cache is not None:
        cmd += ["--cache-dir", str(cache)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "TVM_NUM_THREADS": "2"})


def one_line_error(p, match):
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandwichc: error:"), p.stderr
    assert match in lines[0]

