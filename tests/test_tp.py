"""Tensor parallelism (issue 6): the shared-memory all-reduce with rank-shifted circular
writing across 2 and 3 processes, and TP=2 logits against TP=1 on a Llama-160M-shaped and a
GQA (Llama-3.2-1B-shaped, 2 layers, 2048-token vocabulary) random checkpoint.

TP=1 kernels are tuned as in test_runtime_executor.py (threads=2), the tp=2 payload with
threads=1 (each rank gets one of the two CPUs); `tiny` budget, seq_max=2;
SANDWICHC_TEST_CACHE_DIR keeps them across runs. The Llama-160M test runs the numpy-fallback
non-GEMM ops (a faster start, and it covers the fallback), the GQA test the DSL kernels.
"""

import contextlib
import io
import json
import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from conftest import tuned_checkpoint

from sandwich.errors import ConfigError
from sandwich.models import load_model_config, read_raw_config
from sandwich.runtime.allreduce import AllReduceError, ShmAllReduce
from sandwich.runtime.executor import Executor
from sandwich.runtime.loader import load_model
from sandwich.runtime.shard import shard_config
from sandwich.runtime.tp import TPError, TPExecutor, resolve_cpu_sets

SIZES = [1, 15, 16, 17, 768, 1001, 4099, 5 * 1024 + 3]  # tails, cache-line edges, odd sizes
CAPACITY = 5 * 1024 + 3
PROMPT = [1, 5, 9, 200, 1000, 7, 11, 13]
STEPS = 8


# -- the all-reduce ------------------------------------------------------------------------
def _data(rank: int, call: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 * call + rank).standard_normal(n).astype(np.float32)


def _rank_calls(comm: ShmAllReduce, world: int) -> None:
    """The same sequence on every rank: sums of every size (twice), then a gather."""
    for call, n in enumerate(SIZES * 2):
        x = _data(comm.rank, call, n)
        comm(x)
        want = sum(_data(r, call, n).astype(np.float64) for r in range(world))
        np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    part = np.full((3, 5), comm.rank, np.float32)
    out = np.zeros((3, 5 * world), np.float32) if comm.rank == 0 else None
    comm.gather(part, out)
    if out is not None:
        np.testing.assert_array_equal(out[0], np.repeat(np.arange(world), 5))


def _worker(spec, rank: int, world: int) -> None:
    comm = ShmAllReduce(spec, rank, timeout=30)
    try:
        _rank_calls(comm, world)
    finally:
        comm.close()


@pytest.mark.parametrize("world", [2, 3])
def test_allreduce_equals_numpy_sum(world):
    comm = ShmAllReduce.create(world, CAPACITY, gather=15, timeout=30)
    path = comm.spec.path
    assert comm.spec.block % 16 == 0  # whole cache lines: no two ranks write one line
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(comm.spec, r, world)) for r in range(1, world)]
    for p in procs:
        p.start()
    comm.alive = lambda: next((f"rank {i + 1} exited" for i, p in enumerate(procs)
                               if not p.is_alive() and p.exitcode), None)
    try:
        _rank_calls(comm, world)
    finally:
        for p in procs:
            p.join(30)
        comm.close()
    assert [p.exitcode for p in procs] == [0] * (world - 1)
    assert not os.path.exists(path)  # the segment is unlinked on close


def _exit_early(spec) -> None:
    ShmAllReduce(spec, 1).close()


def test_allreduce_dead_or_silent_peer_is_an_error_not_a_hang():
    ctx = mp.get_context("spawn")
    with ShmAllReduce.create(2, 64, timeout=60) as comm:
        p = ctx.Process(target=_exit_early, args=(comm.spec,))
        p.start()
        comm.alive = lambda: None if p.is_alive() else f"rank 1 exited with code {p.exitcode}"
        t0 = time.monotonic()
        with pytest.raises(AllReduceError, match="rank 1 exited with code 0"):
            comm(np.ones(64, np.float32))
        assert time.monotonic() - t0 < 30
        with pytest.raises(AllReduceError, match="rank 1 exited"):  # broken stays broken
            comm(np.ones(64, np.float32))
    with ShmAllReduce.create(2, 64, timeout=0.2) as comm:  # a peer that never calls
        with pytest.raises(AllReduceError, match=r"waited 0 s at a barrier for ranks \[1\]"):
            comm(np.ones(64, np.float32))


