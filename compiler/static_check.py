"""A static check of a GEMM kernel's hot loop: cross-compile for a named CPU, run llvm-mca.

Timing a kernel needs the CPU; reading its innermost loop does not. llvm-mca's model of
the named CPU says how many cycles the loop takes per iteration, and the same model says
how fast that many independent FMAs could go, so a loop slowed by spills, extra loads or
index arithmetic shows on any machine (an AMD host guards the Intel builds too). A bf16 or
int family is built as it is for that CPU, with vdpbf16ps or vpdpbusd where the CPU has
them, and those count as the loop's products.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sandwich.compiler.llvm_splice import splice_module
from sandwich.compiler.target import CpuInfo, tvm_target
from sandwich.errors import BuildError, ToolError, first_line
from sandwich.types import KernelSchedule

TOLERANCE = 1.10  # the loop may take at most 10% more cycles than its FMAs alone
ITERATIONS = 200
_TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-linux-gnu"}
_COMMENTS = {"x86_64": "#", "aarch64": "//"}  # AArch64 writes immediates as #4
# the loop's product instructions: FMAs, and the dot products that replace them for bf16
# (vdpbf16ps) and int weights on 8-bit activations (vpdpbusd) where the CPU has them
_FMA = {"x86_64": re.compile(r"^\s*(vfn?madd\d+p[sd]|vdpbf16ps|vpdpbusds?|vpdpwssds?)\s"),
        "aarch64": re.compile(r"^\s*fmla\s")}
_LABEL = re.compile(r"^([.\w$]+):")
_BRANCH = re.compile(r"^\s*(j\w+|b\.\w+|b|cbn?z|tbn?z)\s+(?:.*,\s*)?([.\w$]+)\s*$")
# a stack slot: x86 (%rsp), AArch64 [sp]; and the frame pointer's (%rbp), [x29] when the
# function sets one up (else it is one more general register, e.g. a pointer into A). An
# lea only computes an address.
_STACK = {"x86_64": re.compile(r"\(%rsp\b"), "aarch64": re.compile(r"\[sp\b")}
_FRAME = {"x86_64": re.compile(r"\(%r[sb]p\b"), "aarch64": re.compile(r"\[(sp|x29)\b")}
_SET_FRAME = {"x86_64": re.compile(r"^\s*movq\s+%rsp,\s*%rbp\s*$", re.M),
              "aarch64": re.compile(r"^\s*(mov\s+x29,\s*sp|add\s+x29,\s*sp\b)", re.M)}
_LEA = re.compile(r"^\s*lea")
_SIGN_EXT = re.compile(r"^\s*(movslq|cltq|sxtw|sbfiz\s.*#32$)")


@dataclass(frozen=True)
class LoopCheck:
    """llvm-mca's verdict on one kernel's hot loop for one CPU model."""

    target: str  # LLVM CPU name
    tile: str  # mu_m x mu_n
    cycles_per_iter: float
    fma_bound: float  # cycles per iteration of the loop's FMAs (or dot products) alone
    fmas: int
    products: tuple[str, ...]  # the mnemonics of those instructions, e.g. ("vdpbf16ps",)
    spills: tuple[str, ...]  # loop instructions that touch a stack slot
    sign_extensions: int  # 32-bit index widenings inside the loop
    mca_version: str

    @property
    def ratio(self) -> float:
        return self.cycles_per_iter / self.fma_bound

    @property
    def ok(self) -> bool:
        return self.ratio <= TOLERANCE and not self.spills


def cpu_for(name: str, arch: str = "x86_64") -> CpuInfo:
    """A CpuInfo for LLVM CPU `name`, its vector features as LLVM's own model lists them
    (so a foreign CPU is built as detect_cpu would build it on that CPU)."""
    import tvm
    from tvm.target import codegen

    try:
        valid = codegen.llvm_is_valid_cpu(name, _TRIPLES[arch])
    except Exception:  # a TVM built without that LLVM backend
        valid = False
    if not valid:
        raise ToolError(f"TVM's LLVM {codegen.llvm_version_major()} has no CPU named {name} "
                        f"for {arch}")
    if arch == "aarch64":
        return CpuInfo("aarch64", name, name, ("+neon",), "neon", 128, 32, 64, 64 << 10,
                       1 << 20, 0, 1, ())
    target = tvm.target.Target({"kind": "llvm", "mcpu": name})
    feats = codegen.llvm_get_cpu_features(target)
    mattr = tuple(sorted(f"+{f}" for f in feats if f.startswith(("avx", "fma", "f16c", "amx"))))
    isa, bits, regs = (("avx512", 512, 32) if "avx512f" in feats else
                       ("avx2", 256, 16) if "avx2" in feats else ("scalar", 128, 16))
    return CpuInfo("x86_64", name, name, mattr, isa, bits, regs, 64, 48 << 10, 2 << 20, 0, 1,
                   ())


def find_llvm_mca() -> tuple[str, str]:
    """(path, version) of the newest llvm-mca on PATH: llvm-mca-NN first, then llvm-mca."""
    found: dict[int, str] = {}
    for d in os.environ.get("PATH", "").split(os.pathsep):
        for p in Path(d or ".").glob("llvm-mca-[0-9]*"):
            if p.name[9:].isdigit() and os.access(p, os.X_OK):
                found.setdefault(int(p.name[9:]), str(p))
    plain = [str(p) for d in os.environ.get("PATH", "").split(os.pathsep)
             if os.access(p := Path(d or ".") / "llvm-mca", os.X_OK)]
    for path in [found[v] for v in sorted(found, reverse=True)] + plain[:1]:
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"LLVM version (\S+)", out)
        if m:
            return path, m.group(1)
    raise ToolError("llvm-mca is not installed (Debian: apt-get install llvm-19)")


@lru_cache(maxsize=16)
def _parsed(schedule: KernelSchedule, n: int, k: int, lanes: int, l2_bytes: int, isa: str,
            bf16_dot: bool, int8_dot: bool):
    """The family's TIR: parsing it is most of a build and does not depend on the CPU's
    model, so one parse serves every CPU of the same vector ISA, L2 (which sizes a thread's
    chunks of rows, outside the hot loop) and dot-product instructions."""
    from sandwich.compiler.build import parse_tvmscript
    from sandwich.compiler.gemm_dsl import gemm_dsl_tvmscript

    return parse_tvmscript(gemm_dsl_tvmscript(schedule, n=n, k=k, lanes=lanes, l2_bytes=l2_bytes,
                                              isa=isa, bf16_dot=bf16_dot, int8_dot=int8_dot))


def kernel_asm(schedule: KernelSchedule, *, cpu: CpuInfo, n: int, k: int) -> str:
    """The assembly of the GEMM family of `schedule` built for `cpu`, one thread, as
    build_gemm_dsl compiles it (with the CPU's bf16 and int8 dot products where it has them);
    it is only read, never run."""
    import tvm

    try:
        ex = tvm.compile(_parsed(schedule.family(), n, k, cpu.lanes_f32, cpu.l2_bytes, cpu.isa,
                                 cpu.bf16_dot, cpu.int8_dot),
                         target=tvm_target(cpu, 1))
    except Exception as e:  # TVM raises many types; the caller sees one line
        raise BuildError(f"TVM failed to cross-compile for {cpu.mcpu}: "
                         f"{first_line(e)}") from e
    if cpu.bf16_dot:  # vdpbf16ps goes in after TVM, as in a build (a module without it stays)
        ex = splice_module(ex)
    return getattr(ex, "mod", ex).inspect_source("asm")


def hot_loop(asm: str, *, arch: str = "x86_64") -> list[str]:
    """The instructions of the main tile's loop: of the innermost loops (a label up to a
    backward branch to it) with vector FMAs, the one with the most accumulators, then the
    most FMAs. Counting FMAs alone picks an unrolled tail tile (8 rows unrolled twice beat
    a 9-row main tile once). The label stays first so the branch still resolves."""
    lines = [x.split(_COMMENTS[arch])[0].rstrip() for x in asm.splitlines()]
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    loops = []
    for j, line in enumerate(lines):
        m = _BRANCH.match(line)
        if m and labels.get(m.group(2), j) < j:
            i = labels[m.group(2)]
            fmas = [x for x in lines[i:j + 1] if _FMA[arch].match(x)]
            if fmas:
                loops.append((i, j, len({_fma_dest(x, arch) for x in fmas}), len(fmas)))
    inner = [a for a in loops if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in loops)]
    if not inner:
        raise BuildError("the kernel's assembly has no loop with vector FMAs")
    i, j, _, _ = max(inner, key=lambda lp: lp[2:])
    return [lines[i]] + [x for x in lines[i + 1:j + 1] if x.strip()
                         and not x.lstrip().startswith(".") and not _LABEL.match(x)]


def _fma_dest(line: str, arch: str) -> str:
    """The accumulator an FMA writes: AT&T puts it last, AArch64 first."""
    ops = [o.strip() for o in line.split(None, 1)[1].split(",")]
    return ops[-1] if arch == "x86_64" else ops[0]


def fma_block(loop: list[str], *, arch: str = "x86_64") -> list[str]:
    """As many FMAs as the loop has, of its form and vector width, on registers only, into
    enough accumulators (28, or 14 of 16 ymm) that the FMA ports bound them, not latency."""
    out = []
    for i, fma in enumerate(x for x in loop if _FMA[arch].match(x)):
        if arch == "aarch64":
            lanes = re.search(r"\.(\d+[sdh])", fma)
            t = lanes.group(1) if lanes else "4s"
            out.append(f"fmla v{i % 28}.{t}, v30.{t}, v31.{t}")
        else:
            reg = re.search(r"%([xyz]mm)", fma)
            r = reg.group(1) if reg else "zmm"
            accs = 28 if r == "zmm" else 14
            out.append(f"{fma.split()[0]} %{r}{accs + 2}, %{r}{accs + 3}, %{r}{i % accs}")
    return out


def stack_traffic(loop: list[str], *, asm: str, arch: str = "x86_64") -> tuple[str, ...]:
    """The loop's instructions that load or store a stack slot: spills and reloads."""
    stack = _FRAME[arch] if _SET_FRAME[arch].search(asm) else _STACK[arch]
    return tuple(x.strip() for x in loop[1:] if stack.search(x) and not _LEA.match(x))


