"""Tuners that share a cache, and a tune killed with SIGKILL resumed from its committed
records (subprocesses, as a user runs them)."""

import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from cli_run import run


@pytest.mark.tvm
def test_concurrent_tunes_share_a_cache(tmp_path, tiny_config):
    cache = tmp_path / "shared"
    args = [sys.executable, "-m", "sandwich.cli", "tune", "--model", str(tiny_config),
            "--seq-max", "4", "--budget", "tiny", "--no-progress", "--plan", "off", "--cache-dir", str(cache)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    v = run("cache", "verify", "--numerics", "6", "--seq-max", "4", cache=cache)
    assert v.returncode == 0 and "verified" in v.stdout, v.stdout + v.stderr


@pytest.mark.tvm
def test_sigkill_resumes_from_committed_records(tmp_path, tiny_config):
    cache = tmp_path / "killed"
    args = [sys.executable, "-m", "sandwich.cli", "tune", "--model", str(tiny_config),
            "--seq-max", "16", "--budget", "tiny", "--no-progress", "--plan", "off",
            "--cache-dir", str(cache)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = cache / "tuning.sqlite"
    committed = 0
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if db.exists():
            try:
                committed = sqlite3.connect(db, timeout=1).execute(
                    "SELECT COUNT(*) FROM records").fetchone()[0]
            except sqlite3.Error:
                continue
            if committed >= 2:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert committed >= 2
    kept = sqlite3.connect(db).execute("SELECT COUNT(*) FROM records").fetchone()[0]
    p = run("tune", "--model", str(tiny_config), "--seq-max", "16", "--budget", "tiny",
            "--no-progress", "--plan", "off", cache=cache)
    assert p.returncode == 0, p.stderr
    cached = sum(int(line.split()[5]) for line in p.stdout.splitlines()  # op N K format searched cached
                 if line.split() and line.split()[0] in ("qkv", "o", "gate_up+lm_head", "down"))
    assert cached >= kept
    again = run("tune", "--model", str(tiny_config), "--seq-max", "16", "--budget", "tiny",
                "--no-progress", "--plan", "off", cache=cache)
    assert again.returncode == 0
    rows = [line.split() for line in again.stdout.splitlines()
            if line.split() and line.split()[0] in ("qkv", "o", "gate_up+lm_head", "down")]
    assert len(rows) == 4 and all(r[3:5] == ["fp32", "0"] for r in rows)  # nothing searched again
