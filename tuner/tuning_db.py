"""Tuning records and kernel files in SQLite (WAL): safe for concurrent tuners, resumable."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sandwich.errors import CacheError
from sandwich.types import KernelSchedule, TuneRecord

# a damaged file can also make SQLite's own messages undecodable text
_DB_ERRORS = (sqlite3.DatabaseError, UnicodeDecodeError)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    fingerprint TEXT NOT NULL, op TEXT NOT NULL, n INTEGER NOT NULL, k INTEGER NOT NULL,
    dtype TEXT NOT NULL, threads INTEGER NOT NULL, m_lo INTEGER NOT NULL, m_hi INTEGER NOT NULL,
    schedule TEXT NOT NULL, gflops REAL NOT NULL, trials INTEGER NOT NULL, seconds REAL NOT NULL,
    reused INTEGER NOT NULL DEFAULT 0, stable INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL,
    digest TEXT,
    PRIMARY KEY (fingerprint, n, k, dtype, threads, m_lo)
);
CREATE TABLE IF NOT EXISTS leases (
    fingerprint TEXT NOT NULL, n INTEGER NOT NULL, k INTEGER NOT NULL, dtype TEXT NOT NULL,
    threads INTEGER NOT NULL, owner TEXT NOT NULL, heartbeat REAL NOT NULL,
    PRIMARY KEY (fingerprint, n, k, dtype, threads)
);
CREATE TABLE IF NOT EXISTS kernels (
    fingerprint TEXT NOT NULL, n INTEGER NOT NULL, k INTEGER NOT NULL, dtype TEXT NOT NULL,
    schedule_key TEXT NOT NULL, schedule TEXT NOT NULL, path TEXT NOT NULL, sha256 TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (fingerprint, n, k, dtype, schedule_key)
);
"""


def lease_owner() -> str:
    """Who holds a lease: this host, this process, and a nonce (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _dead_here(owner: str) -> bool:
    """Whether `owner` (see lease_owner) is a process of this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # it runs, under another user
        return False
    return False


@dataclass(frozen=True)
class KernelFile:
    """A compiled `.so` in the cache directory and the hash it must still have."""

    n: int
    k: int
    dtype: str
    schedule: KernelSchedule
    path: str  # relative to the cache directory
    sha256: str


@dataclass(frozen=True)
class StoredRecord:
    """A TuneRecord plus the thread count it was tuned for and whether reuse produced it."""

    record: TuneRecord
    threads: int
    reused: bool
    stable: bool = False


