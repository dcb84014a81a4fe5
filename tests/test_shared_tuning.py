"""Concurrent tuners split the shapes through leases in the tuning database (issue 24):
a shape leased by a live tuner is skipped and come back to; a dead tuner's lease expires.
The search itself is replaced by a recorder: no kernel is compiled."""

import os
import socket
import subprocess
import sys
import time

import pytest

from sandwich.tuner import shared_tuning
from sandwich.tuner.budget import get_budget
from sandwich.tuner.tuning_db import TuningDB, lease_owner
from sandwich.types import GemmOp

KEY = ("fp", 64, 64, "float32", 1)


def test_a_lease_is_exclusive_until_released_or_expired(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    assert db.claim(KEY, "a", ttl_s=30) and db.claim(KEY, "a", ttl_s=30)  # re-entrant
    assert not db.claim(KEY, "b", ttl_s=30)
    db.release(KEY, "b")  # not b's to release
    assert not db.claim(KEY, "b", ttl_s=30)
    db.release(KEY, "a")
    assert db.claim(KEY, "b", ttl_s=30)
    db.conn.execute("UPDATE leases SET heartbeat = ?", (time.time() - 60,))  # b died
    assert db.claim(KEY, "c", ttl_s=30)
    db.renew("c")
    assert not db.claim(KEY, "a", ttl_s=30)


def test_a_lease_of_a_process_gone_from_this_host_is_taken_at_once(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid no longer runs (reaped)
    host = socket.gethostname()
    assert db.claim(KEY, f"{host}:{os.getpid()}:aaaa", ttl_s=30)
    assert not db.claim(KEY, lease_owner(), ttl_s=30)  # this test's own process is alive
    db.release(KEY, f"{host}:{os.getpid()}:aaaa")
    assert db.claim(KEY, f"{host}:{gone.pid}:bbbb", ttl_s=30)
    me = lease_owner()
    assert db.claim(KEY, me, ttl_s=30)  # a fresh heartbeat, yet its owner is gone
    db.release(KEY, me)
    assert db.claim(KEY, f"{host}-other:{gone.pid}:cccc", ttl_s=30)
    assert not db.claim(KEY, me, ttl_s=30)  # another host's pids are not this one's to judge


class _Cache:
    """What tune_shared needs of a KernelCache."""

    def __init__(self, db):
        self.db, self.fingerprint = db, "fp"

    def kernel_n(self, n):
        return n


def test_a_shape_another_tuner_holds_is_done_last(tmp_path, monkeypatch):
    db = TuningDB(tmp_path / "t.sqlite")
    shapes = [(["a"], GemmOp("a", 128, 64)), (["b"], GemmOp("b", 64, 64))]  # a is larger: first
    order = []
    monkeypatch.setattr(shared_tuning, "tune_op",
                        lambda *, names, **kw: order.append(names[0]) or names[0])
    db.claim(("fp", 128, 64, "float32", 1), "other", ttl_s=30)  # a live tuner has shape a

    def sleep(_):  # while we wait, the other tuner finishes
        db.release(("fp", 128, 64, "float32", 1), "other")

    out = shared_tuning.tune_shared(shapes, seq_max=8, threads=1, budget=get_budget("tiny"),
                                    cache=_Cache(db), sleep=sleep)
    assert order == ["b", "a"] and out == ["a", "b"]  # reports in the shapes' order
    assert db.conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)


def test_a_dead_tuners_lease_is_taken_over(tmp_path, monkeypatch):
    db = TuningDB(tmp_path / "t.sqlite")
    monkeypatch.setattr(shared_tuning, "tune_op", lambda *, names, **kw: names[0])
    db.claim(("fp", 64, 64, "float32", 1), "dead", ttl_s=30)
    db.conn.execute("UPDATE leases SET heartbeat = ?", (time.time() - 120,))
    slept = []
    out = shared_tuning.tune_shared([(["a"], GemmOp("a", 64, 64))], seq_max=8, threads=1,
                                    budget=get_budget("tiny"), cache=_Cache(db),
                                    sleep=slept.append)
    assert out == ["a"] and slept == []


def test_a_failed_search_gives_its_lease_back(tmp_path, monkeypatch):
    db = TuningDB(tmp_path / "t.sqlite")

    def boom(**kw):
        raise RuntimeError("search failed")

    monkeypatch.setattr(shared_tuning, "tune_op", boom)
    with pytest.raises(RuntimeError):
        shared_tuning.tune_shared([(["a"], GemmOp("a", 64, 64))], seq_max=8, threads=1,
                                  budget=get_budget("tiny"), cache=_Cache(db))
    assert db.conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)


def _open_db(path, barrier, errors):
    from sandwich.errors import CacheError

    barrier.wait()
    try:
        TuningDB(path)
    except CacheError as e:
        errors.put(str(e))


def test_processes_opening_a_new_cache_at_once_all_get_it(tmp_path):
    """CI: of two `tune` processes on one new cache, one failed with "database is locked":
    switching a new database to WAL can fail at once, without SQLite's busy handler. Before
    the retry, 6 processes x 20 new caches failed 7 times here."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    errors = ctx.Queue()
    for trial in range(12):
        barrier = ctx.Barrier(6)
        procs = [ctx.Process(target=_open_db, args=(tmp_path / f"c{trial}.sqlite", barrier, errors))
                 for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert all(p.exitcode == 0 for p in procs)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found
