"""Token log-probabilities (OpenAI's `logprobs`): the model's own log-softmax of each step's
logits, the likeliest tokens at the step, carried through the engine; and each token's bytes,
which the wire format shows beside them."""

import random

import numpy as np
import pytest
from engine_fakes import FakeExecutor
from gguf_tiny import write_tiny_gguf

from sandwich.runtime.engine import Engine, Request
from sandwich.runtime.logprobs import MAX_TOP, log_softmax, token_logprob
from sandwich.runtime.tokenizer import load_tokenizer


def test_a_token_logprob_is_the_log_softmax_of_its_row_with_the_likeliest_first():
    rng = np.random.default_rng(0)
    row = rng.standard_normal(300).astype(np.float32) * 4
    row[[7, 9]] = row.max() + 1  # a tie at the top: the lower id first
    want = np.log(np.exp(row.astype(np.float64)) / np.exp(row.astype(np.float64)).sum())
    lp = token_logprob(row, 42, 5)
    assert lp.token == 42 and lp.logprob == pytest.approx(want[42], abs=1e-12)
    order = sorted(range(300), key=lambda i: (-row[i], i))[:5]
    assert [t for t, _ in lp.top] == order and [t for t, _ in lp.top][:2] == [7, 9]
    assert [v for _, v in lp.top] == pytest.approx(want[order], abs=1e-12)
    assert token_logprob(row, 3, 0).top == ()
    assert len(token_logprob(row, 3, 1000).top) == 300  # no more than the vocabulary
    # logits of any scale: no overflow, and the probabilities still sum to one
    big = np.array([1e4, 1e4 - 1, -1e4], np.float32)
    assert np.exp(log_softmax(big)).sum() == pytest.approx(1.0)
    assert token_logprob(big, 0, 0).logprob == pytest.approx(-np.log1p(np.exp(-1.0)))


def test_the_engine_reports_each_tokens_logprob_when_asked_and_only_then():
    fake = FakeExecutor(max_batch=2, max_seq=32, vocab=50)
    engine = Engine(fake)
    seen = []
    engine.on_token = lambda ticket, token, lp: seen.append((ticket, token, lp))
    asked, plain, sampled, bad = engine.run([
        Request(prompt=(3,), max_new_tokens=4, logprobs=2),
        Request(prompt=(5,), max_new_tokens=4),
        Request(prompt=(9,), max_new_tokens=3, temperature=1.5, top_k=3, seed=1, logprobs=0),
        Request(prompt=(1,), max_new_tokens=2, logprobs=MAX_TOP + 1)])
    # the fake's row for a step is one-hot at last + 1: that token's logprob, then the zeros' ids
    hot = float(log_softmax(np.eye(50)[0])[0])
    cold = float(log_softmax(np.eye(50)[0])[1])
    assert asked.ids == (4, 5, 6, 7)
    assert [(lp.token, lp.logprob) for lp in asked.logprobs] == [(t, pytest.approx(hot)) for t in asked.ids]
    assert [lp.top for lp in asked.logprobs][0] == ((4, pytest.approx(hot)), (0, pytest.approx(cold)))
    assert plain.logprobs == () and bad.finish == "error" and "logprobs must be 0 to 20" in bad.error
    # sampling's temperature and cut do not change what is reported: the model's own figures
    assert [lp.logprob for lp in sampled.logprobs] == \
        [pytest.approx(hot if t == (prev + 1) % 50 else cold) for prev, t in zip((9, *sampled.ids[:-1]), sampled.ids, strict=True)]
    assert all(lp.top == () for lp in sampled.logprobs)
    by_ticket: dict[int, list] = {}
    for ticket, _, lp in seen:  # as they were sampled, one callback a token
        by_ticket.setdefault(ticket, []).append(lp)
    assert by_ticket == {1: list(asked.logprobs), 2: [None] * 4, 3: list(sampled.logprobs)}


@pytest.mark.parametrize("vocab", ["gpt2", "spm"])
def test_token_bytes_join_to_the_decoded_text(tmp_path, vocab):
    """Each token's bytes, joined, are the reply's UTF-8 whenever the reply decodes whole: for
    byte-level BPE (tokens may end inside a character) and for SentencePiece pieces."""
    tok = load_tokenizer(write_tiny_gguf(tmp_path / "t.gguf", vocab=vocab)[0])
    specials = {i for i, t in tok.backend.get_added_tokens_decoder().items() if t.special}
    size = tok.backend.get_vocab_size()
    rnd, split, checked = random.Random(0), 0, 0
    for _ in range(1000):
        ids = [t for t in (rnd.randrange(size) for _ in range(rnd.randrange(1, 12))) if t not in specials]
        text = tok.decode(ids)
        if not ids or "\ufffd" in text:
            continue
        joined = b"".join(tok.token_bytes(t) for t in ids)
        if vocab == "spm" and joined.startswith(b" "):
            joined = joined[1:]  # the decoder drops the space the encoder put in front
        assert joined.decode() == text, ids
        checked += 1
        split += any(not _whole(tok.token_bytes(t)) for t in ids)
    assert checked > 100
    if vocab == "gpt2":
        assert split > 0  # some tokens end inside a character, and still join right
    assert tok.token_bytes(size + 5) == b""


def _whole(b: bytes) -> bool:
    try:
        b.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_the_engine_scores_a_prompt_when_asked_and_a_schedule_that_cannot_says_so():
    """Echo with logprobs: each prompt token after the first under the row of the token before
    it, reported once the prompt is prefilled and in the result; a schedule that prefills a
    prompt on another process, or an executor that cannot score rows, refuses the request in
    one line."""
    from sandwich.runtime.schedule import make_schedule

    fake = FakeExecutor(max_batch=2, max_seq=32, vocab=50)
    engine = Engine(fake)
    told = []
    engine.on_prompt = lambda ticket, lps: told.append((ticket, lps))
    prompt = (3, 4, 9, 10)
    scored, plain = engine.run([Request(prompt=prompt, max_new_tokens=2, prompt_logprobs=1, logprobs=1),
                                Request(prompt=prompt, max_new_tokens=2)])
    hot, cold = (float(v) for v in log_softmax(np.eye(50)[0])[:2])
    assert [(lp.token, lp.logprob) for lp in scored.prompt_logprobs] == \
        [(4, pytest.approx(hot)), (9, pytest.approx(cold)), (10, pytest.approx(hot))]
    assert [lp.top[0][0] for lp in scored.prompt_logprobs] == [4, 5, 10]  # the likeliest after each
    assert told == [(1, scored.prompt_logprobs)] and plain.prompt_logprobs == ()
    assert scored.ids == plain.ids  # scoring does not change the reply
    chunked = Engine(FakeExecutor(max_batch=2, max_seq=32, vocab=50), schedule=make_schedule("chunked:4"))
    (bad,) = chunked.run([Request(prompt=prompt, max_new_tokens=2, prompt_logprobs=0)])
    assert bad.finish == "error" and "need one process" in bad.error and "chunked:4" in bad.error
