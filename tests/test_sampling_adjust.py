"""Logit adjustments before a pick (runtime/sampling.py): logit_bias, HF's repetition penalty
and OpenAI's presence and frequency penalties, against HF transformers' own logits
processors and OpenAI's documented formula, step by step over a reply; the raw row is left
for logprobs; bad values are refused in one line, by the sampler and by the engine."""

import numpy as np
import pytest
from engine_fakes import FakeExecutor

from sandwich.errors import ConfigError
from sandwich.runtime.engine import Engine, Request
from sandwich.runtime.logprobs import log_softmax
from sandwich.runtime.sampling import Sampler, SamplingParams

VOCAB = 40


def _reference(row, prompt, reply, p: SamplingParams):
    """The adjusted row as HF's processors (bias, then repetition over prompt + reply) and
    OpenAI's formula (mu[j] - c[j] * frequency - (c[j] > 0) * presence) compute it."""
    torch = pytest.importorskip("torch")
    from transformers import RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

    ids = torch.tensor([list(prompt) + list(reply)], dtype=torch.long)
    x = torch.tensor(row, dtype=torch.float32)[None]
    if p.logit_bias:
        x = SequenceBiasLogitsProcessor({(t,): v for t, v in p.logit_bias})(ids, x)
    if p.repetition_penalty != 1.0:
        x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, x)
    out = x[0].numpy().astype(np.float32)
    counts = np.bincount(np.asarray(reply, dtype=np.int64), minlength=len(row)).astype(np.float32)
    return out - counts * p.frequency_penalty - (counts > 0) * p.presence_penalty


@pytest.mark.parametrize("adjust", [
    dict(logit_bias=((3, 5.0), (7, -100.0), (11, 2.5))),
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.8),
    dict(presence_penalty=0.7, frequency_penalty=0.4),
    dict(presence_penalty=-0.5, frequency_penalty=-0.3),
    dict(logit_bias=((5, 1.0),), repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=1.0),
])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_each_pick_is_the_reference_pick_on_the_adjusted_row(adjust, temperature):
    """Over 30 steps of a reply (rows peaked on a few tokens, so penalties change the picks),
    the adjusting sampler picks what a plain sampler with the same seed picks on the row the
    reference adjusts, and leaves the row it was given as it was."""
    rng = np.random.default_rng(7)
    p = SamplingParams(temperature, seed=3, **adjust)
    ours, plain = Sampler(p, prompt=(1, 2, 3, 2)), Sampler(SamplingParams(temperature, seed=3))
    prompt, reply, changed = (1, 2, 3, 2), [], 0
    for _ in range(30):
        row = rng.standard_normal(VOCAB).astype(np.float32)
        row[[1, 2, 3, 5, 9]] += 4.0 * rng.random(5).astype(np.float32)
        kept = row.copy()
        want = plain(_reference(row, prompt, reply, p))
        got = ours(row)
        assert got == want
        np.testing.assert_array_equal(row, kept)
        changed += int(np.argmax(row)) != got
        reply.append(got)
    assert changed > 0  # the adjustments moved some picks off the raw argmax


def test_bias_forces_and_bans_tokens_and_penalties_break_a_loop():
    row = np.zeros(VOCAB, np.float32)
    row[4] = 3.0
    assert Sampler(SamplingParams(logit_bias=((9, 100.0),)))(row) == 9
    assert Sampler(SamplingParams(logit_bias=((4, -100.0),)))(row) != 4
    hot = Sampler(SamplingParams(1.0, seed=0, logit_bias=((9, 100.0),)))
    assert {hot(row) for _ in range(20)} == {9}
    # greedy on one row repeats its argmax; a frequency penalty of 2 moves on after two picks
    s = Sampler(SamplingParams(frequency_penalty=2.0))
    assert [s(row) for _ in range(3)][:2] == [4, 4] and s(row) != 4
    r = Sampler(SamplingParams(repetition_penalty=2.0), prompt=(4,))
    assert r(row) == 4  # 3.0 / 2 is still the top logit: the penalty scales, it does not ban


def test_min_tokens_hold_the_stop_ids_back_until_the_reply_is_long_enough():
    row = np.zeros(VOCAB, np.float32)
    row[2], row[5] = 3.0, 1.0  # 2 is a stop id and the likeliest
    s = Sampler(SamplingParams(min_tokens=3, suppress=(2, 7)))
    assert [s(row) for _ in range(5)] == [5, 5, 5, 2, 2]
    hot = Sampler(SamplingParams(1.0, seed=4, min_tokens=20, suppress=(2,)))
    assert 2 not in {hot(row) for _ in range(20)}
    assert Sampler(SamplingParams(min_tokens=3))(row) == 2  # nothing to hold back


@pytest.mark.parametrize("adjust, match", [
    (dict(presence_penalty=2.5), "presence_penalty must be in"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty must be in"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be > 0"),
    (dict(logit_bias=((-1, 1.0),)), "logit_bias token id must be >= 0"),
    (dict(logit_bias=((1, 101.0),)), "logit_bias value must be in"),
    (dict(min_tokens=-1), "min_tokens must be >= 0"),
])
def test_bad_adjustments_are_refused(adjust, match):
    with pytest.raises(ConfigError, match=match):
        Sampler(SamplingParams(**adjust))


def test_the_engine_adjusts_each_request_alone_and_reports_raw_logprobs():
    """A biased request and a plain one in the same batch: the bias moves only its own
    tokens; its logprobs are the model's (before the bias), as vLLM reports them; a bias on
    a token outside the vocabulary fails that request alone."""
    ex = FakeExecutor(max_batch=3, max_seq=32, vocab=VOCAB)
    biased = Request(prompt=(1, 2), max_new_tokens=4, logit_bias=((30, 50.0),), logprobs=1)
    plain = Request(prompt=(1, 2), max_new_tokens=4)
    bad = Request(prompt=(1, 2), max_new_tokens=4, logit_bias=((VOCAB, 1.0),))
    a, b, c = Engine(ex).run([biased, plain, bad])
    assert a.ids == (30, 30, 30, 30) and b.ids == (3, 4, 5, 6)
    raw = log_softmax(ex._row(2)[None])[0]
    assert a.logprobs[0].logprob == pytest.approx(float(raw[30]))
    assert c.finish == "error" and "logit_bias token id 40 is outside the vocabulary" in c.error
