import json

import pytest

from sandwich.errors import ConfigError
from sandwich.models import embedded_models, load_model_config
from sandwich.payload import make_payload


def test_embedded_models_present():
    assert {"llama-160m", "sheared-llama-1.3b", "llama-3.2-1b", "llama-3-8b"} <= set(embedded_models())


def test_llama160m_payload_shapes():
    p = make_payload(load_model_config("llama-160m"), seq_max=2048)
    shapes = {op.name: (op.n, op.k) for op in p.ops}
    assert shapes == {"qkv": (2304, 768), "o": (768, 768), "gate_up": (6144, 768),
                      "down": (768, 3072), "lm_head": (32000, 768)}


def test_gqa_and_tp_sharding():
    cfg = load_model_config("llama-3.2-1b")
    assert (cfg.num_key_value_heads, cfg.head_dim) == (8, 64)
    p = make_payload(cfg, tp=2)
    shapes = {op.name: (op.n, op.k) for op in p.ops}
    assert shapes["qkv"] == ((16 + 2 * 4) * 64, 2048)
    assert shapes["down"] == (2048, 4096)
    with pytest.raises(ConfigError, match="does not divide"):
        make_payload(cfg, tp=3)


def test_config_path_and_directory(tmp_path):
    from importlib import resources

    raw = json.loads((resources.files("sandwich") / "configs" / "llama-160m.json").read_text())
    raw["hidden_size"] = 512
    raw["num_attention_heads"] = raw["num_key_value_heads"] = 8
    (tmp_path / "config.json").write_text(json.dumps(raw))
    for arg in (tmp_path, tmp_path / "config.json"):
        assert load_model_config(arg).hidden_size == 512


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"model_type": "gpt2"}', "not Llama-family"),
    ('{"model_type": "llama", "hidden_size": -4}', "positive integer"),
    ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 6, '
     '"intermediate_size": 8, "num_hidden_layers": 1, "vocab_size": 8}', "not divisible"),
])
def test_bad_configs(tmp_path, text, match):
    f = tmp_path / "config.json"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_model_config(f)


def test_unknown_model_and_bad_seq_max():
    with pytest.raises(ConfigError, match="unknown model"):
        load_model_config("no-such-model")
    with pytest.raises(ConfigError, match="seq-max"):
        make_payload(load_model_config("llama-160m"), seq_max=0)
