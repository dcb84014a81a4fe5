"""Inputs and references for `sandwichc tune-kernel`: numpy for the shipped tunable kernels,
the reference interpreter (dsl/interp.py) for any other kernel, on small shapes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sandwich.dsl import ast as A
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.interp import NUMPY_DTYPES, Interpreter, run
from sandwich.errors import ConfigError
from sandwich.tuner.reference import reference_attention, reference_matmul

INTERP_MAX_ELEMENTS = 200_000  # the interpreter reference is pure Python: small shapes only


@dataclass(frozen=True)
class Case:
    """How to feed and check one kernel: the scalars to fix at build time, the seeded data
    (drawn once), the arrays of one point, and the expected values of its outputs."""

    fixed: tuple[str, ...]
    data: Callable[[dict, np.random.Generator], dict]
    args: Callable[[dict, dict, dict], dict]  # (scalars, data, params) -> arrays by name
    reference: Callable[..., dict]  # (scalars, data, point arrays, params) -> outputs
    per_point_reference: bool = False
    work: Callable[[dict, dict], tuple[float, str]] | None = None  # (scalars, data) -> (amount, unit)


def rand(rng: np.random.Generator, *shape) -> np.ndarray:
    return (rng.random(shape, dtype=np.float32) - 0.5).astype(np.float32)


def nan_like(shape) -> np.ndarray:
    """Outputs start as NaN, so an element the kernel never writes fails the check."""
    return np.full(shape, np.nan, np.float32)


# --- GEMM: W is drawn once as [K, N] and packed per point into W[N / pack_n, K, pack_n]
def _gemm_data(s, rng):
    return {"A": rand(rng, s["M"], s["K"]), "W": rand(rng, s["K"], s["N"])}


def _gemm_args(s, d, p):
    n, k, pn = s["N"], s["K"], p["pack_n"]
    packed = np.ascontiguousarray(d["W"].reshape(k, n // pn, pn).transpose(1, 0, 2))
    return {"A": d["A"], "W": packed, "C": nan_like((s["M"], n))}


GEMM = Case(fixed=("N", "K"), data=_gemm_data, args=_gemm_args,
            reference=lambda s, d, a, p: {"C": reference_matmul(d["A"], d["W"])},
            work=lambda s, d: (2.0 * s["M"] * s["N"] * s["K"], "GFLOPS"))


def _heads(s) -> None:
    if s["KVH"] < 1 or s["H"] % s["KVH"]:
        raise ConfigError(f"--shape H={s['H']} KVH={s['KVH']}: H must be a multiple of KVH")


def _prefill_data(s, rng):
    _heads(s)
    if s["L"] < s["S"]:
        raise ConfigError(f"--shape L={s['L']}: L (cached + new positions) must be >= S={s['S']}")
    return {"Q": rand(rng, s["S"], s["H"], s["D"]), "K": rand(rng, s["L"], s["KVH"], s["D"]),
            "V": rand(rng, s["L"], s["KVH"], s["D"])}


def _prefill_flops(s, d):
    """Each query row i (of S, after L - S cached positions) sees L - S + i + 1 keys."""
    keys = s["S"] * (s["L"] - s["S"]) + s["S"] * (s["S"] + 1) / 2
    return 4.0 * keys * s["D"] * s["H"], "GFLOPS"


FLASH_PREFILL = Case(
    fixed=("H", "KVH", "D"), data=_prefill_data,
    args=lambda s, d, p: {**d, "O": nan_like((s["S"], s["H"], s["D"]))},
    reference=lambda s, d, a, p: {"O": reference_attention(d["Q"], d["K"], d["V"], s["scale"], True)},
    work=_prefill_flops)


def _decode_data(s, rng):
    _heads(s)
    if not 1 <= s["B"] <= s["max_batch"]:
        raise ConfigError(f"--shape B={s['B']}: need 1 <= B <= max_batch ({s['max_batch']})")
    kv = (s["max_seq"], s["max_batch"], s["KVH"], s["D"])
    lens = rng.integers(1, s["max_seq"] + 1, s["B"]).astype(np.int32)
    lens[0] = s["max_seq"]  # one full-length sequence: the ragged batch spans the range
    return {"q": rand(rng, s["B"], s["H"], s["D"]), "k_cache": rand(rng, *kv),
            "v_cache": rand(rng, *kv), "slots": np.arange(s["B"], dtype=np.int32), "lens": lens}


def _decode_ref(s, d, a, p):
    out = [reference_attention(d["q"][b:b + 1], d["k_cache"][:n, b], d["v_cache"][:n, b], s["scale"],
                         False)[0] for b, n in enumerate(d["lens"])]
    return {"out": np.stack(out)}


DECODE_ATTENTION = Case(
    fixed=("H", "KVH", "D"), data=_decode_data,
    args=lambda s, d, p: {**d, "out": nan_like((s["B"], s["H"], s["D"])),
                          "work": nan_like((p["n_split"], s["B"], s["H"], s["D"] + 16))},
    reference=_decode_ref,
    work=lambda s, d: (2.0 * int(d["lens"].sum()) * s["KVH"] * s["D"] * 4, "GB/s"))

SHIPPED = {"gemm": GEMM, "flash_prefill": FLASH_PREFILL, "decode_attention": DECODE_ATTENTION}


# --- any other kernel: seeded random arrays, checked against the interpreter per point
def _written(stmts) -> set[str]:
    """Arrays the kernel stores into: its outputs."""
    return {s.target.array for s in H.walk(stmts)
            if isinstance(s, A.Assign) and isinstance(s.target, A.Index)}


def interpreter_case(kernel: H.Kernel, *, vlen: int) -> Case:
    """Inputs from a seed per array name (the same data at every point, whatever shape the
    tunables give it); integer arrays are zero, outputs NaN; the interpreter is the reference."""
    arrays = [p for p in kernel.params if p.shape]
    outputs = _written(kernel.body) & {p.name for p in arrays}
    params_in_order = [p.name for p in kernel.params]

    def args(s, d, p):
        interp, out = Interpreter({A.VLEN: vlen, **s, **p}), {}
        total = 0
        for i, a in enumerate(arrays):
            shape = tuple(int(interp.expr(e)) for e in a.shape)
            total += math.prod(shape)
            if a.name in outputs and a.dtype in A.FLOAT_DTYPES:
                out[a.name] = nan_like(shape).astype(NUMPY_DTYPES[a.dtype])
            elif a.dtype in A.FLOAT_DTYPES:
                seed = params_in_order.index(a.name) + 1000 * i
                out[a.name] = rand(np.random.default_rng(seed), *shape).astype(NUMPY_DTYPES[a.dtype])
            else:
                out[a.name] = np.zeros(shape, NUMPY_DTYPES[a.dtype])
        if total > INTERP_MAX_ELEMENTS:
            raise ConfigError(f"kernel {kernel.name} has no numpy reference, and the "
                              f"interpreter reference needs small shapes ({total} array "
                              f"elements > {INTERP_MAX_ELEMENTS}); give smaller --shape values")
        return out

    def reference(s, d, a, p):
        copies = {n: v.copy() for n, v in a.items()}
        run(kernel, tunables=p, vlen=vlen, **s, **copies)
        return {n: copies[n] for n in outputs}

    return Case(fixed=(), data=lambda s, rng: {}, args=args, reference=reference,
                per_point_reference=True)


def _signature(kernel: H.Kernel) -> tuple:
    return tuple((p.name, p.dtype, len(p.shape)) for p in kernel.params)


def case_for(kernel: H.Kernel, *, vlen: int) -> Case:
    """The numpy case when `kernel` has a shipped kernel's name and signature, else the
    interpreter case (a user's own `gemm` with other arguments is not mistaken for ours)."""
    from sandwich.dsl.load import builtin_kernels, load_kernel

    if kernel.name in SHIPPED and kernel.name in builtin_kernels():
        if _signature(load_kernel(kernel.name)) == _signature(kernel):
            return SHIPPED[kernel.name]
    return interpreter_case(kernel, vlen=vlen)
