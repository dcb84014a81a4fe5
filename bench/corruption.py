"""`sandwichc bench corruption`: single-byte corruptions of a finished kernel cache, each
classified by what a user would see. A worker process takes the corruptions in turn (TVM
is imported once); when it dies by a signal, that corruption is a crash and a new worker
takes the next one.

Outcomes per corruption: `harmless` (verify clean, every GEMM equal to numpy), `reported`
(verify or opening the cache names a problem), `error-at-use` (verify clean, a GEMM call
raises a one-line SandwichError), and the two failures: `wrong` (a GEMM result off numpy)
and `crash` (a signal, or an exception that is not a SandwichError)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("harmless", "reported", "error-at-use", "wrong", "crash")
MS = (1, 3, 8, 17)  # M values each GEMM is checked at


@dataclass(frozen=True)
class Corruption:
    index: int
    file: str  # relative to the cache directory
    offset: int
    old: int
    new: int


@dataclass
class CorruptionReport:
    machine: str
    command: str
    count: int
    files: dict[str, int] = field(default_factory=dict)  # bytes per corruptible file
    outcomes: dict[str, int] = field(default_factory=dict)
    by_file_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)  # wrong or crash, with their corruption
    at_use: list[dict] = field(default_factory=list)  # error-at-use, with their corruption
    seconds: float = 0.0


def plan(cache_dir: Path, count: int, seed: int = 0) -> list[Corruption]:
    """Half the corruptions in the SQLite file, half in the `.so` files (one picked at
    random each time); a uniform offset; a byte replaced by a different random value."""
    rng = random.Random(seed)
    db = cache_dir / "tuning.sqlite"
    sos = sorted(p for p in (cache_dir / "kernels").rglob("*.so"))
    out = []
    for i in range(count):
        f = db if (rng.random() < 0.5 or not sos) else rng.choice(sos)
        data_len = f.stat().st_size
        off = rng.randrange(data_len)
        old = f.read_bytes()[off]
        new = rng.choice([b for b in range(256) if b != old])
        out.append(Corruption(i, str(f.relative_to(cache_dir)), off, old, new))
    return out


def check_one(base: Path, work: Path, c: Corruption, shapes: list[tuple[int, int]]) -> dict:
    """Apply one corruption to a fresh copy of the cache and classify it (in the worker)."""
    import numpy as np

    from sandwich.errors import SandwichError
    from sandwich.tuner.kernel_cache import KernelCache

    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(base, work)
    path = work / c.file
    data = bytearray(path.read_bytes())
    data[c.offset] = c.new
    path.write_bytes(bytes(data))
    try:
        cache = KernelCache(work)
        problems = cache.verify()
    except SandwichError as e:
        return {"outcome": "reported", "why": str(e)[:200]}
    if problems:
        return {"outcome": "reported", "why": problems[0][:200]}
    rng = np.random.default_rng(c.index)
    for n, k in shapes:
        try:
            gemm = cache.gemm(n=n, k=k)
            w = rng.standard_normal((k, n), dtype=np.float32)
            wp = gemm.pack(w)
            for m in MS:
                a = rng.standard_normal((m, k), dtype=np.float32)
                ref = a.astype(np.float64) @ w
                err = float(np.abs(gemm(a, wp) - ref).max() / max(np.abs(ref).max(), 1e-30))
                if not err <= 1e-4:
                    return {"outcome": "wrong", "why": f"N={n} K={k} M={m}: rel. error {err:.3g}"}
        except SandwichError as e:
            return {"outcome": "error-at-use", "why": str(e)[:200]}
    return {"outcome": "harmless"}


def worker_main(spec_path: str) -> None:
    """`python -m sandwich.bench.corruption SPEC`: one JSON line out per corruption in."""
    spec = json.loads(Path(spec_path).read_text())
    base, work = Path(spec["base"]), Path(spec["work"])
    shapes = [tuple(s) for s in spec["shapes"]]
    for line in sys.stdin:
        c = Corruption(**json.loads(line))
        try:
            res = check_one(base, work, c, shapes)
        except Exception as e:  # noqa: BLE001 - any other exception is what we look for
            res = {"outcome": "crash", "why": f"{type(e).__name__}: {e}"[:200]}
        print(json.dumps({"index": c.index} | res), flush=True)


def run_corruptions(base: Path, work: Path, corruptions: list[Corruption],
                    shapes: list[tuple[int, int]], on_result=lambda r: None) -> list[dict]:
    """Feed the corruptions to worker processes, restarting after a crash."""
    spec = work.parent / "corruption_spec.json"
    spec.write_text(json.dumps({"base": str(base), "work": str(work), "shapes": shapes}))
    results: list[dict] = []
    todo = list(corruptions)
    while todo:
        proc = subprocess.Popen([sys.executable, "-m", "sandwich.bench.corruption", str(spec)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        while todo:
            c = todo[0]
            try:
                proc.stdin.write(json.dumps(c.__dict__) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except BrokenPipeError:
                line = ""
            if not line:  # the worker died on this corruption
                proc.wait()
                res = {"index": c.index, "outcome": "crash",
                       "why": f"worker exited with {proc.returncode}"}
                todo.pop(0)
                results.append(res | {"corruption": c.__dict__})
                on_result(res)
                break
            res = json.loads(line)
            todo.pop(0)
            results.append(res | {"corruption": c.__dict__})
            on_result(res)
        else:
            proc.stdin.close()
            proc.wait()
    return results


def summarize(results: list[dict], report: CorruptionReport) -> CorruptionReport:
    report.outcomes = {o: 0 for o in OUTCOMES} | dict(Counter(r["outcome"] for r in results))
    kinds: dict[str, Counter] = {}
    for r in results:
        kind = "sqlite" if r["corruption"]["file"].endswith(".sqlite") else ".so"
        kinds.setdefault(kind, Counter())[r["outcome"]] += 1
    report.by_file_kind = {k: dict(v) for k, v in kinds.items()}
    report.failures = [r for r in results if r["outcome"] in ("wrong", "crash")]
    report.at_use = [r for r in results if r["outcome"] == "error-at-use"]
    return report


def write_report(report: CorruptionReport, md: Path, js: Path) -> None:
    md.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(report.__dict__, indent=1))
    lines = [
        f"# {report.count} single-byte corruptions of a finished kernel cache", "",
        f"Machine: {report.machine}. Command: `{report.command}` ({report.seconds:.0f} s).", "",
        "Each corruption replaces one byte (uniform offset, a different random value) of a "
        "fresh copy of a tuned tiny-model cache: half in `tuning.sqlite`, half in one of the "
        "`.so` files. Then `cache verify`, then every GEMM at M = "
        + ", ".join(map(str, MS)) + " against numpy.", "",
        "| outcome | count | what it means |", "|---|---:|---|",
    ]
    meaning = {"harmless": "verify clean, every GEMM equal to numpy",
               "reported": "verify (or opening the cache) names the problem",
               "error-at-use": "verify clean; a GEMM call fails with a one-line error",
               "wrong": "**failure**: a GEMM result differs from numpy",
               "crash": "**failure**: a signal or a traceback"}
    lines += [f"| {o} | {report.outcomes.get(o, 0)} | {meaning[o]} |" for o in OUTCOMES]
    lines += ["", "| file | " + " | ".join(OUTCOMES) + " |", "|---|" + "---:|" * len(OUTCOMES)]
    for kind, counts in sorted(report.by_file_kind.items()):
        lines.append(f"| {kind} | " + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES) + " |")
    for title, rows in (("Failures", report.failures), ("Errors at use", report.at_use)):
        if rows:
            lines += ["", f"{title}:"] + [f"- {f['corruption']}: {f['outcome']} ({f.get('why')})"
                                          for f in rows[:20]]
    md.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    worker_main(sys.argv[1])
