"""`sandwichc init-model` checkpoints, the loader's config and checkpoint checks, RoPE tables
(issue 6). Nothing here compiles a kernel: the loader checks files before it looks up GEMMs."""

import argparse
import json

import numpy as np
import pytest

from sandwich.cli import serve as runtime_cli
from sandwich.errors import ConfigError, ShapeError
from sandwich.models import load_model_config
from sandwich.runtime.checkpoint import tensor_shapes, write_checkpoint
from sandwich.runtime.loader import WeightReader, read_config
from sandwich.runtime.rope_tables import RopeSpec, cos_sin, inv_freq, rope_spec
from sandwich.runtime.safetensors_io import Checkpoint, CheckpointError, SafeTensorsFile, save_file

SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
         "vocab_size": 96, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def _small(tmp_path, **over):
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(SMALL | over))
    return p


def _run_cli(argv):
    parser = argparse.ArgumentParser()
    runtime_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_init_model_cli_writes_hf_format(tmp_path, capsys):
    out = tmp_path / "m"
    assert _run_cli(["init-model", "--config", "llama-160m", "--layers", "2", "--seed", "3",
                     "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    raw = json.loads((out / "config.json").read_text())
    assert raw["num_hidden_layers"] == 2 and raw["hidden_size"] == 768 and raw["torch_dtype"] == "float32"
    f = SafeTensorsFile(out / "model.safetensors")
    cfg = load_model_config(out)
    assert set(f.keys()) == set(tensor_shapes(cfg))
    assert {"model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
            "model.layers.1.post_attention_layernorm.weight", "lm_head.weight",
            "model.norm.weight"} <= set(f.keys())
    q = f.get("model.layers.0.self_attn.q_proj.weight").array
    assert q.shape == (768, 768) and abs(float(q.std()) - 0.02) < 1e-3
    assert np.all(f.get("model.norm.weight").array == 1.0)


def test_same_seed_same_weights_and_tied_embeddings(tmp_path):
    a = write_checkpoint(_small(tmp_path, tie_word_embeddings=True), tmp_path / "a", seed=5)
    b = write_checkpoint(_small(tmp_path, tie_word_embeddings=True), tmp_path / "b", seed=5)
    fa, fb = SafeTensorsFile(a / "model.safetensors"), SafeTensorsFile(b / "model.safetensors")
    assert "lm_head.weight" not in fa
    for k in fa.keys():
        np.testing.assert_array_equal(fa.get(k).array, fb.get(k).array)


def test_transformers_loads_our_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = write_checkpoint(_small(tmp_path), tmp_path / "m", seed=1, shards=2)
    hf = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32)
    ck = Checkpoint(d)
    state = hf.state_dict()
    for name in ck.keys():
        np.testing.assert_array_equal(state[name].numpy(), ck.get(name).array)


def test_read_config_accepts_llama_and_rejects_others(tmp_path):
    write_checkpoint(_small(tmp_path), tmp_path / "ok")
    cfg, rope = read_config(tmp_path / "ok")
    assert cfg.num_key_value_heads == 2 and rope == RopeSpec(10000.0, 16)
    for i, (over, pattern) in enumerate([({"model_type": "gpt2"}, "not Llama-family"),
                          ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
                          ({"attention_bias": True}, "biases"),
                          ({"model_type": "qwen3", "attention_bias": True}, "attention_bias"),
                          ({"mlp_bias": True}, "MLP biases"),
                          ({"model_type": "qwen2", "use_sliding_window": True,
                            "sliding_window": 64}, "sliding-window"),
                          ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_type 'yarn'")]):
        bad = tmp_path / f"bad{i}"
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps(SMALL | over))
        with pytest.raises(ConfigError, match=pattern):
            read_config(bad)
    with pytest.raises(ConfigError, match="no such model directory"):
        read_config(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        read_config(tmp_path / "empty")


def test_checkpoint_that_does_not_match_its_config(tmp_path):
    d = write_checkpoint(_small(tmp_path), tmp_path / "m")
    cfg, _ = read_config(d)
    ck = Checkpoint(d)
    tensors = {k: np.array(v.array) for k, v in ck.items()}
    WeightReader(ck, cfg)  # intact: fine
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ShapeError, match="lacks model.layers.1.mlp.up_proj.weight"):
        WeightReader(Checkpoint(d), cfg)
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((128, 63), np.float32)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ShapeError, match=r"has shape \[128, 63\], config.json implies \[128, 64\]"):
        WeightReader(Checkpoint(d), cfg)
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="truncated"):
        Checkpoint(d)
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        Checkpoint(d)


def test_bf16_checkpoint_reads_back_close(tmp_path):
    d = write_checkpoint(_small(tmp_path), tmp_path / "m", seed=2, bf16=True)
    f32 = write_checkpoint(_small(tmp_path), tmp_path / "f", seed=2)
    a, b = Checkpoint(d), Checkpoint(f32)
    w = "model.layers.0.self_attn.k_proj.weight"
    assert a.get(w).dtype == "BF16"
    np.testing.assert_allclose(a.get(w).to_f32(), b.get(w).array, rtol=2 ** -8, atol=0)


def test_unknown_config_name():
    with pytest.raises(ConfigError, match="unknown model 'nope'"):
        write_checkpoint("nope", "/nonexistent/x")


def test_rope_tables_match_transformers():
    torch = pytest.importorskip("torch")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    for name in ("llama-3.2-1b", "llama-160m"):
        raw = json.loads(json.dumps(load_model_config(name).__dict__))
        raw.pop("name")
        raw["max_position_embeddings"] = 131072
        hf_cfg = LlamaConfig(**raw)
        spec = rope_spec(raw, head_dim=raw["head_dim"], source=name)
        if spec.kind == "llama3":
            ref, _ = rope_utils._compute_llama3_parameters(hf_cfg, torch.device("cpu"))
        else:
            ref = 1.0 / (spec.theta ** (torch.arange(0, spec.head_dim, 2).float() / spec.head_dim))
        np.testing.assert_allclose(inv_freq(spec), ref.numpy(), rtol=1e-6)
    spec = rope_spec({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0}},
                     head_dim=8, source="x")
    assert spec.theta == 100.0 and spec.kind == "linear"
    cos, sin = cos_sin(spec, 5)
    assert cos.shape == sin.shape == (5, 4) and np.all(cos[0] == 1) and np.all(sin[0] == 0)
