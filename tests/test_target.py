from pathlib import Path

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
