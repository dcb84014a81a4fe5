"""Property tests for issue 24: whatever a user puts in a config.json, a trace file or a
count on the command line, the outcome is a result or one clear error (ConfigError /
TraceError, printed by the CLI as one `sandwichc: error:` line), never another exception.
Bounded examples: these run in CI in seconds."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandwich.errors import ConfigError, SandwichError
from sandwich.models import parse_model_config
from sandwich.payload import make_payload
from sandwich.runtime.rope_tables import rope_spec
from sandwich.runtime.traces import read_trace

BASE = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
        "vocab_size": 256, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)
ROPE = st.fixed_dictionaries({"rope_type": st.sampled_from(["default", "linear", "llama3", "x"])},
                              optional={k: JSON_VALUES | st.floats(0.5, 64) for k in (
                                  "factor", "low_freq_factor", "high_freq_factor",
                                  "original_max_position_embeddings", "rope_theta")})
FAST = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(st.dictionaries(st.sampled_from(sorted(BASE) + ["head_dim", "rope_scaling",
                                                       "rope_parameters", "tie_word_embeddings"]),
                       JSON_VALUES | ROPE, max_size=4))
def test_any_config_values_give_a_config_or_a_config_error(changes):
    raw = BASE | changes
    try:
        cfg = parse_model_config(raw, source="config.json", name="x")
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    make_payload(cfg, tp=1, seq_max=8)  # what every command does next
    try:
        rope_spec(raw, head_dim=cfg.head_dim, source="config.json")  # what the loader does
    except ConfigError as e:
        assert "\n" not in str(e)


@FAST
@given(st.lists(st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode),
                          st.builds(lambda d: json.dumps(d).encode(),
                                    st.dictionaries(st.sampled_from(
                                        ["arrival_s", "prompt_len", "output_len", "prompt_ids"]),
                                        JSON_VALUES, max_size=4))),
                min_size=1, max_size=5))
def test_any_trace_file_gives_entries_or_a_trace_error(tmp_path, lines):
    f = tmp_path / "t.jsonl"
    f.write_bytes(b"\n".join(lines))
    try:
        entries = read_trace(f)
    except SandwichError as e:
        assert "\n" not in str(e)
        return
    assert entries and all(e.arrival_s >= 0 and e.prompt_len >= 1 for e in entries)


@FAST
@given(st.dictionaries(st.sampled_from(["threads", "seq_max", "max_seq", "max_batch", "tp",
                                        "max_new_tokens", "ctx", "repeats", "clients"]),
                       st.integers(-2**40, 2**40), min_size=1))
def test_any_count_is_accepted_only_when_positive(values):
    import argparse

    from sandwich.cli import check_numbers

    args = argparse.Namespace(**values)
    if min(values.values()) >= 1:
        check_numbers(args)
    else:
        with pytest.raises(ConfigError, match="must be >= 1"):
            check_numbers(args)