# -- TP=2 against TP=1 ---------------------------------------------------------------------
def _checkpoint(tmp_path_factory, cache, name: str, **over):
    """A 2-layer random checkpoint, tuned for tp=1 (2 threads) and tp=2 (1 thread per rank)."""
    return tuned_checkpoint(tmp_path_factory, cache, name, tp_threads=((1, 2), (2, 1)), **over)


@pytest.fixture(scope="module")
def llama160m(tmp_path_factory, cache):
    return _checkpoint(tmp_path_factory, cache, "llama-160m")


@pytest.fixture(scope="module")
def gqa1b(tmp_path_factory, cache):
    return _checkpoint(tmp_path_factory, cache, "llama-3.2-1b", vocab_size=2048, bos_token_id=1,
                       eos_token_id=2)


def _rel(a, ref) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def _greedy(ex, steps: int = STEPS, prompt=PROMPT) -> tuple[int, list[np.ndarray], list[int]]:
    slot, logits = ex.start(prompt)
    out, toks = [logits.copy()], []
    for _ in range(steps):
        toks.append(int(out[-1].argmax()))
        out.append(ex.decode([slot], [toks[-1]])[0].copy())
    return slot, out, toks


def _tp1(d, cache, ops: str):
    return Executor(load_model(d, cache, threads=2), max_batch=2, max_seq=64, max_tokens=16,
                    ops=ops, threads=2)


