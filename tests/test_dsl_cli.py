"""`sandwichc ir`: the dsl subcommand prints IR and reports bad sources as DSLError."""

import argparse

import pytest

from sandwich.cli.dsl import register
from sandwich.dsl.errors import DSLSyntaxError
from sandwich.dsl.highlevel.transform import parse as parse_high
from sandwich.dsl.lowlevel.transform import parse as parse_low
from sandwich.errors import SandwichError


def run(argv):
    parser = argparse.ArgumentParser(prog="sandwichc")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_ir_prints_high_level_by_default(capsys):
    assert run(["ir", "rmsnorm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def rmsnorm(") and "for i in parallel(M):" in out
    parse_high(out)


def test_ir_prints_low_level(capsys, tmp_path):
    src = tmp_path / "k.sw"
    src.write_text("kernel k(tunable i32 mu in {1, 2}, i32 n, f32 a[n]) {\n"
                   "  vectorize for (i32 i = 0; i < n; i += mu) { a[i] = 0.0; } }")
    assert run(["ir", str(src), "--level", "low"]) == 0
    out = capsys.readouterr().out
    assert "tunable i32 mu in {1, 2}" in out and "vectorize for (i32 i = 0; i < n; i += mu)" in out
    assert parse_low(out) == parse_low(src.read_text())


def test_ir_reports_bad_source_as_project_error(tmp_path):
    src = tmp_path / "bad.sw"
    src.write_text("kernel k() {\n  f32 x = ;\n}\n")
    with pytest.raises(DSLSyntaxError, match=r"bad.sw:2:11: syntax error"):
        run(["ir", str(src)])


def test_ir_unknown_file_is_project_error():
    with pytest.raises(SandwichError, match="no such file"):
        run(["ir", "does-not-exist.sw"])


def test_compile_refuses_missing_and_unknown_params(tmp_path):
    out = str(tmp_path / "k.so")
    with pytest.raises(SandwichError, match="missing n_d"):
        run(["compile", "decode_attention", "--param", "b_kv=16", "--param", "n_split=2",
             "-o", out])
    with pytest.raises(SandwichError, match="no tunable or scalar parameter 'zz'"):
        run(["compile", "rmsnorm", "--param", "zz=1", "-o", out])
    with pytest.raises(SandwichError, match="must be an integer"):
        run(["compile", "rmsnorm", "--param", "N=1.5", "-o", out])
    with pytest.raises(SandwichError, match="name=value"):
        run(["compile", "rmsnorm", "--param", "N", "-o", out])


@pytest.mark.tvm
def test_compile_writes_a_loadable_kernel(tmp_path, capsys):
    pytest.importorskip("tvm")
    from sandwich.compiler.build import load_function

    out = tmp_path / "silu.so"
    assert run(["compile", "silu_mul", "--param", "N=32", "-o", str(out)]) == 0
    assert "silu_mul" in capsys.readouterr().out
    assert load_function(out) is not None
