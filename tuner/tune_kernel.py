"""`sandwichc tune-kernel`: a DSL kernel as a KernelTemplate, a measure that checks each new
point against a reference before timing it, and the report (table, JSON, best .so)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.compiler.tensors import tensor_copy
from sandwich.dsl import ast as A
from sandwich.dsl.check import _names
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.interp import Interpreter
from sandwich.dsl.space import domains
from sandwich.errors import BuildError, ConfigError, first_line
from sandwich.tuner.template_search import KernelTemplate, Outcome, SearchResult, search
from sandwich.tuner.tune_cases import Case, case_for


@dataclass(frozen=True)
class TuneSettings:
    """How hard to search and how carefully to time: `--budget` presets, `--trials` overrides."""

    trials: int
    warmup: int = 1
    repeat: int = 5
    min_repeat_s: float = 0.02
    seed: int = 0
    threads: int = 2


BUDGETS = {"tiny": TuneSettings(trials=4, warmup=1, repeat=3, min_repeat_s=0.005),
           "quick": TuneSettings(trials=16, warmup=1, repeat=5, min_repeat_s=0.02),
           "default": TuneSettings(trials=48, warmup=2, repeat=7, min_repeat_s=0.05)}


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not name or not value:
            raise ConfigError(f"{flag} {item!r}: write name=value, e.g. {flag} M=64")
        if name in out:
            raise ConfigError(f"{flag} {name} is given twice")
        out[name] = value
    return out


def parse_shapes(kernel: H.Kernel, items: list[str]) -> dict[str, int | float]:
    """`--shape name=value` -> every scalar argument; `eps`, `scale` (1/sqrt(D)) and a
    prefill's total length `L` (= S) default."""
    scalars = {p.name: p.dtype for p in kernel.params if not p.shape}
    tunables = {t.name for t in kernel.tunables}
    shapes: dict[str, int | float] = {}
    for name, text in _pairs(items, "--shape").items():
        if name in tunables:
            raise ConfigError(f"--shape {name}: {name} is a tunable, the search picks it "
                              f"(pin it with --pin {name}=VALUE)")
        if name not in scalars:
            raise ConfigError(f"--shape {name}: kernel {kernel.name} has no scalar parameter "
                              f"{name!r} (scalars: {', '.join(scalars) or 'none'})")
        is_int = scalars[name] in A.INT_DTYPES
        try:
            shapes[name] = int(text) if is_int else float(text)
        except ValueError:
            raise ConfigError(f"--shape {name}={text}: the value must be "
                              f"{'an integer' if is_int else 'a number'}") from None
        if is_int and shapes[name] < 1:
            raise ConfigError(f"--shape {name}={text}: sizes must be at least 1")
    if "eps" in scalars and "eps" not in shapes:
        shapes["eps"] = 1e-6
    if "scale" in scalars and "scale" not in shapes and "D" in shapes:
        shapes["scale"] = 1.0 / math.sqrt(shapes["D"])
    if "L" in scalars and "L" not in shapes and "S" in shapes:  # prefill: a whole prompt
        shapes["L"] = shapes["S"]
    missing = [n for n in scalars if n not in shapes]
    if missing:
        raise ConfigError(f"kernel {kernel.name}: give --shape for {', '.join(missing)} "
                          f"(e.g. " + " ".join(f"--shape {n}=64" for n in missing[:3]) + ")")
    return {n: shapes[n] for n in scalars}


def pinned_domains(kernel: H.Kernel, pins: list[str], *, vlen: int) -> dict[str, tuple]:
    """The kernel's domains with `--pin name=value` tunables narrowed to one value."""
    doms = domains(kernel, vlen=vlen)
    if not doms:
        raise ConfigError(f"kernel {kernel.name} has no tunables: nothing to tune "
                          f"(build it with `sandwichc compile`)")
    for name, text in _pairs(pins, "--pin").items():
        if name not in doms:
            raise ConfigError(f"--pin {name}: kernel {kernel.name} has no tunable {name!r} "
                              f"(tunables: {', '.join(doms)})")
        if not text.lstrip("-").isdigit() or int(text) not in doms[name]:
            raise ConfigError(f"--pin {name}={text}: not in its domain {list(doms[name])}")
        doms[name] = (int(text),)
    return doms


def validity(kernel: H.Kernel, shapes: dict, *, vlen: int):
    """Top-level asserts over tunables, vlen and the given sizes (e.g. N % pack_n == 0)."""
    known = {t.name for t in kernel.tunables} | {A.VLEN} | set(shapes)
    conds = [s.cond for s in kernel.body
             if isinstance(s, A.Assert) and set(_names(s.cond)) <= known]

    def is_valid(params: dict) -> bool:
        interp = Interpreter({A.VLEN: vlen, **shapes, **params})
        try:
            return all(interp.expr(c) for c in conds)
        except ZeroDivisionError:
            return False
    return is_valid


def constraint_text(kernel: H.Kernel, shapes: dict) -> str:
    from sandwich.dsl.highlevel.printer import print_expr

    known = {t.name for t in kernel.tunables} | {A.VLEN} | set(shapes)
    return ", ".join(print_expr(s.cond) for s in kernel.body
                     if isinstance(s, A.Assert) and set(_names(s.cond)) <= known)


def close(got: np.ndarray, want: np.ndarray) -> bool:
    """fp32 against a float64 reference: rtol 1e-4, atol scaled by the output's magnitude."""
    finite = want[np.isfinite(want)]
    scale = float(np.abs(finite).max()) if finite.size else 1.0
    return bool(np.allclose(got, want, rtol=1e-4, atol=1e-4 * max(scale, 1.0), equal_nan=True))


