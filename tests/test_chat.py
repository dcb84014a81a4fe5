"""`sandwichc chat` (issue 23): the conversation kept to the context, and the terminal loop on
the tiny GGUF (replies streamed, /reset, end of input leaves)."""

import subprocess
import sys

import pytest
from conftest import tune_model
from gguf_tiny import write_tiny_gguf

from sandwich.errors import ConfigError
from sandwich.runtime.chat_session import ChatSession
from sandwich.runtime.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")[0]


def test_old_turns_are_dropped_to_fit_the_context_and_the_system_message_stays(tiny):
    tok = load_tokenizer(tiny)
    s = ChatSession(tok, max_seq=100, max_new_tokens=10, system="be brief")
    first = s.prompt("hello world")
    assert tok.decode(first).startswith("system\nbe brief")
    s.reply("the quick brown fox")
    second = s.prompt("numbers 0123456789")
    assert len(second) > len(first) and s.dropped == 0
    s.reply("def main(): return 42 " * 3)
    third = s.prompt("hello tokens")  # the whole history no longer fits: the oldest turn goes
    assert s.dropped >= 1 and len(third) + 10 - 1 <= 100
    assert "be brief" in tok.decode(third) and "hello world" not in tok.decode(third)
    with pytest.raises(ConfigError, match="does not fit the context"):
        s.prompt("hello world " * 40)
    assert s.history[-1]["content"] == "hello tokens"  # the refused message is not kept
    s.reset()
    assert s.history == [] and s.prompt("hi") == tok.encode(tok.render_chat(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]))


@pytest.mark.tvm
def test_cli_chat_streams_replies_resets_and_leaves_at_end_of_input(tiny, cache):
    tune_model(tiny, cache)
    cmd = [sys.executable, "-m", "sandwich.cli", "chat", "--model", str(tiny), "--cache-dir",
           str(cache.dir), "--no-tune", "--max-new-tokens", "6", "--max-seq", "128"]
    r = subprocess.run(cmd, input="hello world\n/reset\nhello world\n", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    replies = r.stdout.split("\n")[:2]
    assert replies[0] == replies[1]  # greedy, and /reset forgot the first turn
    assert "(conversation cleared)" in r.stderr


@pytest.mark.tvm
def test_cli_chat_fits_its_default_reply_to_a_short_context(tiny, cache):
    """The tiny model's context is 256 tokens: a default reply of 512 refused every message
    ("does not fit the context"); the default is now half the context when that is shorter."""
    tune_model(tiny, cache)
    cmd = [sys.executable, "-m", "sandwich.cli", "chat", "--model", str(tiny), "--cache-dir",
           str(cache.dir), "--no-tune"]
    r = subprocess.run(cmd, input="hello world\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "does not fit" not in r.stderr, r.stderr
    assert r.stdout  # a reply (this random model's are mostly newlines)
