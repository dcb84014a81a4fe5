"""`sandwichc tune-kernel` (issue 3): the template search on fake timings, the CLI's errors,
the reference check, and one real tuning run of the shipped GEMM."""

import json

import pytest

from sandwich.cli import main
from sandwich.errors import BuildError, ConfigError
from sandwich.tuner.template_search import (
    KernelTemplate,
    Outcome,
    search,
    start_point,
)

XY = {"x": (0, 1, 2, 3, 4), "y": (0, 1, 2)}


def template(doms=XY, valid=lambda p: True):
    return KernelTemplate("fake", doms, valid)


def bowl(opt):
    """A convex fake landscape with its minimum (1 ms) at `opt`; it records the visits."""
    seen = []

    def measure(p):
        seen.append((p["x"], p["y"]))
        return Outcome(1.0 + sum((p[k] - opt[k]) ** 2 for k in opt))
    return measure, seen


def test_coordinate_descent_visits_the_expected_points_then_stops_at_the_optimum():
    measure, seen = bowl({"x": 4, "y": 0})
    res = search(template(), measure=measure, trials=8)
    # median start, both x neighbours, both y neighbours, and so on until a sweep gains nothing
    assert seen == [(2, 1), (1, 1), (3, 1), (3, 0), (3, 2), (2, 0), (4, 0), (4, 1)]
    assert res.best.params == {"x": 4, "y": 0} and res.best.outcome.ms == 1.0
    assert [t.phase for t in res.history][:2] == ["start", "move"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finds_optimum_of_a_convex_landscape_and_restarts_until_the_budget_is_spent(seed):
    doms = {"a": (1, 2, 4, 8, 16, 32, 64), "b": (8, 16, 32, 64, 128), "c": (1, 2, 3, 4)}
    opt = {"a": 64, "b": 8, "c": 1}
    res = search(template(doms), seed=seed, trials=30,
                 measure=lambda p: Outcome(1.0 + sum((doms[k].index(p[k]) - doms[k].index(v)) ** 2
                                                     for k, v in opt.items())))
    assert res.best.params == opt
    assert len(res.history) == 30 and "restart" in {t.phase for t in res.history}
    assert len({tuple(sorted(t.params.items())) for t in res.history}) == 30  # no point twice


def test_invalid_points_are_skipped_without_counting_and_a_small_space_is_exhausted():
    valid = lambda p: (p["x"] + p["y"]) % 2 == 0  # noqa: E731
    measure, seen = bowl({"x": 4, "y": 2})
    res = search(template(valid=valid), measure=measure, trials=100)
    assert all(valid({"x": x, "y": y}) for x, y in seen)
    assert len(seen) == len(res.history) == 8  # every valid point once, then the space is spent
    assert res.best.params == {"x": 4, "y": 2}


def test_start_is_the_valid_point_nearest_the_median():
    assert start_point(template()) == {"x": 2, "y": 1}
    assert start_point(template(valid=lambda p: p["x"] != 2)) in ({"x": 1, "y": 1},
                                                                  {"x": 3, "y": 1})
    assert start_point(template(valid=lambda p: False)) is None
    assert search(template(valid=lambda p: False), measure=None, trials=5).history == []


def test_failed_builds_and_wrong_outputs_count_but_never_win():
    def measure(p):
        if p["x"] == 1:
            raise BuildError("TVM failed to compile the kernel: boom")
        if p["x"] == 3:
            return Outcome(None, "wrong", "output C differs from the reference")
        return Outcome(10.0 - p["x"])

    res = search(template({"x": (0, 1, 2, 3, 4)}), measure=measure, trials=5)
    status = {t.params["x"]: t.outcome.status for t in res.history}
    assert status == {2: "ok", 1: "failed", 3: "wrong", 0: "ok", 4: "ok"}
    assert res.best.params == {"x": 4}
    assert [t.params["x"] for t in res.ranked(5)] == [4, 2, 0]


@pytest.mark.parametrize("argv, message", [
    (["rmsnorm", "--shape", "M=4", "--shape", "N=8"], "has no tunables"),
    (["gemm", "--shape", "M=4", "--shape", "N=64"], "give --shape for K"),
    (["gemm", "--shape", "M=4", "--shape", "Q=1"], "no scalar parameter 'Q'"),
    (["gemm", "--shape", "mu_m=4"], "mu_m is a tunable"),
    (["gemm", "--shape", "M=4", "--shape", "N=64", "--shape", "K=8", "--pin", "zz=1"],
     "no tunable 'zz'"),
    (["gemm", "--shape", "M=4", "--shape", "N=64", "--shape", "K=8", "--pin", "mu_m=3"],
     "not in its domain"),
    (["gemm", "--shape", "M=4", "--shape", "N=10", "--shape", "K=8"],
     "no tunable values satisfy its constraints"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    assert main(["tune-kernel", *argv, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sandwichc: error: ") and message in err and err.count("\n") == 1


def test_interpreter_reference_needs_small_shapes(tmp_path):
    from sandwich.dsl.load import load_file
    from sandwich.tuner.tune_cases import interpreter_case

    src = tmp_path / "k.sw"
    src.write_text("kernel k(tunable i32 mu in {1, 2}, i32 n, f32 a[n], f32 b[n]) {\n"
                   "  for (i32 i = 0; i < n; i++) { b[i] = a[i] * 2.0; } }\n")
    case = interpreter_case(load_file(src).kernels[0], vlen=8)
    args = case.args({"n": 5}, {}, {"mu": 1})
    assert args["b"].shape == (5,) and all(x != x for x in args["b"])  # outputs start NaN
    assert (case.reference({"n": 5}, {}, args, {"mu": 1})["b"] == 2 * args["a"]).all()
    with pytest.raises(ConfigError, match="small shapes"):
        case.args({"n": 10**6}, {}, {"mu": 1})


@pytest.mark.tvm
def test_a_point_with_wrong_output_is_reported_not_timed():
    pytest.importorskip("tvm")
    from sandwich.dsl.load import load_kernel
    from sandwich.tuner.tune_cases import GEMM
    from sandwich.tuner.tune_kernel import BUDGETS, DslMeasure

    shapes = {"M": 3, "N": 32, "K": 8}
    m = DslMeasure(load_kernel("gemm"), GEMM, shapes, BUDGETS["tiny"],
                   build=lambda p: (lambda *args: None))  # "runs", never writes C
    out = m({"pack_n": 16})
    assert out.status == "wrong" and out.ms is None and "output C" in out.error


@pytest.mark.tvm
def test_tune_kernel_end_to_end_on_the_shipped_gemm(tmp_path, capsys):
    pytest.importorskip("tvm")
    from sandwich.compiler.target import detect_cpu
    from sandwich.dsl.load import load_kernel
    from sandwich.dsl.space import domains, is_valid

    out, so = tmp_path / "best.json", tmp_path / "best.so"
    assert main(["tune-kernel", "gemm", "--shape", "M=8", "N=64", "--shape", "K=64",
                 "--budget", "tiny", "--trials", "3", "--threads", "2", "--seed", "1",
                 "--json", str(out), "--out", str(so), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "GFLOPS" in text and "rank" in text
    data = json.loads(out.read_text())
    assert data["kernel"] == "gemm" and data["shape"] == {"M": 8, "N": 64, "K": 64}
    assert data["threads"] == 2 and data["trials"] == len(data["history"]) == 3
    best = data["best"]["params"]
    assert data["best"]["ms"] == min(h["ms"] for h in data["history"] if h["status"] == "ok")
    vlen = detect_cpu().lanes_f32
    doms = domains(load_kernel("gemm"), vlen=vlen)
    assert all(best[k] in doms[k] for k in doms) and is_valid(load_kernel("gemm"), best, vlen=vlen)
    assert so.stat().st_size > 0
