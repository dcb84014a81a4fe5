"""Shared test setup: TVM's thread pool is sized from TVM_NUM_THREADS when it starts; the
runtime tests share one way to get a tuned kernel cache and a small random checkpoint."""

import json
import os

import pytest

os.environ.setdefault("TVM_NUM_THREADS", "2")


# the test files that took longest on a 2-core Zen 3 (2026-11-29, junit times, slowest
# first): `make test` hands files to its two workers in this order (--no-loadscope-reorder),
# so that no long file starts last while the other worker idles; files not named follow
SLOW_FIRST = ("test_quant_gemm", "test_schedule", "test_tp", "test_runtime_executor", "test_gguf",
              "test_plan", "test_rpc", "test_cli_resume", "test_topology_hwloc", "test_rpc_kill",
              "test_cli_bench", "test_cache_ab", "test_http_server", "test_gemm_dsl",
              "test_bf16_gemm", "test_engine", "test_dsl_fuzz", "test_baselines_metaschedule",
              "test_static_loop", "test_topology_parse", "test_moe", "test_qwen_moe")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: file order kept


@pytest.fixture(scope="session", autouse=True)
def shared_builds(tmp_path_factory):
    """Every kernel the run compiles, kept by its source for every worker and every command
    the tests start ($SANDWICHC_BUILD_CACHE, compiler/build.compile_source): the command-line
    tests tune the same small shapes into kernel caches of their own, and each compiled the
    same kernels again (compiling was about 40% of the suite's time on a Zen 3)."""
    if not os.environ.get("SANDWICHC_BUILD_CACHE"):
        base = tmp_path_factory.getbasetemp()
        d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "builds"
        d.mkdir(exist_ok=True)
        os.environ["SANDWICHC_BUILD_CACHE"] = str(d)
    return os.environ["SANDWICHC_BUILD_CACHE"]


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One kernel cache for the whole run: modules that tune the same shapes resume from the
    records another module stored instead of tuning again (tests that need an empty or a
    broken cache make their own). SANDWICHC_TEST_CACHE_DIR keeps its kernels across runs."""
    from sandwich.runtime import KernelCache

    return KernelCache(os.environ.get("SANDWICHC_TEST_CACHE_DIR") or _run_dir(tmp_path_factory))


def _run_dir(tmp_path_factory):
    """A directory for the whole run: under pytest-xdist each worker process has its own
    base temp, and the workers share their parent's (the cache takes concurrent tunes)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.mktemp("kernels")
    d = tmp_path_factory.getbasetemp().parent / "kernels"
    d.mkdir(exist_ok=True)
    return d


def tuned_checkpoint(tmp_path_factory, cache, name: str, *, tp_threads=((1, 2),), **over):
    """A 2-layer random checkpoint of embedded model `name` (config fields overridden), with
    its GEMMs tuned at the `tiny` budget for each (tp, threads); seq_max=2 suffices, since
    larger M reuse the M=2 schedule."""
    from sandwich.models import read_raw_config
    from sandwich.runtime.checkpoint import write_checkpoint

    raw, _ = read_raw_config(name)
    cfg_path = tmp_path_factory.mktemp("cfg") / "config.json"
    cfg_path.write_text(json.dumps(raw | {"num_hidden_layers": 2} | over))
    d = write_checkpoint(cfg_path, tmp_path_factory.mktemp(name), seed=7, norm_std=0.1)
    for tp, threads in tp_threads:
        tune_model(d, cache, tp=tp, threads=threads)
    return d


def tune_model(model, cache, *, tp=1, threads=2, budget="tiny", weights="fp32", seq_max=2):
    """Tune every GEMM of a model (directory or GGUF file) at seq_max=2 (or 1: half the
    tuning) for one weight format: larger M reuse the largest M's schedule."""
    from sandwich.models import load_model_config
    from sandwich.payload import make_payload
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.tune import tune_op, unique_shapes

    payload = make_payload(load_model_config(model), tp=tp, seq_max=seq_max, weights=weights)
    for names, op in unique_shapes(payload):
        tune_op(names=names, op=op, seq_max=seq_max, threads=threads, budget=get_budget(budget),
                cache=cache)


@pytest.fixture()
def tiny_config(tmp_path):
    """A one-layer Llama config.json (tests/cli_run.py: TINY), for the command-line tests."""
    from cli_run import TINY

    f = tmp_path / "config.json"
    f.write_text(json.dumps(TINY))
    return f