@pytest.mark.tvm
def test_tp2_equals_tp1_llama160m_then_a_killed_worker_is_an_error(llama160m, cache):
    ref_ex = _tp1(llama160m, cache, "numpy")
    _, ref, _ = _greedy(ref_ex)
    b_ref = ref_ex.start([42, 17, 99])[1].copy()
    tp = TPExecutor(llama160m, cache, tp=2, max_batch=2, max_seq=64, max_tokens=16, ops="numpy",
                    cpu_sets=[[0], [1]])
    try:
        assert os.sched_getaffinity(tp._procs[0].pid) == {1}  # the worker is pinned
        assert (tp.kv.max_batch, tp.kv.max_seq) == (2, 64)
        slot, got, toks = _greedy(tp)
        errors = [_rel(g, r) for g, r in zip(got, ref, strict=True)]
        assert max(errors) <= 1e-4, errors
        other, logits_b = tp.start([42, 17, 99])
        assert _rel(logits_b, b_ref) <= 1e-4
        both = tp.decode([slot, other], [toks[-1], 5])  # a batched step on both ranks
        assert both.shape == (2, 32000) and np.isfinite(both).all()
        tp.release(other)
        os.kill(tp._procs[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(TPError, match="rank 1"):
            tp.decode([slot], [3])
        assert time.monotonic() - t0 < 20
        with pytest.raises(TPError, match="broken"):
            tp.decode([slot], [3])
    finally:
        tp.close()
    assert not os.path.exists(tp.comm.spec.path)


@pytest.mark.tvm
def test_tp2_equals_tp1_gqa(gqa1b, cache):
    _, ref, _ = _greedy(_tp1(gqa1b, cache, "dsl"))
    with TPExecutor(gqa1b, cache, tp=2, max_batch=2, max_seq=64, max_tokens=16, ops="dsl") as tp:
        assert tp.ex.cfg.num_key_value_heads == 4 and tp.ex.cfg.num_attention_heads == 16
        _, got, _ = _greedy(tp)
    errors = [_rel(g, r) for g, r in zip(got, ref, strict=True)]
    assert max(errors) <= 1e-4, errors


@pytest.mark.tvm
def test_tp2_equals_tp1_qwen2_with_bf16_kv_caches(tmp_path_factory, cache):
    """Each rank adds its own heads' share of Qwen2's q/k/v biases and keeps a bf16 KV cache
    of its heads (rounded as TP = 1 rounds them): llama-160m's shapes, so its tuned kernels."""
    d = _checkpoint(tmp_path_factory, cache, "llama-160m", model_type="qwen2")
    ex = Executor(load_model(d, cache, threads=2), max_batch=2, max_seq=64, max_tokens=16,
                  ops="numpy", threads=2, kv_dtype="bf16")
    _, ref, _ = _greedy(ex, steps=3)
    with TPExecutor(d, cache, tp=2, max_batch=2, max_seq=64, max_tokens=16, ops="numpy",
                    kv_dtype="bf16") as tp:
        assert tp.ex.cfg.qkv_bias and tp.ex.kv.dtype == "bf16"
        full = ex.model.layers[0].qkv_bias  # rank 0 keeps the first half of q's, k's and v's
        want = np.concatenate([full[:384], full[768:768 + 384], full[1536:1536 + 384]])
        np.testing.assert_array_equal(tp.ex.model.layers[0].qkv_bias, want)
        _, got, _ = _greedy(tp, steps=3)
    errors = [_rel(g, r) for g, r in zip(got, ref, strict=True)]
    assert max(errors) <= 1e-4, errors


@pytest.mark.tvm
def test_tp2_int_weights_equal_tp1(tmp_path, cache):
    """Int weights under TP: each rank's share of K is cut from the GGUF's Q4_1 blocks as
    stored (re-quantizing the dequantized share moves the logits by about 2e-2), so TP=2
    gives TP=1's logits."""
    from conftest import tune_model
    from gguf_tiny import TYPES, write_tiny_gguf

    weights = "int4-g32-asym"
    path = write_tiny_gguf(tmp_path / "tiny.gguf", types=dict.fromkeys(TYPES, "Q4_1"))[0]
    tune_model(path, cache, tp=1, threads=2, weights=weights, seq_max=1)
    tune_model(path, cache, tp=2, threads=1, weights=weights, seq_max=1)
    prompt = [1, 5, 9, 200, 100, 7, 11, 13]
    ex = Executor(load_model(path, cache, threads=2, weights=weights), max_batch=1, max_seq=32,
                  max_tokens=16, threads=2)
    _, ref, _ = _greedy(ex, prompt=prompt)
    with TPExecutor(path, cache, tp=2, max_batch=1, max_seq=32, max_tokens=16,
                    weights=weights) as tp:
        assert tp.ex.model.gemms.o.dtype == weights
        _, got, want = _greedy(tp, prompt=prompt)
    errors = [_rel(g, r) for g, r in zip(got, ref, strict=True)]
    assert max(errors) <= 1e-3, errors  # fp32 sums in another order, 8-bit activations alike
    assert _generate_ids(path, cache, "--tp", "2", "--weights", weights,
                         prompt=prompt) == want  # the command line's TP engine reads them too


def _generate_ids(model, cache, *flags, prompt, new_tokens=STEPS) -> list[int]:
    """`sandwichc generate`'s greedy ids; the process is unpinned after (the command pins
    rank 0 until the process exits, atexit; later tests need both CPUs)."""
    from sandwich.cli import main
    from sandwich.runtime.phases import unpin_process

    cpus = tuple(sorted(os.sched_getaffinity(0)))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            assert main(["generate", "--model", str(model), "--cache-dir", str(cache.dir),
                         "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
                         str(new_tokens), "--json", "--threads", "2", *flags]) == 0
    finally:
        unpin_process(cpus)
    return json.loads(out.getvalue())["ids"]


def test_config_errors_come_before_any_process(tmp_path):
    cfg = load_model_config("llama-3.2-1b")
    with pytest.raises(ConfigError, match="does not divide num_attention_heads \\(32\\)"):
        shard_config(cfg, 3)
    with pytest.raises(ConfigError, match="does not divide num_key_value_heads \\(8\\)"):
        shard_config(cfg, 16)
    raw, _ = read_raw_config("llama-160m")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw | {"num_hidden_layers": 1}))
    with pytest.raises(ConfigError, match="tensor-parallel degree 5 does not divide num_attention_heads"):
        TPExecutor(d, tmp_path / "cache", tp=5, max_batch=1, max_seq=8)
    with pytest.raises(ConfigError, match="int4-g128 needs K a multiple of 128, got weight "
                       r"\(K, N\) = \(192, 768\)"):  # o: 3 of 12 heads a rank
        TPExecutor(d, tmp_path / "cache", tp=4, max_batch=1, max_seq=8, weights="int4-g128")
    with pytest.raises(ConfigError, match="needs 2 non-empty CPU sets"):
        resolve_cpu_sets(2, [[0]])


@pytest.mark.tvm
def test_generate_cli_with_tp2_gives_the_tp1_ids(llama160m, cache, capsys):
    from sandwich.cli import main

    ids = [_generate_ids(llama160m, cache, "--tp", tp, "--ops", "numpy", prompt=[1, 5, 9, 200],
                         new_tokens=6) for tp in ("1", "2")]
    assert len(ids[0]) == 6 and ids[0] == ids[1]
    assert main(["generate", "--model", str(llama160m), "--cache-dir", str(cache.dir),
                 "--prompt-ids", "1", "--max-new-tokens", "2", "--tp", "2",
                 "--prefill-config", "x.json"]) == 1
    assert "--prefill-config with --tp > 1" in capsys.readouterr().err
