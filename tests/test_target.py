import json
import os
import re
from pathlib import Path

import pytest

from sandwich.compiler.target import detect_cpu


def _snapshot(root: Path, flags: str, l3: str = "32768K") -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n")
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                             (2, "Unified", "2048K"), (3, "Unified", l3)]):
        d = root / f"sys/devices/system/cpu/cpu0/cache/index{i}"
        d.mkdir(parents=True)
        for name, val in (("level", level), ("type", kind), ("size", size),
                          ("coherency_line_size", 64)):
            (d / name).write_text(f"{val}\n")
    return root


def test_avx512_amx_host(tmp_path):
    cpu = detect_cpu(_snapshot(tmp_path, "fma avx avx2 avx512f avx512bw amx_tile avx512_bf16"),
                     llvm_cpu="generic")
    assert cpu.isa == "avx512" and cpu.lanes_f32 == 16 and cpu.vector_registers == 32
    assert "+amx-tile" in cpu.mattr and "+avx512bf16" in cpu.mattr
    assert cpu.mcpu == "sapphirerapids"  # generic is replaced: it would drop AVX-512
    assert (cpu.l1d_bytes, cpu.l2_bytes, cpu.l3_bytes) == (48 * 1024, 2 << 20, 32 << 20)
    d = cpu.target_dict(2)
    assert d["kind"] == "llvm" and d["num-cores"] == 2 and "+avx512f" in d["mattr"]


def test_avx2_host_and_named_cpu(tmp_path):
    cpu = detect_cpu(_snapshot(tmp_path, "sse4_2 avx avx2 fma"), llvm_cpu="znver2")
    assert cpu.isa == "avx2" and cpu.lanes_f32 == 8 and cpu.vector_registers == 16
    assert cpu.mcpu == "znver2"
    assert not any(a.startswith("+avx512") for a in cpu.mattr)


def test_neon_host(tmp_path):
    root = tmp_path / "arm"
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm\n")
    cpu = detect_cpu(root, llvm_cpu="generic")
    assert cpu.arch == "aarch64" and cpu.isa == "neon" and cpu.lanes_f32 == 4


def test_fingerprint_depends_on_flags(tmp_path):
    a = detect_cpu(_snapshot(tmp_path / "a", "avx2 fma"), llvm_cpu="haswell")
    b = detect_cpu(_snapshot(tmp_path / "b", "avx2 fma avx512f"), llvm_cpu="haswell")
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == detect_cpu(tmp_path / "a", llvm_cpu="haswell").fingerprint()


def test_live_host_has_a_vector_isa():
    cpu = detect_cpu()
    assert cpu.cores >= 1 and cpu.lanes_f32 >= 4


# Flag lines of KVM guests of each kind the project's machines have been (vector families only,
# as /proc/cpuinfo spells them), and what LLVM's host detection called the CPU there.
SPR_AMX = ("fma avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 "
           "avx512_fp16 avx_vnni amx_bf16 amx_tile amx_int8 avx512_vbmi2 vaes", "GenuineIntel")
ZEN4 = ("fma avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 "
        "avx512_vbmi2 vaes", "AuthenticAMD")
ZEN5 = ZEN4[0] + " avx_vnni avx512_vp2intersect", "AuthenticAMD"
ZEN3 = "fma avx avx2 vaes vpclmulqdq", "AuthenticAMD"


def _kind(root: Path, kind: tuple[str, str]) -> Path:
    _snapshot(root, kind[0])
    info = root / "proc/cpuinfo"
    info.write_text(info.read_text().replace("processor\t: 0\n",
                                             f"processor\t: 0\nvendor_id\t: {kind[1]}\n"))
    return root