class DslMeasure:
    """Builds a point, runs it once on fresh arrays, checks the outputs, then times it."""

    def __init__(self, kernel: H.Kernel, case: Case, shapes: dict, settings: TuneSettings,
                 build) -> None:
        from sandwich.tuner.timing import time_callable

        self.time = time_callable
        self.kernel, self.case, self.shapes, self.settings, self.build = (
            kernel, case, shapes, settings, build)
        self.data = case.data(shapes, np.random.default_rng(settings.seed))
        self.expected: dict | None = None

    def _call(self, fn, arrays: dict):
        tensors = {n: tensor_copy(a) for n, a in arrays.items()}
        args = [tensors[p.name] if p.shape else self.shapes[p.name] for p in self.kernel.params]
        return (lambda: fn(*args)), tensors

    def __call__(self, params: dict) -> Outcome:
        arrays = self.case.args(self.shapes, self.data, params)
        try:
            fn = self.build(params)
            call, tensors = self._call(fn, arrays)
            call()
        except Exception as e:  # TVM raises many types: the point failed, the search goes on
            return Outcome(None, "failed", first_line(e))
        if self.expected is None or self.case.per_point_reference:
            self.expected = self.case.reference(self.shapes, self.data, arrays, params)
        bad = [n for n, want in self.expected.items() if not close(tensors[n].numpy(), want)]
        if bad:
            return Outcome(None, "wrong", f"output {', '.join(bad)} differs from the reference")
        s = self.settings
        t = self.time(call, warmup=s.warmup, repeat=s.repeat, min_repeat_s=s.min_repeat_s)
        return Outcome(t.median_s * 1e3)


@dataclass
class Tuning:
    """What a tune-kernel run found, with what the report needs."""

    kernel: H.Kernel
    shapes: dict
    settings: TuneSettings
    result: SearchResult
    work: tuple[float, str] | None
    builder: object


def make_template(kernel: H.Kernel, *, shapes: dict, pins: list[str], cpu, threads: int,
                  fixed: tuple[str, ...]) -> KernelTemplate:
    """The DSL kernel as the tuner sees it: domains, validity at these sizes, and
    params -> compiled module (its "main" is the kernel; the module exports to a .so)."""
    from sandwich.compiler.lower_build import build_kernel

    vlen = cpu.lanes_f32
    fix = {n: shapes[n] for n in fixed}

    def build(params: dict):
        return build_kernel(kernel, tunables=params, fixed=fix, cpu=cpu, threads=threads)

    return KernelTemplate(kernel.name, pinned_domains(kernel, pins, vlen=vlen),
                          validity(kernel, shapes, vlen=vlen), build)


def tune(kernel: H.Kernel, *, shape_args: list[str], pins: list[str], settings: TuneSettings,
         on_trial=None) -> Tuning:
    """Search `kernel` at the `--shape` sizes; a project error when nothing valid is found."""
    from sandwich.compiler.target import detect_cpu

    cpu = detect_cpu()
    shapes = parse_shapes(kernel, shape_args)
    case = case_for(kernel, vlen=cpu.lanes_f32)
    template = make_template(kernel, shapes=shapes, pins=pins, cpu=cpu,
                             threads=settings.threads, fixed=case.fixed)
    measure = DslMeasure(kernel, case, shapes, settings, lambda p: template.build(p)["main"])
    result = search(template, measure=measure, trials=settings.trials, seed=settings.seed,
                    on_trial=on_trial)
    if not result.history:
        raise ConfigError(f"kernel {kernel.name}: no tunable values satisfy its constraints "
                          f"at {shapes} ({constraint_text(kernel, shapes)}); change --shape "
                          f"or --pin")
    if result.best is None:
        why = "; ".join(sorted({f"{t.outcome.status}: {t.outcome.error}"
                                for t in result.history})[:3])
        raise BuildError(f"kernel {kernel.name}: none of the {len(result.history)} points "
                         f"tried ran correctly at {shapes} ({why}); try more --trials")
    work = case.work(shapes, measure.data) if case.work else None
    return Tuning(kernel, shapes, settings, result, work, template.build)


def rate(work: tuple[float, str] | None, ms: float) -> str:
    return f"{work[0] / (ms * 1e-3) / 1e9:.1f} {work[1]}" if work else "-"


def _rate_json(work, ms: float) -> dict:
    if not work:
        return {}
    return {"rate": work[0] / (ms * 1e-3) / 1e9, "unit": work[1]}


def report_lines(t: Tuning, top: int = 5) -> list[str]:
    lines = [f"{'rank':<5}{'ms':>10}  {'rate':>14}  params"]
    for i, tr in enumerate(t.result.ranked(top), 1):
        lines.append(f"{i:<5}{tr.outcome.ms:>10.4f}  {rate(t.work, tr.outcome.ms):>14}  "
                     + " ".join(f"{k}={v}" for k, v in tr.params.items()))
    bad = [tr for tr in t.result.history if not tr.outcome.ok]
    for tr in bad:
        lines.append(f"{tr.outcome.status}: {tr.params}: {tr.outcome.error}")
    return lines


def to_json(t: Tuning) -> dict:
    best = t.result.best
    return {"kernel": t.kernel.name, "shape": t.shapes, "threads": t.settings.threads,
            "trials": len(t.result.history), "seed": t.settings.seed,
            "best": {"params": best.params, "ms": best.outcome.ms,
                     **_rate_json(t.work, best.outcome.ms)},
            "history": [tr.to_json() for tr in t.result.history]}


def write_json(t: Tuning, path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_json(t), indent=1) + "\n", encoding="utf-8")


def write_best_so(t: Tuning, path: str) -> None:
    from sandwich.compiler.build import export_atomic

    export_atomic(t.builder(t.result.best.params), Path(path))
