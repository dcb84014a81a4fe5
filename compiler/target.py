"""Host CPU -> TVM target (JSON form, explicit mcpu/mattr from the CPU flags) and its fingerprint.

TVM's bundled LLVM rejects `mcpu=native` and falls back to a generic CPU without AVX-512,
so the ISA is read from /proc/cpuinfo and spelled out.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

# (cpu flag, llvm attribute) in the order they imply wider vectors
_X86_ATTRS = [
    ("sse4_2", "+sse4.2"), ("avx", "+avx"), ("avx2", "+avx2"), ("fma", "+fma"), ("f16c", "+f16c"),
    ("avx512f", "+avx512f"), ("avx512bw", "+avx512bw"), ("avx512dq", "+avx512dq"),
    ("avx512vl", "+avx512vl"), ("avx512cd", "+avx512cd"), ("avx512_vnni", "+avx512vnni"),
    ("avx512_bf16", "+avx512bf16"), ("avx512_fp16", "+avx512fp16"),
    ("amx_tile", "+amx-tile"), ("amx_bf16", "+amx-bf16"), ("amx_int8", "+amx-int8"),
]
# The widest vector family a CPU has, by its flags, widest first. A hypervisor may report a
# model whose LLVM name contradicts the flags (an AMX Sapphire Rapids seen as family 6 model
# 167, "rocketlake"); -mcpu then enables or omits whole families, so the name is checked.
_FAMILIES = ("amx_tile", "avx512_bf16", "avx512f", "avx2")
# LLVM x86 CPU names by the widest family they enable (a name not listed is taken as it is)
_LLVM_FAMILY = {
    "amx_tile": {"sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
                 "diamondrapids"},
    "avx512_bf16": {"cooperlake", "znver4", "znver5"},
    "avx512f": {"knl", "knm", "skylake-avx512", "cascadelake", "cannonlake", "icelake-client",
                "icelake-server", "tigerlake", "rocketlake", "x86-64-v4"},
    "avx2": {"haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
             "arrowlake", "arrowlake-s", "lunarlake", "gracemont", "sierraforest", "grandridge",
             "clearwaterforest", "znver1", "znver2", "znver3", "bdver4", "x86-64-v3"},
}
_GENERIC = ("generic", "", "x86-64")


@dataclass(frozen=True)
class CpuInfo:
    """What the kernels are shaped by: ISA, vector width, register count, caches, cores."""

    arch: str
    model: str
    mcpu: str
    mattr: tuple[str, ...]
    isa: str  # "avx512" | "avx2" | "neon" | "scalar"
    vector_bits: int
    vector_registers: int
    cache_line: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    cores: int
    flags: tuple[str, ...]
    mcpu_reported: str = ""  # LLVM's host name when it contradicted the flags and was replaced

    @property
    def lanes_f32(self) -> int:
        return self.vector_bits // 32

    @property
    def bf16_dot(self) -> bool:
        """Whether the target multiplies bf16 pairs into f32 lanes (vdpbf16ps, avx512_bf16)."""
        return "+avx512bf16" in self.mattr

    @property
    def int8_dot(self) -> bool:
        """Whether the target multiplies 4 unsigned by 4 signed bytes into i32 lanes
        (vpdpbusd, AVX512-VNNI)."""
        return "+avx512vnni" in self.mattr

    @property
    def amx(self) -> bool:
        """Whether the target has AMX tiles with bf16 products (tdpbf16ps: AMX-TILE, AMX-BF16)."""
        return "+amx-tile" in self.mattr and "+amx-bf16" in self.mattr

    @property
    def amx_int8(self) -> bool:
        """Whether the target's AMX tiles multiply bytes too (tdpbsud: AMX-INT8)."""
        return self.amx and "+amx-int8" in self.mattr

    def target_dict(self, threads: int | None = None) -> dict:
        """The TVM target in the dict form that TVM 0.27 accepts."""
        d: dict = {"kind": "llvm", "mcpu": self.mcpu, "num-cores": threads or self.cores}
        if self.mattr:
            d["mattr"] = list(self.mattr)
        if self.arch == "aarch64":
            d["mtriple"] = "aarch64-linux-gnu"
        return d

    def fingerprint(self) -> str:
        """Hash of TVM version + target + flags: records from another CPU or TVM never match."""
        import tvm

        payload = json.dumps({"tvm": tvm.__version__, "target": self.target_dict(1),
                              "flags": sorted(self.flags)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _cpuinfo(root: Path) -> tuple[str, set[str], bool]:
    """(model name, flags of the first processor, whether its vendor is AMD)."""
    model, flags, amd = "unknown", set(), False
    try:
        text = (root / "proc/cpuinfo").read_text()
    except OSError:
        return model, flags, amd
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and model == "unknown":
            model = val.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(val.split())
        elif key == "vendor_id":
            amd = amd or val.strip() == "AuthenticAMD"
    return model, flags, amd


def llvm_cpu_for(reported: str, flags: set[str], *, amd: bool) -> str:
    """The -mcpu to build for: LLVM's host name when the vector family it enables is the one
    the flags show, else a name chosen by the flags. A name not in _LLVM_FAMILY (a newer CPU,
    or one without AVX2) is kept: -mattr spells out every family the flags show anyway."""
    have = next((f for f in _FAMILIES if f in flags), None)
    named = next((f for f in _FAMILIES if reported in _LLVM_FAMILY[f]), None)
    if reported not in _GENERIC and (named is None or named == have):
        return reported
    return _by_flags(have, flags, amd=amd)


def _by_flags(have: str | None, flags: set[str], *, amd: bool) -> str:
    """An LLVM name for the widest vector family the flags show."""
    if have is None:
        return "nehalem" if "sse4_2" in flags else "x86-64"
    if amd and have != "amx_tile":  # Zen 5 has VP2INTERSECT and AVX-VNNI, Zen 4 neither
        if have == "avx2":
            return "znver3" if "vaes" in flags else "znver2"
        return "znver5" if {"avx512_vp2intersect", "avx_vnni"} & flags else "znver4"
    if have == "amx_tile":
        return "graniterapids" if "amx_fp16" in flags else "sapphirerapids"
    if have == "avx512_bf16":
        return "cooperlake"
    if have == "avx512f":
        return ("icelake-server" if "avx512_vbmi2" in flags else
                "cascadelake" if "avx512_vnni" in flags else "skylake-avx512")
    return "haswell"


def _size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * mult


def _caches(root: Path) -> dict[str, int]:
    out = {"line": 64, "l1d": 32 * 1024, "l2": 1024 * 1024, "l3": 0}
    base = root / "sys/devices/system/cpu/cpu0/cache"
    for idx in sorted(base.glob("index*")):
        try:
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = _size((idx / "size").read_text())
            out["line"] = int((idx / "coherency_line_size").read_text() or 64)
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        out[{1: "l1d", 2: "l2", 3: "l3"}.get(level, "l3")] = size
    return out


def _llvm_cpu() -> str:
    try:
        import tvm

        return str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:  # pragma: no cover - only without a TVM build
        return "generic"


def detect_cpu(root: str | Path = "/", *, llvm_cpu: str | None = None) -> CpuInfo:
    """Read the host (or a snapshot laid out like `/`) and derive the kernel-relevant facts."""
    root = Path(root)
    model, flags, amd = _cpuinfo(root)
    arch = platform.machine() if str(root) == "/" else ("aarch64" if "asimd" in flags else "x86_64")
    caches = _caches(root)
    cores = len(os.sched_getaffinity(0)) if str(root) == "/" else os.cpu_count() or 1
    if arch in ("aarch64", "arm64"):
        isa, bits, regs = ("neon", 128, 32) if ("asimd" in flags or not flags) else ("scalar", 32, 32)
        return CpuInfo("aarch64", model, llvm_cpu or "generic", ("+neon",), isa, bits, regs,
                       caches["line"], caches["l1d"], caches["l2"], caches["l3"], cores,
                       tuple(sorted(flags)))
    mattr = tuple(attr for flag, attr in _X86_ATTRS if flag in flags)
    if "avx512f" in flags:
        isa, bits, regs = "avx512", 512, 32
    elif "avx2" in flags:
        isa, bits, regs = "avx2", 256, 16
    else:
        isa, bits, regs = "scalar", 128, 16
    reported = llvm_cpu if llvm_cpu is not None else _llvm_cpu()
    mcpu = llvm_cpu_for(reported, flags, amd=amd)
    return CpuInfo(arch, model, mcpu, mattr, isa, bits, regs, caches["line"], caches["l1d"],
                   caches["l2"], caches["l3"], cores, tuple(sorted(flags)),
                   mcpu_reported=reported if reported not in (mcpu, *_GENERIC) else "")


def tvm_target(cpu: CpuInfo, threads: int):
    """A tvm.target.Target for `threads` worker threads."""
    import tvm

    return tvm.target.Target(cpu.target_dict(threads))


def describe_machine() -> str:
    """One line for benchmark reports: CPU model, -mcpu, ISA, cores and LLC."""
    cpu = detect_cpu()
    return f"{cpu.model} ({cpu.mcpu}, {cpu.isa}, {cpu.cores} cores, L3 {cpu.l3_bytes >> 20} MiB)"