@pytest.mark.parametrize("kind, reported, want", [
    (SPR_AMX, "rocketlake", "sapphirerapids"),  # issue 30: family 6 model 167 under KVM
    (SPR_AMX, "sapphirerapids", "sapphirerapids"),
    (SPR_AMX, "generic", "sapphirerapids"),
    (ZEN4, "znver4", "znver4"),
    (ZEN4, "znver3", "znver4"),  # an older LLVM's name would drop AVX-512
    (ZEN4, "generic", "znver4"),
    (ZEN5, "znver5", "znver5"),
    (ZEN5, "generic", "znver5"),
    (ZEN3, "znver3", "znver3"),
    (ZEN3, "znver4", "znver3"),  # a name enabling AVX-512 the CPU lacks would fault
    (ZEN3, "generic", "znver3"),
    (ZEN3, "futurecpu", "futurecpu"),  # a name this table does not know is taken as it is
])
def test_the_target_is_named_by_the_flags_when_the_reported_name_contradicts_them(
        tmp_path, kind, reported, want):
    cpu = detect_cpu(_kind(tmp_path, kind), llvm_cpu=reported)
    assert cpu.mcpu == want
    assert cpu.mcpu_reported == ("" if reported in (want, "generic") else reported)


def test_info_on_snapshots_names_the_target_and_what_was_reported(tmp_path, capsys):
    from sandwich.cli import main

    for name, kind, want in (("spr", SPR_AMX, "sapphirerapids"), ("zen4", ZEN4, "znver4"),
                             ("zen5", ZEN5, "znver5")):
        root = _kind(tmp_path / name, kind)
        assert main(["info", "--root", str(root), "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["mcpu"] == want and d["target"]["mcpu"] == want and "mcpu_reported" not in d
    assert main(["info", "--root", str(tmp_path / "spr"), "--llvm-cpu", "rocketlake"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^mcpu\s+sapphirerapids$", out, re.M)
    assert re.search(r"^mcpu_reported\s+rocketlake \(.*not used\)$", out, re.M)
    assert main(["info", "--root", str(tmp_path / "nothing")]) == 1  # one error line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no proc/cpuinfo" in err[0]


def test_kernel_cache_key_depends_on_the_l2_size(tmp_path):
    """The family's kernels are built with the L2 size (their row chunks) and their schedules
    timed on it: two CPUs of one target and flags that differ in L2 share no kernels."""
    import dataclasses

    from sandwich.tuner.kernel_cache import cache_fingerprint

    a = detect_cpu(_snapshot(tmp_path / "a", "avx2 fma"), llvm_cpu="haswell")
    b = dataclasses.replace(a, l2_bytes=a.l2_bytes // 2)
    assert a.fingerprint() == b.fingerprint()  # same target, flags and TVM
    assert cache_fingerprint(a) != cache_fingerprint(b)
    assert cache_fingerprint(a) == cache_fingerprint(dataclasses.replace(a))


def test_kernel_cache_key_depends_on_the_timing_method(tmp_path, monkeypatch):
    """Records timed another way (before: large weights hot at prefill's M) ranked schedules
    on other terms, so a cache tuned so is searched again, not reused."""
    from sandwich.tuner import streaming
    from sandwich.tuner.kernel_cache import cache_fingerprint

    cpu = detect_cpu(_snapshot(tmp_path / "a", "avx2 fma"), llvm_cpu="haswell")
    before = cache_fingerprint(cpu)
    monkeypatch.setattr(streaming, "TIMING_VERSION", streaming.TIMING_VERSION + 1)
    assert cache_fingerprint(cpu) != before


def test_importing_the_package_sizes_tvms_pool_to_the_cpus_it_may_use():
    """Without TVM_NUM_THREADS, TVM on x86 sizes its pool to half the CPUs and reads
    /sys/devices/system/cpu/online on every parallel launch; importing sandwich sets it to
    the process's CPUs first, and leaves a value the user gave alone."""
    import subprocess
    import sys

    code = ("import os, sandwich, tvm; "
            "print(os.environ['TVM_NUM_THREADS'], tvm.get_global_func('runtime.NumThreads')())")
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    cpus = len(os.sched_getaffinity(0))
    for given, want in ((None, cpus), ("1", 1)):
        run_env = env if given is None else {**env, "TVM_NUM_THREADS": given}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(want), str(want)], out.stdout