def mca_cycles(block: list[str], *, mca: tuple[str, str], triple: str, mcpu: str) -> float:
    """llvm-mca's cycles per iteration of `block` on `mcpu` (Total Cycles / Iterations)."""
    path, version = mca
    proc = subprocess.run([path, f"-mtriple={triple}", f"-mcpu={mcpu}",
                           f"-iterations={ITERATIONS}"],
                          input="\n".join(block) + "\n", capture_output=True, text=True)
    if "not a recognized processor" in proc.stderr:
        raise ToolError(f"llvm-mca {version} ({path}) does not know the CPU {mcpu}")
    total = re.search(r"Total Cycles:\s+(\d+)", proc.stdout)
    iters = re.search(r"Iterations:\s+(\d+)", proc.stdout)
    if proc.returncode or not total or not iters:
        first = (proc.stderr.strip().splitlines() or ["no output"])[0]
        raise ToolError(f"llvm-mca {version} failed on the loop for {mcpu}: {first}")
    return int(total.group(1)) / int(iters.group(1))


def check_asm(asm: str, *, mcpu: str, arch: str = "x86_64", tile: str = "") -> LoopCheck:
    """The static check of the hot loop of `asm` on llvm-mca's model of `mcpu`."""
    mca = find_llvm_mca()
    loop = hot_loop(asm, arch=arch)
    block = fma_block(loop, arch=arch)
    triple = _TRIPLES[arch]
    return LoopCheck(
        target=mcpu, tile=tile,
        cycles_per_iter=mca_cycles(loop, mca=mca, triple=triple, mcpu=mcpu),
        fma_bound=mca_cycles(block, mca=mca, triple=triple, mcpu=mcpu), fmas=len(block),
        products=tuple(sorted({x.split()[0] for x in block})),
        spills=stack_traffic(loop, asm=asm, arch=arch),
        sign_extensions=sum(bool(_SIGN_EXT.match(x)) for x in loop), mca_version=mca[1])


def check_kernel(schedule: KernelSchedule, *, mcpu: str, n: int, k: int,
                 arch: str = "x86_64") -> LoopCheck:
    """Cross-compile `schedule`'s family for LLVM CPU `mcpu` and check its hot loop."""
    find_llvm_mca()  # fail before the build when the tool is missing
    asm = kernel_asm(schedule, cpu=cpu_for(mcpu, arch), n=n, k=k)
    mk = schedule.micro_kernel
    return check_asm(asm, mcpu=mcpu, arch=arch, tile=f"{mk.mu_m}x{mk.mu_n}")
