"""What a tuning record read back from the cache must satisfy before its schedule reaches a
kernel: a flipped bit in the database can make a slice of zero (a division by zero inside
the kernel) or a negative one (silently wrong output), and SQLite's own checks pass."""

from __future__ import annotations

from sandwich.errors import ConfigError
from sandwich.tuner.tuning_db import StoredRecord


def record_problem(rec: StoredRecord, *, lanes: int) -> str | None:
    """Why this record must not be used, or None."""
    from sandwich.compiler.gemm_formats import op_takes
    from sandwich.compiler.gemm_template import GemmProblem, validate

    r = rec.record
    if rec.threads < 1:
        return f"thread count {rec.threads}"
    if not 1 <= r.m_lo <= r.m_hi:
        return f"M range [{r.m_lo}, {r.m_hi}]"
    if r.n < 1 or r.k < 1 or r.schedule.pack_n < 1:
        return f"shape N={r.n} K={r.k} pack_n={r.schedule.pack_n}"
    if r.schedule.polymerization.threads > rec.threads:
        return f"{r.schedule.polymerization.threads} threads in a schedule tuned for {rec.threads}"
    try:
        if r.schedule.dtype != r.dtype or not op_takes(r.schedule.op, r.dtype, r.k):
            return f"schedule {r.schedule.op}/{r.schedule.dtype} for a {r.dtype} record"
        validate(r.schedule, GemmProblem(r.n, r.k, lanes))
    except ConfigError as e:
        return str(e)
    return None


def describe(rec: StoredRecord) -> str:
    r = rec.record
    return f"record N={r.n} K={r.k} threads={rec.threads} M>={r.m_lo} ({r.schedule.key()})"