def record_digest(fields: tuple) -> str:
    """Checksum of a record's stored fields (canonical JSON): a flipped bit that still reads
    as a plausible record (another M range, another slice) is caught, not used."""
    import hashlib
    import json

    text = json.dumps(list(fields), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class TuningDB:
    """One SQLite file; every write is one short transaction so a killed tuner loses nothing
    that was committed. Safe to share between threads (a server loads kernels lazily on its
    engine thread): one lock serialises the connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        try:
            self.conn = sqlite3.connect(str(path), timeout=60, isolation_level=None,
                                        check_same_thread=False)
            # damaged text must not raise UnicodeDecodeError from deep inside sqlite3: it
            # decodes to U+FFFD and then fails the checks on what it should say
            self.conn.text_factory = lambda b: b.decode("utf-8", "replace")
            self.conn.execute("PRAGMA busy_timeout=60000")
            self._init_schema()
        except _DB_ERRORS as e:
            raise CacheError(f"cache database {path} is unreadable ({e}); move it away or run "
                             f"`sandwichc cache clear` to start a new cache") from None

    def _init_schema(self, *, wait_s: float = 60.0) -> None:
        """WAL mode and the tables. Two tuners opening a new cache at once: switching the
        journal mode can fail with "database is locked" at once, without SQLite's busy
        handler waiting (seen in CI), so that step is retried until `wait_s` has passed."""
        deadline = time.monotonic() + wait_s
        pause = 0.01
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.executescript(_SCHEMA)
                columns = {r[1] for r in self.conn.execute("PRAGMA table_info(records)")}
                if "digest" not in columns:  # a cache written before records carried a checksum
                    self.conn.execute("ALTER TABLE records ADD COLUMN digest TEXT")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(pause)
                pause = min(0.5, 2 * pause)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield from self._tx_locked()

    def _tx_locked(self) -> Iterator[sqlite3.Connection]:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            yield self.conn
            self.conn.execute("COMMIT")
        except _DB_ERRORS as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise CacheError(f"cache database {self.path}: {e}") from None
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            with self._lock:
                return self.conn.execute(sql, args).fetchall()
        except _DB_ERRORS as e:
            raise CacheError(f"cache database {self.path} is unreadable ({e}); move it away or "
                             f"run `sandwichc cache clear`") from None

    def put_record(self, rec: TuneRecord, *, threads: int, reused: bool = False,
                   stable: bool = False) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO records (fingerprint, op, n, k, dtype, threads, m_lo, "
                "m_hi, schedule, gflops, trials, seconds, reused, stable, created, digest) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (*(fields := (rec.target_fingerprint, rec.op, rec.n, rec.k, rec.dtype, threads,
                              rec.m_lo, rec.m_hi, rec.schedule.to_json(), rec.gflops, rec.trials,
                              rec.seconds, int(reused), int(stable))), time.time(),
                 record_digest(fields)),
            )

    def delete_records(self, fingerprint: str, n: int, k: int, dtype: str, threads: int) -> None:
        """Drop the tuning records of one (N, K, dtype, threads); kernel files stay listed."""
        with self._tx() as c:
            c.execute("DELETE FROM records WHERE fingerprint = ? AND n = ? AND k = ? AND dtype = ? "
                      "AND threads = ?", (fingerprint, n, k, dtype, threads))

    def records(self, *, fingerprint: str | None = None, n: int | None = None,
                k: int | None = None, dtype: str | None = None,
                threads: int | None = None, bad: list[str] | None = None) -> list[StoredRecord]:
        """Records matching the given fields, sorted by (n, k, threads, m_lo). A row whose
        schedule does not parse is skipped (described in `bad` when given): one damaged
        record costs a re-tune of its shape, never the cache."""
        where, args = [], []
        for col, val in (("fingerprint", fingerprint), ("n", n), ("k", k), ("dtype", dtype),
                         ("threads", threads)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        sql = "SELECT fingerprint, op, n, k, dtype, threads, m_lo, m_hi, schedule, gflops, " \
              "trials, seconds, reused, stable, digest FROM records"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY n, k, threads, m_lo"
        out = []
        for row in self._query(sql, tuple(args)):
            fp, op, n_, k_, dt, thr, lo, hi, sched, g, trials, secs, reused, stable, digest = row
            if digest is not None and digest != record_digest(row[:-1]):
                if bad is not None:
                    bad.append(f"record N={n_} K={k_} threads={thr} M>={lo}: does not match its "
                               f"checksum (altered)")
                continue
            try:
                schedule = KernelSchedule.from_json(sched)
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                if bad is not None:
                    bad.append(f"record N={n_} K={k_} threads={thr} M>={lo}: malformed schedule ({e})")
                continue
            rec = TuneRecord(fp, op, n_, k_, dt, lo, hi, schedule, g, trials, secs)
            out.append(StoredRecord(rec, thr, bool(reused), bool(stable)))
        return out

    def put_kernel(self, fingerprint: str, kf: KernelFile) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO kernels VALUES (?,?,?,?,?,?,?,?,?)",
                (fingerprint, kf.n, kf.k, kf.dtype, kf.schedule.family_key(), kf.schedule.to_json(),
                 kf.path, kf.sha256, time.time()),
            )

    def kernel(self, fingerprint: str, n: int, k: int, dtype: str,
               schedule: KernelSchedule) -> KernelFile | None:
        rows = self._query(
            "SELECT path, sha256 FROM kernels WHERE fingerprint=? AND n=? AND k=? AND dtype=? "
            "AND schedule_key=?", (fingerprint, n, k, dtype, schedule.family_key()))
        if not rows:
            return None
        return KernelFile(n, k, dtype, schedule, rows[0][0], rows[0][1])

    def kernels(self, bad: list[str] | None = None) -> list[tuple[str, KernelFile]]:
        """Every recorded kernel file; a row whose schedule does not parse is skipped (and
        described in `bad` when given)."""
        rows = self._query("SELECT fingerprint, n, k, dtype, schedule, path, sha256 FROM kernels "
                           "ORDER BY n, k, path")
        out = []
        for fp, n, k, dt, s, p, h in rows:
            try:
                out.append((fp, KernelFile(n, k, dt, KernelSchedule.from_json(s), p, h)))
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                if bad is not None:
                    bad.append(f"kernel file row N={n} K={k} {p}: malformed schedule ({e})")
        return out

    # -- leases: concurrent tuners split the shapes instead of each searching all of them --
    def claim(self, key: tuple, owner: str, *, ttl_s: float) -> bool:
        """Take the lease on one shape key (fingerprint, n, k, dtype, threads) unless a live
        tuner holds it; a lease whose heartbeat is older than ttl_s belonged to a dead one,
        and so does one held by a process of this host that no longer runs (a rerun after a
        kill starts at once instead of waiting out the heartbeat)."""
        now = time.time()
        with self._tx() as c:
            row = c.execute("SELECT owner, heartbeat FROM leases WHERE fingerprint=? AND n=? AND "
                            "k=? AND dtype=? AND threads=?", key).fetchone()
            if row is not None and row[0] != owner and now - row[1] <= ttl_s \
                    and not _dead_here(row[0]):
                return False
            c.execute("INSERT OR REPLACE INTO leases VALUES (?,?,?,?,?,?,?)", (*key, owner, now))
            return True

    def renew(self, owner: str) -> None:
        """Every lease `owner` holds is alive now (its heartbeat)."""
        with self._tx() as c:
            c.execute("UPDATE leases SET heartbeat=? WHERE owner=?", (time.time(), owner))

    def release(self, key: tuple, owner: str) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM leases WHERE fingerprint=? AND n=? AND k=? AND dtype=? AND "
                      "threads=? AND owner=?", (*key, owner))

    def integrity_problems(self) -> list[str]:
        """SQLite's own full check (pages, and every index against its table)."""
        try:
            rows = self._query("PRAGMA integrity_check")
        except CacheError as e:
            return [str(e)]
        return [] if rows == [("ok",)] else [f"cache database {self.path}: {r[0]}" for r in rows]

    def checkpoint(self) -> None:
        """Move committed transactions from the WAL into the database file, so the records
        survive even if someone deletes a `-wal` file left by a killed tuner."""
        try:
            with self._lock:
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except _DB_ERRORS:
            pass  # another process holds the database; its own checkpoint will do it

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
