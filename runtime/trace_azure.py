"""The Azure LLM inference trace CSV (Azure/AzurePublicDataset, the traces behind Splitwise):
`TIMESTAMP,ContextTokens,GeneratedTokens`, one request a row.

TIMESTAMP is a datetime such as `2023-11-16 18:15:46.6805900` (the 2024 files add
`+00:00`; naive times are read as UTC) or a number of seconds; a request arrives that many
seconds after the first row. The files hold token counts only (the prompts are private), so
the prompt ids are random. A count of 0 becomes 1: the engine needs one prompt token and
always samples the first output token.
"""

from __future__ import annotations

import csv
import io
import math
from datetime import datetime, timezone
from pathlib import Path

from sandwich.runtime.traces import TraceEntry, TraceError, check_order, read_text

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_time(text: str, where: str) -> float:
    """Seconds since the epoch of a TIMESTAMP cell."""
    s = text.strip()
    try:
        t = float(s)
    except ValueError:
        try:
            d = datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise TraceError(f"{where}: TIMESTAMP {text!r} is neither a date-time like "
                             f"'2023-11-16 18:15:46.6805900' nor a number of seconds") from None
        return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).timestamp()
    if not math.isfinite(t) or t < 0:
        raise TraceError(f"{where}: TIMESTAMP must be a time >= 0, got {text!r}")
    return t


def _count(text: str, column: str, where: str) -> int:
    try:
        n = int(text.strip())
    except ValueError:
        raise TraceError(f"{where}: {column} must be an integer token count, got {text!r}") from None
    if n < 0:
        raise TraceError(f"{where}: {column} must be >= 0, got {n}")
    return max(1, n)


def read_azure_csv(path: str | Path) -> list[TraceEntry]:
    """Parse the CSV; the first bad row raises TraceError naming FILE:LINE."""
    p = Path(path)
    rows = csv.reader(io.StringIO(read_text(p)))
    header = next(rows, None)
    while header is not None and not any(c.strip() for c in header):
        header = next(rows, None)  # leading blank lines
    if header is None:
        raise TraceError(f"{p}:1: empty file; expected the header {','.join(COLUMNS)}")
    names = [c.strip().lstrip("\ufeff") for c in header]
    line = rows.line_num
    for c in COLUMNS:
        if c not in names:
            raise TraceError(f"{p}:{line}: missing column {c!r} (the header has "
                             f"{','.join(names)}; expected {','.join(COLUMNS)})")
    col = [names.index(c) for c in COLUMNS]
    out, t0 = [], None
    for row in rows:
        where = f"{p}:{rows.line_num}"
        if not any(c.strip() for c in row):
            continue
        if len(row) < len(names):
            raise TraceError(f"{where}: {len(row)} fields, the header has {len(names)}")
        t = parse_time(row[col[0]], where)
        t0 = t if t0 is None else t0
        n, new = (_count(row[col[i]], COLUMNS[i], where) for i in (1, 2))
        out.append((rows.line_num, TraceEntry(t - t0, n, new)))
    return check_order(out, p)  # a row before the first one goes backwards
